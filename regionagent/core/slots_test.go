package core

import (
	"testing"
	"time"
)

// TestFallbackSlots: a region installs a fallback share of its own only
// with the allocator unreachable, no share of its own in force and a
// local fallback; it holds A slots for one share ttl, under the last
// share's seq (at least 1) so that the allocator's next share replaces it.
func TestFallbackSlots(t *testing.T) {
	local := Limit{ID: "c/a", Slots: 3, TTL: 10 * time.Second, Mode: ModeBounded,
		Fallback: Fallback{Kind: FallbackLocal, LocalTokens: 2}}
	closed := local
	closed.Fallback = Fallback{Kind: FallbackClosed}
	inForce := SlotPlan{Seq: 7, N: 3, Admit: 3, Deadline: t0.Add(time.Second)}
	expired := SlotPlan{Seq: 7, N: 3, Admit: 3, Deadline: t0}
	for _, c := range []struct {
		name      string
		p         SlotPlan
		l         Limit
		allocDown bool
		ok        bool
		seq, n    int64
	}{
		{"allocator up", expired, local, false, false, 0, 0},
		{"a share of its own in force", inForce, local, true, false, 0, 0},
		{"closed fallback", expired, closed, true, false, 0, 0},
		{"unset fallback", expired, Limit{ID: "c/a", Slots: 3, TTL: time.Second}, true, false, 0, 0},
		{"local, after a share", expired, local, true, true, 7, 2},
		{"local, never a share", SlotPlan{}, local, true, true, 1, 2},
	} {
		p := c.p
		seq, n, dl, ok := p.FallbackSlots(c.l, c.allocDown, t0)
		if ok != c.ok || seq != c.seq || n != c.n {
			t.Errorf("%s: seq %d, n %d, ok %v; want %d, %d, %v", c.name, seq, n, ok, c.seq, c.n, c.ok)
		}
		if ok && !dl.Equal(t0.Add(10*time.Second)) {
			t.Errorf("%s: deadline %v, want now + the share ttl", c.name, dl)
		}
		if p != c.p {
			t.Errorf("%s: the plan changed: %+v", c.name, p)
		}
	}
}

// TestSlotDemandIsARate: two regions whose callers are denied at the same
// rate report the same demand beyond what they hold, whether they ask
// every SlotRetry (no share) or every half share life (renewing one): a
// count of denials since the last request would weigh the renewing
// region's callers five times here and keep the slots where they are.
func TestSlotDemandIsARate(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	const perSecond = 8 // denials per second in both regions
	steps := []struct {
		every time.Duration // between requests
		held  int64
	}{
		{SlotRetry, 0},
		{2500 * time.Millisecond, 3},
		{10 * time.Second, 3},
	}
	want := float64(perSecond) * SlotRetry.Seconds() // waiting, per SlotRetry
	for _, s := range steps {
		var p SlotPlan
		p.Asked(t0)
		p.Pending = false
		p.Denied = int64(perSecond * s.every.Seconds())
		got := p.Demand(t0.Add(s.every), s.held)
		if got != float64(s.held)+want {
			t.Errorf("asking every %v holding %d: demand %v, want %v", s.every, s.held, got, float64(s.held)+want)
		}
		p.Asked(t0.Add(s.every))
		if p.Denied != 0 || !p.Pending || !p.AskedAt.Equal(t0.Add(s.every)) {
			t.Errorf("Asked did not start a new count: %+v", p)
		}
	}
	// A first request (nothing asked before) reports its denials as they
	// are; a request sooner than SlotRetry after the last is not scaled up.
	p := SlotPlan{Denied: 3}
	if got := p.Demand(t0, 2); got != 5 {
		t.Errorf("first request: demand %v, want 5", got)
	}
	p.AskedAt = t0
	p.Denied = 3
	if got := p.Demand(t0.Add(100*time.Millisecond), 2); got != 5 {
		t.Errorf("a request 100ms after the last: demand %v, want 5", got)
	}
}

// TestSlotPlanIdle: a replica forgets a slot plan only with no request in
// flight, no share in force, and nothing used, asked or answered for the
// idle time (counted from the latest of them, the share's end included);
// a plan answered again after it was forgotten takes seq 1.
func TestSlotPlanIdle(t *testing.T) {
	const idle = 5 * time.Minute
	for _, tc := range []struct {
		name string
		p    SlotPlan
		at   time.Time
		want bool
	}{
		{"never used", SlotPlan{}, t0, true},
		{"in flight", SlotPlan{Pending: true}, t0.Add(time.Hour), false},
		{"share in force", SlotPlan{Seq: 4, N: 3, Deadline: t0.Add(time.Hour)}, t0.Add(time.Hour - time.Millisecond), false},
		{"share ended, not long ago", SlotPlan{Seq: 4, N: 3, Deadline: t0}, t0.Add(idle - time.Millisecond), false},
		{"share ended idle ago", SlotPlan{Seq: 4, N: 3, Deadline: t0}, t0.Add(idle), true},
		{"used after the share", SlotPlan{Seq: 4, Deadline: t0, UsedAt: t0.Add(time.Minute)}, t0.Add(idle), false},
		{"asked after the share", SlotPlan{Seq: 4, Deadline: t0, AskedAt: t0.Add(time.Minute)}, t0.Add(idle), false},
		{"an empty answer after", SlotPlan{Deadline: t0, EmptyAt: t0.Add(time.Minute)}, t0.Add(idle), false},
		{"a failure after", SlotPlan{Deadline: t0, FailedAt: t0.Add(time.Minute)}, t0.Add(idle + time.Minute), true},
	} {
		if got := tc.p.Idle(tc.at, idle); got != tc.want {
			t.Errorf("%s: Idle = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A plan kept past its share's end takes a lower seq (the allocator
	// forgot the tenant and restarted it at 1).
	p := SlotPlan{Seq: 9, N: 3, Admit: 3, Deadline: t0}
	d, install := p.Answered(t0.Add(time.Minute), t0.Add(time.Minute), SlotReply{OK: true, Seq: 1, N: 2, Admit: 2, ExpiresIn: 10 * time.Second}, 0)
	if !install || p.Seq != 1 || p.N != 2 || !p.Deadline.Equal(d) || !p.InForce(t0.Add(time.Minute)) {
		t.Fatalf("seq 1 after the old share ended: %+v, install %v", p, install)
	}
}
