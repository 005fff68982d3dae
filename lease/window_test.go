package lease

import (
	"math"
	"math/big"
	"math/rand"
	"reflect"
	"testing"
	"testing/quick"
	"time"
)

// epoch is the instant every window is aligned on.
var epoch = time.Unix(0, 0)

// at returns the instant d after the Unix epoch, so that tables read as
// offsets.
func at(d time.Duration) time.Time { return epoch.Add(d) }

func TestWindowOf(t *testing.T) {
	const m = time.Minute
	tokyo := time.FixedZone("JST", 9*60*60)
	cases := []struct {
		name   string
		t      time.Time
		length time.Duration
		want   Window
		start  time.Time
	}{
		{"epoch", epoch, m, Window{Index: 0, Length: m}, epoch},
		{"last ns of window 0", at(m - 1), m, Window{Index: 0, Length: m}, epoch},
		{"exact boundary starts the next window", at(m), m, Window{Index: 1, Length: m}, at(m)},
		{"one ns before epoch is window -1 (floor, not truncation)", at(-1), m, Window{Index: -1, Length: m}, at(-m)},
		{"exact negative boundary", at(-m), m, Window{Index: -1, Length: m}, at(-m)},
		{"one ns before a negative boundary", at(-m - 1), m, Window{Index: -2, Length: m}, at(-2 * m)},
		{"mid-minute", time.Date(2026, 5, 1, 12, 34, 56, 789, time.UTC), m,
			Window{Index: 29627314, Length: m}, time.Date(2026, 5, 1, 12, 34, 0, 0, time.UTC)},
		{"time zone does not move the window", time.Date(2026, 5, 1, 21, 34, 56, 789, tokyo), m,
			Window{Index: 29627314, Length: m}, time.Date(2026, 5, 1, 12, 34, 0, 0, time.UTC)},
		{"1s windows", at(1500 * time.Millisecond), time.Second, Window{Index: 1, Length: time.Second}, at(time.Second)},
		{"1h windows before epoch", at(-90 * time.Minute), time.Hour, Window{Index: -2, Length: time.Hour}, at(-2 * time.Hour)},
		{"1ns windows", at(-7), 1, Window{Index: -7, Length: 1}, at(-7)},
		{"zero length has no windows", at(m), 0, Window{}, epoch},
		{"negative length has no windows", at(m), -m, Window{}, epoch},
		{"year 1 (UnixNano overflows)", time.Time{}, time.Hour,
			Window{Index: -17259888, Length: time.Hour}, time.Time{}},
		{"year 3000 (UnixNano overflows)", time.Date(3000, 1, 1, 0, 30, 0, 0, time.UTC), time.Hour,
			Window{Index: 9028800, Length: time.Hour}, time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := WindowOf(c.t, c.length)
			if w != c.want {
				t.Fatalf("WindowOf(%v, %v) = %+v, want %+v", c.t, c.length, w, c.want)
			}
			if !w.Start().Equal(c.start) {
				t.Errorf("Start() = %v, want %v", w.Start().UTC(), c.start.UTC())
			}
			if c.length > 0 {
				if !w.Contains(c.t) {
					t.Errorf("%+v does not contain %v", w, c.t)
				}
				if got := w.End().Sub(w.Start()); got != c.length {
					t.Errorf("End()-Start() = %v, want %v", got, c.length)
				}
				if !w.Next().Start().Equal(w.End()) {
					t.Errorf("Next().Start() = %v, want End() %v", w.Next().Start(), w.End())
				}
			}
		})
	}
}

