package regionagent

import (
	"context"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

func TestReserveRelease(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/sub", 100, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 100 // one lease holds the whole window
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	ctx := context.Background()
	t0 := w.clock.Now()
	a.Check(ctx, l.Id, 1)
	a.evaluate(ctx, l.Id) // the lease: expires_in 15s from t0, margin 2ms + 15ms
	win := lease.WindowOf(t0, time.Minute).Index

	w.clock.Add(time.Second)
	r, err := a.Reserve(ctx, l.Id, 40, 10, "client-1")
	if err != nil {
		t.Fatal(err)
	}
	deadline := t0.Add(15*time.Second - a.opt.safetyMargin(15*time.Second)).Truncate(time.Millisecond)
	if !r.Allowed || r.Granted != 40 || w.clock.Now().Add(r.ExpiresIn) != deadline {
		t.Fatalf("reserve: %+v; want 40 tokens until the lease's deadline %v (expires_in %v)", r, deadline, deadline.Sub(w.clock.Now()))
	}
	if r2, _ := a.Reserve(ctx, l.Id, 40, 10, "client-1"); r2.Granted != 40 || r2.ExpiresIn != r.ExpiresIn {
		t.Fatalf("retried reserve: %+v", r2)
	}
	// Others see the balance without the reserved tokens.
	if d, _ := a.Check(ctx, l.Id, 61); d.Allowed || d.Remaining != 60 {
		t.Fatalf("check of 61 with 60 left: %+v", d)
	}
	// A usage report while the reservation is out counts its 40 tokens as
	// admitted (a client that crashes is counted as having spent them).
	a.report(ctx)
	// The client spent 15 of 40: 25 come back and are spendable by Checks.
	if n, err := a.Release(ctx, l.Id, "client-1", 25); err != nil || n != 25 {
		t.Fatalf("release: %d %v", n, err)
	}
	if n, _ := a.Release(ctx, l.Id, "client-1", 25); n != 25 {
		t.Fatalf("retried release: %d", n)
	}
	// The allocator keeps each reporter's highest counts: the report before
	// the release (40) must not stand for more than was admitted (15).
	a.report(ctx)
	if got := w.regionUsage(l.Id, "eu", win).NetAdmitted(); got != 15 {
		t.Fatalf("after the release the allocator counts %d admitted, want 15", got)
	}
	if d, _ := a.Check(ctx, l.Id, 85); !d.Allowed {
		t.Fatalf("the released tokens are not spendable: %+v", d)
	}
	// Conservation: granted = admitted (15 by the client + 85) + held, the
	// bucket's admitted less what the release gave back (every counter
	// only grows).
	bal := balance(t, a, l.Id, win, w.clock.Now())
	net := bal.Admitted - counterOf(bal, "released")
	if got := w.stats(l.Id, win).Granted; got != net+bal.Spendable || net != 100 {
		t.Fatalf("granted %d, admitted %d (less released), held %d", got, net, bal.Spendable)
	}
	// The allocator, which keeps each reporter's highest counts, has what
	// was really admitted: the report before the release (40 admitted)
	// is not taken for more than it was.
	a.report(ctx)
	if got := w.regionUsage(l.Id, "eu", win).NetAdmitted(); got != 100 {
		t.Fatalf("the allocator counts %d admitted, want 100", got)
	}
	// Nothing left: a reservation gets nothing and says why.
	if r, _ := a.Reserve(ctx, l.Id, 10, 1, "client-2"); r.Allowed || r.Granted != 0 {
		t.Fatalf("reserve from an empty region: %+v", r)
	}
	for _, bad := range []struct {
		tokens, min int64
		id          string
	}{{0, 1, "x"}, {101, 1, "x"}, {10, 11, "x"}, {10, 1, ""}, {10, 1, "a/b"}} {
		if _, err := a.Reserve(ctx, l.Id, bad.tokens, bad.min, bad.id); err == nil {
			t.Errorf("Reserve(%d, %d, %q) accepted", bad.tokens, bad.min, bad.id)
		}
	}
	if _, err := a.Release(ctx, l.Id, "client-1", -1); err == nil {
		t.Error("negative unspent accepted")
	}
}

func counterOf(b store.BalanceResult, name string) int64 {
	for _, c := range b.Counters {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}
