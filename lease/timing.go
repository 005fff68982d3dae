package lease

import (
	"math"
	"time"

	"leasehold/internal/seeded"
)

// Timing says when a lease becomes spendable and when it expires, as
// durations from the moment the allocator decided (its now).
//
// Durations, not timestamps, cross machines: each side measures them on its
// own monotonic clock, so skew between wall clocks cannot make a lease live
// longer than the allocator meant. The allocator fills a Timing with
// [Schedule]; the agent turns it into instants with [StartAt] and
// [Deadline].
type Timing struct {
	// StartsIn is how long after now the lease becomes spendable: 0 for
	// the current window, the time until the window starts for a lease
	// granted early for a future window.
	StartsIn time.Duration
	// ExpiresIn is how long after now the lease expires (exclusive). It is
	// never before StartsIn and never past the window's end.
	ExpiresIn time.Duration
}

// Schedule returns the timing of a lease with the given ttl granted at now
// for window w, the current window or a future one:
//
//	StartsIn  = max(0, w.Start() - now)
//	ExpiresIn = min(StartsIn + ttl, w.End() - now)
//
// The ttl runs from the moment the lease becomes spendable, so a lease
// granted early for the next window is not shortened by the wait. The
// window's end always wins, which is the Clamp invariant: now + ExpiresIn
// <= w.End(), so no lease outlives its window.
//
// A negative ttl counts as 0. A window that is over at now (or empty) gives
// the zero Timing: the lease is expired on arrival and the agent must not
// spend it. Durations beyond the ~292 years a time.Duration holds saturate
// toward the safe side.
func Schedule(now time.Time, w Window, ttl time.Duration) Timing {
	if w.Length <= 0 {
		return Timing{}
	}
	start := w.Start()
	left := start.Add(w.Length).Sub(now) // saturated values are below the truth: still safe
	if left <= 0 {
		return Timing{}
	}
	startsIn := max(start.Sub(now), 0)
	expiresIn := min(addSat(startsIn, max(ttl, 0)), left)
	if seeded.On(seeded.NoClamp) {
		expiresIn = addSat(startsIn, max(ttl, 0))
	}
	return Timing{StartsIn: startsIn, ExpiresIn: expiresIn}
}

// Deadline returns the instant, on the agent's clock, after which the agent
// must stop spending a lease: sent + expiresIn - margin, but never before
// sent.
//
// sent is when the agent sent the request, not when the reply arrived.
// The allocator started its expiresIn no earlier than that, so counting from
// sent can only end earlier than the allocator's expiry; the margin covers
// the rate drift between the two clocks over the ttl. Pass a time.Time that
// carries a monotonic reading (from time.Now()) and the result keeps it, so
// wall-clock steps on the agent cannot stretch the lease either.
//
// A negative margin counts as 0: it would move the deadline past the
// allocator's. A lease whose expiresIn does not exceed the margin is
// expired on arrival and gets Deadline == sent, so [Spendable] is false for
// it at every instant.
func Deadline(sent time.Time, expiresIn, margin time.Duration) time.Time {
	margin = max(margin, 0)
	if expiresIn <= margin {
		return sent
	}
	return sent.Add(expiresIn - margin)
}

// StartAt returns the instant, on the agent's clock, from which a lease may
// be spent: received + max(0, startsIn).
//
// received is when the reply arrived, not when the request was sent: the
// allocator's startsIn had already begun to run before that, so counting
// from received can only start late, never early. A late start costs a few
// milliseconds of a future window; an early one would spend two windows'
// budgets at once.
func StartAt(received time.Time, startsIn time.Duration) time.Time {
	return received.Add(max(startsIn, 0))
}

// Spendable reports whether a lease that starts at start and has the given
// deadline may be spent at now, that is whether now is in [start, deadline).
// The deadline is exclusive, so a lease with deadline == start (expired on
// arrival) is never spendable.
func Spendable(now, start, deadline time.Time) bool {
	return !now.Before(start) && now.Before(deadline)
}

// addSat returns a+b for a, b >= 0, saturating at the largest Duration
// instead of wrapping to a negative one.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
