package lease

import (
	"testing"
	"time"
)

// TestWindows: a schedule names the same windows as WindowOfPhase, ByIndex
// rebuilds them from their index, and phase 0 is exactly WindowOf.
func TestWindows(t *testing.T) {
	const m, s = time.Minute, time.Second
	cases := []struct {
		name   string
		sched  Windows
		t      time.Time
		want   Window
		starts bool
	}{
		{"phase 0 is WindowOf", WindowsOf(m, 0), at(m + 5*s), Window{Index: 1, Length: m}, false},
		{"at an aligned boundary", WindowsOf(m, 0), at(2 * m), Window{Index: 2, Length: m}, true},
		{"phased, before its boundary", WindowsOf(m, 17*s), at(m + 16*s), Window{Index: 0, Length: m, Phase: 17 * s}, false},
		{"phased, at its boundary", WindowsOf(m, 17*s), at(m + 17*s), Window{Index: 1, Length: m, Phase: 17 * s}, true},
		{"a phase of W + 17s is 17s", WindowsOf(m, m+17*s), at(m + 17*s), Window{Index: 1, Length: m, Phase: 17 * s}, true},
		{"no length, no windows", WindowsOf(0, 17*s), at(m), Window{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := c.sched.Of(c.t)
			if w != c.want {
				t.Fatalf("Of(%v) = %+v, want %+v", c.t, w, c.want)
			}
			if b := c.sched.ByIndex(w.Index); b != w {
				t.Errorf("ByIndex(%d) = %+v, want %+v", w.Index, b, w)
			}
			if w.Length > 0 && w.Schedule() != c.sched {
				t.Errorf("Schedule() = %+v, want %+v", w.Schedule(), c.sched)
			}
			if got := c.sched.StartsWindow(c.t); got != c.starts {
				t.Errorf("StartsWindow(%v) = %v, want %v", c.t, got, c.starts)
			}
		})
	}
	if got := WindowsOf(m, 0).Of(at(m + 5*s)); got != WindowOf(at(m+5*s), m) {
		t.Errorf("phase 0: %+v != WindowOf", got)
	}
	if s := WindowsOf(m, 17*s).String(); s != "1m0s phase 17s" {
		t.Errorf("String() = %q", s)
	}
}

// FuzzWindows: for any instant, length and phase, Of holds the instant,
// ByIndex rebuilds the same window and the next window starts where it
// ends.
func FuzzWindows(f *testing.F) {
	f.Add(int64(0), int64(time.Minute), int64(17*time.Second))
	f.Add(int64(-1), int64(time.Second), int64(-1))
	f.Add(int64(1<<62), int64(31*24*time.Hour), int64(1<<40))
	f.Fuzz(func(t *testing.T, ns, length, phase int64) {
		if length <= 0 {
			return
		}
		s := WindowsOf(time.Duration(length), time.Duration(phase))
		if s.Phase < 0 || s.Phase >= s.Length {
			t.Fatalf("phase %v outside [0, %v)", s.Phase, s.Length)
		}
		at := time.Unix(0, ns)
		w := s.Of(at)
		if w.Index <= -1<<62 || w.Index >= 1<<62 {
			return // saturated far-out windows
		}
		if !w.Contains(at) {
			t.Fatalf("%+v does not hold %v", w, at)
		}
		if s.ByIndex(w.Index) != w {
			t.Fatalf("ByIndex(%d) = %+v, want %+v", w.Index, s.ByIndex(w.Index), w)
		}
		if !w.Next().Start().Equal(w.End()) || s.Of(w.End()) != w.Next() {
			t.Fatalf("next of %+v does not start at its end", w)
		}
	})
}

