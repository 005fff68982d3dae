package allocator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"leasehold/lease"
)

// A bucket limit's promise is about every interval: admitted <= B + R*T.
// The allocator checks it per reporting interval (BucketInterval, aligned
// on its clock) from what the agents tell it: each share request carries
// its holder's admitted counter (cumulative, as the agent last read it from
// the bucket), and the allocator adds up, per interval, what the counters
// grew by. Counts arrive late: a counter read up to a renewal period before
// the request arrived (and other replicas' admits in between) lands in the
// next interval. So the tokens counted in an interval were admitted within
// it or within bucketSlack before it, and the bound the allocator holds
// them against covers that longer span: B + R * (BucketInterval + slack).

// BucketInterval is the reporting interval of bucket limits.
const BucketInterval = time.Minute

// bucketSlack is how much earlier than its interval a counted token may
// have been admitted: a holder asks at least every half share TTL while it
// has Checks, and a limit stays active for 5 s after its last Check (the
// agent's default), plus a second for the call.
func bucketSlack(l *Limit) time.Duration {
	return max(shareTTL(l), 5*time.Second) + time.Second
}

// BucketReport is what the allocator knows of one closed reporting
// interval of a bucket limit.
type BucketReport struct {
	Limit    string
	Interval int64         // index of the interval on the allocator's clock
	Length   time.Duration // BucketInterval
	// Admitted is what the holders' counters grew by in the interval.
	Admitted int64
	// Bound is B + ceil(R * (Length + slack) / period) with the largest R
	// and B in force during the interval: Admitted above it is a bug.
	Bound int64
}

// bucketUsage is what the Core adds up for one bucket limit.
type bucketUsage struct {
	seen     map[string]int64 // holder key -> the largest admitted count reported
	index    int64            // the running interval
	admitted int64            // counted in the running interval
	rate     int64            // the largest R in force in it
	period   time.Duration
	burst    int64 // the largest B in force in it
	slack    time.Duration
	last     *BucketReport // the last closed interval
}

// observeBucket records a holder's admitted counter, reported at now.
// The first count of a holder the Core has no shares of is counted whole
// (its bucket began with its first share); a holder with shares but no
// count (a new leader) starts from its first count.
func (c *Core) observeBucket(now time.Time, l *Limit, hk string, admitted int64) {
	u := c.bucketUse[l.ID]
	if u == nil {
		u = &bucketUsage{seen: map[string]int64{}, index: lease.WindowOf(now, BucketInterval).Index}
		c.bucketUse[l.ID] = u
	}
	u.roll(now)
	u.rate, u.burst, u.period = max(u.rate, l.Rate), max(u.burst, l.Burst), l.RatePeriod
	u.slack = max(u.slack, bucketSlack(l))
	prev, known := u.seen[hk]
	if !known {
		if st := c.shares[l.ID]; st != nil && st.seq[hk] > 0 {
			u.seen[hk] = max(admitted, 0) // a count from before: unknown to this leader
			return
		}
	}
	if admitted > prev {
		u.admitted += admitted - prev
	}
	u.seen[hk] = max(prev, admitted)
}

// roll closes the running interval if now is past it.
func (u *bucketUsage) roll(now time.Time) {
	idx := lease.WindowOf(now, BucketInterval).Index
	if idx <= u.index {
		return
	}
	if u.rate > 0 {
		u.last = &BucketReport{Interval: u.index, Length: BucketInterval, Admitted: u.admitted,
			Bound: lease.BucketBound(u.rate, u.period, u.burst, BucketInterval+u.slack, 0)}
	}
	if idx > u.index+1 {
		// Intervals with no report at all: nothing counted in them.
		u.last = &BucketReport{Interval: idx - 1, Length: BucketInterval,
			Bound: lease.BucketBound(u.rate, u.period, u.burst, BucketInterval+u.slack, 0)}
	}
	u.index, u.admitted = idx, 0
}

// BucketReport returns the last closed reporting interval of a bucket
// limit at now (ok false before one closed).
func (c *Core) BucketReport(limit string, now time.Time) (BucketReport, bool) {
	u := c.bucketUse[limit]
	if u == nil {
		return BucketReport{}, false
	}
	u.roll(now)
	if u.last == nil {
		return BucketReport{}, false
	}
	r := *u.last
	r.Limit = limit
	return r, true
}

// bucketCollector exports each bucket limit's last closed reporting
// interval: what was admitted and the bound, side by side.
type bucketCollector struct {
	a               *Allocator
	admitted, bound *prometheus.Desc
	intervalSeconds *prometheus.Desc
}

func newBucketCollector(a *Allocator) *bucketCollector {
	return &bucketCollector{a: a,
		admitted: prometheus.NewDesc("leasehold_bucket_admitted_tokens",
			"Tokens a bucket limit admitted in its last closed reporting interval, all regions (from the agents' counters).", []string{"limit"}, nil),
		bound: prometheus.NewDesc("leasehold_bucket_bound_tokens",
			"The bound on what a bucket limit may admit in its last closed reporting interval: B + R x (interval + slack). Admitted above it is a bug.", []string{"limit"}, nil),
		intervalSeconds: prometheus.NewDesc("leasehold_bucket_interval_seconds",
			"The reporting interval of bucket limits.", nil, nil),
	}
}

func (c *bucketCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.admitted
	ch <- c.bound
	ch <- c.intervalSeconds
}

func (c *bucketCollector) Collect(ch chan<- prometheus.Metric) {
	var reps []BucketReport
	err := c.a.View(func(now time.Time, core *Core) {
		for id := range core.bucketUse {
			if r, ok := core.BucketReport(id, now); ok {
				reps = append(reps, r)
			}
		}
	})
	if err != nil {
		return // a follower exports none
	}
	ch <- prometheus.MustNewConstMetric(c.intervalSeconds, prometheus.GaugeValue, BucketInterval.Seconds())
	for _, r := range reps {
		ch <- prometheus.MustNewConstMetric(c.admitted, prometheus.GaugeValue, float64(r.Admitted), r.Limit)
		ch <- prometheus.MustNewConstMetric(c.bound, prometheus.GaugeValue, float64(r.Bound), r.Limit)
	}
}
