package lease

import "time"

// Windows is the window schedule of one limit: windows of Length, shifted
// by a phase offset Phase (0 <= Phase < Length, [NormPhase]), or, when
// Cal.Loc is set, the calendar windows of Cal ([CalendarWindows]; Length
// and Phase are then 0 and each window has its own length). Every place
// that names a window of a limit names it from the limit's Windows (Of
// for the window holding an instant, ByIndex for a numbered one), never
// from the length alone, so that a phase is honoured everywhere or
// nowhere.
//
// The zero Phase is the epoch-aligned windows of [WindowOf]: a limit
// without a phase keeps exactly the windows it always had. A Windows with
// Length <= 0 has only the empty Window{}. A Windows is a value, safe for
// concurrent use, and reads no clock: time is an argument.
//
// Two calendar schedules compare equal with == only if they hold the same
// *time.Location: load a zone once and share it.
type Windows struct {
	Length time.Duration
	Phase  time.Duration
	Cal    Calendar
}

// CalendarWindows returns the schedule of the calendar windows of c.
func CalendarWindows(c Calendar) Windows { return Windows{Cal: c} }

// IsCalendar reports whether s is a calendar schedule.
func (s Windows) IsCalendar() bool { return s.Cal.Loc != nil }

// WindowsOf returns the schedule of windows of length with phase offset
// phase, the phase taken modulo length.
func WindowsOf(length, phase time.Duration) Windows {
	return Windows{Length: length, Phase: NormPhase(length, phase)}
}

// Of returns the window that holds t.
func (s Windows) Of(t time.Time) Window {
	if s.IsCalendar() {
		return s.calendarWindow(s.Cal.WindowOf(t))
	}
	return WindowOfPhase(t, s.Length, s.Phase)
}

// calendarWindow is cw as a Window of s (the empty Window for an empty
// calendar window).
func (s Windows) calendarWindow(cw CalendarWindow) Window {
	if cw.Empty() {
		return Window{}
	}
	return Window{Index: cw.Index, Length: cw.Length(), Cal: s.Cal}
}

// ByIndex returns window number index of the schedule: [index*Length +
// Phase, (index+1)*Length + Phase).
func (s Windows) ByIndex(index int64) Window {
	if s.IsCalendar() {
		return s.calendarWindow(s.Cal.Window(index))
	}
	if s.Length <= 0 {
		return Window{}
	}
	return Window{Index: index, Length: s.Length, Phase: NormPhase(s.Length, s.Phase)}
}

// Schedule returns the schedule w belongs to.
func (w Window) Schedule() Windows {
	if w.Cal.Loc != nil {
		return Windows{Cal: w.Cal}
	}
	return Windows{Length: w.Length, Phase: w.Phase}
}

// StartsWindow reports whether t is the first instant of a window of s.
func (s Windows) StartsWindow(t time.Time) bool {
	w := s.Of(t)
	return w.Length > 0 && w.Start().Equal(t)
}

// String names the schedule as a limit setting reads: "1m0s", "1m0s
// phase 17s", or "month in Europe/Berlin".
func (s Windows) String() string {
	if s.IsCalendar() {
		return s.Cal.Unit.String() + " in " + s.Cal.Loc.String()
	}
	if s.Phase == 0 {
		return s.Length.String()
	}
	return s.Length.String() + " phase " + s.Phase.String()
}