// TestWindowSteps walks one 60 s window at fixed instants.
func TestWindowSteps(t *testing.T) {
	w := Window{Index: 10, Length: time.Minute} // [600s, 660s)
	steps := []struct {
		name     string
		now      time.Time
		contains bool
		left     time.Duration
	}{
		{"t0: long before", at(0), false, time.Minute},
		{"t1: 1ns before start", at(600*time.Second - 1), false, time.Minute},
		{"t2: start", at(600 * time.Second), true, time.Minute},
		{"t3: +15s", at(615 * time.Second), true, 45 * time.Second},
		{"t4: 1ns before end", at(660*time.Second - 1), true, 1},
		{"t5: end (exclusive)", at(660 * time.Second), false, 0},
		{"t6: after end", at(700 * time.Second), false, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if got := w.Contains(s.now); got != s.contains {
				t.Errorf("Contains = %v, want %v", got, s.contains)
			}
			if got := w.Left(s.now); got != s.left {
				t.Errorf("Left = %v, want %v", got, s.left)
			}
		})
	}
}

func TestEmptyWindow(t *testing.T) {
	for _, w := range []Window{{}, {Index: 5}, {Index: 5, Length: -time.Second}} {
		if w.Contains(epoch) || w.Contains(at(5*time.Second)) {
			t.Errorf("%+v contains an instant", w)
		}
		if got := w.Left(at(-time.Hour)); got != 0 {
			t.Errorf("%+v.Left = %v, want 0", w, got)
		}
		if !w.Start().Equal(epoch) || !w.End().Equal(epoch) {
			t.Errorf("%+v = [%v, %v), want the epoch", w, w.Start(), w.End())
		}
		if got := Clamp(at(-time.Hour), time.Hour, w); got != 0 {
			t.Errorf("Clamp on %+v = %v, want 0", w, got)
		}
		if got := Schedule(at(-time.Hour), w, time.Hour); got != (Timing{}) {
			t.Errorf("Schedule on %+v = %+v, want zero", w, got)
		}
	}
}

func TestWindowExtremes(t *testing.T) {
	// Windows at the int64 limits must not wrap around or panic.
	last := Window{Index: math.MaxInt64, Length: time.Hour}
	if last.Next() != last {
		t.Errorf("Next of the last window = %+v, want itself", last.Next())
	}
	if !last.End().After(last.Start()) {
		t.Errorf("last window [%v, %v) is not ordered", last.Start(), last.End())
	}
	for _, w := range []Window{{Index: math.MaxInt64, Length: time.Second}, {Index: math.MinInt64, Length: time.Second}, {Index: math.MaxInt64, Length: math.MaxInt64}} {
		if s, e := w.Start(), w.End(); !e.After(s) || s.Equal(epoch) {
			t.Errorf("%+v = [%v, %v): want a saturated, ordered interval", w, s, e)
		}
	}
	first := Window{Index: math.MinInt64, Length: time.Hour}
	if !first.Start().Before(epoch) || !first.End().After(first.Start()) {
		t.Errorf("first window [%v, %v) wrapped", first.Start(), first.End())
	}
	if got := (Window{Index: math.MinInt64, Length: 1}).Start(); got.UnixNano() != math.MinInt64 {
		t.Errorf("Start of window MinInt64 with 1ns = %d ns, want MinInt64", got.UnixNano())
	}
	// Far instants saturate the index rather than wrapping.
	far := time.Unix(1<<62, 0)
	if w := WindowOf(far, 1); w.Index != math.MaxInt64 {
		t.Errorf("WindowOf(+2^62 s, 1ns).Index = %d, want MaxInt64", w.Index)
	}
	if w := WindowOf(time.Unix(-1<<62, 0), 1); w.Index != math.MinInt64 {
		t.Errorf("WindowOf(-2^62 s, 1ns).Index = %d, want MinInt64", w.Index)
	}
}

// instant is a quick.Generator of instants spread over many scales, from
// nanoseconds around the epoch to far beyond the years UnixNano can hold.
type instant struct{ time.Time }

func (instant) Generate(r *rand.Rand, _ int) reflect.Value {
	var sec int64
	switch r.Intn(4) {
	case 0:
		sec = r.Int63n(200) - 100
	case 1:
		sec = r.Int63n(4e9) - 2e9
	case 2:
		sec = r.Int63n(2e10) - 1e10 // past UnixNano's range
	default:
		sec = r.Int63n(1<<50) - 1<<49
	}
	return reflect.ValueOf(instant{time.Unix(sec, r.Int63n(1e9))})
}

