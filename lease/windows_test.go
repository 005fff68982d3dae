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
