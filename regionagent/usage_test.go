package regionagent

import (
	"context"
	"testing"
	"time"

	"leasehold/allocator"
	"leasehold/lease"
)

// TestUsageReported: the regional counts a replica reports reach the
// allocator once, whichever replicas report them and however often.
func TestUsageReported(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/usage", 10, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 10
	l = w.putLimit(l)
	a1, a2 := w.agent("eu", "r1"), w.agent("eu", "r2")
	ctx := context.Background()
	a1.Check(ctx, l.Id, 1)
	a1.evaluate(ctx, l.Id)
	admitted, denied := int64(0), int64(0)
	for i := range 8 {
		d, _ := []*Agent{a1, a2}[i%2].Check(ctx, l.Id, 2)
		if d.Allowed {
			admitted += 2
		} else {
			denied += 2
		}
	}
	for range 3 {
		a1.report(ctx)
		a2.report(ctx)
	}
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	var got map[string]struct{ adm, den int64 }
	_ = w.alloc.View(func(_ time.Time, c *allocator.Core) {
		got = map[string]struct{ adm, den int64 }{}
		for r, u := range c.RegionUsage(l.Id, win) {
			got[r] = struct{ adm, den int64 }{u.Admitted, u.Denied}
		}
	})
	// The very first Check was denied before any lease (cost 1).
	if got["eu"].adm != admitted || got["eu"].den != denied+1 {
		t.Fatalf("allocator has eu %+v, Checks saw admitted %d denied %d (+1 cold)", got["eu"], admitted, denied)
	}
}
