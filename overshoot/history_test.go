package overshoot

import "testing"

// TestHistoriesReachTheBound replays scripted histories through the
// token-by-token reference: each term is needed (a history that keeps the
// rules reaches it exactly), and dropping CarryOver would let a history
// without clamping break the bound.
func TestHistoriesReachTheBound(t *testing.T) {
	twoRegions := func(mode FallbackMode, a int64) []regionConf {
		return []regionConf{{name: "eu", fallback: mode, allowance: a}, {name: "us", fallback: mode, allowance: a}}
	}
	// fill grants G in chunks of 100, 6 to eu and 4 to us, and spends them.
	fill := []event{
		{kind: evGrant, region: 0, n: 100}, {kind: evGrant, region: 1, n: 100},
		{kind: evGrant, region: 0, n: 100}, {kind: evGrant, region: 1, n: 100},
		{kind: evGrant, region: 0, n: 100}, {kind: evGrant, region: 1, n: 100},
		{kind: evGrant, region: 0, n: 100}, {kind: evGrant, region: 1, n: 100},
		{kind: evGrant, region: 0, n: 100}, {kind: evGrant, region: 0, n: 100},
		{kind: evSpend, region: 0, n: 600}, {kind: evSpend, region: 1, n: 400},
	}
	with := func(evs ...event) []event { return append(append([]event(nil), fill...), evs...) }

	for _, tc := range []struct {
		name       string
		h          history
		admitted   int64
		term       func(Bound) int64
		infinite   bool
		withoutOff bool // the bound without this term is broken
	}{
		{
			name:     "strict, clamped: admitted = G",
			h:        history{g0: 1000, regions: twoRegions(FallbackClosed, 0), events: with(event{kind: evFallbackOn, region: 0})},
			admitted: 1000, term: func(b Bound) int64 { return b.Total },
		},
		{
			name: "etcd loses quorum, both regions in local:100",
			h: history{g0: 1000, regions: twoRegions(FallbackLocal, 100), events: with(
				event{kind: evFallbackOn, region: 0}, event{kind: evFallbackOn, region: 1},
				event{kind: evFallbackAdmit, region: 0, n: 100}, event{kind: evFallbackAdmit, region: 1, n: 100})},
			admitted: 1200, term: func(b Bound) int64 { return b.Fallback }, withoutOff: true,
		},
		{
			name: "open fallback",
			h: history{g0: 1000, regions: twoRegions(FallbackOpen, 0), events: with(
				event{kind: evFallbackOn, region: 1}, event{kind: evFallbackAdmit, region: 1, n: 5000})},
			admitted: 6000, infinite: true,
		},
		{
			name: "Redis failover loses 300ms x 10/s of spends, re-spent",
			h: history{g0: 1000, regions: twoRegions(FallbackClosed, 0), events: with(
				event{kind: evFailover, region: 0, n: 3, lagMS: 300, rate: 10}, event{kind: evSpend, region: 0, n: 3})},
			admitted: 1003, term: func(b Bound) int64 { return b.RedisRollback }, withoutOff: true,
		},
		{
			name: "G lowered from 1000 to 600 after all was granted",
			h: history{g0: 1000, regions: twoRegions(FallbackClosed, 0), events: with(
				event{kind: evLimit, n: 600})},
			admitted: 1000, term: func(b Bound) int64 { return b.LimitLowered }, withoutOff: true,
		},
		{
			name: "leases not clamped: one chunk per region carried in",
			h: history{g0: 1000, regions: twoRegions(FallbackClosed, 0), events: with(
				event{kind: evCarryIn, region: 0, n: 100}, event{kind: evCarryIn, region: 1, n: 100},
				event{kind: evSpend, region: 0, n: 100}, event{kind: evSpend, region: 1, n: 100})},
			admitted: 1200, term: func(b Bound) int64 { return b.CarryOver }, withoutOff: true,
		},
		{
			name: "settle-later requests cost 70 more than the spent window held",
			h: history{g0: 1000, regions: twoRegions(FallbackClosed, 0), events: with(
				event{kind: evSettleOver, region: 0, n: 50}, event{kind: evSettleOver, region: 1, n: 20})},
			admitted: 1070, term: func(b Bound) int64 { return b.Settlement }, withoutOff: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := replay(tc.h)
			if err != nil {
				t.Fatal(err)
			}
			if out.admitted != tc.admitted {
				t.Fatalf("admitted %d, want %d", out.admitted, tc.admitted)
			}
			b := Compute(out.w)
			if b.Infinite != tc.infinite {
				t.Fatalf("Infinite = %v, want %v", b.Infinite, tc.infinite)
			}
			if tc.infinite {
				return
			}
			obs := Observed(out.w)
			if obs != b.Total || tc.term(b) != b.Total {
				t.Errorf("observed %d, bound %v: want the term alone to reach the bound", obs, b)
			}
			if tc.withoutOff && !(obs > b.Total-tc.term(b)) {
				t.Errorf("without the term the bound %d still covers %d", b.Total-tc.term(b), obs)
			}
		})
	}
}

// TestReplayRejectsBrokenRules checks the reference itself: a history that
// breaks a rule is refused, so the property tests only see valid ones.
func TestReplayRejectsBrokenRules(t *testing.T) {
	one := []regionConf{{name: "eu", fallback: FallbackLocal, allowance: 10}}
	for _, tc := range []struct {
		name string
		h    history
	}{
		{"grant beyond the pool", history{g0: 100, regions: one, events: []event{{kind: evGrant, n: 101}}}},
		{"grant beyond the pool after G lowered", history{g0: 100, regions: one, events: []event{
			{kind: evGrant, n: 50}, {kind: evLimit, n: 40}, {kind: evGrant, n: 1}}}},
		{"spend beyond the balance", history{g0: 100, regions: one, events: []event{{kind: evGrant, n: 10}, {kind: evSpend, n: 11}}}},
		{"return beyond the balance", history{g0: 100, regions: one, events: []event{{kind: evGrant, n: 10}, {kind: evReturn, n: 11}}}},
		{"fallback admit without fallback", history{g0: 100, regions: one, events: []event{{kind: evFallbackAdmit, n: 1}}}},
		{"fallback admit above A", history{g0: 100, regions: one, events: []event{{kind: evFallbackOn}, {kind: evFallbackAdmit, n: 11}}}},
		{"more lost than lag x rate", history{g0: 100, regions: one, events: []event{
			{kind: evGrant, n: 10}, {kind: evSpend, n: 10}, {kind: evFailover, n: 4, lagMS: 300, rate: 10}}}},
		{"more lost than spent", history{g0: 100, regions: one, events: []event{
			{kind: evGrant, n: 10}, {kind: evSpend, n: 2}, {kind: evFailover, n: 3, measured: true}}}},
		{"no such region", history{g0: 100, regions: one, events: []event{{kind: evSpend, region: 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := replay(tc.h); err == nil {
				t.Error("replay accepted a history that breaks a rule")
			}
		})
	}
}
