package client

import "math"

// Rate estimation of this client's own demand for one limit.
const (
	// ratePeriod is the shortest span a rate sample covers.
	ratePeriod = int64(250e6) // ns
	// rateTau is the decay time constant: a caller that stops is quiet
	// (below any HotRate it was above) within a few seconds.
	rateTau = 1e9 // ns
)

// rateEst estimates a cost rate from a cumulative count: fast attack (a
// sample above the estimate replaces it, so a ramp is followed at once and
// the chunk grows with it), exponential decay (a lull shrinks the estimate
// over about a second). Times are nanoseconds on the client's clock.
//
// The zero value is ready: the first observation starts the measurement.
// Not safe for concurrent use (guarded by its limit state's mutex).
type rateEst struct {
	started bool
	at      int64   // time of the last sample
	total   int64   // cumulative cost at that sample
	rate    float64 // cost per second
}

// observe records the cumulative cost total at now and returns the rate.
// Samples shorter than ratePeriod are folded into the next one.
func (e *rateEst) observe(now, total int64) float64 {
	if !e.started {
		e.started, e.at, e.total = true, now, total
		return e.rate
	}
	dt := now - e.at
	if dt < ratePeriod {
		return e.rate
	}
	inst := float64(total-e.total) / (float64(dt) / 1e9)
	a := math.Exp(-float64(dt) / rateTau)
	e.rate = max(inst, a*e.rate+(1-a)*inst)
	switch {
	case math.IsNaN(e.rate) || e.rate < 0:
		e.rate = 0
	case e.rate > 1e15:
		e.rate = 1e15
	}
	e.at, e.total = now, total
	return e.rate
}
