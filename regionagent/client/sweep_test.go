package client

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"leasehold/regionagent/client/clienttest"
)

// TestSweepVisitsHeldLimits: the sweep's usual pass visits only the
// limits that hold something (a chunk, a denial), so 1,000 limits the
// client merely knows cost it nothing; they are forgotten by the full
// pass once idle for StateTTL.
func TestSweepVisitsHeldLimits(t *testing.T) {
	const denied = "tenant/denied"
	r := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(denied, 1, 10*time.Second, 5*time.Second)
		a.DenyRetryAfter = 400 * time.Millisecond
	}, WithSubLeases(subCfg))
	for i := range 1000 {
		r.c.AskedOf("tenant/known-"+strconv.Itoa(i), 1, 1000)
	}
	if n, held := r.c.Limits(), r.c.Holding(); n != 1000 || held != 0 {
		t.Fatalf("after 1,000 limits asked of: %d limits, %d listed as holding something, want 1000 and 0", n, held)
	}
	r.hotUntilReserved()
	if held := r.c.Holding(); held != 1 {
		t.Fatalf("with a chunk of %s: %d limits listed, want 1", testLimit, held)
	}
	ctx := context.Background()
	for range 2 {
		if _, err := r.c.Allow(ctx, denied, 1); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := r.c.Allow(ctx, denied, 1); d.Source != SourceDenialCache {
		t.Fatalf("the third call of a limit of G = 1: %+v, want a cached denial", d)
	}
	if held := r.c.Holding(); held != 2 {
		t.Fatalf("with a chunk and a denial: %d limits listed, want 2", held)
	}
	r.clock.Advance(subCfg.IdleAfter) // the chunk idle, the denial expired
	r.sweep()
	if held := r.c.Holding(); held != 0 || r.c.state(testLimit).cur.Load() != nil {
		t.Fatalf("after the chunk went idle and the denial expired: %d limits listed (chunk %v), want 0",
			held, r.c.state(testLimit).cur.Load() != nil)
	}
	r.clock.Advance(StateTTL)
	r.sweep()
	if n := r.c.Limits(); n != 1002 {
		t.Fatalf("the usual pass forgot limits it does not visit: %d left, want 1002", n)
	}
	r.c.sweep(r.c.mono())
	if n := r.c.Limits(); n != 0 {
		t.Fatalf("after the full pass, %d limits idle for StateTTL are still known, want 0", n)
	}
}

// TestHeldTokens: HeldTokens is what the client's sub-leases hold
// unspent, a chunk's grant less what was spent from it, and nothing once
// the chunk is given back.
func TestHeldTokens(t *testing.T) {
	r := newRig(t, nil, WithSubLeases(subCfg))
	if n := r.c.HeldTokens(); n != 0 {
		t.Fatalf("before any chunk: HeldTokens = %d, want 0", n)
	}
	res := r.hotUntilReserved() // the call that reserved it spent 1 of it
	if n := r.c.HeldTokens(); n != res.Granted-1 {
		t.Fatalf("with a chunk of %d, one spent: HeldTokens = %d, want %d", res.Granted, n, res.Granted-1)
	}
	for range 5 {
		if d := r.allow(1); d.Source != SourceSubLease {
			t.Fatalf("a call with the chunk held: %+v, want it decided from the chunk", d)
		}
	}
	if n := r.c.HeldTokens(); n != res.Granted-6 {
		t.Fatalf("with 6 spent of the chunk: HeldTokens = %d, want %d", n, res.Granted-6)
	}
	r.clock.Advance(subCfg.IdleAfter)
	r.sweep()
	rel := r.reservations()
	if len(rel) != 1 || !rel[0].Released || rel[0].Unspent != res.Granted-6 {
		t.Fatalf("after the chunk went idle: reservations %+v, want the one released with %d unspent", rel, res.Granted-6)
	}
	if n := r.c.HeldTokens(); n != 0 {
		t.Fatalf("after the chunk was given back: HeldTokens = %d, want 0", n)
	}
	// Hot for a while: chunks are refilled (a next chunk waits beside the
	// one spent) and given back; what is held is what was reserved and not
	// given back, less what was spent, at every moment.
	spent := int64(6) // of the first chunk
	for i := range 12 {
		spent += int64(r.hot(200, 250*time.Millisecond)[SourceSubLease])
		if n, out := r.c.HeldTokens(), r.outstanding(); n != out-spent {
			t.Fatalf("after %d x 250 ms at 200/s: HeldTokens = %d, want %d reserved and not given back - %d spent = %d",
				i+1, n, out, spent, out-spent)
		}
	}
	if n := len(r.reservations()); n < 3 {
		t.Fatalf("3 s at 200/s made %d reservations, want a refill at least", n-1)
	}
}

// TestHeldTokensWhileSpending: scraped while four callers spend the limit
// and the sweep runs (as the collectors and the sweeper do), HeldTokens
// never counts less than nothing nor more than was reserved and not given
// back, and once the traffic stops it is exactly what was reserved less
// what was given back and spent. Run with -race, it also checks that it
// reads the chunks safely.
func TestHeldTokensWhileSpending(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 1<<40, 10*time.Second, 5*time.Second) }, WithSubLeases(subCfg))
	ctx := context.Background()
	// Each caller decides once per permit; each step hands out 50 permits,
	// waits for their decisions, then moves the clock 5 ms: 10,000
	// decisions a second on the client's clock, a hot limit.
	permits := make(chan struct{}, 50)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range permits {
				if _, err := r.c.Allow(ctx, testLimit, 1); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	defer func() {
		close(permits)
		wg.Wait()
	}()
	deadline := time.Now().Add(30 * time.Second)
	sawHeld := false
	for i := range 400 {
		target := r.c.Stats().Total() + 50
		for range 50 {
			permits <- struct{}{}
		}
		for r.c.Stats().Total() < target {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: the callers made %d of %d decisions in 30 s", i, r.c.Stats().Total(), target)
			}
			runtime.Gosched()
		}
		r.clock.Advance(5 * time.Millisecond)
		held := r.c.HeldTokens()
		if bound := r.outstanding(); held < 0 || held > bound {
			t.Fatalf("step %d: HeldTokens = %d, want 0 to the %d reserved and not given back", i, held, bound)
		}
		sawHeld = sawHeld || held > 0
		if i%50 == 49 {
			r.c.sweepHeld(r.c.mono())
		}
	}
	r.settle()
	if !sawHeld {
		t.Fatal("the callers never held a chunk: the test measured nothing")
	}
	spent := r.c.Stats().SubLease
	if n, want := r.c.HeldTokens(), r.outstanding()-spent; n != want {
		t.Fatalf("after the traffic: HeldTokens = %d, want %d reserved and not given back less %d spent from chunks", n, want+spent, spent)
	}
}

// outstanding is what the fake agent reserved to the client and was not
// given back: every reservation's grant, less what each release returned
// unspent.
func (r *rig) outstanding() (n int64) {
	for _, x := range r.reservations() {
		n += x.Granted
		if x.Released {
			n -= x.Unspent
		}
	}
	return n
}
