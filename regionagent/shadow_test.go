package regionagent

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// driveClock moves the world's clock 100 ms per millisecond until stop is
// called: Checks that wait for a renewal, a lease's end or a retry then
// get to their deadlines (a frozen clock would hold them forever). The
// tests' assertions count decisions, whatever the pace.
func driveClock(w *world) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				w.clock.Add(100 * time.Millisecond)
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// TestShadowAdmitsAndCounts: a limit in shadow mode, G = 100 per hour in
// two regions, gets about 3x its budget from both. Every Check is admitted;
// each one enforcement would have denied says so, and the allocator's
// window report holds exactly the test's own counts: per region, the
// cost admitted as enforced and the cost and number of would-deny
// Checks, with admitted <= G (the decisions are the enforced ones).
func TestShadowAdmitsAndCounts(t *testing.T) {
	w := newWorld(t, "eu", "us")
	l := limit("tenant/shadow", 100, time.Hour, time.Minute, "eu", "us")
	l.Shadow = true
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	agents := map[string]*Agent{"eu": w.agent("eu", "r1", WithColdWait(2*time.Second)),
		"us": w.agent("us", "r1", WithColdWait(2*time.Second))}
	ctx, stop := context.WithCancel(context.Background())
	stopClock := driveClock(w)
	var loops sync.WaitGroup
	for _, a := range agents {
		loops.Add(1)
		go func() { defer loops.Done(); a.workLoop(ctx) }()
	}
	type counts struct{ admitted, wouldDeny, wouldDenyChecks, over int64 }
	got := map[string]*counts{"eu": {}, "us": {}}
	var mu sync.Mutex
	var load sync.WaitGroup
	for region, a := range agents {
		for g := range 4 {
			load.Add(1)
			go func() {
				defer load.Done()
				rng := rand.New(rand.NewPCG(uint64(len(region)), uint64(g)))
				for range 50 {
					cost := 1 + rng.Int64N(3)
					d, err := a.Check(context.Background(), l.Id, cost)
					if err != nil {
						t.Errorf("check: %v", err)
						return
					}
					if !d.Allowed || d.Reason != pb.Reason_REASON_OK {
						t.Errorf("%s: a Check of a shadow limit was answered %v %v", region, d.Allowed, d.Reason)
						return
					}
					mu.Lock()
					c := got[region]
					switch d.WouldDeny {
					case pb.Reason_REASON_UNSPECIFIED:
						c.admitted += cost
					case pb.Reason_REASON_OVER_LIMIT, pb.Reason_REASON_UNAVAILABLE:
						c.wouldDeny += cost
						c.wouldDenyChecks++
						if d.WouldDeny == pb.Reason_REASON_OVER_LIMIT {
							c.over++
						}
					default:
						t.Errorf("would_deny %v", d.WouldDeny)
					}
					mu.Unlock()
				}
			}()
		}
	}
	load.Wait()
	stopClock()
	// The work loops may be writing the last Checks' counters: wait for
	// them before stopping the loops (a cancelled write is lost).
	for _, a := range agents {
		a.settle(context.Background())
	}
	stop()
	loops.Wait()
	if t.Failed() {
		return
	}
	// Quiescent agents: the would-deny counters are written, then read.
	for _, a := range agents {
		a.settle(context.Background())
		a.report(context.Background())
	}
	// The load normally fits in one window; should the machine be slow
	// enough for it to cross a boundary, the windows' counts add up.
	reps, err := w.alloc.Reports(l.Id, 10)
	if err != nil || len(reps) == 0 {
		t.Fatalf("reports %v, %v", reps, err)
	}
	repAdmitted, repWouldDeny := map[string]int64{}, map[string]int64{}
	var repChecks int64
	for _, rep := range reps {
		if rep.AdmittedTotal > 100 || !rep.Shadow {
			t.Errorf("window %v: admitted %d (shadow %v): want <= G = 100: the decisions are the enforced ones",
				rep.WindowStart, rep.AdmittedTotal, rep.Shadow)
		}
		for r, n := range rep.Admitted {
			repAdmitted[r] += n
		}
		for r, n := range rep.WouldDeny {
			repWouldDeny[r] += n
		}
		repChecks += rep.WouldDenyChecks
	}
	var checks, admitted, over int64
	for region, c := range got {
		if repAdmitted[region] != c.admitted || repWouldDeny[region] != c.wouldDeny {
			t.Errorf("%s: reports admitted %d, would deny %d; the Checks said %d and %d",
				region, repAdmitted[region], repWouldDeny[region], c.admitted, c.wouldDeny)
		}
		checks += c.wouldDenyChecks
		admitted += c.admitted
		over += c.over
	}
	if repChecks != checks || checks == 0 || over == 0 {
		t.Errorf("reports: %d would-deny Checks; the Checks said %d (%d over the limit)", repChecks, checks, over)
	}
	t.Logf("%d windows; admitted as enforced %d; would deny %d Checks (%d over the limit)", len(reps), admitted, checks, over)
}

// TestShadowCheckMultiMixed: in a CheckMulti of an enforced limit and a
// shadow limit, the shadow limit's would-be denial does not deny the
// request (the enforced limit decides, and is charged); the enforced
// limit's denial denies it, and then nothing is counted as would-deny.
func TestShadowCheckMultiMixed(t *testing.T) {
	w := newWorld(t, "eu")
	enf := limit("tenant/mix-enforced", 5, time.Hour, time.Hour, "eu")
	enf.Lease.MinChunk = 5
	enf = w.putLimit(enf)
	sh := limit("tenant/mix-shadow", 2, time.Hour, time.Hour, "eu")
	sh.Shadow, sh.Lease.MinChunk = true, 2
	sh = w.putLimit(sh)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1", WithColdWait(2*time.Second))
	runWork(t, a)
	t.Cleanup(driveClock(w))
	ctx := context.Background()
	// Leases for both first.
	a.Check(ctx, enf.Id, 1)
	a.Check(ctx, sh.Id, 1)
	items := []CheckItem{{Limit: enf.Id, Cost: 1}, {Limit: sh.Id, Cost: 1}}
	var admitted, shadowDenied int
	for range 8 {
		ds, err := a.CheckMulti(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].WouldDeny != 0 {
			t.Fatalf("the enforced limit says would-deny: %+v", ds[0])
		}
		if ds[0].Allowed != ds[1].Allowed {
			t.Fatalf("answers differ: %+v / %+v", ds[0], ds[1])
		}
		if ds[0].Allowed {
			admitted++
			if ds[1].WouldDeny != 0 {
				shadowDenied++
			}
		} else if ds[1].WouldDeny != 0 {
			t.Fatalf("a denied request counted as would-deny: %+v", ds[1])
		}
	}
	// enforced: 5 tokens, 1 taken by its own first Check: 4 admitted.
	// shadow: 2 tokens, 1 taken: 1 admitted in the CheckMulti, the other
	// 3 admitted ones would have been denied.
	// Over gRPC: the field says it.
	resp, err := NewServer(a).Check(ctx, &pb.CheckRequest{LimitId: sh.Id})
	if err != nil || !resp.Allowed || resp.Reason != pb.Reason_REASON_OK || resp.WouldDeny != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("gRPC Check of the spent shadow limit: %v, %v", resp, err)
	}
	if admitted != 4 || shadowDenied != 3 {
		t.Fatalf("admitted %d, %d of them would-deny by the shadow limit: want 4 and 3", admitted, shadowDenied)
	}
}
