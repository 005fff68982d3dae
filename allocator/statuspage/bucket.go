package statuspage

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"leasehold/allocator"
	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// A bucket limit (rate R per period, burst B) has no windows: the page
// shows its reporting intervals (what the regions admitted beside the
// bound B + R x (interval + slack)) and the rate shares in force.

// isBucket tells whether l is a bucket limit.
func isBucket(l *pb.Limit) bool { return l.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET }

// rateDesc is a bucket limit's rate and burst: "100/s, burst 200".
func rateDesc(l *pb.Limit) string {
	p := l.GetRatePeriod().AsDuration()
	if l.GetRatePeriod() == nil {
		p = limitspec.DefaultRatePeriod
	}
	return limitspec.FormatRate(l.GetRateTokens(), p) + ", burst " + fmtInt(l.GetBurstTokens())
}

// intervalRow is one reporting interval as the tables show it.
type intervalRow struct {
	Start         time.Time
	Running       bool
	Rate          string // the largest R in force, "100/s"
	Burst         int64
	Admitted      []int64 // per region, in the table's region order
	AdmittedTotal int64
	Bound         int64
	Slack         string
	OverBound     bool
	// WouldDeny: shadow mode, "12 checks (340 tokens)"; "" for none.
	WouldDeny       string
	WouldDenyChecks int64
}

func newIntervalRow(r allocator.BucketReport, regions []string) intervalRow {
	ir := intervalRow{Start: r.Start(), Running: !r.Closed, Burst: r.Burst, AdmittedTotal: r.Admitted, Bound: r.Bound,
		Slack: fmtDuration(r.Slack), OverBound: r.Admitted > r.Bound, Rate: "-"}
	if r.Rate > 0 && r.Period > 0 {
		ir.Rate = limitspec.FormatRate(r.Rate, r.Period)
	}
	for _, reg := range regions {
		ir.Admitted = append(ir.Admitted, r.ByRegion[reg])
	}
	if r.WouldDenyChecks > 0 {
		ir.WouldDenyChecks = r.WouldDenyChecks
		ir.WouldDeny = fmtInt(r.WouldDenyChecks) + " checks (" + fmtInt(r.WouldDeny) + " tokens)"
	}
	return ir
}

// shareRow is a rate share in force.
type shareRow struct {
	Region, Holder string
	Rate           string // tokens per period, to a thousandth
	Burst          int64
	Expires        time.Time
	Seq            int64
}

// shareRate writes milli-tokens per period as tokens: "33.333/s".
func shareRate(milli int64, period time.Duration) string {
	n := strconv.FormatInt(milli/1000, 10)
	if f := milli % 1000; f != 0 {
		n += strings.TrimRight("."+strconv.FormatInt(1000+f, 10)[1:], "0")
	}
	return n + strings.TrimPrefix(limitspec.FormatRate(1, period), "1")
}

// bucketView is the bucket part of a limit's page.
type bucketView struct {
	Intervals []intervalRow // newest first
	Shares    []shareRow
}

// bucketStatus returns a bucket limit's intervals and shares; ok false
// when they cannot be had from this replica (the fetcher says why).
func (f *fetcher) bucketStatus(id string, last int) (allocator.BucketStatus, bool) {
	if f.follower || f.err != nil {
		return allocator.BucketStatus{}, false
	}
	st, err := f.src.BucketStatus(id, last)
	if err == nil {
		return st, true
	}
	f.note(err)
	return allocator.BucketStatus{}, false
}

// bucketRow fills a bucket limit's table row: its last closed interval,
// and a critical alert when that admitted more than its bound.
func bucketRow(rw *row, l *pb.Limit, st allocator.BucketStatus) {
	rw.Bucket, rw.Window = true, rateDesc(l)
	for i := len(st.Intervals) - 1; i >= 0; i-- {
		if st.Intervals[i].Closed {
			ir := newIntervalRow(st.Intervals[i], l.GetRegions())
			rw.LastInterval = &ir
			break
		}
	}
	if rw.LastInterval != nil && rw.LastInterval.OverBound {
		rw.Alerts, rw.Level = append(rw.Alerts, alertTag{"admitted > bound", "crit"}), "crit"
	}
	if rw.LastInterval != nil && (l.GetShadow() || rw.LastInterval.WouldDenyChecks > 0) {
		// Shadow mode: not enforced; what enforcement would have denied.
		rw.Alerts = append(rw.Alerts, alertTag{"shadow: would deny " + fmtInt(rw.LastInterval.WouldDenyChecks) + " checks", "info"})
	}
}

// newBucketView builds the bucket part of a limit's page.
func newBucketView(l *pb.Limit, st allocator.BucketStatus, regions []string) *bucketView {
	bv := &bucketView{}
	for i := len(st.Intervals) - 1; i >= 0; i-- {
		bv.Intervals = append(bv.Intervals, newIntervalRow(st.Intervals[i], regions))
	}
	period := limitspec.DefaultRatePeriod
	if l.GetRatePeriod() != nil && l.GetRatePeriod().AsDuration() > 0 {
		period = l.GetRatePeriod().AsDuration()
	}
	for _, s := range st.Shares {
		bv.Shares = append(bv.Shares, shareRow{Region: s.Region, Holder: s.Holder, Rate: shareRate(s.Rate, period),
			Burst: s.Burst, Expires: s.ExpiresAt, Seq: s.Seq})
	}
	return bv
}

// bucketRegions is the limit's regions followed by any other region its
// intervals or shares name.
func bucketRegions(l *pb.Limit, st allocator.BucketStatus) []string {
	out := slices.Clone(l.GetRegions())
	seen := map[string]bool{}
	for _, r := range out {
		seen[r] = true
	}
	var extra []string
	add := func(r string) {
		if !seen[r] {
			seen[r] = true
			extra = append(extra, r)
		}
	}
	for _, r := range st.Intervals {
		for reg := range r.ByRegion {
			add(reg)
		}
	}
	for _, s := range st.Shares {
		add(s.Region)
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// shareDesc describes a bucket limit's share settings.
func shareDesc(ls *pb.LeaseSettings) string {
	ttl := fmtDuration(allocator.DefaultShareTTL)
	if d := ls.GetTtl().AsDuration(); d > 0 {
		ttl = fmtDuration(d)
	}
	return "rate shares, ttl " + ttl + ", renewed at half their life"
}

// slotShareDesc describes a concurrency limit's share settings.
func slotShareDesc(ls *pb.LeaseSettings) string {
	ttl := fmtDuration(allocator.DefaultShareTTL)
	if d := ls.GetTtl().AsDuration(); d > 0 {
		ttl = fmtDuration(d)
	}
	return "slot shares, ttl " + ttl + ", renewed at half their life; a slot ends with the share it was counted under"
}
