// Package overshoot computes, for one (limit, window), how far the tokens
// admitted may exceed the limit's budget G, term by term, and how far they
// really did.
//
// Leasehold never promises admitted <= G unconditionally. It promises
// (ARCHITECTURE.md, invariant 6)
//
//	admitted(L, w) <= G + Total
//
// where Total is the sum of the terms of a [Bound], each tied to one thing
// that really happened in the window:
//
//   - CarryOver: tokens of leases from other windows spent in this one.
//     Always 0 in Leasehold, which clamps every lease to its window.
//   - Fallback: for every region that entered local:A fallback, its
//     allowance A. A region in open fallback makes the bound infinite.
//   - RedisRollback: for every Redis failover that lost writes, the spends
//     that may be re-spent: ceil(lag x regional admit rate), or the re-spends
//     the agent measured if that is larger.
//   - LimitLowered: tokens granted under a larger G that stay spendable after
//     G was lowered mid-window.
//   - LostGrants: tokens granted (net of returns) beyond any G that was in
//     force. 0 whenever the allocator keeps invariant 1; anything else is a
//     bug.
//
// In strict mode (fallback closed) with leases clamped to their window, no
// Redis failover and no limit lowered mid-window every term is 0, so
// admitted <= G exactly.
//
// [Compute] gives the bound, [Observed] the overshoot that really happened
// (max(0, admitted - G)) and [Stranded] the tokens granted but neither
// returned nor spent. Observed above the bound is a bug, and so is a
// LostGrants term above 0. [NewReport] packs one window into a row for
// metrics and JSON. docs/overshoot.md proves each term.
//
// The package is pure: no I/O, no clock, no goroutines, standard library
// only. Every function reads its arguments and never modifies them, so all
// of them are safe for concurrent use as long as no one writes the [Window]
// (including its Regions and Failovers slices) at the same time.
//
// Arithmetic saturates: a sum that would exceed math.MaxInt64 is
// math.MaxInt64, never a wrapped negative number. Negative counts, which the
// system never produces, are read as 0; [Window.Validate] reports them.
package overshoot
