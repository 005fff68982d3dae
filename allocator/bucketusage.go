package allocator

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
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
	// ByRegion is Admitted per region (all holders of a region together).
	ByRegion map[string]int64
	// Rate, Period and Burst are the largest R (tokens per Period) and B in
	// force in the interval; Slack is how much earlier than the interval a
	// counted token may have been admitted (the bound covers Length+Slack).
	Rate   int64
	Period time.Duration
	Burst  int64
	Slack  time.Duration
	// Closed is false for the running interval (BucketReports only).
	Closed bool
	// WouldDeny is, for a limit in shadow mode, the cost of the Checks
	// admitted although enforcement would have denied them (not in
	// Admitted), counted as Admitted is; WouldDenyByRegion per region,
	// WouldDenyChecks how many Checks.
	WouldDeny, WouldDenyChecks int64
	WouldDenyByRegion          map[string]int64
	// Shadow: the limit was in shadow mode when a holder reported in
	// the interval (tried, not enforced).
	Shadow bool
}

// Start is the first instant of the interval on the allocator's clock.
func (r BucketReport) Start() time.Time { return time.Unix(0, r.Interval*int64(r.Length)) }

// bucketHistory is how many closed reporting intervals of a bucket limit
// the Core keeps for quotactl windows and the status page: an hour.
const bucketHistory = 60

// holderCounts are a holder's bucket's cumulative counters.
type holderCounts struct {
	admitted, wd, wdc int64
}

// bucketUsage is what the Core adds up for one bucket limit.
type bucketUsage struct {
	seen     map[string]holderCounts // holder key -> the largest counts reported
	index    int64                   // the running interval
	admitted int64                   // counted in the running interval
	rate     int64                   // the largest R in force in it
	period   time.Duration
	burst    int64 // the largest B in force in it
	slack    time.Duration
	byRegion map[string]int64 // counted in the running interval, per region
	// wd, wdc and wdByRegion: would-deny counts of the running interval.
	wd, wdc    int64
	wdByRegion map[string]int64
	shadow     bool
	closed     []BucketReport // the last closed intervals, oldest first, at most bucketHistory
}

// push keeps r as the newest closed interval.
func (u *bucketUsage) push(r BucketReport) {
	if len(u.closed) == bucketHistory {
		u.closed = append(u.closed[:0], u.closed[1:]...)
	}
	u.closed = append(u.closed, r)
}

// running is the interval in progress as a report (Closed false).
func (u *bucketUsage) running() BucketReport {
	return BucketReport{Interval: u.index, Length: BucketInterval, Admitted: u.admitted,
		Bound:    lease.BucketBound(u.rate, u.period, u.burst, BucketInterval+u.slack, 0),
		ByRegion: maps.Clone(u.byRegion), Rate: u.rate, Period: u.period, Burst: u.burst, Slack: u.slack,
		WouldDeny: u.wd, WouldDenyChecks: u.wdc, WouldDenyByRegion: maps.Clone(u.wdByRegion), Shadow: u.shadow}
}

// observeBucket records a holder's counters (admitted, and the would-deny
// ones of shadow mode), reported at now.
// The first count of a holder the Core has no shares of is counted whole
// (its bucket began with its first share); a holder with shares but no
// count (a new leader), or of a tenant of a plan (whose state the core
// forgets when it is idle), starts from its first count.
func (c *Core) observeBucket(now time.Time, l *Limit, hk string, n holderCounts) {
	u := c.bucketUse[l.ID]
	if u == nil {
		u = &bucketUsage{seen: map[string]holderCounts{}, index: lease.WindowOf(now, BucketInterval).Index}
		c.bucketUse[l.ID] = u
	}
	u.roll(now)
	u.rate, u.burst, u.period = max(u.rate, l.Rate), max(u.burst, l.Burst), l.RatePeriod
	u.slack = max(u.slack, bucketSlack(l))
	u.shadow = u.shadow || l.Proto.GetShadow()
	if st := c.shares[l.ID]; st != nil {
		// Shares granted under a larger R or B (before a change made now,
		// or an override that ended) may still be spent, or have been
		// within the slack: the interval's bound counts them at what
		// they were granted under, on a leader that restored them from
		// their records too. Shares of another rate period (a change of
		// the period) are left to the limit's own R, as before.
		since := now.Add(-u.slack).UnixNano()
		for _, gs := range st.byRegion {
			for _, g := range gs {
				if g.ExpiresAt > since && g.PeriodMs == l.RatePeriod.Milliseconds() {
					u.rate, u.burst = max(u.rate, g.LimitRate), max(u.burst, g.LimitBurst)
				}
			}
		}
	}
	prev, known := u.seen[hk]
	if !known {
		// A tenant of a plan whose state was forgotten (forgetShareTenant)
		// may come back with a counter from before, still in its agent or
		// its region's store: unknown to this core too.
		if st := c.shares[l.ID]; st != nil && st.seq[hk] > 0 || l.Proto.GetPlan() != "" {
			u.seen[hk] = holderCounts{max(n.admitted, 0), max(n.wd, 0), max(n.wdc, 0)} // counts from before: unknown to this leader
			return
		}
	}
	region, _, _ := strings.Cut(hk, "/")
	if n.admitted > prev.admitted {
		u.admitted += n.admitted - prev.admitted
		if u.byRegion == nil {
			u.byRegion = map[string]int64{}
		}
		u.byRegion[region] += n.admitted - prev.admitted
	}
	if n.wd > prev.wd {
		u.wd += n.wd - prev.wd
		if u.wdByRegion == nil {
			u.wdByRegion = map[string]int64{}
		}
		u.wdByRegion[region] += n.wd - prev.wd
	}
	if n.wdc > prev.wdc {
		u.wdc += n.wdc - prev.wdc
	}
	u.seen[hk] = holderCounts{max(prev.admitted, n.admitted), max(prev.wd, n.wd), max(prev.wdc, n.wdc)}
}

