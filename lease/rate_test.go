package lease

import (
	"math"
	"sync"
	"testing"
	"time"
)

// TestRateConverges: a steady 10 tokens/s observed in 100 ms steps reads
// within 2% of 10 after 5*tau, and a silence of 5*tau takes it below 1% of
// that, for time constants below, at and above the step.
func TestRateConverges(t *testing.T) {
	const step = 100 * time.Millisecond
	for _, tau := range []time.Duration{50 * time.Millisecond, time.Second, DefaultTau, 30 * time.Second} {
		t.Run(tau.String(), func(t *testing.T) {
			e := NewRateEstimator(tau)
			t0 := at(1000 * time.Second)
			now := t0
			for now.Sub(t0) < 5*tau {
				now = now.Add(step)
				e.Observe(now, 1)
			}
			if got := e.Rate(now); math.Abs(got-10) > 0.2 {
				t.Errorf("after 5*tau: Rate = %v, want 10 within 2%%", got)
			}
			// Between observations the estimate decays, by at most the
			// share of one step in tau (documented); never above the rate.
			if got, low := e.Rate(now.Add(step/2)), 10*math.Exp(-step.Seconds()/2/tau.Seconds())*0.98; got > 10.2 || got < low {
				t.Errorf("half a step later: Rate = %v, want in [%v, 10.2]", got, low)
			}
			old := e.Rate(now)
			if got := e.Rate(now.Add(5 * tau)); got >= old/100 {
				t.Errorf("after 5*tau of silence: Rate = %v, want below %v", got, old/100)
			}
			if got := e.Rate(now); got != old {
				t.Errorf("Rate changed the state: %v, then %v", old, got)
			}
		})
	}
}

// TestRateSteps drives one estimator (tau = 1s) at fixed instants.
func TestRateSteps(t *testing.T) {
	e := NewRateEstimator(time.Second)
	s := time.Second
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	steps := []struct {
		name   string
		now    time.Time
		tokens float64 // observed at now unless negative zero
		want   float64 // Rate(now) after the observation
	}{
		{"t0: first observation is an impulse of n/tau", at(10 * s), 5, 5},
		{"t1: same instant adds n/tau", at(10 * s), 1, 6},
		{"t2: 1s later, 10 tokens: sample 10/s", at(11 * s), 10, 6*math.Exp(-1) + 10*(1-math.Exp(-1))},
		{"t3: earlier instant: no decay, no time travel", at(5 * s), 2, 6*math.Exp(-1) + 10*(1-math.Exp(-1)) + 2},
		{"t4: zero tokens 1s later decays", at(12 * s), 0, (6*math.Exp(-1) + 10*(1-math.Exp(-1)) + 2) * math.Exp(-1)},
		{"t5: NaN counts as 0", at(13 * s), math.NaN(), (6*math.Exp(-1) + 10*(1-math.Exp(-1)) + 2) * math.Exp(-2)},
		{"t6: negative counts as 0", at(13 * s), -100, (6*math.Exp(-1) + 10*(1-math.Exp(-1)) + 2) * math.Exp(-2)},
	}
	for _, st := range steps {
		e.Observe(st.now, st.tokens)
		if got := e.Rate(st.now); !near(got, st.want) {
			t.Errorf("%s: Rate = %v, want %v", st.name, got, st.want)
		}
	}
	// A query before the latest observation reads the latest estimate.
	if got, want := e.Rate(at(0)), e.Rate(at(13*s)); got != want {
		t.Errorf("Rate in the past = %v, want %v", got, want)
	}
}

func TestRateZeroValue(t *testing.T) {
	var e RateEstimator
	if got := e.Rate(at(0)); got != 0 {
		t.Errorf("Rate before any observation = %v, want 0", got)
	}
	e.Observe(at(0), 10)
	if got, want := e.Rate(at(0)), 10/DefaultTau.Seconds(); got != want {
		t.Errorf("zero value: Rate = %v, want %v (tau = DefaultTau)", got, want)
	}
	if got, want := NewRateEstimator(-time.Second).tauSeconds(), DefaultTau.Seconds(); got != want {
		t.Errorf("negative tau = %v s, want DefaultTau", got)
	}
}

// TestRateNeverNegativeOrNaN feeds hostile instants and counts.
func TestRateNeverNegativeOrNaN(t *testing.T) {
	e := NewRateEstimator(time.Nanosecond) // 1/tau = 1e9: overflow-prone
	inputs := []struct {
		now    time.Time
		tokens float64
	}{
		{at(time.Hour), math.MaxFloat64},
		{at(time.Hour), math.MaxFloat64},
		{at(time.Hour + 1), math.MaxFloat64},
		{at(-time.Hour), math.Inf(1)},
		{at(-time.Hour), math.Inf(-1)},
		{at(2 * time.Hour), 1},
		{time.Unix(1<<40, 0), math.MaxFloat64},
		{time.Unix(-1<<40, 0), 1e-300},
		{time.Unix(1<<40, 1), 5e-324},
	}
	for i, in := range inputs {
		e.Observe(in.now, in.tokens)
		for _, q := range []time.Time{in.now, in.now.Add(-1), in.now.Add(1), in.now.Add(time.Hour), time.Unix(1<<41, 0)} {
			if r := e.Rate(q); math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
				t.Fatalf("after input %d: Rate(%v) = %v", i, q, r)
			}
		}
	}
}

// TestRateConcurrent runs observers and readers together; run with -race.
func TestRateConcurrent(t *testing.T) {
	e := NewRateEstimator(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				now := at(time.Duration(i+g) * time.Millisecond)
				e.Observe(now, 1)
				if r := e.Rate(now); r < 0 || math.IsNaN(r) {
					t.Errorf("Rate = %v", r)
					return
				}
			}
		}()
	}
	wg.Wait()
}
