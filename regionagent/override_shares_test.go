package regionagent

import (
	"context"
	"fmt"
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

// TestConcurrencyOverrideAtAgent: an override raising a concurrency
// limit's N reaches the agent (real allocator on etcd, real redis-server):
// it admits up to the override's N; from the end, the slots held above
// the old N are not taken back, and no new holder is admitted while the
// region holds the old N or more.
func TestConcurrencyOverrideAtAgent(t *testing.T) {
	w := newWorld(t, "eu")
	w.putConcLimit("c/ovr", 2, 10*time.Second, "eu")
	ctx := context.Background()
	up := &pb.Limit{Id: "c/ovr", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 5, Regions: []string{"eu"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	o, err := w.alloc.PutLimit(ctx, up, allocator.Change{Reason: "incident 50", OverrideFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eu := w.agent("eu", "eu-1")
	w.sync(eu)
	var held []SlotDecision
	for i := range 5 {
		held = append(held, acquireOK(t, eu, "c/ovr", fmt.Sprintf("job-%d", i), 8*time.Second))
	}
	if held[4].Limit != 5 || held[4].Held != 5 {
		t.Fatalf("the fifth slot under the override: %+v, want N 5, 5 held", held[4])
	}
	if d, err := eu.AcquireSlot(ctx, "c/ovr", "job-x", 8*time.Second); err != nil || d.Allowed {
		t.Fatalf("a sixth holder under the override of 5: %+v, %v", d, err)
	}

	// The end: N = 2. The five slots stay held; no new holder is admitted.
	w.clock.Add(o.Override.EndsAt.AsTime().Sub(w.clock.Now()))
	w.sync(eu)
	for i := range 3 {
		d, err := eu.AcquireSlot(ctx, "c/ovr", fmt.Sprintf("new-%d", i), 8*time.Second)
		eu.slotsSettled(t, "c/ovr")
		if err != nil || d.Allowed {
			t.Fatalf("a new holder after the end, 5 held: %+v, %v; want OVER_LIMIT", d, err)
		}
	}
	if again := acquireOK(t, eu, "c/ovr", "job-0", 8*time.Second); again.SlotID != held[0].SlotID {
		t.Fatalf("job-0 after the end: slot %q, want its own %q (held slots are not taken back)", again.SlotID, held[0].SlotID)
	}
	// Four of the five released: one held, below N = 2: a new holder gets a slot.
	for _, h := range held[1:] {
		if ok, err := eu.ReleaseSlot(ctx, "c/ovr", h.SlotID); !ok || err != nil {
			t.Fatalf("release %s: %v, %v", h.SlotID, ok, err)
		}
	}
	if d := acquireOK(t, eu, "c/ovr", "new-after", 8*time.Second); d.Limit != 2 || d.Held != 2 {
		t.Fatalf("a new holder once 1 is held: %+v, want N 2, 2 held", d)
	}
	if d, err := eu.AcquireSlot(ctx, "c/ovr", "new-third", 8*time.Second); err != nil || d.Allowed {
		t.Fatalf("a third holder under N = 2: %+v, %v", d, err)
	}
}
