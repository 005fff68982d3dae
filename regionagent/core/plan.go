package core

import (
	"math"
	"strings"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// PlanInput is everything a renewal decision looks at.
type PlanInput struct {
	NowMs    int64         // now on the store's clock
	Left     time.Duration // time left in the current window
	Rate     float64       // the region's demand, tokens/s
	TTL      time.Duration // the limit's lease TTL
	Lead     time.Duration // renewal lead time
	Every    time.Duration // slack before the window's end for the next window's lease
	Bucket   store.BalanceResult
	Spent    bool  // the allocator said the window's pool is spent (recently)
	Pending  bool  // an unanswered lease request waits to be sent again
	NextDone bool  // a lease of the next window is held
	KickCost int64 // the largest cost denied since the last renewal
}

// Plan is what a renewal round does.
type Plan struct {
	Held   int64 // tokens spendable now that outlast the lead time
	Low    int64 // the low-water mark
	Target int64 // what the rest of the lease horizon needs
	// Acquire asks for a lease of the current window; Want is its explicit
	// size (0: sized from demand).
	Acquire bool
	Want    int64
	// AcquireNext asks for a lease of the next window.
	AcquireNext bool
	// Close are expired leases to close and return.
	Close []store.ExpiredLease
	// Surplus are lasting leases to close and return (latest deadline
	// first) so busier regions can have their tokens.
	Surplus []store.OpenLease
}

// Closing lists the leases the round closes: expired ones, then surplus.
func (p Plan) Closing() []string {
	ids := make([]string, 0, len(p.Close)+len(p.Surplus))
	for _, e := range p.Close {
		ids = append(ids, e.ID)
	}
	for _, o := range p.Surplus {
		ids = append(ids, o.ID)
	}
	return ids
}

// Idle reports whether the plan does nothing.
func (p Plan) Idle() bool {
	return !p.Acquire && !p.AcquireNext && len(p.Close) == 0 && len(p.Surplus) == 0
}

// PlanRenewal decides a renewal round:
//
//   - held is what stays spendable past the lead time (a lease about to
//     expire will not be there when needed), or near the window's end what
//     stays spendable until about its end (heldHorizon);
//   - low-water = demand x lead, capped by what the rest of the window can
//     use (else agents ask for crumbs at a window's end), at least 1;
//   - renew when held < low-water, when a denied cost exceeds held, or to
//     replay an unanswered request; not while the pool is known spent;
//   - more than twice what the rest of the lease horizon needs is surplus;
//   - within lead + interval of the window's end, fetch the next window.
func PlanRenewal(in PlanInput) Plan {
	p := Plan{Close: in.Bucket.Expired}
	rate := in.Rate
	if math.IsNaN(rate) || rate < 0 {
		rate = 0
	}
	p.Low = LowWater(rate, in.Lead, in.Left)
	p.Held = in.Bucket.Lasting(in.NowMs, heldHorizon(in.Lead, in.Left).Milliseconds())
	p.Target = ceilTokens(rate * min(in.TTL, in.Left).Seconds())
	p.Acquire = !in.Spent && (in.Pending || p.Held < p.Low || in.KickCost > p.Held)
	if p.Acquire && in.KickCost > p.Target {
		p.Want = in.KickCost
	}
	if !p.Acquire && p.Held > 2*p.Target+1 {
		kept := p.Held
		for i := len(in.Bucket.Open) - 1; i >= 0; i-- {
			o := in.Bucket.Open[i]
			lasts := o.DeadlineMs > in.NowMs+in.Lead.Milliseconds()
			sub := strings.HasPrefix(o.ID, store.SubLeasePrefix) // not the allocator's: never returned
			if sub || o.StartMs > in.NowMs || !lasts || o.Remaining == 0 || kept-o.Remaining < p.Target {
				continue
			}
			kept -= o.Remaining
			p.Surplus = append(p.Surplus, o)
		}
	}
	p.AcquireNext = !in.NextDone && rate > 0 && in.Left < in.Lead+in.Every
	return p
}

// heldHorizon is how long a token must stay spendable to count as held:
// the lead time, but no longer than the window has left less a quarter of
// the lead (every lease ends at its window's end, a little before it on
// the agent's and the store's clocks). Without the cap nothing counts as
// held in a window's last lead time, and every round acquires crumbs.
func heldHorizon(lead, left time.Duration) time.Duration {
	return max(0, min(lead, left-lead/4))
}

// LowWater is the balance below which a limit is renewed: demand x lead
// time, capped by what the rest of the window can use (renewing for
// demand past the window's end would ask for crumbs), at least 1. The
// Check path and PlanRenewal both use it.
func LowWater(rate float64, lead, left time.Duration) int64 {
	return max(1, min(lease.LowWater(rate, lead), ceilTokens(rate*left.Seconds())))
}

func ceilTokens(x float64) int64 {
	switch {
	case math.IsNaN(x) || x <= 0:
		return 0
	case x >= math.MaxInt64/2:
		return math.MaxInt64 / 2
	}
	return int64(math.Ceil(x - 1e-9))
}