// length is a quick.Generator of window lengths.
type length time.Duration

func (length) Generate(r *rand.Rand, _ int) reflect.Value {
	choices := []time.Duration{1, 7, time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour}
	d := choices[r.Intn(len(choices))]
	if r.Intn(3) == 0 {
		d = time.Duration(r.Int63n(int64(100*time.Hour))) + 1
	}
	return reflect.ValueOf(length(d))
}

// TestWindowOfQuick checks WindowOf against floor division in math/big and
// that the window contains the instant.
func TestWindowOfQuick(t *testing.T) {
	f := func(ti instant, l length) bool {
		ns := new(big.Int).Mul(big.NewInt(ti.Unix()), big.NewInt(1e9))
		ns.Add(ns, big.NewInt(int64(ti.Nanosecond())))
		want := new(big.Int)
		// Div is Euclidean, which for a positive divisor is floor.
		want.Div(ns, big.NewInt(int64(l)))
		w := WindowOf(ti.Time, time.Duration(l))
		if !want.IsInt64() {
			// Beyond int64 windows of this length: Index saturates.
			return w.Index == math.MaxInt64 || w.Index == math.MinInt64
		}
		if w.Index != want.Int64() {
			t.Logf("WindowOf(%v, %v) = %d, want %v", ti.Time, time.Duration(l), w.Index, want)
			return false
		}
		start := new(big.Int).Mul(want, big.NewInt(int64(l)))
		got := new(big.Int).Mul(big.NewInt(w.Start().Unix()), big.NewInt(1e9))
		got.Add(got, big.NewInt(int64(w.Start().Nanosecond())))
		if got.Cmp(start) != 0 {
			t.Logf("Start of %+v = %v ns, want %v", w, got, start)
			return false
		}
		return w.Contains(ti.Time) && !w.Next().Contains(ti.Time) &&
			w.Left(ti.Time) > 0 && w.Left(ti.Time) <= w.Length
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}

func TestClampSteps(t *testing.T) {
	w := Window{Index: 0, Length: time.Minute} // [0, 60s)
	s := time.Second
	steps := []struct {
		name string
		now  time.Time
		ttl  time.Duration
		want time.Duration
	}{
		{"t0: start, ttl fits", at(0), 15 * s, 15 * s},
		{"t1: ttl ends exactly at end", at(45 * s), 15 * s, 15 * s},
		{"t2: ttl would pass end", at(50 * s), 15 * s, 10 * s},
		{"t3: 1ns before end", at(60*s - 1), 15 * s, 1},
		{"t4: at end", at(60 * s), 15 * s, 0},
		{"t5: after end", at(61 * s), 15 * s, 0},
		{"zero ttl", at(10 * s), 0, 0},
		{"negative ttl", at(10 * s), -15 * s, 0},
		{"huge ttl", at(10 * s), math.MaxInt64, 50 * s},
		{"before the window: measured from now", at(-10 * s), 15 * s, 15 * s},
		{"before the window: still stops at end", at(-10 * s), time.Hour, 70 * s},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if got := Clamp(st.now, st.ttl, w); got != st.want {
				t.Errorf("Clamp(%v, %v) = %v, want %v", st.now.Sub(epoch), st.ttl, got, st.want)
			}
		})
	}
}

// TestClampQuick: no lease outlives its window, and a ttl is never
// lengthened. A zero ttl is a lease that is expired at now, so it is the
// answer for windows that are over.
func TestClampQuick(t *testing.T) {
	f := func(ti instant, l length, k int8, ttl int64) bool {
		w := WindowOf(ti.Time, time.Duration(l))
		w.Index += int64(k % 3) // the current, a past or a future window
		c := Clamp(ti.Time, time.Duration(ttl), w)
		return c >= 0 && c <= max(time.Duration(ttl), 0) && (c == 0 || !ti.Add(c).After(w.End()))
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}
