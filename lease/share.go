package lease

import "math"

// ShareRequest asks for one region's rate share of a bucket limit: the
// allocator's side of a share renewal.
type ShareRequest struct {
	// Rate is the limit's R in milli-tokens per period (1000 x R); Burst
	// its B in tokens.
	Rate, Burst int64
	// Region is the requester.
	Region string
	// Demands are the fresh demand reports of the limit's regions, the
	// requester's among them (Rate in tokens per second; only the
	// proportions matter). Held and Granted are ignored.
	Demands []RegionDemand
	// OthersRate and OthersBurst are what the other regions' shares that
	// may still be in force hold, each region counted at the largest of
	// its unexpired shares (a region may still spend an older share until
	// the newer one reaches it).
	OthersRate, OthersBurst int64
}

// ShareFloor is the smallest weight of a region with a fresh report, as a
// fraction of all the demand: a region that went quiet keeps a sliver of
// the rate so that its first requests after the lull are not all denied
// while its renewal travels.
const ShareFloor = 0.01

// SizeShare returns the rate (milli-tokens per period) and burst (tokens)
// of the requester's next share.
//
// The limit's whole rate and burst are split between the regions with a
// fresh report in proportion to their demand (each weighing at least
// ShareFloor of the total; all alike when nobody reports any), so that
// under demand the shares add up to R and each region's follows its
// demand. What the requester gets is its part, capped by what the other
// regions' shares leave: the caps are exact integer arithmetic, which is
// what keeps sum r_i <= R and sum b_i <= B whatever the float weights
// round to. A region with any rate gets a burst of at least 1 token when
// one is left, so that it can admit a request of cost 1.
//
// A requester missing from Demands weighs what a quiet region weighs.
// Negative and NaN demands count as 0, an infinite one as the largest
// float. The results are never negative; nothing panics.
func SizeShare(r ShareRequest) (rate, burst int64) {
	freeRate := max(0, max(r.Rate, 0)-max(r.OthersRate, 0))
	freeBurst := max(0, max(r.Burst, 0)-max(r.OthersBurst, 0))
	f := shareFraction(r.Region, r.Demands)
	rate = min(partOf(max(r.Rate, 0), f), freeRate)
	burst = min(partOf(max(r.Burst, 0), f), freeBurst)
	if rate > 0 && burst == 0 && freeBurst > 0 {
		burst = 1
	}
	return rate, burst
}

// shareFraction returns the requester's weight over all weights, in
// [0, 1]. Demands are scaled by the largest one first, so that no sum can
// overflow whatever the reports say.
func shareFraction(region string, demands []RegionDemand) float64 {
	clean := func(v float64) float64 {
		if !(v > 0) {
			return 0
		}
		return min(v, math.MaxFloat64)
	}
	var top float64
	found := false
	for _, d := range demands {
		top = max(top, clean(d.Rate))
		found = found || d.Region == region
	}
	n := len(demands)
	if !found {
		n++ // the requester weighs what a quiet region weighs
	}
	if top == 0 {
		return 1 / float64(n)
	}
	var total float64
	for _, d := range demands {
		total += clean(d.Rate) / top // each in [0, 1]
	}
	floor := total * ShareFloor
	var sum, mine float64
	for _, d := range demands {
		w := max(clean(d.Rate)/top, floor)
		sum += w
		if d.Region == region {
			mine += w
		}
	}
	if !found {
		mine = floor
		sum += floor
	}
	return min(max(mine/sum, 0), 1) // sum >= the top demand's weight, 1
}

// partOf returns floor(total x f) for total >= 0 and f in [0, 1], never
// above total. A product a hair below a whole number (0.9 x 100000 is
// 89999.99999999999 in float64) counts as that number: the caller's exact
// caps, not this rounding, keep the shares within the limit.
func partOf(total int64, f float64) int64 {
	p := float64(total)*f + 1e-6
	if !(p > 0) {
		return 0
	}
	if p >= float64(total) {
		return total
	}
	return min(int64(p), total)
}
