package faulttest_test

import (
	"math"
	"testing"
	"time"

	"leasehold/internal/faulttest"
)

// TestFairShares: real processes (an allocator, an agent per region, a
// redis-server per region), G = 600 per 10 s. eu asks as fast as its
// callers go (a load far above G), us at 20 Checks/s, about 4 % of the
// demand. us's admitted share of every full window must be within 10 %
// (relative) of its share of the demand, as the test counts both from the
// answers: the allocator keeps a share of each window for a region with
// fresh demand, so the busy region that asks first cannot drain the pool.
func TestFairShares(t *testing.T) {
	skipShort(t)
	s := &scenario{t: t, G: 600}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{})}
	rs := redisOf(t)
	alloc := []string{s.allocs[0].GRPCAddr}
	eu := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", Allocators: alloc, Redis: rs["eu"].Addr()})
	us := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "us", Allocators: alloc, Redis: rs["us"].Addr()})
	s.putLimit(0)
	s.waitKnown(eu, us)

	start := time.Now()
	// Two windows to learn both regions' demand, then four measured.
	from := nextWindowStart(start, 2*W)
	end := from.Add(4 * W)
	euLoad := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 480, Workers: 8,
		Duration: end.Sub(start), Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu.GRPCAddr}}})
	usLoad := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 20, Workers: 2,
		Duration: end.Sub(start), Targets: []faulttest.Target{{Name: "us-1", Region: "us", Addr: us.GRPCAddr}}})
	euLoad.Wait()
	usLoad.Wait()

	events := append(euLoad.Events(), usLoad.Events()...)
	tally := faulttest.Count(events)
	asked := map[int64]map[string]int64{}
	for _, e := range events {
		if e.Window < 0 {
			continue
		}
		if asked[e.Window] == nil {
			asked[e.Window] = map[string]int64{}
		}
		asked[e.Window][e.Region]++
	}
	ws := fullWindows(from, end)
	if len(ws) < 3 {
		t.Fatalf("only %d full windows measured", len(ws))
	}
	for _, w := range ws {
		demand := asked[w]["eu"] + asked[w]["us"]
		admitted := tally.Total(w)
		if demand <= s.G || admitted == 0 {
			t.Fatalf("window %d: demand %d, admitted %d: the window is not contended", w, demand, admitted)
		}
		demandShare := float64(asked[w]["us"]) / float64(demand)
		share := float64(tally.Admitted[w]["us"]) / float64(admitted)
		t.Logf("window %+.0fs: demand eu %d us %d (us %.2f %%), admitted eu %d us %d of G = %d (us %.2f %%)",
			windowStart(w).Sub(from).Seconds(), asked[w]["eu"], asked[w]["us"], 100*demandShare,
			tally.Admitted[w]["eu"], tally.Admitted[w]["us"], s.G, 100*share)
		if admitted > s.G {
			t.Errorf("window %d: admitted %d > G = %d", w, admitted, s.G)
		}
		if math.Abs(share-demandShare) > 0.1*demandShare {
			t.Errorf("window %d: us got %.2f %% of the window, its demand share is %.2f %%: want within 10 %% of it",
				w, 100*share, 100*demandShare)
		}
	}
}
