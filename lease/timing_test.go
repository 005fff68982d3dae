package lease

import (
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
	"time"
)

func TestScheduleSteps(t *testing.T) {
	s := time.Second
	cur := Window{Index: 0, Length: time.Minute} // [0, 60s)
	next := cur.Next()                           // [60s, 120s)
	steps := []struct {
		name string
		now  time.Time
		w    Window
		ttl  time.Duration
		want Timing
	}{
		{"t0: current window, start", at(0), cur, 15 * s, Timing{0, 15 * s}},
		{"t1: current window, ttl fits", at(10 * s), cur, 15 * s, Timing{0, 15 * s}},
		{"t2: current window, clamped to end", at(50 * s), cur, 15 * s, Timing{0, 10 * s}},
		{"t3: next window granted early", at(55 * s), next, 15 * s, Timing{5 * s, 20 * s}},
		{"t4: next window, ttl = W clamped to its end", at(55 * s), next, time.Minute, Timing{5 * s, 65 * s}},
		{"t5: 1ns before end", at(60*s - 1), cur, 15 * s, Timing{0, 1}},
		{"t6: at end, window over", at(60 * s), cur, 15 * s, Timing{}},
		{"t7: after end", at(90 * s), cur, 15 * s, Timing{}},
		{"t8: next window is now current", at(60 * s), next, 15 * s, Timing{0, 15 * s}},
		{"negative ttl, current", at(10 * s), cur, -s, Timing{0, 0}},
		{"negative ttl, next: starts and expires together", at(55 * s), next, -s, Timing{5 * s, 5 * s}},
		{"huge ttl saturates, then clamps", at(55 * s), next, math.MaxInt64, Timing{5 * s, 65 * s}},
		{"window two ahead", at(10 * s), next.Next(), 15 * s, Timing{110 * s, 125 * s}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if got := Schedule(st.now, st.w, st.ttl); got != st.want {
				t.Errorf("Schedule(%v, %+v, %v) = %+v, want %+v", st.now.Sub(epoch), st.w, st.ttl, got, st.want)
			}
		})
	}
}

func TestDeadlineStartAtSpendable(t *testing.T) {
	s := time.Second
	sent := at(100 * s)
	cases := []struct {
		name              string
		expiresIn, margin time.Duration
		want              time.Time
	}{
		{"margin subtracted", 15 * s, 100 * time.Millisecond, at(115*s - 100*time.Millisecond)},
		{"no margin", 15 * s, 0, at(115 * s)},
		{"negative margin counts as 0", 15 * s, -s, at(115 * s)},
		{"expires with the margin: expired on arrival", s, s, sent},
		{"expires within the margin", s, 2 * s, sent},
		{"zero expiresIn", 0, 0, sent},
		{"negative expiresIn", -s, 0, sent},
		{"huge expiresIn", math.MaxInt64, s, sent.Add(math.MaxInt64 - s)},
	}
	for _, c := range cases {
		t.Run("Deadline/"+c.name, func(t *testing.T) {
			if got := Deadline(sent, c.expiresIn, c.margin); !got.Equal(c.want) {
				t.Errorf("Deadline(sent, %v, %v) = sent%+v, want sent%+v", c.expiresIn, c.margin, got.Sub(sent), c.want.Sub(sent))
			}
		})
	}

	received := at(100 * s)
	for _, c := range []struct {
		startsIn time.Duration
		want     time.Time
	}{{5 * s, at(105 * s)}, {0, received}, {-s, received}} {
		if got := StartAt(received, c.startsIn); !got.Equal(c.want) {
			t.Errorf("StartAt(received, %v) = %v, want %v", c.startsIn, got, c.want)
		}
	}

	start, deadline := at(10*s), at(20*s)
	for _, c := range []struct {
		name string
		now  time.Time
		want bool
	}{
		{"before start", at(10*s - 1), false},
		{"at start (inclusive)", at(10 * s), true},
		{"inside", at(15 * s), true},
		{"1ns before deadline", at(20*s - 1), true},
		{"at deadline (exclusive)", at(20 * s), false},
		{"after deadline", at(21 * s), false},
	} {
		t.Run("Spendable/"+c.name, func(t *testing.T) {
			if got := Spendable(c.now, start, deadline); got != c.want {
				t.Errorf("Spendable = %v, want %v", got, c.want)
			}
		})
	}
	if Spendable(start, start, start) {
		t.Error("a lease with deadline == start is spendable")
	}
}

