package lease

import "math"

// SlotRequest asks for one holder's slot share of a concurrency limit (at
// most N slots held at once, all regions together).
type SlotRequest struct {
	// N is the limit's cap.
	N int64
	// Region is the requester; Demands the fresh demand reports of the
	// limit's regions (slots wanted: held + waiting acquires; only the
	// proportions matter), as for ShareRequest.
	Region  string
	Demands []RegionDemand
	// Held is how many slots the requester holds now.
	Held int64
	// Others is what the other holders' shares that may still be in force
	// hold, each counted at the largest of its unexpired shares.
	Others int64
}

// SizeSlots returns the requester's next slot share: n, the slots it may
// hold (what the allocator counts), and admit <= n, the slots it may hold
// after admitting a new acquire.
//
// The fair part is ceil(N x f), f the requester's weight among the
// regions with a fresh report (as SizeShare's, each weighing at least
// ShareFloor), rounded up so that the parts of a few regions use the
// whole cap (3 slots between two regions: 2 and 1, not 1 and 1); the
// exact cap by what the others hold keeps the sum <= N whatever the
// rounding. admit is that part, capped. n is admit, or what the requester
// holds if more (and the others leave room): a running job keeps its slot
// while a region's share shrinks, but no new job starts there until the
// region is back within its part, so a busy region cannot keep the slots
// from another by handing each freed slot to its next waiting acquire.
//
// Negative inputs count as 0; the results are never negative and never
// above N - Others; nothing panics.
func SizeSlots(r SlotRequest) (n, admit int64) {
	total := max(r.N, 0)
	free := max(0, total-max(r.Others, 0))
	f := shareFraction(r.Region, r.Demands)
	p := float64(total)*f - 1e-9
	part := total
	if p < float64(total) {
		part = int64(math.Ceil(max(p, 0)))
	}
	admit = min(part, free)
	n = max(admit, min(max(r.Held, 0), free))
	return n, admit
}
