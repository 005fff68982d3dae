package lease

import (
	"math"
	"math/bits"
	"time"
)

// Window is the half-open interval [Start(), End()) of length Length, the
// Index-th such interval since the Unix epoch of the allocator's clock.
//
// Windows are numbered rather than described by a start time so that they
// compare with ==, serve as map keys and name etcd and Redis keys without
// any formatting of times. Aligning on the epoch means every replica of the
// allocator computes the same window for the same instant with no shared
// state.
//
// A Window with Length <= 0 (the zero Window among them) is empty: it starts
// and ends at the Unix epoch, contains no instant and has nothing left.
// [WindowOf] returns it for a non-positive length.
type Window struct {
	// Index counts windows from the Unix epoch; the window holding the
	// epoch itself is 0 and windows before it are negative.
	Index int64
	// Length is the window length W of the limit.
	Length time.Duration
	// Phase shifts the windows of a limit with a phase offset φ (0 <= φ
	// < Length, [WindowOfPhase]): window Index is then [Index*Length + φ,
	// (Index+1)*Length + φ), so that many limits do not all reset at the
	// same instant. 0, the zero value, is the epoch-aligned windows.
	Phase time.Duration
	// Cal, when its Loc is set, makes w the calendar window Index of Cal
	// ([Calendar.Window]): its start is the calendar's, Length its own
	// length (a day may last 23 h), Phase 0. The zero Calendar: a window
	// of fixed length, as above.
	Cal Calendar
}

// NormPhase returns phase as a phase offset of windows of length: in [0,
// length), phase modulo length (a phase of a whole window is none). 0 for
// a length <= 0.
func NormPhase(length, phase time.Duration) time.Duration {
	if length <= 0 {
		return 0
	}
	phase %= length
	if phase < 0 {
		phase += length
	}
	return phase
}

// WindowOfPhase returns the window of the given length and phase offset
// that contains t: Index = floor((t - phase) / length), the windows
// [Index*length + phase, (Index+1)*length + phase). The phase is taken
// modulo length ([NormPhase]); phase 0 is [WindowOf]. Like WindowOf it
// takes time as an argument and a length <= 0 gives the empty Window{}.
func WindowOfPhase(t time.Time, length, phase time.Duration) Window {
	phase = NormPhase(length, phase)
	w := WindowOf(t.Add(-phase), length)
	if w.Length > 0 {
		w.Phase = phase
	}
	return w
}

// WindowOf returns the window of the given length that contains t:
// Index = floor(t.UnixNano() / length).
//
// The division rounds down also for instants before the epoch, so that
// every window really has the same length: truncation toward zero would
// make window 0 twice as long as the others.
//
// Unlike t.UnixNano, the computation is exact for every representable
// time.Time (Index saturates at the int64 limits only for times so far out
// that the window number itself does not fit, e.g. year 10^12 with 1 ns
// windows). A length <= 0 has no windows: WindowOf returns the empty
// Window{} rather than panicking, and callers validate limits (W >= 1 s)
// before they get here.
func WindowOf(t time.Time, length time.Duration) Window {
	if length <= 0 {
		return Window{}
	}
	sec, nsec := t.Unix(), int64(t.Nanosecond())
	// Fast path: t.UnixNano() fits in an int64 (years 1678 to 2262).
	const maxSec = math.MaxInt64/1_000_000_000 - 1
	if sec > -maxSec && sec < maxSec {
		ns := sec*1e9 + nsec
		q, r := ns/int64(length), ns%int64(length)
		if r < 0 {
			q-- // Go truncates toward zero; windows need floor
		}
		return Window{Index: q, Length: length}
	}
	return Window{Index: floorDivNanos(sec, nsec, length), Length: length}
}

