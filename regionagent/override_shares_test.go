package regionagent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

// TestBucketOverrideAtAgent: an override raising a bucket limit's R and
// B reaches the agent at its next sync and renewal, through a real
// allocator on etcd and a real redis-server: its Checks refill at the
// override's rate up to its burst; from the end (the next sync and
// renewal) at the old rate, the level capped at the old burst.
func TestBucketOverrideAtAgent(t *testing.T) {
	w := newWorld(t, "eu")
	w.putBucketLimit("b/ovr", 10, 5, 10*time.Second, "eu")
	ctx := context.Background()
	eu := w.agent("eu", "eu-1")
	admitted := func(n int) (ok int, limit int64) {
		t.Helper()
		for range n {
			d, err := eu.Check(ctx, "b/ovr", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason == pb.Reason_REASON_OK {
				ok++
			}
			limit = d.Limit
		}
		return ok, limit
	}
	eu.evaluate(ctx, "b/ovr")
	w.clock.Add(time.Second) // refilled to the burst: 5
	if ok, r := admitted(8); ok != 5 || r != 10 {
		t.Fatalf("before the override: admitted %d of 8, limit %d; want 5 (B 5), 10", ok, r)
	}

	up := &pb.Limit{Id: "b/ovr", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 40, BurstTokens: 20,
		RatePeriod: durationpb.New(time.Second), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	o, err := w.alloc.PutLimit(ctx, up, allocator.Change{Reason: "incident 48", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	end := o.Override.EndsAt.AsTime()
	w.sync(eu)
	eu.evaluate(ctx, "b/ovr") // the renewal: 40/s, burst 20
	w.clock.Add(time.Second)
	if ok, r := admitted(30); ok != 20 || r != 40 {
		t.Fatalf("under the override: admitted %d of 30, limit %d; want 20 (B 20), 40", ok, r)
	}

	// The end: the next sync and renewal give the old rate and burst.
	w.clock.Add(end.Sub(w.clock.Now()))
	w.sync(eu)
	eu.evaluate(ctx, "b/ovr")
	w.clock.Add(2 * time.Second)
	if ok, r := admitted(30); ok != 5 || r != 10 {
		t.Fatalf("after the end: admitted %d of 30, limit %d; want 5 (B 5), 10", ok, r)
	}
}
