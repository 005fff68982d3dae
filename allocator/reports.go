package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/internal/planbind"
	"leasehold/internal/zones"
	"leasehold/lease"
	"leasehold/overshoot"
	pb "leasehold/proto/leasehold/v1"
)

// WindowReport is one (limit, window) as SREs see it: the overshoot
// package's report plus whether the window is over and each region's
// fail mode in it.
type WindowReport struct {
	overshoot.Report
	// Closed is false for the window still running (its counts grow).
	Closed bool `json:"closed"`
	// Fallback is, per region, the most permissive fail mode in force in
	// the window (absent: none).
	Fallback map[string]pb.FallbackKind `json:"fallback,omitempty"`
	// WouldDeny is, per region, the cost admitted in shadow mode that
	// enforcement would have denied (not in Admitted); WouldDenyChecks
	// counts those checks, all regions together.
	WouldDeny       map[string]int64 `json:"would_deny,omitempty"`
	WouldDenyTotal  int64            `json:"would_deny_total,omitempty"`
	WouldDenyChecks int64            `json:"would_deny_checks,omitempty"`
	// Shadow: the limit was in shadow mode at the window's end.
	Shadow bool `json:"shadow,omitempty"`
	// Plan names the plan the limit was resolved from ("" for a limit
	// with a record of its own).
	Plan string `json:"plan,omitempty"`
	// Standing is the part of Granted that is the regions' standing
	// shares.
	Standing int64 `json:"standing,omitempty"`
	// Calendar is the window's calendar (zero for fixed windows).
	Calendar lease.Calendar `json:"-"`
}

// WindowSummary is what is kept of a closed window once its grant and
// usage records are removed: enough to report it. Stored in etcd, the last
// N per limit.
type WindowSummary struct {
	Limit    string                 `json:"limit"`
	Window   int64                  `json:"w"`
	WindowMs int64                  `json:"wms"`
	PhaseMs  int64                  `json:"phms,omitempty"`     // the windows' phase offset
	Cal      string                 `json:"cal,omitempty"`      // calendar windows (zones.Format)
	G        int64                  `json:"g"`                  // G at the window's end
	MaxG     int64                  `json:"maxg"`               // largest G in force at a grant
	Granted  int64                  `json:"granted"`            // leases and standing shares
	Standing int64                  `json:"standing,omitempty"` // of Granted, the regions' standing shares
	Credited int64                  `json:"credited"`
	Late     int64                  `json:"late,omitempty"`
	Regions  map[string]UsageRecord `json:"regions,omitempty"`
	// Local is, per region, the local:A allowance in force (for the bound).
	Local map[string]int64 `json:"local,omitempty"`
	// Shadow: the limit was in shadow mode (tried, not enforced).
	Shadow bool `json:"shadow,omitempty"`
	// Plan: the limit was resolved from this plan.
	Plan string `json:"plan,omitempty"`
}

// summarize captures a window of the core (nil if it has none).
func (c *Core) summarize(k windowKey) *WindowSummary {
	ws := c.windows[k]
	if ws == nil {
		return nil
	}
	s := &WindowSummary{Limit: k.limit, Window: k.index, WindowMs: ws.sched.Length.Milliseconds(),
		PhaseMs: ws.sched.Phase.Milliseconds(), Cal: zones.Format(ws.sched.Cal), G: ws.maxG, MaxG: ws.maxG,
		Granted: ws.granted, Credited: ws.credited, Late: ws.late, Regions: c.RegionUsage(k.limit, k.index)}
	if l, ok := c.limit(k.limit); ok {
		v := l
		win := ws.sched.ByIndex(k.index)
		switch {
		case l.Previous != nil:
			v = l.At(win.Start())
		case l.After != nil:
			// An override ends mid-window: G at the window's end (the
			// bound's limit_lowered term covers grants made under a
			// higher G before).
			v = l.At(win.End().Add(-1))
		}
		s.G = v.Tokens
		if st := l.At(win.Start()); st.Standing > 0 {
			// The shares were counted as granted from the window's
			// start, under the G that governed it.
			s.Standing = st.standingTotal()
			s.Granted += s.Standing
			s.MaxG = max(s.MaxG, st.Tokens)
		}
		s.Local = localAllowances(v)
		s.Shadow = v.Proto.GetShadow()
		s.Plan = v.Proto.GetPlan()
	}
	return s
}

