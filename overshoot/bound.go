package overshoot

import (
	"fmt"
	"math"
	"time"
)

// Bound is the most tokens a window may admit above its limit G, split into
// one term per cause. The system promises admitted <= G + Total; every term
// is >= 0 and is 0 when its cause did not happen. docs/overshoot.md proves
// the promise term by term.
//
// The zero value is the bound of a window where nothing went wrong:
// admitted <= G exactly.
type Bound struct {
	// Infinite is true when a region entered open fallback (or reported a
	// fallback mode this package does not know): it admitted without any
	// limit, and no finite bound holds.
	Infinite bool
	// Total is the bound on admitted - G: the saturating sum of the six
	// terms below, or math.MaxInt64 when Infinite, so that a plain
	// comparison observed <= Total stays correct.
	Total int64

	// CarryOver is the tokens of leases from other windows spendable in
	// this one (Window.CarriedOver). 0 in Leasehold: leases are clamped to
	// their window.
	CarryOver int64
	// Fallback is the sum of the allowances A of the regions that entered
	// local:A fallback in the window. Regions that stayed on leases or
	// fell back to closed add 0. Regions in open fallback make the bound
	// Infinite and add nothing here.
	Fallback int64
	// LostGrants is max(0, (Granted - Returned) - max(Limit, LimitAtGrant)):
	// tokens the allocator granted, net of returns, beyond every G that was
	// in force when it granted. Invariant 1 makes it 0; any other value is
	// an allocator bug (for example a grant answered before it was durable
	// and granted again by the next leader) and should page someone.
	LostGrants int64
	// RedisRollback is the sum over the window's Redis failovers with lost
	// writes of max(ceil(Lag x AdmitRate), Observed): the spends the new
	// primary may have forgotten, whose tokens can be admitted again.
	RedisRollback int64
	// LimitLowered is max(0, min(Granted - Returned, LimitAtGrant) - Limit):
	// tokens granted under a larger G that stayed spendable after G was
	// lowered to Limit during the window.
	LimitLowered int64
	// Settlement is the sum over regions of SettleOverrun: cost that
	// settle-later decisions turned out to have beyond their estimate,
	// admitted after the fact when the window's leases could not hold it
	// (docs/settle.md). It is bounded a priori only by the settle-later
	// requests' actual costs; this is what really happened.
	Settlement int64
}

// Compute returns the bound on admitted - G for the window w, from what
// really happened in it: which regions fell back and how, which Redis
// failovers lost writes, how the grants compare with the limit, and how much
// was carried over from other windows.
//
// The fallback term uses each region's allowance A, not what the region
// admitted under fallback: the bound is what the rules allow given the
// faults that happened, so a region that admitted more than A shows up as
// observed overshoot above the bound instead of being silently absorbed.
//
// Compute is safe for concurrent use; it does not modify w.
func Compute(w Window) Bound {
	var b Bound
	b.CarryOver = nonNeg(w.CarriedOver)

	n := w.outstanding()
	g := nonNeg(w.Limit)
	ever := max(g, nonNeg(w.LimitAtGrant))
	// n - g splits exactly into the part above every G ever in force (a
	// bug) and the part between the final G and the G the grants were
	// made under (a limit lowered mid-window).
	b.LostGrants = max(0, n-ever)
	b.LimitLowered = max(0, min(n, ever)-g)

	for _, r := range w.Regions {
		switch r.Fallback {
		case FallbackNone, FallbackClosed:
		case FallbackLocal:
			b.Fallback = addSat(b.Fallback, nonNeg(r.LocalAllowance))
		default: // FallbackOpen, or a mode we cannot bound.
			b.Infinite = true
		}
		for _, f := range r.Failovers {
			b.RedisRollback = addSat(b.RedisRollback, rollback(f))
		}
		b.Settlement = addSat(b.Settlement, nonNeg(r.SettleOverrun))
	}

	if b.Infinite {
		b.Total = math.MaxInt64
		return b
	}
	b.Total = addSat(b.CarryOver, b.Fallback, b.LostGrants, b.RedisRollback, b.LimitLowered, b.Settlement)
	return b
}

// Observed returns the overshoot that really happened in w:
// max(0, admitted - Limit), where admitted is the tokens admitted by every
// region, from leases and under fallback. It is safe for concurrent use.
func Observed(w Window) int64 {
	lease, fallback := w.admitted()
	return max(0, addSat(lease, fallback)-nonNeg(w.Limit))
}

// Stranded returns the tokens granted in w that were neither returned nor
// admitted from a lease: max(0, Granted - Returned - lease-admitted). They
// were lost to the window: held by a region that went quiet, left in a
// Redis that went down, or in a lease that expired unspent. It is a lower
// estimate when carried-over tokens or re-spends after a Redis failover
// were admitted. It is safe for concurrent use.
func Stranded(w Window) int64 {
	lease, _ := w.admitted()
	return max(0, w.outstanding()-lease)
}

// Covers reports whether an observed overshoot stays within b. An observed
// overshoot that b does not cover is a bug.
func (b Bound) Covers(observed int64) bool {
	return b.Infinite || observed <= b.Total
}

// Float64 returns Total as a float64, or +Inf when b is Infinite: the form a
// Prometheus gauge takes.
func (b Bound) Float64() float64 {
	if b.Infinite {
		return math.Inf(1)
	}
	return float64(b.Total)
}

// String returns the total and every term, for logs:
// "200 (carry_over 0, fallback 200, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)".
func (b Bound) String() string {
	total := fmt.Sprint(b.Total)
	if b.Infinite {
		total = "+Inf"
	}
	return fmt.Sprintf("%s (carry_over %d, fallback %d, lost_grants %d, redis_rollback %d, limit_lowered %d, settlement %d)",
		total, b.CarryOver, b.Fallback, b.LostGrants, b.RedisRollback, b.LimitLowered, b.Settlement)
}

// rollback is one failover's RedisRollback term: the estimate
// ceil(lag x rate), or what the agent observed if that is larger.
func rollback(f Failover) int64 {
	return max(respendEstimate(f.Lag, f.AdmitRate), nonNeg(f.Observed))
}

// respendEstimate is ceil(lag x rate) in tokens, saturating. The spends lost
// in a failover are those made during the replication lag, and the region
// makes at most rate tokens of spends per second. An unknown rate (NaN or
// +Inf) cannot bound anything, so it saturates.
func respendEstimate(lag time.Duration, rate float64) int64 {
	if lag <= 0 || rate <= 0 {
		return 0
	}
	if math.IsNaN(rate) {
		return math.MaxInt64
	}
	// Nanoseconds first: integer lags are exact in a float64 up to 2^53 ns
	// (104 days), so 300ms x 10/s is exactly 3, not 3.0000000000000004.
	x := float64(lag) * rate / float64(time.Second)
	if x >= math.MaxInt64 { // also +Inf; float64(MaxInt64) is 2^63
		return math.MaxInt64
	}
	return int64(math.Ceil(x))
}

// nonNeg reads a count the system never makes negative.
func nonNeg(v int64) int64 { return max(0, v) }

// addSat adds non-negative numbers, saturating at math.MaxInt64.
func addSat(vs ...int64) int64 {
	var sum int64
	for _, v := range vs {
		if v > math.MaxInt64-sum {
			return math.MaxInt64
		}
		sum += v
	}
	return sum
}
