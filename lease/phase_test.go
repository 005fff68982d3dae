package lease

import (
	"testing"
	"time"
)

// TestWindowOfPhase: windows of a limit with a phase offset φ are [k*W +
// φ, (k+1)*W + φ): the step table at the instants around a phased
// boundary, before the epoch, a phase outside [0, W) taken modulo W, and
// Next, Left and Clamp honouring the phase.
func TestWindowOfPhase(t *testing.T) {
	const m, s = time.Minute, time.Second
	cases := []struct {
		name          string
		t             time.Time
		length, phase time.Duration
		want          Window
		start         time.Time
	}{
		{"phase 0 is WindowOf", at(m + 5*s), m, 0, Window{Index: 1, Length: m}, at(m)},
		{"just before the phased boundary", at(m + 15*s - 1), m, 15 * s, Window{Index: 0, Length: m, Phase: 15 * s}, at(15 * s)},
		{"at the phased boundary", at(m + 15*s), m, 15 * s, Window{Index: 1, Length: m, Phase: 15 * s}, at(m + 15*s)},
		{"the epoch lies in window -1", epoch, m, 15 * s, Window{Index: -1, Length: m, Phase: 15 * s}, at(-45 * s)},
		{"before the epoch", at(-50 * s), m, 15 * s, Window{Index: -2, Length: m, Phase: 15 * s}, at(-m - 45*s)},
		{"a phase of W is none", at(m + 5*s), m, m, Window{Index: 1, Length: m}, at(m)},
		{"a phase above W modulo W", at(m + 20*s), m, m + 15*s, Window{Index: 1, Length: m, Phase: 15 * s}, at(m + 15*s)},
		{"a negative phase modulo W", at(m + 50*s), m, -15 * s, Window{Index: 1, Length: m, Phase: 45 * s}, at(m + 45*s)},
		{"no windows of length 0", at(m), 0, 15 * s, Window{}, epoch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := WindowOfPhase(c.t, c.length, c.phase)
			if w != c.want {
				t.Fatalf("WindowOfPhase(%v, %v, %v) = %+v, want %+v", c.t, c.length, c.phase, w, c.want)
			}
			if !w.Start().Equal(c.start) {
				t.Errorf("Start() = %v, want %v", w.Start(), c.start)
			}
			if c.length > 0 && (!w.Contains(c.t) || !w.End().Equal(c.start.Add(c.length))) {
				t.Errorf("%+v = [%v, %v) does not hold %v", w, w.Start(), w.End(), c.t)
			}
		})
	}
	w := WindowOfPhase(at(m+20*s), m, 15*s)
	if n := w.Next(); n != (Window{Index: 2, Length: m, Phase: 15 * s}) || !n.Start().Equal(w.End()) {
		t.Errorf("Next() = %+v", n)
	}
	if l := w.Left(at(m + 20*s)); l != 55*s {
		t.Errorf("Left = %v, want 55s", l)
	}
	if c := Clamp(at(m+20*s), 2*m, w); c != 55*s {
		t.Errorf("Clamp = %v, want 55s (to the phased end)", c)
	}
	// A lease for the next phased window granted 5 s before it starts.
	if tm := Schedule(at(m+10*s), w, 20*s); tm.StartsIn != 5*s || tm.ExpiresIn != 25*s {
		t.Errorf("Schedule = %+v, want starts in 5s, expires in 25s", tm)
	}
}

// FuzzWindowOfPhase: for any instant, length and phase, the phased window
// holds the instant, starts a whole number of windows after the phase,
// and is the epoch-aligned window of the instant shifted by the phase.
func FuzzWindowOfPhase(f *testing.F) {
	f.Add(int64(75e9), int64(60e9), int64(15e9))
	f.Add(int64(-1), int64(1e9), int64(999_999_999))
	f.Add(int64(0), int64(1), int64(-5))
	f.Fuzz(func(t *testing.T, ns, length, phase int64) {
		if length <= 0 || length > int64(maxPhaseTestWindow) {
			return
		}
		tm := time.Unix(0, ns)
		w := WindowOfPhase(tm, time.Duration(length), time.Duration(phase))
		p := NormPhase(time.Duration(length), time.Duration(phase))
		if w.Phase != p || p < 0 || p >= time.Duration(length) {
			t.Fatalf("phase %v of %+v, want %v in [0, %v)", w.Phase, w, p, length)
		}
		if !w.Contains(tm) {
			t.Fatalf("%+v = [%v, %v) does not hold %v", w, w.Start(), w.End(), tm)
		}
		if a := WindowOf(tm.Add(-p), time.Duration(length)); a.Index != w.Index {
			t.Fatalf("index %d, the shifted instant's %d", w.Index, a.Index)
		}
		if !w.Next().Start().Equal(w.End()) {
			t.Fatalf("%+v: Next starts at %v, not at End %v", w, w.Next().Start(), w.End())
		}
	})
}

// maxPhaseTestWindow bounds the fuzzed lengths to what limits use
// (windows up to a few weeks).
const maxPhaseTestWindow = 31 * 24 * time.Hour
