package core

import (
	"strings"
	"testing"
	"time"

	"leasehold/lease"
)

func standingLimit(id string, standing int64) Limit {
	l := strictLimit(id, 100, time.Minute, 15*time.Second)
	l.Standing = standing
	return l
}

// TestStandingShareDecidesFirstChecks: a limit's first Check of a window
// deposits the region's standing share and is decided from it, without a
// call to the allocator; Checks go on from the share until its balance
// falls below the renewal low-water mark, and only then is a lease asked
// for. A second replica on the same bucket finds the share there (no
// second deposit of it lands) and spends from it too. At the window's end
// each replica closes it and returns what is left under the share's id,
// the same unspent from both (the allocator credits it once).
func TestStandingShareDecidesFirstChecks(t *testing.T) {
	l := standingLimit("t/s", 5)
	w := newWorld(t, 10, l)
	w.advance(time.Second)
	win := l.Windows().Of(w.now)
	id := lease.StandingLeaseID(win.Index, "eu")
	// Low water: the prior 100/60/2 per second over the 2 s lead, 1.67.
	for i := range 3 {
		if a := w.check(l.ID, 1); !a.Allowed {
			t.Fatalf("check %d: %+v", i, a)
		}
	}
	if w.alloc.calls != 0 {
		t.Fatalf("%d allocator calls while the share paid, want 0", w.alloc.calls)
	}
	if len(w.deposits) != 1 || w.deposits[0].LeaseID != id || w.deposits[0].Tokens != 5 {
		t.Fatalf("deposits %+v, want the share alone", w.deposits)
	}
	if end := win.End().Add(-w.c.margin(win.End().Sub(t0))); w.deposits[0].Deadline.After(end) {
		t.Fatalf("share deadline %v after the window's end less the margin %v", w.deposits[0].Deadline, end)
	}
	if a := w.check(l.ID, 1); !a.Allowed || w.alloc.calls != 1 {
		t.Fatalf("the check that takes the balance under low water: %+v, %d allocator calls, want one (a lease)", a, w.alloc.calls)
	}

	// A second replica of the region, on the same bucket.
	w2 := newWorld(t, 10, l)
	w2.shared, w2.alloc, w2.now = w.shared, w.alloc, w.now
	before := w.shared.Balance(l.key(win.Index), ms(w.now))
	if a := w2.check(l.ID, 1); !a.Allowed {
		t.Fatalf("second replica: %+v", a)
	}
	if after := w.shared.Balance(l.key(win.Index), ms(w.now)); after.Spendable != before.Spendable-1 {
		t.Fatalf("second replica's check: spendable %d -> %d, want one spent and no second share", before.Spendable, after.Spendable)
	}

	// The window ends: both replicas close the share and return the same
	// unspent under its id.
	w.holdReturns, w2.holdReturns = true, true
	w.advance(time.Minute)
	w2.now = w.now
	w2.c.Tick(w2.now)
	w2.drain()
	var unspent []int64
	for _, r := range append(w.heldReturns, w2.heldReturns...) {
		if r.LeaseID == id {
			unspent = append(unspent, r.Unspent)
		}
	}
	if len(unspent) == 0 || len(unspent) > 2 || unspent[0] != unspent[len(unspent)-1] {
		t.Fatalf("returns of the share: unspent %v, want one or two equal", unspent)
	}
}

// TestStandingShareAloneClosedAtDeadline: a limit whose Checks of a
// window the share paid alone (no lease: a sparse tenant's) closes the
// share at its deadline and returns what is left in time for the
// allocator to credit it, not when the idle limit is forgotten minutes
// later.
func TestStandingShareAloneClosedAtDeadline(t *testing.T) {
	l := standingLimit("t/s", 5)
	w := newWorld(t, 10, l)
	w.advance(time.Second)
	win := l.Windows().Of(w.now)
	if a := w.check(l.ID, 1); !a.Allowed || w.alloc.calls != 0 || len(w.deposits) != 1 {
		t.Fatalf("the first check: %+v, %d allocator calls, deposits %+v; want the share alone", a, w.alloc.calls, w.deposits)
	}
	share := w.deposits[0]
	w.holdReturns = true
	w.advance(share.Deadline.Sub(w.now))
	var unspent []int64
	for _, r := range w.heldReturns {
		if r.LeaseID == lease.StandingLeaseID(win.Index, "eu") {
			unspent = append(unspent, r.Unspent)
		}
	}
	if len(unspent) != 1 || unspent[0] != 4 {
		t.Fatalf("at the share's deadline (%v into the window), returns of it: %v; want one of 4", share.Deadline.Sub(win.Start()), unspent)
	}
}

