package regionagent

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// balance reads a bucket at the fake clock.
func balance(t *testing.T, a *Agent, limit string, window int64, now time.Time) bucket.BalanceResult {
	t.Helper()
	b, err := a.shared.b.Balance(context.Background(), bucket.Key("", limit, window), now.UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNoDoubleSpend: two replicas of one region share one Redis; 64
// goroutines each make 20,000 Checks in all, of random cost 1-5, against
// G = 5,000 per window while both replicas renew. Admitted cost <= G, and
// granted - returned == admitted + what the region still holds: nothing is
// spent twice and nothing is lost.
func TestNoDoubleSpend(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/nds", 5000, time.Minute, 15*time.Second, "eu"))
	w.clock.Add(time.Second)
	agents := []*Agent{w.agent("eu", "r1", WithColdWait(2*time.Second)), w.agent("eu", "r2", WithColdWait(2*time.Second))}
	for _, a := range agents {
		runWork(t, a)
	}
	ctx := context.Background()
	var admitted, checks atomic.Int64
	var load sync.WaitGroup
	stop := make(chan struct{})
	var renew sync.WaitGroup
	for _, a := range agents {
		renew.Add(1)
		go func() { // the tick side of the renewal loop, racing the Checks
			defer renew.Done()
			for {
				select {
				case <-stop:
					return
				default:
					a.evaluate(ctx, l.Id)
				}
			}
		}()
	}
	const total = 20000
	for i, a := range agents {
		for g := range 64 {
			load.Add(1)
			go func() {
				defer load.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				for range total / 128 {
					cost := 1 + rng.Int64N(5)
					d, err := a.Check(ctx, l.Id, cost)
					if err != nil {
						t.Errorf("check: %v", err)
						return
					}
					checks.Add(1)
					if d.Allowed {
						admitted.Add(cost)
					}
				}
			}()
		}
	}
	load.Wait()
	close(stop)
	renew.Wait()
	if t.Failed() {
		return
	}
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	if got := admitted.Load(); got > 5000 || got < 4950 {
		t.Fatalf("admitted %d of G = 5000 under %d Checks of demand ~%d: want <= G and within 1%%", got, checks.Load(), 3*total)
	}
	// Let every lease expire within the window, then close and return them.
	w.clock.Add(20 * time.Second)
	for _, a := range agents {
		a.evaluate(ctx, l.Id)
		a.tick(ctx)
	}
	bal := balance(t, agents[0], l.Id, win, w.clock.Now())
	st := w.stats(l.Id, win)
	if st.Granted-st.Credited != admitted.Load()+bal.Spendable+bal.Pending {
		t.Fatalf("granted %d - credited %d != admitted %d + held %d", st.Granted, st.Credited, admitted.Load(), bal.Spendable+bal.Pending)
	}
	if bal.Admitted != admitted.Load() {
		t.Fatalf("Redis counted %d admitted, Checks said %d", bal.Admitted, admitted.Load())
	}
	t.Logf("admitted %d in %d checks; granted %d, returned %d", admitted.Load(), checks.Load(), st.Granted, st.Credited)
}

// TestLeaseNeverSpentAfterDeadline drives both clocks: a lease granted at
// t with expires_in 10s and a margin of 2ms + 1000ppm x 10s = 12ms is
// spendable until t+9.987s and never at t+9.988s, which is before the
// allocator's own expiry.
func TestLeaseNeverSpentAfterDeadline(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/dl", 100, time.Minute, 10*time.Second, "eu")
	l.Lease.MinChunk = 100 // the first lease takes the whole pool
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	ctx := context.Background()
	t0 := w.clock.Now()
	if d, _ := a.Check(ctx, l.Id, 1); d.Allowed {
		t.Fatal("admitted with no lease")
	}
	a.evaluate(ctx, l.Id) // acquires and deposits at t0
	for _, step := range []struct {
		at      time.Duration
		allowed bool
	}{
		{0, true},
		{5 * time.Second, true},
		{9987 * time.Millisecond, true},
		{9988 * time.Millisecond, false},
		{9999 * time.Millisecond, false},
		{10 * time.Second, false},
	} {
		w.clock.ns.Store(t0.Add(step.at).UnixNano())
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != step.allowed {
			t.Fatalf("at t+%v: allowed %v, want %v (%+v)", step.at, d.Allowed, step.allowed, d)
		}
	}
	if p := w.pool(l.Id, lease.WindowOf(t0, time.Minute).Index); p != 0 {
		t.Fatalf("pool %d: the denials above must come from the deadline, not a dry region", p)
	}
}

// TestCloseReturnsOnce: an expired lease closed by both replicas, several
// times, credits its unspent tokens to the pool exactly once.
func TestCloseReturnsOnce(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/cl", 100, time.Minute, 10*time.Second, "eu")
	l.Lease.MinChunk = 60
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a1, a2 := w.agent("eu", "r1"), w.agent("eu", "r2")
	ctx := context.Background()
	a1.Check(ctx, l.Id, 1)
	a1.evaluate(ctx, l.Id)
	for range 7 {
		if d, _ := a2.Check(ctx, l.Id, 1); !d.Allowed {
			t.Fatal("denied with a lease")
		}
	}
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	granted := w.stats(l.Id, win).Granted
	w.clock.Add(11 * time.Second)
	var wg sync.WaitGroup
	for range 3 {
		for _, a := range []*Agent{a1, a2} {
			wg.Add(2)
			go func() { defer wg.Done(); a.evaluate(ctx, l.Id) }() // a round reads the expired lease and closes it
			go func() { defer wg.Done(); a.tick(ctx) }()           // the holder closes it at its deadline
		}
	}
	wg.Wait()
	st := w.stats(l.Id, win)
	// Later evaluations may have leased again; the first lease's return is
	// what must count once: credited == granted first - 7 spent.
	if st.Credited != granted-7 {
		t.Fatalf("credited %d, want %d (lease of %d, 7 spent)", st.Credited, granted-7, granted)
	}
}

// TestTwoRegionsDemandWeighted steps a whole window in 100 ms steps with
// two regions' agents. Demand under G: nothing is denied while the pool
// has tokens. Demand over G: the region's shares follow demand and the
// total admitted is within 1% of G.
func TestTwoRegionsDemandWeighted(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		eu, us                 float64 // per minute
		wantEU, wantUS, within float64
	}{
		{"under G", 900, 100, 900, 100, 0.02},
		{"contention", 1500, 500, 750, 250, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "eu", "us")
			l := w.putLimit(limit("tenant/2r", 1000, time.Minute, 15*time.Second, "eu", "us"))
			agents := map[string]*Agent{
				"eu": w.agent("eu", "eu1", WithColdWait(2*time.Second)),
				"us": w.agent("us", "us1", WithColdWait(2*time.Second)),
			}
			for _, a := range agents {
				runWork(t, a)
			}
			rates := map[string]float64{"eu": tc.eu / 60, "us": tc.us / 60}
			ctx := context.Background()
			start := w.clock.Now()
			win := lease.WindowOf(start, time.Minute).Index
			acc := map[string]float64{}
			admitted := map[string]int64{}
			var deniedWithPool int64
			for step := 0; step < 600; step++ {
				for _, r := range []string{"eu", "us"} {
					acc[r] += rates[r] / 10
					for acc[r] >= 1 {
						acc[r]--
						d, err := agents[r].Check(ctx, l.Id, 1)
						if err != nil {
							t.Fatal(err)
						}
						if d.Allowed {
							admitted[r]++
						} else if p := w.pool(l.Id, win); p > 0 {
							deniedWithPool++
							t.Logf("step %d: %s denied (%v) with pool %d", step, r, d.Reason, p)
						}
					}
					agents[r].tick(ctx) // timed work only: every round comes from the Checks and the timers
				}
				w.clock.Add(100 * time.Millisecond)
			}
			total := admitted["eu"] + admitted["us"]
			t.Logf("admitted eu %d us %d (total %d), denied while the pool had tokens: %d", admitted["eu"], admitted["us"], total, deniedWithPool)
			if deniedWithPool > 0 {
				t.Errorf("%d denied while the pool had tokens", deniedWithPool)
			}
			if total > 1000 {
				t.Errorf("admitted %d > G", total)
			}
			if d := math.Abs(float64(total) - (tc.wantEU + tc.wantUS)); d > 0.01*1000 {
				t.Errorf("total admitted %d, want %v within 1%% of G", total, tc.wantEU+tc.wantUS)
			}
			if math.Abs(float64(admitted["eu"])-tc.wantEU) > tc.within*tc.wantEU || math.Abs(float64(admitted["us"])-tc.wantUS) > tc.within*tc.wantUS+2 {
				t.Errorf("shares eu %d us %d, want %v/%v within %v", admitted["eu"], admitted["us"], tc.wantEU, tc.wantUS, tc.within)
			}
		})
	}
}

