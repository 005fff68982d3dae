package lease

import "time"

// Windows is the window schedule of one limit: windows of Length, shifted
// by a phase offset Phase (0 <= Phase < Length, [NormPhase]). Every place
// that names a window of a limit names it from the limit's Windows (Of
// for the window holding an instant, ByIndex for a numbered one), never
// from the length alone, so that a phase is honoured everywhere or
// nowhere.
//
// The zero Phase is the epoch-aligned windows of [WindowOf]: a limit
// without a phase keeps exactly the windows it always had. A Windows with
// Length <= 0 has only the empty Window{}. A Windows is a value, safe for
// concurrent use, and reads no clock: time is an argument.
type Windows struct {
	Length time.Duration
	Phase  time.Duration
}

// WindowsOf returns the schedule of windows of length with phase offset
// phase, the phase taken modulo length.
func WindowsOf(length, phase time.Duration) Windows {
	return Windows{Length: length, Phase: NormPhase(length, phase)}
}

// Of returns the window that holds t.
func (s Windows) Of(t time.Time) Window {
	return WindowOfPhase(t, s.Length, s.Phase)
}

// ByIndex returns window number index of the schedule: [index*Length +
// Phase, (index+1)*Length + Phase).
func (s Windows) ByIndex(index int64) Window {
	if s.Length <= 0 {
		return Window{}
	}
	return Window{Index: index, Length: s.Length, Phase: NormPhase(s.Length, s.Phase)}
}

// Schedule returns the schedule w belongs to.
func (w Window) Schedule() Windows {
	return Windows{Length: w.Length, Phase: w.Phase}
}

// StartsWindow reports whether t is the first instant of a window of s.
func (s Windows) StartsWindow(t time.Time) bool {
	return s.Length > 0 && s.Of(t).Start().Equal(t)
}

// String names the schedule as a limit setting reads: "1m0s", or "1m0s
// phase 17s".
func (s Windows) String() string {
	if s.Phase == 0 {
		return s.Length.String()
	}
	return s.Length.String() + " phase " + s.Phase.String()
}
