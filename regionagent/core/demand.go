package core

import (
	"time"

	"leasehold/lease"
)

// instWindow is the span of the fast demand rate.
const instWindow = time.Second

// Demand estimates a region's demand for one limit from its cumulative
// count (admitted + denied + fallback cost, all replicas): fast attack,
// slow decay. The rate is the larger of the rate over the last second (a
// ramp is followed at once, so a region is not left dry while the pool has
// tokens) and a 5 s exponentially smoothed rate (a short lull does not
// shrink the next lease). Before anything is measurable it is the prior.
//
// The zero value is not usable; call NewDemand. Not safe for concurrent
// use.
type Demand struct {
	prior   float64
	ewma    lease.RateEstimator // the zero value: DefaultTau, 5 s
	samples [8]countSample
	n       int
	window  int64 // window of the last count
	count   int64 // the last count of that window
}

type countSample struct {
	at    time.Time
	total int64 // cumulative over windows
}

// NewDemand returns an estimator whose rate is prior until measured.
func NewDemand(prior float64) *Demand {
	d := new(Demand)
	d.init(prior)
	return d
}

// init makes a zero Demand ready, with prior (one held in a larger
// struct, not allocated on its own).
func (d *Demand) init(prior float64) { d.prior, d.window = prior, -1 }

// Observe records the count of window seen at now (it restarts at each
// window). Readings may arrive out of order (spends answered concurrently):
// a count below one already seen for the window, or a reading of an older
// window, adds nothing.
func (d *Demand) Observe(now time.Time, window, count int64) {
	if window < d.window || window == d.window && count <= d.count && d.n > 0 {
		return
	}
	delta := count
	if d.window == window {
		delta = count - d.count
	}
	if delta > 0 {
		d.ewma.Observe(now, float64(delta))
	}
	total := int64(0)
	if d.n > 0 {
		total = d.samples[(d.n-1)%len(d.samples)].total
	}
	d.add(now, total+max(0, delta))
	d.window, d.count = window, count
}

// sampleGap is the least spacing kept between the samples of the fast
// rate: readings arrive with every spend, and eight samples a few
// milliseconds apart would measure a burst, not the last second. A reading
// within sampleGap of the sample before the newest replaces the newest.
const sampleGap = instWindow / 8

func (d *Demand) add(now time.Time, total int64) {
	if d.n > 0 {
		last := &d.samples[(d.n-1)%len(d.samples)]
		if !now.After(last.at) {
			last.total = max(last.total, total)
			return
		}
		if d.n > 1 && now.Sub(d.samples[(d.n-2)%len(d.samples)].at) < sampleGap {
			last.at, last.total = now, max(last.total, total)
			return
		}
	}
	d.samples[d.n%len(d.samples)] = countSample{at: now, total: total}
	d.n++
}

// Rate returns the demand in tokens per second at now.
func (d *Demand) Rate(now time.Time) float64 { return d.rate(now, d.prior) }

// Measured returns the demand measured at now, without the prior: 0 until
// something is observed.
func (d *Demand) Measured(now time.Time) float64 { return d.rate(now, 0) }

func (d *Demand) rate(now time.Time, prior float64) float64 {
	r := d.ewma.Rate(now)
	if d.n > 0 {
		newest := d.samples[(d.n-1)%len(d.samples)]
		oldest := max(0, d.n-len(d.samples))
		for i := d.n - 1; i >= oldest; i-- {
			s := d.samples[i%len(d.samples)]
			if dt := newest.at.Sub(s.at); dt >= instWindow || i == oldest {
				if dt >= instWindow/10 {
					return max(r, float64(newest.total-s.total)/dt.Seconds())
				}
				break
			}
		}
	}
	return max(r, prior)
}