// roll closes the running interval if now is past it.
func (u *bucketUsage) roll(now time.Time) {
	idx := lease.WindowOf(now, BucketInterval).Index
	if idx <= u.index {
		return
	}
	if u.rate > 0 {
		r := u.running()
		r.Closed = true
		u.push(r)
	}
	// Intervals with no report at all: nothing counted in them (the
	// newest bucketHistory of them kept).
	for i := max(u.index+1, idx-bucketHistory); i < idx; i++ {
		u.push(BucketReport{Interval: i, Length: BucketInterval, Closed: true,
			Bound: lease.BucketBound(u.rate, u.period, u.burst, BucketInterval+u.slack, 0),
			Rate:  u.rate, Period: u.period, Burst: u.burst, Slack: u.slack})
	}
	u.index, u.admitted, u.byRegion = idx, 0, nil
	u.wd, u.wdc, u.wdByRegion, u.shadow = 0, 0, nil, false
}

// BucketReport returns the last closed reporting interval of a bucket
// limit at now (ok false before one closed).
func (c *Core) BucketReport(limit string, now time.Time) (BucketReport, bool) {
	u := c.bucketUse[limit]
	if u == nil {
		return BucketReport{}, false
	}
	u.roll(now)
	if len(u.closed) == 0 {
		return BucketReport{}, false
	}
	r := u.closed[len(u.closed)-1]
	r.Limit = limit
	return r, true
}

// BucketReports returns up to last reporting intervals of a bucket limit
// at now, oldest first, the running one included (Closed false): what
// quotactl windows and the status page show. None before the allocator
// heard of the limit's first share request.
func (c *Core) BucketReports(limit string, now time.Time, last int) []BucketReport {
	u := c.bucketUse[limit]
	if u == nil || last <= 0 {
		return nil
	}
	u.roll(now)
	out := make([]BucketReport, 0, min(last, len(u.closed)+1))
	for _, r := range u.closed[max(0, len(u.closed)-(last-1)):] {
		r.Limit, r.ByRegion, r.WouldDenyByRegion = limit, maps.Clone(r.ByRegion), maps.Clone(r.WouldDenyByRegion)
		out = append(out, r)
	}
	r := u.running()
	r.Limit = limit
	return append(out, r)
}

// ShareInForce is a rate share of a bucket limit that may still be spent.
type ShareInForce struct {
	Region, Holder string
	Rate           int64 // milli-tokens per the limit's rate period
	Burst          int64
	ExpiresAt      time.Time // allocator clock
	Seq            int64
	// Slots, Admit and Held: a concurrency limit's slot share, and what
	// its holder held when it asked.
	Slots, Admit, Held int64
}

// SharesInForce returns the shares of a bucket limit that may still be
// spent at now, by region and holder, each holder's newest first.
func (c *Core) SharesInForce(limit string, now time.Time) []ShareInForce {
	st := c.shares[limit]
	if st == nil {
		return nil
	}
	var out []ShareInForce
	for _, gs := range st.byRegion {
		for i := len(gs) - 1; i >= 0; i-- {
			if g := gs[i]; g.inForce(now) {
				out = append(out, ShareInForce{Region: g.Region, Holder: g.Holder, Rate: g.Rate, Burst: g.Burst,
					ExpiresAt: time.Unix(0, g.ExpiresAt), Seq: g.Seq, Slots: g.Slots, Admit: g.Admit, Held: g.Held})
			}
		}
	}
	slices.SortFunc(out, func(a, b ShareInForce) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Holder, b.Holder), cmp.Compare(b.Seq, a.Seq))
	})
	return out
}

// bucketCollector exports each bucket limit's last closed reporting
// interval: what was admitted and the bound, side by side.
type bucketCollector struct {
	a               *Allocator
	admitted, bound *prometheus.Desc
	intervalSeconds *prometheus.Desc
	// wouldDeny, wouldDenyChecks: a limit in shadow mode (exported for a
	// limit whose interval had would-deny Checks).
	wouldDeny, wouldDenyChecks *prometheus.Desc
}