// TestStandingShareWhenNot: the share is not deposited, and a Check goes
// the lease's way, when it cannot be known right: a snapshot of the
// limits taken before the window began (the share may have changed at
// the boundary); the window's first instants, while the allocator's clock
// may still be in the window before; an agent of several allocator groups
// (one clock estimate for several allocators); and a limit without a
// share. A cost the share cannot pay is denied by it and asks for a lease.
func TestStandingShareWhenNot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		standing int64
		setup    func(w *world)
	}{
		{"snapshot from the window before", 5, func(w *world) {
			w.c.SetLimits(w.c.SyncStart(), 2, []Limit{w.alloc.limits["t/s"]}, t0.Add(-time.Second)) // taken before t0, the window's start
			w.advance(time.Second)
		}},
		{"the window's first instant", 5, func(w *world) {
			// The allocator's clock read 40 ms into a 100 ms round trip:
			// it may be up to 60 ms behind the agent's at t0.
			w.c.SetAllocatorClock(t0.Add(-100*time.Millisecond), t0, t0.Add(-60*time.Millisecond))
			w.now = t0.Add(30 * time.Millisecond)
		}},
		{"a group whose clock was never read", 5, func(w *world) {
			w.c.SetShareGroups(func(string, time.Time) (string, bool) { return "a", true })
			w.advance(time.Second)
		}},
		{"a definition not the window owner's", 5, func(w *world) {
			w.c.SetShareGroups(func(string, time.Time) (string, bool) { return "a", false })
			w.c.SetGroupClock("a", t0, t0, t0)
			w.advance(time.Second)
		}},
		{"the owner's snapshot from the window before", 5, func(w *world) {
			w.c.SetShareGroups(func(string, time.Time) (string, bool) { return "a", true })
			w.c.SetGroupClock("a", t0.Add(-time.Second), t0.Add(-time.Second), t0.Add(-time.Second))
			w.advance(time.Second)
		}},
		{"no share", 0, func(w *world) { w.advance(time.Second) }},
	} {
		w := newWorld(t, 10, standingLimit("t/s", tc.standing))
		tc.setup(w)
		if a := w.check("t/s", 1); !a.Allowed || w.alloc.calls != 1 || len(w.deposits) != 1 || strings.HasSuffix(w.deposits[0].LeaseID, lease.StandingRequestID) {
			t.Errorf("%s: %+v, %d allocator calls, deposits %+v; want a lease, no share", tc.name, a, w.alloc.calls, w.deposits)
		}
	}

	w := newWorld(t, 10, standingLimit("t/s", 5))
	w.advance(time.Second)
	if a := w.check("t/s", 6); !a.Allowed || w.alloc.calls != 1 || len(w.deposits) != 2 {
		t.Errorf("cost above the share: %+v, %d allocator calls, %d deposits; want the share and a lease", a, w.alloc.calls, len(w.deposits))
	}
}

