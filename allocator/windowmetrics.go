package allocator

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"leasehold/internal/planbind"
	pb "leasehold/proto/leasehold/v1"
)

// windowCollector exports, per limit, its last closed window (and each
// region's fail mode in the running one), computed from the leader's core
// at scrape time. A follower exports none of them.
//
// Cardinality: with 100k limits a label per limit would be 100k x (7 +
// regions) series. The collector exports at most reportLimits limits,
// chosen by need: first every limit whose last window went over its
// bound, lost grants, has a region in LOCAL or OPEN fallback, or stranded
// more than 10% of G; then the limits that admitted most. Totals without
// a limit label (windows over bound) cover everything.
type windowCollector struct {
	a *Allocator

	limitTokens, admitted, fallbackAdmitted, bound, observed, stranded, lost, settlement, mode, exported *prometheus.Desc
	wouldDeny, wouldDenyChecks, overrideEnd                                                              *prometheus.Desc
}

func newWindowCollector(a *Allocator) *windowCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &windowCollector{
		a:                a,
		limitTokens:      d("leasehold_window_limit_tokens", "G of the limit's last closed window.", "limit"),
		admitted:         d("leasehold_window_admitted_tokens", "Tokens admitted in the last closed window, per region (leases and fallback).", "limit", "region"),
		fallbackAdmitted: d("leasehold_window_fallback_admitted_tokens", "Tokens admitted under LOCAL or OPEN fallback in the last closed window, per region.", "limit", "region"),
		bound:            d("leasehold_overshoot_bound_tokens", "The computed bound on tokens admitted above G in the last closed window (+Inf while a region was OPEN).", "limit"),
		observed:         d("leasehold_overshoot_observed_tokens", "Tokens admitted above G in the last closed window: max(0, admitted - G). Above the bound is a bug.", "limit"),
		stranded:         d("leasehold_stranded_tokens", "Tokens granted in the last closed window that were neither returned nor admitted.", "limit"),
		lost:             d("leasehold_lost_grants_tokens", "Tokens granted beyond G in the last closed window: above 0 is an allocator bug.", "limit"),
		settlement:       d("leasehold_window_settlement_tokens", "The bound's settlement term in the last closed window: cost settle-later Checks admitted beyond the window's leases.", "limit"),
		mode:             d("leasehold_region_fallback_mode", "Most permissive fail mode in force per region in the running window: 0 none, 1 closed, 2 local, 3 open.", "limit", "region"),
		exported:         d("leasehold_report_limits", "Limits exported with a limit label by the window metrics (capped)."),
		wouldDeny: d("leasehold_window_would_deny_tokens",
			"Shadow mode: tokens admitted in the last closed window that enforcement would have denied, per region (not in admitted).", "limit", "region"),
		overrideEnd: d("leasehold_limit_override_end_timestamp_seconds",
			"When the override in force on a limit ends (Unix seconds; absent without one): the version before it governs again then.", "limit"),
		wouldDenyChecks: d("leasehold_window_would_deny_checks",
			"Shadow mode: checks admitted in the last closed window that enforcement would have denied, all regions.", "limit"),
	}
}

func (c *windowCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.limitTokens, c.admitted, c.fallbackAdmitted, c.bound, c.observed, c.stranded, c.lost, c.settlement, c.mode, c.exported, c.wouldDeny, c.wouldDenyChecks, c.overrideEnd} {
		ch <- d
	}
}

type limitRow struct {
	rep      WindowReport
	mode     map[string]pb.FallbackKind // running window
	fallback map[string]int64           // fallback-admitted per region, last closed window
	regions  []string
	priority bool
}

