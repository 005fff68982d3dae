package regionagent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// usageReads takes the pipelines h recorded since the last take and
// counts those that carry usage reads (a script call whose first key is a
// limit's epoch key), and the reads. pipeHook sees pipelines only: reads
// sent as calls of their own would count none, and fail the test too.
func usageReads(h *pipeHook) (trips, reads int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.pipes {
		n := 0
		for _, c := range p {
			if strings.HasPrefix(c, "evalsha ") && strings.HasSuffix(c, ":epoch") {
				n++
			}
		}
		if n > 0 {
			trips++
			reads += n
		}
	}
	h.pipes = nil
	return trips, reads
}

// TestUsageReadsBatched: a report round reads its limits' counts in
// pipelines of maxUsageBatch limits, not one call each, and every
// limit's counts reach the allocator: the first round also gives each
// limit its epoch (one more pipeline of reads after), the next only reads.
func TestUsageReadsBatched(t *testing.T) {
	const n = 2*maxUsageBatch + 9
	w := newWorld(t, "eu")
	var ids []string
	for i := range n {
		l := limit(fmt.Sprintf("tenant/u%03d", i), 100, time.Minute, 15*time.Second, "eu")
		l.Lease.MinChunk = 10
		ids = append(ids, w.putLimit(l).Id)
	}
	h := &pipeHook{}
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(h)
	a := w.agentOn(rdb, "eu", "r1", nil)
	ctx := context.Background()
	for _, id := range ids {
		a.Check(ctx, id, 1) // denied: no lease yet
		a.evaluate(ctx, id)
		if d, _ := a.Check(ctx, id, 1); !d.Allowed {
			t.Fatalf("%s not leased: %+v", id, d)
		}
	}
	// Every script known to Redis (a first use is sent again after
	// NOSCRIPT).
	if err := a.shared.b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	usageReads(h)
	a.report(ctx)
	batches := (n + maxUsageBatch - 1) / maxUsageBatch
	if trips, reads := usageReads(h); trips != 2*batches || reads != 2*n {
		t.Errorf("first report: %d usage reads in %d round trips, want %d in %d (each limit read, given an epoch, read again)", reads, trips, 2*n, 2*batches)
	}
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	for _, id := range ids {
		if u := w.regionUsage(id, "eu", win); u.Admitted != 1 || u.Denied != 1 {
			t.Fatalf("allocator has %s %+v, want 1 admitted and 1 denied", id, u)
		}
	}
	for _, id := range ids {
		if d, _ := a.Check(ctx, id, 2); !d.Allowed {
			t.Fatalf("%s: %+v", id, d)
		}
	}
	a.report(ctx)
	if trips, reads := usageReads(h); trips != batches || reads != n {
		t.Errorf("second report: %d usage reads in %d round trips, want %d in %d", reads, trips, n, batches)
	}
	for _, id := range ids {
		if u := w.regionUsage(id, "eu", win); u.Admitted != 3 || u.Denied != 1 {
			t.Fatalf("allocator has %s %+v after the second report, want 3 admitted and 1 denied", id, u)
		}
	}
}