// TestStandingShareByGroupClock: with allocator groups, a share is spent
// by the clock of the group that owns its window, not by the clock the
// agent names windows with: group b's allocator runs 2 s ahead, so 1.5 s
// before the window's end (by the agent's estimate) b's clock may be past
// it, and the Check takes a lease; mid-window the share pays, until 2 s
// (and the margin) before the end. The owner is asked about the window
// the Check spends in.
func TestStandingShareByGroupClock(t *testing.T) {
	for _, tc := range []struct {
		at    time.Duration
		share bool
	}{{30 * time.Second, true}, {time.Minute - 1500*time.Millisecond, false}} {
		l := standingLimit("t/s", 5)
		w := newWorld(t, 10, l)
		var asked []time.Time
		w.c.SetShareGroups(func(limit string, start time.Time) (string, bool) {
			asked = append(asked, start)
			return "b", limit == "t/s"
		})
		w.advance(tc.at)
		w.c.SetGroupClock("b", w.now.Add(-10*time.Millisecond), w.now, w.now.Add(2*time.Second)) // a sync just answered
		win := l.Windows().Of(w.now)
		a := w.check("t/s", 1)
		shared := len(w.deposits) > 0 && strings.HasSuffix(w.deposits[0].LeaseID, lease.StandingRequestID)
		if !a.Allowed || shared != tc.share || (w.alloc.calls == 0) != tc.share {
			t.Fatalf("at %v: %+v, %d allocator calls, deposits %+v; want the share %v", tc.at, a, w.alloc.calls, w.deposits, tc.share)
		}
		if len(asked) == 0 || !asked[0].Equal(win.Start()) {
			t.Fatalf("at %v: owner asked for windows starting %v, want %v", tc.at, asked, win.Start())
		}
		if !tc.share {
			continue
		}
		start, deadline, _ := w.c.shareSpan(w.c.groupClocks["b"].bounds, win)
		if d := w.deposits[0]; !d.Start.Equal(start) || !d.Deadline.Equal(deadline) || d.Deadline.After(win.End().Add(-2*time.Second)) {
			t.Fatalf("share span %v-%v, want %v-%v from b's clock (2 s ahead)", d.Start, d.Deadline, start, deadline)
		}
	}
}

// TestShareSpanInsideWindow: for every agent instant in the span a share
// is spent, the allocator's clock (as bounded by the exchange, drift
// included) is inside the window, whatever the exchange's round trip and
// however old it is.
func TestShareSpanInsideWindow(t *testing.T) {
	c := New(Config{Region: "eu"})
	sched := lease.WindowsOf(time.Minute, 0)
	const ppm = 1000 // the default drift bound
	for _, tc := range []struct {
		rtt, readAt, age time.Duration // read at: from send; age: of the exchange at the window's start
	}{
		{0, 0, 0},
		{100 * time.Millisecond, 40 * time.Millisecond, 0},
		{100 * time.Millisecond, 100 * time.Millisecond, 30 * time.Second},
		{time.Second, 0, 10 * time.Minute},
	} {
		w := sched.ByIndex(30_000_000)
		// The agent's clock runs 7 s ahead of the allocator's.
		recv := w.Start().Add(7*time.Second - tc.age)
		sent := recv.Add(-tc.rtt)
		alloc := sent.Add(-7 * time.Second).Add(tc.readAt)
		c.SetAllocatorClock(sent, recv, alloc)
		start, deadline, ok := c.shareSpan(c.clock, w)
		if !ok {
			t.Fatalf("%+v: no span", tc)
		}
		// The allocator's clock at agent time t, at its earliest and
		// latest: read at alloc somewhere in [sent, recv], then drifting.
		earliest := func(t time.Time) time.Time {
			d := t.Sub(recv)
			return alloc.Add(d - time.Duration(float64(max(d, 0))*ppm/1e6))
		}
		latest := func(t time.Time) time.Time {
			d := t.Sub(sent)
			return alloc.Add(d + time.Duration(float64(max(d, 0))*ppm/1e6))
		}
		if earliest(start).Before(w.Start()) {
			t.Errorf("%+v: at the span's start the allocator's clock may be %v before the window's", tc, w.Start().Sub(earliest(start)))
		}
		if !latest(deadline).Before(w.End()) {
			t.Errorf("%+v: at the span's deadline the allocator's clock may be %v past the window's end", tc, latest(deadline).Sub(w.End()))
		}
		if span := deadline.Sub(start); span < time.Minute-tc.rtt-time.Second-2*time.Duration(float64(tc.age+time.Minute)*ppm/1e6) {
			t.Errorf("%+v: span %v, too short", tc, span)
		}
	}
}
