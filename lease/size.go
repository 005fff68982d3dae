package lease

import (
	"math"
	"time"
)

// RegionDemand is one region's latest demand report, as carried by its
// renewal requests, and what it was granted in the window being sized.
type RegionDemand struct {
	// Region names the region ("eu", "us", ...).
	Region string
	// Rate is the tokens per second the region wants: admitted plus denied
	// cost, smoothed (see [RateEstimator]). Denied cost counts so that a
	// region starved by a small lease still shows its real demand.
	// Negative, NaN and infinite rates count as 0: a report that says
	// nothing sensible must not take the pool.
	Rate float64
	// Held is the tokens the region still holds unspent: they cover part
	// of its need (rule 3 of [Size]) and of its claim (rule 5). A negative
	// value counts as 0.
	Held int64
	// Granted is what the region was granted in the window being sized,
	// net of the tokens it returned while the window was open. It is read
	// only for fair shares (SizeRequest.G > 0). A negative value counts
	// as 0.
	Granted int64
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
	// MinChunk, and it has no fair share. Regions should appear once: if
	// the requester appears more than once only its first entry counts,
	// and other duplicates each count (each as a region of its own).
	Demands []RegionDemand
	// MinChunk is the floor of one grant, so that a region whose demand
	// estimate decayed to nothing can still get tokens and restart
	// (0 = no floor). A negative value counts as 0.
	MinChunk int64
	// MaxChunk caps one grant (0 = no cap), so that one region cannot
	// drain the pool in one lease. A negative value counts as 0.
	MaxChunk int64
	// G is the window's whole budget (the limit's G), from which the fair
	// shares of rule 5 are computed. G <= 0 (unknown) turns fair shares
	// off: the grant is then sized from the pool alone, as if every
	// region's claim were 0.
	G int64
}