// TestWindowsCalendar: a calendar schedule names the same windows as its
// Calendar, and Window's arithmetic (Start, End, Next, Left, Clamp,
// Schedule) follows the calendar: months of Europe/Berlin across both
// daylight-saving changes of 2024, February 2024 in America/New_York, the
// 23-hour day of a spring change, and Apia's missing 30 December 2011.
func TestWindowsCalendar(t *testing.T) {
	berlin, ny, apia := zone(t, "Europe/Berlin"), zone(t, "America/New_York"), zone(t, "Pacific/Apia")
	cases := []struct {
		name       string
		sched      Windows
		at         string
		start, end string
	}{
		{"March in Berlin: spring change inside", CalendarWindows(Calendar{Month, berlin}), "2024-03-31T12:00:00+02:00",
			"2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
		{"October in Berlin: autumn change inside", CalendarWindows(Calendar{Month, berlin}), "2024-10-31T23:59:59+01:00",
			"2024-10-01T00:00:00+02:00", "2024-11-01T00:00:00+01:00"},
		{"February 2024 in New York: 29 days", CalendarWindows(Calendar{Month, ny}), "2024-02-29T23:00:00-05:00",
			"2024-02-01T00:00:00-05:00", "2024-03-01T00:00:00-05:00"},
		{"the 23-hour day in Berlin", CalendarWindows(Calendar{Day, berlin}), "2024-03-31T03:00:00+02:00",
			"2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
		{"Apia: the day before the missing one", CalendarWindows(Calendar{Day, apia}), "2011-12-29T12:00:00-10:00",
			"2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			at, start, end := rfc(t, c.at), rfc(t, c.start), rfc(t, c.end)
			w := c.sched.Of(at)
			if !w.Start().Equal(start) || !w.End().Equal(end) || w.Length != end.Sub(start) || !w.Contains(at) {
				t.Fatalf("Of(%v) = %+v: [%v, %v), want [%v, %v)", at, w, w.Start(), w.End(), start, end)
			}
			if cw := c.sched.Cal.WindowOf(at); cw.Index != w.Index {
				t.Errorf("index %d, the calendar's %d", w.Index, cw.Index)
			}
			if b := c.sched.ByIndex(w.Index); b != w || w.Schedule() != c.sched {
				t.Errorf("ByIndex = %+v, Schedule = %+v", b, w.Schedule())
			}
			n := w.Next()
			if !n.Start().Equal(end) || n.Index <= w.Index || n != c.sched.Of(end) {
				t.Errorf("Next() = %+v starting %v, want the window starting %v", n, n.Start(), end)
			}
			// A lease granted an hour before the end with a ttl of a day is
			// clamped to the calendar window's end; one for the next
			// window waits for its local midnight.
			before := end.Add(-time.Hour)
			if got := Clamp(before, 24*time.Hour, w); got != time.Hour {
				t.Errorf("Clamp an hour before the end = %v", got)
			}
			if got := w.Left(before); got != time.Hour {
				t.Errorf("Left an hour before the end = %v", got)
			}
			if tm := Schedule(before, n, 2*time.Hour); tm.StartsIn != time.Hour || tm.ExpiresIn != 3*time.Hour {
				t.Errorf("Schedule of the next window an hour before = %+v", tm)
			}
			if !c.sched.StartsWindow(start) || c.sched.StartsWindow(at) && !at.Equal(start) {
				t.Errorf("StartsWindow")
			}
		})
	}
	if s := CalendarWindows(Calendar{Month, berlin}).String(); s != "month in Europe/Berlin" {
		t.Errorf("String() = %q", s)
	}
	// The epoch-aligned schedule is untouched by the calendar field.
	if w := WindowsOf(time.Minute, 0).Of(at(time.Minute)); w != (Window{Index: 1, Length: time.Minute}) {
		t.Errorf("fixed schedule: %+v", w)
	}
}

// FuzzWindowsCalendar: for any instant, unit and zone, a calendar
// schedule's window holds the instant, ByIndex rebuilds it, it matches
// the Calendar's window, and the next one starts at its end.
func FuzzWindowsCalendar(f *testing.F) {
	f.Add(int64(1711846800), uint8(2), uint8(0))
	f.Add(int64(1325239200), uint8(0), uint8(2))
	f.Add(int64(-62135596800), uint8(3), uint8(1))
	zones := []string{"Europe/Berlin", "America/New_York", "Pacific/Apia", "Australia/Lord_Howe", "UTC"}
	f.Fuzz(func(t *testing.T, sec int64, unit, z uint8) {
		c := Calendar{Unit: Unit(unit%4) + Day, Loc: zone(t, zones[int(z)%len(zones)])}
		s := CalendarWindows(c)
		tt := time.Unix(sec, 0)
		w := s.Of(tt)
		cw := c.WindowOf(tt)
		if cw.Empty() {
			if w != (Window{}) {
				t.Fatalf("%v: %+v outside the calendar's years", tt, w)
			}
			return
		}
		if !w.Contains(tt) || w.Index != cw.Index || !w.Start().Equal(cw.Start) || !w.End().Equal(cw.End) {
			t.Fatalf("%v: %+v [%v, %v), calendar %+v", tt, w, w.Start(), w.End(), cw)
		}
		if s.ByIndex(w.Index) != w || w.Schedule() != s {
			t.Fatalf("%v: ByIndex %+v, Schedule %+v", tt, s.ByIndex(w.Index), w.Schedule())
		}
		if n := w.Next(); n != w && (!n.Start().Equal(w.End()) || n.Index <= w.Index) {
			t.Fatalf("after %+v: %+v", w, n)
		}
	})
}
