package core

import (
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// TestShadowStepTable: a shadow limit is decided as if enforced, then
// admitted; the would-be denials (over the limit, and the allocator
// unreachable under a closed fallback) say so and are counted in the
// window's bucket; an enforced limit beside it is untouched; a Core that
// has no snapshot does not know the limit is in shadow mode and stays
// UNAVAILABLE.
func TestShadowStepTable(t *testing.T) {
	sh := strictLimit("s", 5, time.Minute, time.Minute)
	sh.Shadow = true
	enf := strictLimit("e", 1, time.Minute, time.Minute)
	roomy := strictLimit("r", 100, time.Minute, time.Minute)
	w := newWorld(t, 5, sh, enf, roomy)
	win := lease.WindowOf(w.now, time.Minute).Index
	key := store.Key{Limit: "s", Window: win}
	for i := range 5 {
		a := w.check("s", 1)
		wantAnswer(t, "within G", a, true, ReasonOK)
		if a.WouldDeny != 0 {
			t.Fatalf("check %d within G: would deny %v", i, a.WouldDeny)
		}
	}
	steps := []struct {
		limit   string
		cost    int64
		allowed bool
		reason  Reason
		would   Reason
		denied  int64 // would_deny after it
		checks  int64 // would_deny_checks after it
	}{
		{"s", 2, true, ReasonOK, ReasonOverLimit, 2, 1},
		{"s", 1, true, ReasonOK, ReasonOverLimit, 3, 2},
		{"e", 1, true, ReasonOK, 0, 3, 2},
		{"e", 1, false, ReasonOverLimit, 0, 3, 2}, // enforced: denied, not counted
	}
	for i, s := range steps {
		a := w.check(s.limit, s.cost)
		w.drain()
		if a.Allowed != s.allowed || a.Reason != s.reason || a.WouldDeny != s.would || (a.Allowed && a.RetryAfter != 0) {
			t.Fatalf("step %d (%s cost %d): %+v, want allowed %v reason %v would deny %v", i, s.limit, s.cost, a, s.allowed, s.reason, s.would)
		}
		bal := w.shared.Balance(key, ms(w.now))
		if got, n := counter(bal, store.CounterWouldDeny), counter(bal, store.CounterWouldDenyChecks); got != s.denied || n != s.checks {
			t.Fatalf("step %d: would_deny %d (%d checks), want %d (%d)", i, got, n, s.denied, s.checks)
		}
	}

	// Shadow and enforced limits in one Check: an enforced limit over its
	// pool denies it and nothing is counted; a shadow limit over its pool
	// does not, the enforced one is charged and the shadow one counted.
	as, _ := w.checkMulti(Item{Limit: "e", Cost: 1}, Item{Limit: "s", Cost: 1})
	w.drain()
	if as[0].Allowed || as[1].Allowed || as[0].Reason != ReasonOverLimit || as[1].WouldDeny != 0 {
		t.Fatalf("enforced limit over, shadow over too: %+v", as)
	}
	rkey := store.Key{Limit: "r", Window: win}
	before := w.shared.Balance(rkey, ms(w.now)).Admitted
	as, _ = w.checkMulti(Item{Limit: "r", Cost: 2}, Item{Limit: "s", Cost: 1})
	w.drain()
	if !as[0].Allowed || as[0].WouldDeny != 0 || !as[1].Allowed || as[1].WouldDeny != ReasonOverLimit {
		t.Fatalf("enforced limit with room, shadow over: %+v", as)
	}
	bal := w.shared.Balance(key, ms(w.now))
	if got := w.shared.Balance(rkey, ms(w.now)).Admitted - before; got != 2 ||
		counter(bal, store.CounterWouldDeny) != 4 || counter(bal, store.CounterWouldDenyChecks) != 3 {
		t.Fatalf("charged %d to the enforced limit (want 2); would_deny %d (%d checks), want 4 (3)", got,
			counter(bal, store.CounterWouldDeny), counter(bal, store.CounterWouldDenyChecks))
	}

	// The allocator unreachable, a new shadow limit with no lease and a
	// closed fallback: UNAVAILABLE if enforced, so admitted, saying so.
	u := strictLimit("u", 10, time.Minute, time.Minute)
	u.Shadow = true
	w.alloc.limits["u"] = u
	w.syncLimits()
	w.dropAcquire = true
	a := w.check("u", 1)
	if !a.Allowed || a.Reason != ReasonOK || a.WouldDeny != ReasonUnavailable {
		t.Fatalf("shadow limit, allocator unreachable: %+v", a)
	}

	// No snapshot: the agent does not know "s" exists, let alone that it
	// is in shadow mode.
	c := New(Config{Region: "eu", RequestPrefix: "eu-2-n", Seed: 1})
	chk := c.Begin(t0, []Item{{Limit: "s", Cost: 1}}, time.Time{})
	if chk.Step != StepDone || chk.Answers[0].Allowed || chk.Answers[0].Reason != ReasonUnavailable || chk.Answers[0].WouldDeny != 0 {
		t.Fatalf("not synced: %+v", chk.Answers)
	}
}