func (c *windowCollector) Collect(ch chan<- prometheus.Metric) {
	var rows []limitRow
	// Overrides in force: every one of a limit or a plan (there are few,
	// and each is an emergency); of a plan's tenants, which may be
	// 100,000, at most reportLimits (tenantOverrideSeries).
	overrides, tenantOverrides := map[string]time.Time{}, map[string]time.Time{}
	err := c.a.View(func(now time.Time, core *Core) {
		core.eachLimit(func(id string, l *Limit) {
			if l.After != nil && now.Before(l.OverrideEnds) {
				if _, explicit := core.limits[id]; explicit {
					overrides[id] = l.OverrideEnds
				} else {
					tenantOverrides[id] = l.OverrideEnds
				}
			}
			if l.At(now).Windowless() {
				return // bucketCollector's, or a concurrency limit's (no windows)
			}
			cur := l.At(now).Windows().Of(now).Index
			rep, ok := core.report(now, id, cur-1)
			if !ok {
				return
			}
			row := limitRow{rep: rep, mode: map[string]pb.FallbackKind{}, fallback: map[string]int64{}, regions: l.Regions}
			for r, u := range core.windowUsage(id, cur-1) {
				row.fallback[r] = u.FallbackAdmitted
			}
			if run, ok := core.report(now, id, cur); ok {
				row.mode = run.Fallback
			}
			row.priority = rep.ObservedOvershoot > 0 && !rep.Bound.Infinite && rep.ObservedOvershoot > rep.Bound.Tokens ||
				rep.Terms.LostGrants > 0 || rep.Stranded*10 > rep.LimitTokens || rep.WouldDenyChecks > 0
			for _, k := range rep.Fallback {
				row.priority = row.priority || k == pb.FallbackKind_FALLBACK_KIND_LOCAL || k == pb.FallbackKind_FALLBACK_KIND_OPEN
			}
			for _, k := range row.mode {
				row.priority = row.priority || k == pb.FallbackKind_FALLBACK_KIND_OPEN
			}
			rows = append(rows, row)
		})
		for id, l := range core.limits {
			if planbind.IsPlan(id) && l.After != nil && now.Before(l.OverrideEnds) {
				overrides[id] = l.OverrideEnds // an override of a plan: the plan's series too (its used tenants have theirs, capped)
			}
		}
	})
	if err != nil {
		return // a follower exports no window metrics
	}
	slices.SortFunc(rows, func(x, y limitRow) int {
		switch {
		case x.priority != y.priority:
			if x.priority {
				return -1
			}
			return 1
		case x.rep.AdmittedTotal != y.rep.AdmittedTotal:
			if x.rep.AdmittedTotal > y.rep.AdmittedTotal {
				return -1
			}
			return 1
		}
		return strings.Compare(x.rep.Limit, y.rep.Limit)
	})
	if len(rows) > c.a.opt.reportLimits {
		rows = rows[:c.a.opt.reportLimits]
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, r := range rows {
		id := r.rep.Limit
		g(c.limitTokens, float64(r.rep.LimitTokens), id)
		g(c.bound, r.rep.Bound.Float64(), id)
		g(c.observed, float64(r.rep.ObservedOvershoot), id)
		g(c.stranded, float64(r.rep.Stranded), id)
		g(c.lost, float64(r.rep.Terms.LostGrants), id)
		g(c.settlement, float64(r.rep.Terms.Settlement), id)
		for region, n := range r.rep.Admitted {
			g(c.admitted, float64(n), id, region)
		}
		for _, reg := range r.regions {
			g(c.mode, float64(r.mode[reg]), id, reg)
		}
		for region, n := range r.fallback {
			g(c.fallbackAdmitted, float64(n), id, region)
		}
		if r.rep.Shadow || r.rep.WouldDenyChecks > 0 {
			for _, reg := range r.regions {
				g(c.wouldDeny, float64(r.rep.WouldDeny[reg]), id, reg)
			}
			g(c.wouldDenyChecks, float64(r.rep.WouldDenyChecks), id)
		}
	}
	g(c.exported, float64(len(rows)))
	for id, end := range overrides {
		g(c.overrideEnd, float64(end.UnixMilli())/1000, id)
	}
	for _, id := range tenantOverrideSeries(tenantOverrides, rows, c.a.opt.reportLimits) {
		g(c.overrideEnd, float64(tenantOverrides[id].UnixMilli())/1000, id)
	}
}

// tenantOverrideSeries picks, of the plan tenants under an override of
// their plan (ends), those that get a series of their own: at most n,
// first the tenants exported with window metrics (rows, in their order:
// by need, then by admitted), then the others by id. The plan's own
// series covers the rest.
func tenantOverrideSeries(ends map[string]time.Time, rows []limitRow, n int) []string {
	out := make([]string, 0, min(len(ends), n))
	taken := map[string]bool{}
	for _, r := range rows {
		if len(out) == n {
			return out
		}
		if _, ok := ends[r.rep.Limit]; ok {
			out = append(out, r.rep.Limit)
			taken[r.rep.Limit] = true
		}
	}
	rest := make([]string, 0, len(ends))
	for id := range ends {
		if !taken[id] {
			rest = append(rest, id)
		}
	}
	slices.Sort(rest)
	return append(out, rest[:min(len(rest), n-len(out))]...)
}

// windowUsage is a window's usage per region, live or from its summary.
func (c *Core) windowUsage(limit string, index int64) map[string]UsageRecord {
	if _, live := c.windows[windowKey{limit, index}]; live {
		return c.RegionUsage(limit, index)
	}
	if s := c.summaryOf(windowKey{limit, index}); s != nil {
		return s.Regions
	}
	return nil
}

// countClosed counts a window that closed above its bound (the core's lock
// is held by the caller).
func (a *Allocator) countClosed(core *Core, k windowKey) {
	rep, ok := core.report(a.opt.now(), k.limit, k.index)
	if !ok {
		return
	}
	if !rep.Bound.Infinite && rep.ObservedOvershoot > rep.Bound.Tokens {
		a.m.overBound.Inc()
		a.log.Error("window admitted more than its bound: this is a bug", "limit", k.limit, "window", k.index,
			"admitted", rep.AdmittedTotal, "limit_tokens", rep.LimitTokens, "bound", rep.Bound.String())
	}
}
