package lease

import (
	"math"
	"sync"
	"time"
)

// DefaultTau is the time constant of a zero RateEstimator. Five seconds
// follows a change of demand within a renewal or two (leases cover about
// 15 s) while smoothing out sub-second bursts.
const DefaultTau = 5 * time.Second

// RateEstimator is an exponentially smoothed rate, in tokens per second, of
// the tokens it is told about, over a time constant tau. The agent feeds it
// each region's demand (admitted plus denied cost) and reports Rate in its
// renewal requests.
//
// Model: each Observe(now, n) is a sample of rate n/dt over the interval dt
// since the previous observation, and the estimate moves toward it by
// 1 - e^(-dt/tau). Weighting by elapsed time, rather than by sample, makes
// the estimate independent of how often the agent observes: at a steady
// rate R every sample is R, so right after an observation the estimate is
// R minus what is left of the initial error (e^(-t/tau)), whatever the
// step, and the influence of the past halves every tau*ln 2. Tokens observed at the same
// instant as the previous observation (dt = 0, the limit of the rule above)
// add n/tau at once. So does the first observation, which has no interval.
// Between observations Rate decays as if nothing had arrived yet, so the
// freshest figure is read right after an Observe; a region that goes
// silent decays to under 1% of its rate within 5*tau.
//
// Time is an argument, as everywhere in this package. An instant earlier
// than the latest one seen (clocks are not always monotonic across
// goroutines) is treated as that latest instant: it never moves the
// estimate back in time and never makes it negative or NaN. Negative, NaN
// and infinite token counts count as 0. The estimate saturates at
// math.MaxFloat64 rather than becoming +Inf.
//
// The zero value is ready to use with time constant [DefaultTau]; use
// [NewRateEstimator] for another one. A RateEstimator is safe for concurrent
// use and must not be copied after first use.
type RateEstimator struct {
	tau time.Duration // set by NewRateEstimator, never changed; <= 0 means DefaultTau

	mu   sync.Mutex // protects rate, last and seen
	rate float64    // tokens/s as of last
	last time.Time  // latest instant observed
	seen bool       // whether anything was observed yet
}

// NewRateEstimator returns an estimator with time constant tau, starting at
// rate 0. A tau <= 0 means [DefaultTau].
func NewRateEstimator(tau time.Duration) *RateEstimator {
	return &RateEstimator{tau: tau}
}

// Observe records tokens arriving at now: the tokens the region wanted
// since its previous observation.
func (e *RateEstimator) Observe(now time.Time, tokens float64) {
	if !(tokens > 0) || math.IsInf(tokens, 1) {
		tokens = 0 // NaN fails tokens > 0
	}
	tau := e.tauSeconds()

	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen {
		e.seen, e.last = true, now
		e.rate = finite(tokens / tau)
		return
	}
	dt := now.Sub(e.last).Seconds()
	if dt <= 0 {
		e.rate = finite(e.rate + tokens/tau)
		return
	}
	x := dt / tau
	// rate*e^-x + (1-e^-x) * tokens/dt, with Expm1 for accuracy at small
	// x; (1-e^-x)/dt <= 1/tau, so the second term stays finite whenever
	// tokens/tau is.
	e.rate = finite(decay(e.rate, x) + tokens*(-math.Expm1(-x)/dt))
	e.last = now
}

// Rate returns the estimate at now, in tokens per second: the estimate at
// the latest observation, decayed over the time since. It is 0 before
// anything was observed.
func (e *RateEstimator) Rate(now time.Time) float64 {
	tau := e.tauSeconds()

	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen {
		return 0
	}
	dt := now.Sub(e.last).Seconds()
	if dt <= 0 {
		return e.rate
	}
	return decay(e.rate, dt/tau)
}

// tauSeconds returns the time constant in seconds.
func (e *RateEstimator) tauSeconds() float64 {
	if e.tau <= 0 {
		return DefaultTau.Seconds()
	}
	return e.tau.Seconds()
}

// decay returns r*e^-x for x >= 0, and exactly 0 once e^-x underflows, so
// that a saturated rate times an underflowed factor cannot become NaN.
func decay(r, x float64) float64 {
	f := math.Exp(-x)
	if f == 0 {
		return 0
	}
	return r * f
}

// finite caps v at math.MaxFloat64.
func finite(v float64) float64 {
	if v > math.MaxFloat64 {
		return math.MaxFloat64
	}
	return v
}