func localAllowances(l *Limit) map[string]int64 {
	var m map[string]int64
	for r, fb := range l.Proto.GetFallback() {
		if fb.GetKind() == pb.FallbackKind_FALLBACK_KIND_LOCAL {
			if m == nil {
				m = map[string]int64{}
			}
			m[r] = fb.LocalTokens
		}
	}
	return m
}

// RestoreSummary adds a stored summary while rebuilding from etcd.
func (c *Core) RestoreSummary(s *WindowSummary) {
	c.summaries[s.Limit] = append(c.summaries[s.Limit], s)
	slices.SortFunc(c.summaries[s.Limit], func(a, b *WindowSummary) int { return int(a.Window - b.Window) })
}

// keepSummary records a summary and returns the windows of summaries
// dropped beyond the last keep of that limit.
func (c *Core) keepSummary(s *WindowSummary, keep int) []int64 {
	list := append(c.summaries[s.Limit], s)
	slices.SortFunc(list, func(a, b *WindowSummary) int { return int(a.Window - b.Window) })
	var dropped []int64
	for len(list) > keep {
		dropped = append(dropped, list[0].Window)
		list = list[1:]
	}
	c.summaries[s.Limit] = list
	return dropped
}

// report builds the report of one window from live state or its summary.
func (c *Core) report(now time.Time, limit string, index int64) (WindowReport, bool) {
	var s *WindowSummary
	if _, live := c.windows[windowKey{limit, index}]; live {
		s = c.summarize(windowKey{limit, index})
	} else {
		s = c.summaryOf(windowKey{limit, index})
	}
	if s == nil {
		return WindowReport{}, false
	}
	w := overshoot.Window{Limit: s.G, LimitAtGrant: s.MaxG, Granted: s.Granted, Returned: s.Credited}
	fallback := map[string]pb.FallbackKind{}
	var wouldDeny map[string]int64
	var wouldDenyTotal, wouldDenyChecks int64
	regions := make([]string, 0, len(s.Regions))
	for r := range s.Regions {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	for _, r := range regions {
		u := s.Regions[r]
		reg := overshoot.Region{Name: r, Admitted: u.NetAdmitted(), FallbackAdmitted: u.FallbackAdmitted,
			Fallback: overshoot.FallbackMode(fallbackRank(u.Fallback)), LocalAllowance: s.Local[r]}
		reg.SettleOverrun = u.SettleOverrun
		if u.RedisRollback > 0 {
			reg.Failovers = []overshoot.Failover{{Observed: u.RedisRollback}}
		}
		if u.Fallback != 0 {
			fallback[r] = pb.FallbackKind(u.Fallback)
		}
		if u.WouldDeny > 0 || u.WouldDenyChecks > 0 {
			if wouldDeny == nil {
				wouldDeny = map[string]int64{}
			}
			wouldDeny[r] = u.WouldDeny
			wouldDenyTotal += u.WouldDeny
			wouldDenyChecks += u.WouldDenyChecks
		}
		w.Regions = append(w.Regions, reg)
	}
	win := schedOf(s.WindowMs, s.PhaseMs, s.Cal).ByIndex(index)
	rep := WindowReport{
		Report:    overshoot.NewReport(limit, win.Start(), win.End(), w),
		Closed:    !now.Before(win.End()),
		Fallback:  fallback,
		WouldDeny: wouldDeny, WouldDenyTotal: wouldDenyTotal, WouldDenyChecks: wouldDenyChecks, Shadow: s.Shadow, Plan: s.Plan,
		Standing: s.Standing, Calendar: win.Cal,
	}
	return rep, true
}

// Reports returns up to last windows of a limit, oldest first, ending with
// the running one: the windows that have data (grants, returns, usage) or
// a stored summary. It is served by the leader (ErrNotLeader elsewhere);
// ErrNotFound for a limit with neither a definition nor reports.
func (a *Allocator) Reports(limit string, last int) ([]WindowReport, error) {
	t, err := a.currentTerm()
	if err != nil {
		return nil, err
	}
	last = max(1, last)
	now := a.opt.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.core.reports(now, limit, last)
}

func (c *Core) reports(now time.Time, limit string, last int) ([]WindowReport, error) {
	var sched lease.Windows
	if l, ok := c.limit(limit); ok {
		sched = l.At(now).Windows()
	} else if ss := c.summaries[limit]; len(ss) > 0 {
		sched = schedOf(ss[len(ss)-1].WindowMs, ss[len(ss)-1].PhaseMs, ss[len(ss)-1].Cal)
	} else {
		return nil, fmt.Errorf("%w: limit %q", ErrNotFound, limit)
	}
	cur := sched.Of(now).Index
	var idx []int64
	for k := range c.windows {
		if k.limit == limit && k.index <= cur {
			idx = append(idx, k.index)
		}
	}
	for _, s := range c.summaries[limit] {
		idx = append(idx, s.Window)
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	if len(idx) > last {
		idx = idx[len(idx)-last:]
	}
	out := make([]WindowReport, 0, len(idx))
	for _, i := range idx {
		if r, ok := c.report(now, limit, i); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// Limits returns every limit (any replica; read from etcd), for the
// status page: the limit records, without the plans' (which are never
// checked), and, on the leader, the tenants' limits resolved from plans
// that have windows kept (the used ones), in id order.
func (a *Allocator) Limits(ctx context.Context) ([]*pb.Limit, error) {
	all, err := a.store.AllLimits(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	now := a.opt.now()
	for _, l := range all {
		if !planbind.IsPlan(l.Id) {
			// As GetLimit shows it: an override that ended is the
			// version it returned to, before the sweep records its end.
			out = append(out, asShown(l, now))
		}
	}
	if t, err := a.currentTerm(); err == nil {
		t.mu.Lock()
		t.core.eachLimit(func(_ string, l *Limit) {
			if l.Proto.GetPlan() != "" {
				out = append(out, asShown(l.Proto, now))
			}
		})
		t.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y *pb.Limit) int { return strings.Compare(x.Id, y.Id) })
	return out, nil
}

// summaryKey is where a window's summary lives.
func (s *Store) summaryKey(limit string, window int64) string {
	return s.prefix + "windows/" + strings.TrimSuffix(windowPart(limit, window), "/")
}

func (s *Store) summariesPrefix() string { return s.prefix + "windows/" }

// ToProto renders a report for the Admin API.
func (r WindowReport) ToProto() *pb.WindowReport {
	out := &pb.WindowReport{
		LimitId:           r.Limit,
		WindowStart:       timestamppb.New(r.WindowStart),
		WindowEnd:         timestamppb.New(r.WindowEnd),
		Closed:            r.Closed,
		LimitTokens:       r.LimitTokens,
		Granted:           r.Granted,
		Standing:          r.Standing,
		Returned:          r.Returned,
		Admitted:          r.Admitted,
		AdmittedTotal:     r.AdmittedTotal,
		FallbackAdmitted:  r.FallbackAdmitted,
		BoundInfinite:     r.Bound.Infinite,
		ObservedOvershoot: r.ObservedOvershoot,
		Stranded:          r.Stranded,
		Terms: &pb.BoundTerms{CarryOver: r.Terms.CarryOver, Fallback: r.Terms.Fallback, LostGrants: r.Terms.LostGrants,
			RedisRollback: r.Terms.RedisRollback, LimitLowered: r.Terms.LimitLowered, Settlement: r.Terms.Settlement},
		Fallback:        r.Fallback,
		WouldDeny:       r.WouldDeny,
		WouldDenyTotal:  r.WouldDenyTotal,
		WouldDenyChecks: r.WouldDenyChecks,
		Shadow:          r.Shadow,
		Plan:            r.Plan,
		Calendar:        calpb(r.Calendar),
	}
	if !r.Bound.Infinite {
		out.Bound = r.Bound.Tokens
	}
	return out
}