func TestCheckBadInput(t *testing.T) {
	w := newWorld(t, "eu", "us")
	l := w.putLimit(limit("tenant/bad", 100, time.Minute, 15*time.Second, "eu"))
	other := w.putLimit(limit("tenant/usonly", 100, time.Minute, 15*time.Second, "us"))
	a := w.agent("eu", "r1")
	ctx := context.Background()
	for _, tc := range []struct {
		limit string
		cost  int64
		field string
	}{
		{"", 1, "limit_id"},
		{l.Id, -1, "cost"},
		{l.Id, 101, "cost"},
		{string(make([]byte, 201)), 1, "limit_id"},
	} {
		_, err := a.Check(ctx, tc.limit, tc.cost)
		var fe *FieldError
		if !errorsAs(err, &fe) || fe.Field != tc.field {
			t.Errorf("Check(%q, %d) = %v, want a field error on %s", tc.limit, tc.cost, err, tc.field)
		}
	}
	for _, id := range []string{"tenant/none", other.Id} {
		if _, err := a.Check(ctx, id, 1); !errorsIs(err, ErrUnknownLimit) {
			t.Errorf("Check(%q) = %v, want ErrUnknownLimit", id, err)
		}
	}
	if _, err := a.CheckMulti(ctx, nil); err == nil {
		t.Error("empty CheckMulti accepted")
	}
	if _, err := a.CheckMulti(ctx, make([]CheckItem, maxMulti+1)); err == nil {
		t.Error("oversized CheckMulti accepted")
	}
	_ = fmt.Sprint
}

