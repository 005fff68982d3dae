package lease

import (
	"math"
	"time"
)

// RegionDemand is one region's latest demand report, as carried by its
// renewal requests.
type RegionDemand struct {
	// Region names the region ("eu", "us", ...).
	Region string
	// Rate is the tokens per second the region wants: admitted plus denied
	// cost, smoothed (see [RateEstimator]). Denied cost counts so that a
	// region starved by a small lease still shows its real demand.
	// Negative, NaN and infinite rates count as 0: a report that says
	// nothing sensible must not take the pool.
	Rate float64
	// Held is the tokens the region still holds unspent. A negative value
	// counts as 0.
	Held int64
}

// SizeRequest is everything [Size] needs to size one grant.
type SizeRequest struct {
	// Pool is the tokens left in the window's pool. Pool <= 0 means there
	// is nothing to give.
	Pool int64
	// Left is the time left in the window from now (see [Window.Left]).
	Left time.Duration
	// Horizon is how far ahead a lease should cover demand: the limit's
	// lease ttl. Horizon <= 0 means the rest of the window.
	Horizon time.Duration
	// Region is the requester.
	Region string
	// Want is the tokens the requester explicitly asks for; 0 (or a
	// negative value) means "derive it from my demand".
	Want int64
	// Demands holds every region's latest report, the requester's
	// included. The requester may be missing; its need is then Want, or
	// MinChunk. Regions should appear once: if the requester appears more
	// than once only its first entry counts, and other duplicates each
	// count.
	Demands []RegionDemand
	// MinChunk is the floor of one grant, so that a region whose demand
	// estimate decayed to nothing can still get tokens and restart
	// (0 = no floor). A negative value counts as 0.
	MinChunk int64
	// MaxChunk caps one grant (0 = no cap), so that one region cannot
	// drain the pool in one lease. A negative value counts as 0.
	MaxChunk int64
}

// Size returns how many tokens the requester is granted. The rules are:
//
//  1. If Pool <= 0 or Left <= 0, the grant is 0: nothing to give, or the
//     window is over.
//  2. The horizon is h = min(Horizon, Left), or Left if Horizon <= 0: no
//     lease covers demand past the window's end, since its tokens would
//     expire unspent with it.
//  3. A region's derived need is max(0, ceil(Rate*h) - Held): what it will
//     spend over the horizon, minus what it already holds. A product within
//     a millionth of a token of an integer counts as that integer, so that
//     floating-point noise (500/60 tokens/s * 15 s = 125.00000000000001)
//     does not ask for an extra token.
//  4. The requester's need is Want if Want > 0, else its derived need (0 if
//     it has no report); then raised to at least MinChunk and capped at
//     MaxChunk. Every other region's need is its derived need (no floor:
//     a quiet region that is not asking should not hold tokens back),
//     capped at MaxChunk.
//  5. total = requester's need + every other region's need.
//  6. If total <= Pool, everyone can be served and the grant is the
//     requester's need: each region gets what it asks.
//  7. Otherwise the pool is shared in proportion to need: the grant is
//     floor(Pool * need / total), exactly (128-bit arithmetic, no
//     overflow or rounding at any size), but at least min(MinChunk, Pool).
//     Proportional shares rather than first come, first served, because
//     renewals arrive in whatever order the WAN delivers them; the floor
//     keeps a region that went quiet able to restart.
//  8. The grant is always within [0, Pool] and, when MaxChunk is set, at
//     most MaxChunk (the cap wins over a larger MinChunk).
//
// If every region asked at the same instant with MinChunk == 0, the shares
// in rule 7 would add up to at most Pool; in practice grants are sequential
// and each one shrinks the pool the next is sized from.
//
// Size never panics and does not allocate; it is safe for concurrent use.
func Size(r SizeRequest) int64 {
	if r.Pool <= 0 || r.Left <= 0 {
		return 0
	}
	h := r.Left
	if r.Horizon > 0 && r.Horizon < h {
		h = r.Horizon
	}
	capChunk := int64(math.MaxInt64)
	if r.MaxChunk > 0 {
		capChunk = r.MaxChunk
	}
	minChunk := max(r.MinChunk, 0)

	var mine int64
	var others u128 // sum of up to len(Demands) int64s: < 2^126, no overflow
	found := false
	for i := range r.Demands {
		d := &r.Demands[i]
		if d.Region == r.Region {
			if !found {
				found = true
				if r.Want <= 0 {
					mine = need(d, h)
				}
			}
			continue
		}
		others = others.add64(uint64(min(need(d, h), capChunk)))
	}
	if r.Want > 0 {
		mine = r.Want
	}
	mine = min(max(mine, minChunk), capChunk)

	total := others.add64(uint64(mine))
	if total.cmp(u128{0, uint64(r.Pool)}) <= 0 {
		return mine // everyone fits; mine <= total <= Pool
	}
	grant := mulDiv(r.Pool, mine, total) // < mine, since Pool < total
	grant = max(grant, min(minChunk, r.Pool))
	return min(grant, capChunk, r.Pool)
}

// need returns a region's derived need over horizon h (rule 3 of [Size]).
func need(d *RegionDemand, h time.Duration) int64 {
	return max(tokensOver(d.Rate, h)-max(d.Held, 0), 0)
}

// LowWater returns the balance below which an agent should renew:
// ceil(rate * lead), in tokens, with lead the renewal lead time (how long a
// renewal may take, WAN round trip and etcd commit included, with slack).
// Renewing at that balance means the new lease normally arrives before the
// old one runs dry.
//
// A negative, NaN or infinite rate and a non-positive lead give 0; a result
// too large for an int64 saturates. Rounding follows rule 3 of [Size].
func LowWater(rate float64, lead time.Duration) int64 {
	return tokensOver(rate, lead)
}

// ceilSlack is how far below an integer a token count may fall and still
// round up to it. Rates arrive as float64 (500/60 tokens/s is not exact),
// and ceil would turn the last-bit error into a whole extra token. A
// millionth of a token is far above float64 noise for counts up to about a
// billion tokens (past that, the noise can cost one token in a billion,
// which nobody can tell) and far below any fraction a caller means.
const ceilSlack = 1e-6

// tokensOver returns ceil(rate * d) in tokens, for rates in tokens per
// second, with the slack above, saturating at math.MaxInt64. Invalid rates
// and non-positive durations give 0.
func tokensOver(rate float64, d time.Duration) int64 {
	if !(rate > 0) || math.IsInf(rate, 1) || d <= 0 {
		return 0 // NaN fails rate > 0
	}
	x := rate * d.Seconds()
	if x >= 1<<63 { // also +Inf from overflow
		return math.MaxInt64
	}
	f := math.Floor(x)
	if x-f > ceilSlack {
		f++
	}
	if f >= 1<<63 {
		return math.MaxInt64
	}
	return int64(f)
}
