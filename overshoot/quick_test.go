package overshoot

import (
	"flag"
	"math"
	"math/rand"
	"reflect"
	"testing"
	"testing/quick"
	"time"
)

var (
	quickSeed  = flag.Int64("overshoot.seed", 1, "seed of the random histories in the property tests")
	quickCount = flag.Int("overshoot.count", 10000, "random histories per property test (at least 10,000 by default)")
)

func quickConfig() *quick.Config {
	return &quick.Config{MaxCount: *quickCount, Rand: rand.New(rand.NewSource(*quickSeed))}
}

// TestQuickObservedWithinBound: over random histories that keep the
// system's rules, what the brute-force replay admitted never exceeds
// G + Compute(w).Total, and Observed agrees with the replay.
func TestQuickObservedWithinBound(t *testing.T) {
	var infinite, tight, nonzero int
	prop := func(a anyHistory) bool {
		out, err := replay(a.h)
		if err != nil {
			t.Logf("generator broke a rule: %v", err)
			return false
		}
		w, b := out.w, Compute(out.w)
		if err := w.Validate(); err != nil {
			t.Logf("valid history gives invalid window: %v", err)
			return false
		}
		obs := Observed(w)
		if want := max(0, out.admitted-w.Limit); obs != want {
			t.Logf("Observed = %d, replay says %d", obs, want)
			return false
		}
		if b.LostGrants != 0 {
			t.Logf("LostGrants = %d in a history that keeps invariant 1", b.LostGrants)
			return false
		}
		if b.Infinite {
			infinite++
			return true
		}
		if obs > 0 {
			nonzero++
		}
		if obs == b.Total {
			tight++
		}
		if !b.Covers(obs) || out.admitted > w.Limit+b.Total {
			t.Logf("admitted %d > G %d + bound %v\nwindow %+v", out.admitted, w.Limit, b, w)
			return false
		}
		return true
	}
	if err := quick.Check(prop, quickConfig()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d histories: %d infinite, %d with overshoot, %d where the bound was reached", *quickCount, infinite, nonzero, tight)
}

// TestQuickStrict: in strict mode (fallback closed), with clamped leases,
// no Redis failover and G unchanged, admitted <= G exactly and every term
// of the bound is 0.
func TestQuickStrict(t *testing.T) {
	var full int
	prop := func(s strictHistory) bool {
		out, err := replay(s.h)
		if err != nil {
			t.Logf("generator broke a rule: %v", err)
			return false
		}
		if b := Compute(out.w); b != (Bound{}) {
			t.Logf("strict bound %v, want all zero", b)
			return false
		}
		if out.admitted > out.w.Limit || Observed(out.w) != 0 {
			t.Logf("strict: admitted %d > G %d", out.admitted, out.w.Limit)
			return false
		}
		if out.admitted == out.w.Limit {
			full++
		}
		return true
	}
	if err := quick.Check(prop, quickConfig()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d strict histories, %d admitted exactly G", *quickCount, full)
}

// randWindow is an arbitrary Window, rules or not, for testing/quick.
type randWindow struct{ w Window }

// Generate implements quick.Generator.
func (randWindow) Generate(r *rand.Rand, _ int) reflect.Value {
	n := func() int64 {
		switch r.Intn(10) {
		case 0:
			return -r.Int63n(100)
		case 1:
			return math.MaxInt64 - r.Int63n(100)
		}
		return r.Int63n(2000)
	}
	w := Window{Limit: n(), LimitAtGrant: n(), Granted: n(), Returned: n(), CarriedOver: n()}
	for range r.Intn(5) {
		reg := Region{
			Admitted: n(), FallbackAdmitted: n(), LocalAllowance: n(),
			Fallback: FallbackMode(r.Intn(4)), SettleOverrun: n(),
		}
		for range r.Intn(3) {
			reg.Failovers = append(reg.Failovers, Failover{
				Lag:       time.Duration(r.Int63n(int64(5 * time.Second))),
				AdmitRate: r.Float64() * 1000,
				Observed:  n(),
			})
		}
		w.Regions = append(w.Regions, reg)
	}
	return reflect.ValueOf(randWindow{w})
}

// clone copies w deeply, so a mutation does not reach the original.
func clone(w Window) Window {
	c := w
	c.Regions = make([]Region, len(w.Regions))
	for i, r := range w.Regions {
		c.Regions[i] = r
		c.Regions[i].Failovers = append([]Failover(nil), r.Failovers...)
	}
	return c
}

// TestQuickMonotone: raising any input that feeds a term never lowers that
// term nor the total; Total is always the saturating sum of the terms.
func TestQuickMonotone(t *testing.T) {
	type mutation struct {
		name   string
		apply  func(w *Window, r *rand.Rand) // raises one input
		term   func(b Bound) int64           // the term it feeds
		fixed  bool                          // the total must not move
		ignore bool                          // the term may fall (it is split off)
	}
	d := func(r *rand.Rand) int64 { return 1 + r.Int63n(500) }
	onRegion := func(f func(reg *Region, r *rand.Rand)) func(*Window, *rand.Rand) {
		return func(w *Window, r *rand.Rand) {
			if len(w.Regions) == 0 {
				w.Regions = append(w.Regions, Region{})
			}
			f(&w.Regions[r.Intn(len(w.Regions))], r)
		}
	}
	muts := []mutation{
		{name: "carried over", term: func(b Bound) int64 { return b.CarryOver },
			apply: func(w *Window, r *rand.Rand) { w.CarriedOver = addSat(nonNeg(w.CarriedOver), d(r)) }},
		{name: "worse fallback mode", term: func(b Bound) int64 { return b.Fallback }, ignore: true,
			apply: onRegion(func(reg *Region, r *rand.Rand) { reg.Fallback = min(reg.Fallback+1, FallbackOpen) })},
		{name: "local allowance", term: func(b Bound) int64 { return b.Fallback },
			apply: onRegion(func(reg *Region, r *rand.Rand) { reg.LocalAllowance = addSat(nonNeg(reg.LocalAllowance), d(r)) })},
		{name: "new failover", term: func(b Bound) int64 { return b.RedisRollback },
			apply: onRegion(func(reg *Region, r *rand.Rand) {
				reg.Failovers = append(reg.Failovers, Failover{Lag: time.Duration(d(r)) * time.Millisecond, AdmitRate: float64(d(r))})
			})},
		{name: "longer lag", term: func(b Bound) int64 { return b.RedisRollback },
			apply: onRegion(func(reg *Region, r *rand.Rand) {
				for i := range reg.Failovers {
					reg.Failovers[i].Lag += time.Duration(d(r)) * time.Millisecond
				}
			})},
		{name: "higher admit rate", term: func(b Bound) int64 { return b.RedisRollback },
			apply: onRegion(func(reg *Region, r *rand.Rand) {
				for i := range reg.Failovers {
					reg.Failovers[i].AdmitRate += float64(d(r))
				}
			})},
		{name: "more observed re-spends", term: func(b Bound) int64 { return b.RedisRollback },
			apply: onRegion(func(reg *Region, r *rand.Rand) {
				for i := range reg.Failovers {
					reg.Failovers[i].Observed = addSat(nonNeg(reg.Failovers[i].Observed), d(r))
				}
			})},
		{name: "more settle overrun", term: func(b Bound) int64 { return b.Settlement },
			apply: onRegion(func(reg *Region, r *rand.Rand) { reg.SettleOverrun = addSat(nonNeg(reg.SettleOverrun), d(r)) })},
		{name: "more granted", term: func(b Bound) int64 { return addSat(b.LostGrants, b.LimitLowered) },
			apply: func(w *Window, r *rand.Rand) { w.Granted = addSat(nonNeg(w.Granted), d(r)) }},
		{name: "more granted (lost grants)", term: func(b Bound) int64 { return b.LostGrants },
			apply: func(w *Window, r *rand.Rand) { w.Granted = addSat(nonNeg(w.Granted), d(r)) }},
		{name: "more granted (limit lowered)", term: func(b Bound) int64 { return b.LimitLowered },
			apply: func(w *Window, r *rand.Rand) { w.Granted = addSat(nonNeg(w.Granted), d(r)) }},
		{name: "larger G at grant", term: func(b Bound) int64 { return b.LimitLowered }, fixed: true,
			apply: func(w *Window, r *rand.Rand) { w.LimitAtGrant = addSat(nonNeg(w.LimitAtGrant), d(r)) }},
	}
	for _, m := range muts {
		t.Run(m.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(*quickSeed))
			prop := func(rw randWindow) bool {
				before := Compute(rw.w)
				w2 := clone(rw.w)
				m.apply(&w2, r)
				after := Compute(w2)
				for _, b := range []Bound{before, after} {
					if want := addSat(b.CarryOver, b.Fallback, b.LostGrants, b.RedisRollback, b.LimitLowered, b.Settlement); !b.Infinite && b.Total != want {
						t.Logf("Total %d != sum of terms %d: %v", b.Total, want, b)
						return false
					}
				}
				if !reflect.DeepEqual(Compute(rw.w), before) {
					t.Logf("mutation reached the original window")
					return false
				}
				if before.Infinite && !after.Infinite {
					t.Logf("bound went from infinite to %v", after)
					return false
				}
				if after.Total < before.Total || (!m.ignore && m.term(after) < m.term(before)) {
					t.Logf("bound fell: %v -> %v", before, after)
					return false
				}
				if m.fixed && after.Total != before.Total {
					t.Logf("total moved: %v -> %v", before, after)
					return false
				}
				return true
			}
			if err := quick.Check(prop, quickConfig()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