func newBucketCollector(a *Allocator) *bucketCollector {
	return &bucketCollector{a: a,
		admitted: prometheus.NewDesc("leasehold_bucket_admitted_tokens",
			"Tokens a bucket limit admitted in its last closed reporting interval, all regions (from the agents' counters).", []string{"limit"}, nil),
		bound: prometheus.NewDesc("leasehold_bucket_bound_tokens",
			"The bound on what a bucket limit may admit in its last closed reporting interval: B + R x (interval + slack). Admitted above it is a bug.", []string{"limit"}, nil),
		intervalSeconds: prometheus.NewDesc("leasehold_bucket_interval_seconds",
			"The reporting interval of bucket limits.", nil, nil),
		wouldDeny: prometheus.NewDesc("leasehold_bucket_would_deny_tokens",
			"Cost a bucket limit in shadow mode admitted in its last closed reporting interval although enforcement would have denied it, per region (not in leasehold_bucket_admitted_tokens).", []string{"limit", "region"}, nil),
		wouldDenyChecks: prometheus.NewDesc("leasehold_bucket_would_deny_checks",
			"Checks a bucket limit in shadow mode admitted in its last closed reporting interval although enforcement would have denied them, all regions.", []string{"limit"}, nil),
	}
}

func (c *bucketCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.admitted
	ch <- c.bound
	ch <- c.intervalSeconds
	ch <- c.wouldDeny
	ch <- c.wouldDenyChecks
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
		if r.WouldDenyChecks > 0 {
			ch <- prometheus.MustNewConstMetric(c.wouldDenyChecks, prometheus.GaugeValue, float64(r.WouldDenyChecks), r.Limit)
			for region, n := range r.WouldDenyByRegion {
				ch <- prometheus.MustNewConstMetric(c.wouldDeny, prometheus.GaugeValue, float64(n), r.Limit, region)
			}
		}
	}
}

// BucketStatus is what quotactl windows and the status page show of a
// bucket limit, which has no windows: its reporting intervals and the
// shares in force.
type BucketStatus struct {
	// Intervals: up to the last asked, oldest first, the running one
	// included (Closed false).
	Intervals []BucketReport
	Shares    []ShareInForce
}

// BucketStatus returns a bucket limit's last reporting intervals and the
// shares in force now. It is served by the leader (ErrNotLeader
// elsewhere); ErrNotFound for a limit that is not a bucket limit now and
// has no intervals.
func (a *Allocator) BucketStatus(limit string, last int) (BucketStatus, error) {
	t, err := a.currentTerm()
	if err != nil {
		return BucketStatus{}, err
	}
	now := a.opt.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.core.bucketStatus(now, limit, max(1, last))
}

func (c *Core) bucketStatus(now time.Time, limit string, last int) (BucketStatus, error) {
	l, defined := c.limit(limit)
	bucket := defined && l.At(now).Kind == pb.LimitKind_LIMIT_KIND_BUCKET
	st := BucketStatus{Intervals: c.BucketReports(limit, now, last), Shares: c.SharesInForce(limit, now)}
	switch {
	case len(st.Intervals) > 0:
	case !bucket:
		return BucketStatus{}, fmt.Errorf("%w: bucket limit %q", ErrNotFound, limit)
	default:
		// No share asked for yet: the running interval, nothing counted.
		v := l.At(now)
		slack := bucketSlack(v)
		st.Intervals = []BucketReport{{Limit: limit, Interval: lease.WindowOf(now, BucketInterval).Index, Length: BucketInterval,
			Bound: lease.BucketBound(v.Rate, v.RatePeriod, v.Burst, BucketInterval+slack, 0),
			Rate:  v.Rate, Period: v.RatePeriod, Burst: v.Burst, Slack: slack}}
	}
	return st, nil
}

// ToProto is the report as ListWindows sends it.
func (r BucketReport) ToProto() *pb.BucketIntervalReport {
	start := r.Start()
	return &pb.BucketIntervalReport{LimitId: r.Limit, Start: timestamppb.New(start), End: timestamppb.New(start.Add(r.Length)),
		Closed: r.Closed, Admitted: maps.Clone(r.ByRegion), AdmittedTotal: r.Admitted, Bound: r.Bound,
		RateTokens: r.Rate, RatePeriod: durationpb.New(r.Period), BurstTokens: r.Burst, Slack: durationpb.New(r.Slack),
		WouldDeny: maps.Clone(r.WouldDenyByRegion), WouldDenyTotal: r.WouldDeny, WouldDenyChecks: r.WouldDenyChecks, Shadow: r.Shadow}
}

// ToProto is the share as ListWindows sends it.
func (s ShareInForce) ToProto() *pb.ShareInForce {
	return &pb.ShareInForce{Region: s.Region, Holder: s.Holder, RateMilliTokens: s.Rate, BurstTokens: s.Burst,
		ExpiresAt: timestamppb.New(s.ExpiresAt), Seq: s.Seq, Slots: s.Slots, AdmitSlots: s.Admit, HeldSlots: s.Held}
}
