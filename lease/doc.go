// Package lease is the pure arithmetic of Leasehold: windows, clamping,
// lease timing on both sides of the WAN, demand-weighted lease sizing and the
// agent's demand estimate.
//
// A limit allows G tokens per window of length W. The home-region allocator
// owns each window's pool and hands regions leases: chunks of the pool that a
// region may spend locally until the lease expires. This package holds the
// decisions that must be the same everywhere and must be testable without a
// network or a real clock:
//
//   - [Window] and [WindowOf]: which window an instant belongs to. Windows
//     are aligned on the Unix epoch of the allocator's clock, the only clock
//     that defines windows.
//   - [Calendar] and [CalendarWindow]: calendar windows (a day, an ISO
//     week, a month, a year) in an IANA time zone, of varying length, with
//     the same numbering, clamping and scheduling. Arithmetic only so far:
//     no limit can ask for them yet (docs/design.md, "Calendar windows").
//   - [Clamp] and [Schedule] (allocator side): when a lease becomes spendable
//     and when it expires, as durations from now, so that no lease outlives
//     its window.
//   - [Deadline], [StartAt] and [Spendable] (agent side): turning those
//     durations into instants on the agent's own monotonic clock, always on
//     the safe side (never later, never earlier than the allocator meant).
//   - [Size] and [Allot] (allocator side): how many tokens one grant gets,
//     from every region's demand, what is left in the pool and, given the
//     window's budget, each region's demand-weighted share of the window.
//   - [LowWater] and [RateEstimator] (agent side): when to renew, and the
//     smoothed demand a renewal request reports.
//   - [TokenBucket], [BucketShare], [BucketUnit] and [BucketBound]: bucket
//     limits (rate R per period, burst B), whose regions hold rate shares
//     (r_i, b_i) and refill a token bucket of their own; the bucket model
//     the Redis script implements, and the bound B + R*T on what any
//     interval of length T may admit; [SizeShare] (allocator side): a
//     region's next rate share, by demand, within what the others hold.
//
// Time is always an argument, in the style of golang.org/x/time/rate's
// AllowN(t, n): nothing here reads the wall clock, sleeps or does I/O, so
// every rule can be tested at fixed instants. Only durations cross machines
// (a lease carries expires_in, not a timestamp), which is what makes clock
// skew between hosts irrelevant.
//
// The functions are pure and safe for concurrent use. The only stateful type,
// [RateEstimator], guards its state with a mutex and is safe for concurrent
// use too.
//
// None of the functions panics, whatever the input: out-of-range values
// (negative durations, NaN or infinite rates, huge pools) are mapped to the
// nearest meaningful value, and each function documents how. The allocator
// talks to untrusted agents; a malformed demand report must not be able to
// crash it.
package lease