// TestCheckSeesAWakeDeliveredBeforeItsWait: a cold Check decides to wait
// for its limit's first lease, and the lease lands, its wake delivered,
// before the Check begins its wait (the observer holds it until then, as
// a preempted goroutine would be held). The Check must spend at once,
// with the clock where it stands: it used to miss the wake and sleep to
// its deadline (here the world's watch moved the clock 9 s for it).
func TestCheckSeesAWakeDeliveredBeforeItsWait(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/late-waiter", 100, time.Minute, time.Minute, "eu"))
	var a *Agent
	var held atomic.Int32
	hold := func(*core.Check) {
		if held.Add(1) != 1 {
			return // the first wait only
		}
		// Hold the Check until its lease is in the bucket and the wakes
		// of the work that put it there were delivered.
		win := lease.WindowOf(w.clock.Now(), time.Minute).Index
		deadline := time.Now().Add(10 * time.Second)
		for balance(t, a, l.Id, win, w.clock.Now()).Spendable == 0 {
			if time.Now().After(deadline) {
				t.Error("the Check's first lease never landed")
				return
			}
			time.Sleep(time.Millisecond) // polling Redis for the deposit
		}
		seq := a.wakeSeq.Load() // the deposit's Ready took its number already
		for {
			a.mu.Lock()
			woke := a.wokeSeq >= seq
			a.mu.Unlock()
			if woke || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond) // polling the work loop's delivery
		}
	}
	a = w.agent("eu", "r1", WithColdWait(10*time.Second), withWaitObserver(hold))
	runWork(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := w.clock.Now()
	d, err := a.Check(ctx, l.Id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || w.clock.Now() != before {
		t.Fatalf("the Check whose lease landed before its wait: %+v after %d waits, the clock moved %v (the world rescued it: %v)",
			d, held.Load(), w.clock.Now().Sub(before), time.Duration(w.rescued.Load()))
	}
}
