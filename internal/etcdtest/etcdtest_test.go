package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"leasehold/internal/etcdtest"
)

func TestThreeMembersSurviveLeaderHardStop(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	lead, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.HardStop(lead)
	// The first requests after a leader crash may time out while the
	// others elect a new leader; etcd says to retry them.
	for {
		_, err := cli.Put(ctx, "k", "v2")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("put after leader hard stop: %v", err)
		}
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("get = %v, %v", resp, err)
	}
	if got, _ := c.WaitLeader(ctx); got == lead {
		t.Fatalf("stopped member %d still reported as leader", lead)
	}
}
