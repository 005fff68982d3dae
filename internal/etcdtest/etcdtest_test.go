package etcdtest_test

import (
	"context"
	"os"
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

func TestMain(m *testing.M) {
	etcdtest.RunMemberIfChild() // a member process of StartProcesses runs here
	os.Exit(m.Run())
}

// TestProcessMemberSIGKILL: three member processes; the raft leader is
// SIGKILLed; the other two elect a leader and take writes, and the killed
// member is reported as not running.
func TestProcessMemberSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("three etcd processes with default timings: ~4 s")
	}
	c := etcdtest.StartProcesses(t, 3)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	lead := c.Leader(ctx, cli)
	if lead < 0 {
		t.Fatal("no raft leader")
	}
	c.Kill(lead)
	if c.Running(lead) {
		t.Fatalf("member %d still running after Kill", lead)
	}
	for {
		_, err := cli.Put(ctx, "k", "v2")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("put after the leader was killed: %v", err)
		}
	}
	if got := c.Leader(ctx, cli); got < 0 || got == lead {
		t.Fatalf("leader after the kill: %d (killed %d)", got, lead)
	}
}