// Allotment is a sizing decision with what it was made from.
type Allotment struct {
	// Tokens is the grant: what [Size] returns.
	Tokens int64
	// Available is the most the requester could have been granted: the
	// pool minus the other regions' claims (rule 7), never below 0.
	Available int64
	// ShareSpent reports that nothing could be granted because the other
	// regions' claims take the whole pool, which is not empty (rule 11):
	// the requester has no claim of its own left, its share of the window
	// is used. It is distinct from an empty pool.
	ShareSpent bool
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
//  5. Fair shares, only when G > 0 (otherwise every claim is 0 and rules
//     6-10 are the plain pool sharing they always were). Every region in
//     Demands, the requester included, has a weight: its Rate in
//     millionths of a token per second, rounded up as in rule 3. Its fair
//     share of the window is f = floor(G * weight / sum of weights)
//     (exact, 128-bit; the shares add up to at most G, and with no weight
//     anywhere every share is 0). Its entitlement left is
//     e = max(0, f - Granted), and its claim is
//     c = min(e, max(0, ceil(Rate*Left) - Held)) (rounded as in rule 3):
//     what it is still owed of its share, but no more than it can still
//     spend from the pool in the rest of the window, beyond what it holds
//     (a claim that counted the tokens a region holds would keep them
//     twice, in its leases and in the pool, and strand them at the
//     window's end).
//  6. Claims never promise more than the pool holds: if every region's
//     claim (the requester's included) adds up to more than Pool, each
//     becomes floor(c * Pool / sum of claims) (exact). This happens when
//     regions that went past their shares while nobody else claimed (see
//     rule 9) left less than the others are owed; those others then share
//     what is left in proportion to what they are owed, rather than each
//     being blocked by the rest.
//  7. The requester may take only what the others do not claim:
//     available = max(0, Pool - sum of the other regions' claims). Its own
//     protected part is p = min(need, its claim, available): the part of
//     its need its own share still covers.
//  8. The rest of the requester's need, need - p, competes for what is
//     free, free = available - p, with each other region's need beyond its
//     claim, max(0, need - c): total = (need - p) + the sum of those.
//  9. If total <= free, everyone can be served and the grant is the
//     requester's need: each region gets what it asks, and a requester may
//     go past its fair share when the others' claims are covered (tokens
//     nobody claims stay usable).
//  10. Otherwise what is free is shared in proportion to need: the grant is
//     p + floor(free * (need - p) / total), exactly (128-bit arithmetic, no
//     overflow or rounding at any size), but at least
//     min(MinChunk, available). Proportional shares rather than first
//     come, first served, because renewals arrive in whatever order the
//     WAN delivers them; the floor keeps a region that went quiet able to
//     restart. The protected part p is not shared: a quiet region's share
//     must not be split again with a busy region's demand beyond its own.
//  11. The grant is always within [0, available] (so within [0, Pool], and
//     never out of another region's claim) and, when MaxChunk is set, at
//     most MaxChunk (the cap wins over a larger MinChunk). When available
//     is 0 while Pool > 0 and Left > 0, nothing can be granted because the
//     requester's share is spent (by rule 6, available is 0 only when the
//     requester has no claim left): [Allot] reports it as ShareSpent.
//
// Without fair shares (G <= 0), available = free = Pool and p = 0: rules
// 7-10 reduce to "everyone fits: the need; otherwise floor(Pool * need /
// total), at least min(MinChunk, Pool)". If every region asked at the same
// instant with MinChunk == 0 and G <= 0, the shares in rule 10 would add
// up to at most Pool; in practice grants are sequential and each one
// shrinks the pool the next is sized from.
//
// Fair shares are what make the split hold over a whole window. Without
// them each grant shares only what is left, so a region that asks again
// and again takes most of what is left each time and drains the pool
// early; with them, the tokens a region with fresh demand is owed of the
// window stay reserved for it until it asks, until what it holds covers
// what it can spend in the rest of the window, or until the caller stops
// listing it (its report went stale).
//
// Size never panics and does not allocate; it is safe for concurrent use.
func Size(r SizeRequest) int64 { return Allot(r).Tokens }

// Allot sizes one grant by the rules of [Size], and says how much was
// available and whether the requester's share is spent.
//
// Allot never panics and does not allocate; it is safe for concurrent use.
func Allot(r SizeRequest) Allotment {
	if r.Pool <= 0 || r.Left <= 0 {
		return Allotment{}
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

	// Rule 5: the sum of weights, the requester's first entry included and
	// its duplicates left out (< 2^126: no overflow).
	var weights u128
	mineAt := -1
	for i := range r.Demands {
		d := &r.Demands[i]
		if d.Region == r.Region {
			if mineAt >= 0 {
				continue
			}
			mineAt = i
		}
		if r.G > 0 {
			weights = weights.add64(uint64(weight(d)))
		}
	}
	var mine int64 // rule 4
	switch {
	case r.Want > 0:
		mine = r.Want
	case mineAt >= 0:
		mine = need(&r.Demands[mineAt], h)
	}
	mine = min(max(mine, minChunk), capChunk)

	// Rule 6: every claim, scaled down if they promise more than the pool.
	// Each claim is at most its fair share, so the sum is at most G.
	// Without fair shares every claim is 0: skip them.
	fair := r.G > 0 && weights != (u128{})
	cl := claims{g: r.G, weights: weights, left: r.Left, pool: r.Pool}
	var mineClaim int64
	if fair {
		if mineAt >= 0 {
			mineClaim = cl.of(&r.Demands[mineAt])
		}
		cl.sum = mineClaim
		for i := range r.Demands {
			if d := &r.Demands[i]; d.Region != r.Region {
				cl.sum += cl.of(d)
			}
		}
	}

	// Rules 7 and 8: the others' claims, and their needs beyond them.
	var claimed int64 // <= sum of claims <= G
	var others u128   // sum of up to len(Demands) int64s: no overflow
	for i := range r.Demands {
		d := &r.Demands[i]
		if d.Region == r.Region {
			continue
		}
		var c int64
		if fair {
			c = cl.scaled(cl.of(d))
		}
		claimed += c
		others = others.add64(uint64(max(min(need(d, h), capChunk)-c, 0)))
	}
	avail := max(r.Pool-claimed, 0)
	if avail == 0 {
		return Allotment{ShareSpent: true}
	}
	own := min(mine, cl.scaled(mineClaim), avail)
	free := avail - own
	rest := mine - own
	total := others.add64(uint64(rest))
	if total.cmp(u128{0, uint64(free)}) <= 0 {
		return Allotment{Tokens: mine, Available: avail} // rule 9; mine = own + rest <= avail
	}
	grant := own + mulDiv(free, rest, total) // rule 10: < mine, since free < total
	grant = max(grant, min(minChunk, avail))
	return Allotment{Tokens: min(grant, capChunk, avail), Available: avail}
}

// need returns a region's derived need over horizon h (rule 3 of [Size]).
func need(d *RegionDemand, h time.Duration) int64 {
	return max(tokensOver(d.Rate, h)-max(d.Held, 0), 0)
}

// weightUnit is the time over which a rate is counted as a weight (rule 5
// of [Size]): a rate in tokens per second over 10^6 s is the rate in
// millionths of a token per second, fine enough for any rate that matters
// and an integer, so that shares are exact.
const weightUnit = 1_000_000 * time.Second

// weight returns a region's weight for fair shares (rule 5 of [Size]).
func weight(d *RegionDemand) int64 { return tokensOver(d.Rate, weightUnit) }

// claims computes the regions' claims on the rest of the window (rules 5
// and 6 of [Size]).
type claims struct {
	g       int64
	weights u128 // sum of the weights
	left    time.Duration
	pool    int64
	sum     int64 // sum of every region's claim, before scaling
}

// of returns a region's claim: min(f - Granted, ceil(Rate*left) - Held),
// at least 0, with f its fair share of g; 0 without fair shares (g <= 0 or
// no weight anywhere).
func (c *claims) of(d *RegionDemand) int64 {
	if c.g <= 0 || c.weights == (u128{}) {
		return 0
	}
	f := mulDiv(c.g, weight(d), c.weights) // <= g, since weight <= weights
	e := max(f-max(d.Granted, 0), 0)
	return min(e, max(tokensOver(d.Rate, c.left)-max(d.Held, 0), 0))
}

// scaled returns claim x scaled down so that the claims add up to at most
// the pool (rule 6).
func (c *claims) scaled(x int64) int64 {
	if c.sum <= c.pool {
		return x
	}
	return mulDiv(x, c.pool, u128{0, uint64(c.sum)})
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