// TestDeadlineKeepsMonotonic: the agent's deadline must be measured on the
// monotonic clock, so Deadline must not strip the reading time.Now() gives.
func TestDeadlineKeepsMonotonic(t *testing.T) {
	now := time.Now()
	for _, tm := range []time.Time{Deadline(now, time.Minute, time.Second), StartAt(now, time.Second)} {
		if !strings.Contains(tm.String(), "m=") {
			t.Errorf("%v has no monotonic reading", tm)
		}
	}
}

// TestLeaseLifecycle follows one lease for the next window across the WAN at
// fixed instants, both clocks shown on the allocator's time line: the agent
// sends at t0, the allocator grants at t1, the reply arrives at t2.
func TestLeaseLifecycle(t *testing.T) {
	const (
		ms     = time.Millisecond
		s      = time.Second
		margin = 200 * ms
	)
	t0 := at(54*s + 950*ms) // agent sends
	t1 := at(55 * s)        // allocator decides
	t2 := at(55*s + 50*ms)  // agent receives
	w := WindowOf(t1, time.Minute).Next()

	tm := Schedule(t1, w, 15*s)
	if want := (Timing{StartsIn: 5 * s, ExpiresIn: 20 * s}); tm != want {
		t.Fatalf("Schedule = %+v, want %+v", tm, want)
	}
	start := StartAt(t2, tm.StartsIn)
	deadline := Deadline(t0, tm.ExpiresIn, margin)
	if start.Before(w.Start()) {
		t.Errorf("agent starts at %v, before the window %v", start, w.Start())
	}
	if allocatorExpiry := t1.Add(tm.ExpiresIn); deadline.After(allocatorExpiry) {
		t.Errorf("agent deadline %v after the allocator's expiry %v", deadline, allocatorExpiry)
	}
	steps := []struct {
		name string
		now  time.Time
		want bool
	}{
		{"t2: reply received", t2, false},
		{"t3: window started, start not yet reached on the agent's count", at(60*s + 10*ms), false},
		{"t4: start", start, true},
		{"t5: mid-lease", at(70 * s), true},
		{"t6: 1ns before deadline", deadline.Add(-1), true},
		{"t7: deadline", deadline, false},
		{"t8: allocator's expiry", t1.Add(tm.ExpiresIn), false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if got := Spendable(st.now, start, deadline); got != st.want {
				t.Errorf("Spendable(%v) = %v, want %v", st.now.Sub(epoch), got, st.want)
			}
		})
	}
}

// latency is a quick.Generator of non-negative one-way delays.
type latency time.Duration

func (latency) Generate(r *rand.Rand, _ int) reflect.Value {
	return reflect.ValueOf(latency(r.Int63n(int64(2 * time.Second))))
}

// TestScheduleQuick checks the Clamp invariant and the agent side on random
// inputs: no lease outlives its window, it never becomes spendable before
// its window starts, the ttl is never lengthened, and the agent's interval
// lies within the allocator's.
func TestScheduleQuick(t *testing.T) {
	f := func(ti instant, l length, k int8, ttl int64, up, down latency, margin int32) bool {
		now := ti.Time
		w := WindowOf(now, time.Duration(l))
		w.Index += int64(k % 4) // a past, the current or a future window
		tm := Schedule(now, w, time.Duration(ttl))
		if msg := checkTiming(now, w, time.Duration(ttl), tm); msg != "" {
			t.Log(msg)
			return false
		}
		if tm.ExpiresIn == tm.StartsIn {
			return true // empty lease: nothing to spend
		}
		// The agent sent before now and received after, on the same clock.
		sent, received := now.Add(-time.Duration(up)), now.Add(time.Duration(down))
		start := StartAt(received, tm.StartsIn)
		deadline := Deadline(sent, tm.ExpiresIn, time.Duration(margin))
		return !start.Before(w.Start()) && !deadline.After(w.End()) &&
			!deadline.After(now.Add(tm.ExpiresIn)) && !deadline.Before(sent)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}

// checkTiming returns what is wrong with tm = Schedule(now, w, ttl), or "".
func checkTiming(now time.Time, w Window, ttl time.Duration, tm Timing) string {
	switch {
	case tm.StartsIn < 0 || tm.ExpiresIn < tm.StartsIn:
		return "negative or inverted timing"
	case tm.ExpiresIn > addSat(tm.StartsIn, max(ttl, 0)):
		return "ttl lengthened"
	case tm.ExpiresIn > 0 && now.Add(tm.ExpiresIn).After(w.End()):
		return "lease outlives its window"
	case tm.ExpiresIn > tm.StartsIn && now.Add(tm.StartsIn).Before(w.Start()):
		return "lease starts before its window"
	case w.Contains(now) && tm.StartsIn != 0:
		return "current window does not start at once"
	case !now.Before(w.End()) && tm != (Timing{}):
		return "window over but lease not empty"
	}
	return ""
}