// floorDivNanos returns floor((sec*1e9 + nsec) / length), with the dividend
// in 128 bits, for the instants whose Unix nanoseconds overflow int64.
func floorDivNanos(sec, nsec int64, length time.Duration) int64 {
	neg := sec < 0
	// |sec| as uint64; for math.MinInt64 the two's-complement wrap gives 2^63.
	abs := uint64(sec)
	if neg {
		abs = -abs
	}
	m := mul64(abs, 1e9)
	if neg {
		// sec*1e9 + nsec = -(|sec|*1e9 - nsec), and |sec|*1e9 > nsec.
		m = m.sub(u128{0, uint64(nsec)})
	} else {
		m = m.add64(uint64(nsec))
	}
	d := uint64(length)
	if m.hi >= d { // quotient does not fit in 64 bits
		if neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	q, r := bits.Div64(m.hi, m.lo, d)
	if !neg {
		if q > math.MaxInt64 {
			return math.MaxInt64
		}
		return int64(q)
	}
	if r != 0 {
		q++ // floor of a negative quotient rounds away from zero
	}
	if q > 1<<63 {
		return math.MinInt64
	}
	return int64(-q) // -(2^63) wraps to math.MinInt64, which is right
}

// Start returns the first instant of the window (Index * Length + Phase
// after the Unix epoch). The result has no monotonic clock reading:
// windows are defined by the allocator's wall clock.
func (w Window) Start() time.Time {
	if w.Length <= 0 {
		return time.Unix(0, 0)
	}
	if w.Cal.Loc != nil {
		return w.Cal.Window(w.Index).Start
	}
	if w.Phase == 0 {
		return nanosTime(w.Index, w.Length)
	}
	return nanosTime(w.Index, w.Length).Add(w.Phase)
}

// End returns the first instant after the window, the Start of w.Next().
// The window does not contain it.
func (w Window) End() time.Time {
	if w.Length <= 0 {
		return time.Unix(0, 0)
	}
	return w.Start().Add(w.Length)
}

// Next returns the window that follows w. Next of the last representable
// window is the window itself rather than a wrap to the first one, so that
// "next" can never go back in time.
func (w Window) Next() Window {
	if w.Index == math.MaxInt64 {
		return w
	}
	if w.Cal.Loc != nil {
		// The window holding the end: a local date that never was (an
		// empty calendar window) is skipped.
		if n := (Windows{Cal: w.Cal}).Of(w.End()); n.Length > 0 {
			return n
		}
		return w
	}
	return Window{Index: w.Index + 1, Length: w.Length, Phase: w.Phase}
}

// Contains reports whether t lies in [w.Start(), w.End()). The end is
// excluded so that every instant belongs to exactly one window.
func (w Window) Contains(t time.Time) bool {
	if w.Length <= 0 {
		return false
	}
	start := w.Start()
	return !t.Before(start) && t.Before(start.Add(w.Length))
}

// Left returns how much of the window remains at now: w.End() - now,
// clamped to [0, w.Length]. Before the window starts the whole Length is
// left (a lease granted early for the next window still gets all of it); at
// or after the end nothing is.
func (w Window) Left(now time.Time) time.Duration {
	if w.Length <= 0 {
		return 0
	}
	start := w.Start()
	if now.Before(start) {
		return w.Length
	}
	d := start.Add(w.Length).Sub(now)
	return min(max(d, 0), w.Length)
}

// Clamp returns ttl shortened so that a lease granted at now with it never
// outlives w: now+Clamp(...) <= w.End(). It returns 0 when now is at or past
// the end of w and for a negative ttl, because a lease that is already
// expired must never be spendable. A ttl is never lengthened.
//
// When now is before w.Start() (a lease for the next window granted early)
// the result is measured from now, so it may exceed w.Length; [Schedule]
// gives both the start and the expiry of such a lease.
func Clamp(now time.Time, ttl time.Duration, w Window) time.Duration {
	if ttl <= 0 || w.Length <= 0 {
		return 0
	}
	left := w.End().Sub(now) // saturates; a saturated value is smaller than the truth, so still safe
	if left <= 0 {
		return 0
	}
	return min(ttl, left)
}

// nanosTime returns the instant index*length nanoseconds after the Unix
// epoch, without overflowing: the product needs 128 bits in general. A
// result beyond what time.Time can hold saturates about 146 billion years
// from the epoch, which no window of a valid limit reaches.
func nanosTime(index int64, length time.Duration) time.Time {
	neg := index < 0
	abs := uint64(index)
	if neg {
		abs = -abs
	}
	p := mul64(abs, uint64(length))
	if p.hi == 0 && p.lo <= math.MaxInt64 {
		ns := int64(p.lo)
		if neg {
			ns = -ns
		}
		return time.Unix(0, ns)
	}
	if neg && p.hi == 0 && p.lo == 1<<63 {
		return time.Unix(0, math.MinInt64)
	}
	// Split into seconds and nanoseconds; seconds beyond ±2^62 are
	// saturated so that time.Unix's internal offset cannot overflow.
	const maxSec = 1 << 62
	var sec, nsec uint64
	if p.hi >= 1e9 {
		sec = maxSec
	} else {
		sec, nsec = bits.Div64(p.hi, p.lo, 1e9)
		if sec > maxSec {
			sec, nsec = maxSec, 0
		}
	}
	if neg {
		return time.Unix(-int64(sec), -int64(nsec))
	}
	return time.Unix(int64(sec), int64(nsec))
}
