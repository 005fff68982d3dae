package allocator

import (
	"time"

	"leasehold/internal/zones"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// UsageRecord is what one reporter (an agent replica) counted for one
// (limit, window) in its region: cumulative since the window started.
type UsageRecord struct {
	Limit            string `json:"limit"`
	Window           int64  `json:"w"`
	WindowMs         int64  `json:"wms"`
	PhaseMs          int64  `json:"phms,omitempty"` // the windows' phase offset, ms
	Cal              string `json:"cal,omitempty"`  // calendar windows (zones.Format)
	Region           string `json:"region"`
	Reporter         string `json:"rep"`
	Admitted         int64  `json:"adm"`
	Denied           int64  `json:"den"`
	FallbackAdmitted int64  `json:"fb"`
	Fallback         int32  `json:"fbk,omitempty"` // pb.FallbackKind, the most permissive seen
	RedisRollback    int64  `json:"rr,omitempty"`
	// Released tokens of sub-leases came back unspent: Admitted counts them
	// from the reservation on, and NetAdmitted subtracts them.
	Released int64 `json:"rel,omitempty"`
	// SettleOverrun is what settle-later Checks admitted beyond the
	// region's leases (its settlement term); Admitted counts it.
	SettleOverrun int64 `json:"so,omitempty"`
	// WouldDeny and WouldDenyChecks are, for a limit in shadow mode, the
	// cost and the number of checks admitted although enforcement would
	// have denied them (not in Admitted).
	WouldDeny       int64 `json:"wd,omitempty"`
	WouldDenyChecks int64 `json:"wdc,omitempty"`
	At              int64 `json:"at"` // unix ns of the last change, allocator clock
}

// NetAdmitted is what was admitted: Admitted minus the tokens of sub-lease
// reservations that came back unspent.
func (r UsageRecord) NetAdmitted() int64 { return max(0, r.Admitted-r.Released) }

type reporterKey struct {
	region, reporter string
}

// fallbackRank orders fail modes from strictest to most permissive.
func fallbackRank(k int32) int {
	switch pb.FallbackKind(k) {
	case pb.FallbackKind_FALLBACK_KIND_CLOSED:
		return 1
	case pb.FallbackKind_FALLBACK_KIND_LOCAL:
		return 2
	case pb.FallbackKind_FALLBACK_KIND_OPEN:
		return 3
	}
	return 0
}

// Report merges one cumulative usage report. Counts only grow: a retried or
// reordered report never lowers them, so reports are idempotent. It returns
// the record to persist, or nil when nothing changed.
func (c *Core) Report(now time.Time, region, reporter string, u *pb.Usage) *UsageRecord {
	l, ok := c.limit(u.LimitId)
	var sched lease.Windows
	if ok {
		l = l.forIndex(u.WindowIndex, now)
		sched = l.Windows()
	}
	k := windowKey{u.LimitId, u.WindowIndex}
	ws := c.windows[k]
	if ws == nil && c.summaryOf(k) != nil {
		return nil // the window was swept: see ReportLate
	}
	if ws == nil {
		if !ok {
			return nil // unknown limit and no window to attach to
		}
		ws = c.window(k, sched)
	} else {
		sched = ws.sched
	}
	if ws.usage == nil {
		ws.usage = map[reporterKey]*UsageRecord{}
	}
	rk := reporterKey{region, reporter}
	cur := ws.usage[rk]
	next := UsageRecord{Limit: u.LimitId, Window: u.WindowIndex, WindowMs: sched.Length.Milliseconds(),
		PhaseMs: sched.Phase.Milliseconds(), Cal: zones.Format(sched.Cal), Region: region, Reporter: reporter}
	if cur != nil {
		next = *cur
	}
	changed := next.merge(u) || cur == nil
	if !changed {
		return nil
	}
	next.At = now.UnixNano()
	ws.usage[rk] = &next
	return &next
}

// merge raises r's counts to u's where u's are higher (counts only grow,
// so a retried or reordered report changes nothing) and reports whether
// anything changed.
func (r *UsageRecord) merge(u *pb.Usage) bool {
	changed := false
	grow := func(dst *int64, v int64) {
		if v > *dst {
			*dst, changed = v, true
		}
	}
	grow(&r.Admitted, u.Admitted)
	grow(&r.Denied, u.Denied)
	grow(&r.FallbackAdmitted, u.FallbackAdmitted)
	grow(&r.RedisRollback, u.RedisRollbackTokens)
	grow(&r.Released, u.Released)
	grow(&r.SettleOverrun, u.SettleOverrun)
	grow(&r.WouldDeny, u.WouldDeny)
	grow(&r.WouldDenyChecks, u.WouldDenyChecks)
	if fallbackRank(int32(u.Fallback)) > fallbackRank(r.Fallback) {
		r.Fallback, changed = int32(u.Fallback), true
	}
	return changed
}

// RestoreUsage adds a committed usage record while rebuilding from etcd.
func (c *Core) RestoreUsage(u *UsageRecord) {
	ws := c.window(windowKey{u.Limit, u.Window}, schedOf(u.WindowMs, u.PhaseMs, u.Cal))
	if ws.usage == nil {
		ws.usage = map[reporterKey]*UsageRecord{}
	}
	cp := *u
	ws.usage[reporterKey{u.Region, u.Reporter}] = &cp
}

// RegionUsage sums one window's usage per region over its reporters.
func (c *Core) RegionUsage(limit string, window int64) map[string]UsageRecord {
	ws := c.windows[windowKey{limit, window}]
	if ws == nil {
		return nil
	}
	out := map[string]UsageRecord{}
	for rk, u := range ws.usage {
		s := out[rk.region]
		s.Limit, s.Window, s.WindowMs, s.PhaseMs, s.Cal, s.Region = u.Limit, u.Window, u.WindowMs, u.PhaseMs, u.Cal, u.Region
		s.Admitted += u.Admitted
		s.Denied += u.Denied
		s.FallbackAdmitted += u.FallbackAdmitted
		s.RedisRollback += u.RedisRollback
		s.Released += u.Released
		s.SettleOverrun += u.SettleOverrun
		s.WouldDeny += u.WouldDeny
		s.WouldDenyChecks += u.WouldDenyChecks
		if fallbackRank(u.Fallback) > fallbackRank(s.Fallback) {
			s.Fallback = u.Fallback
		}
		out[rk.region] = s
	}
	return out
}

// summaryOf returns the stored summary of a swept window, if any.
func (c *Core) summaryOf(k windowKey) *WindowSummary {
	for _, s := range c.summaries[k.limit] {
		if s.Window == k.index {
			return s
		}
	}
	return nil
}

// ReportLate merges a usage report of a window whose records were already
// swept into its summary (counts only grow, per region) and returns the
// summary to persist, or nil when nothing changed or the window has no
// summary. Late reports come from agents that could not reach the
// allocator for longer than the retention.
func (c *Core) ReportLate(region string, u *pb.Usage) *WindowSummary {
	k := windowKey{u.LimitId, u.WindowIndex}
	if c.windows[k] != nil {
		return nil
	}
	s := c.summaryOf(k)
	if s == nil {
		return nil
	}
	cur := s.Regions[region]
	next := cur
	next.Limit, next.Window, next.WindowMs, next.PhaseMs, next.Cal, next.Region = s.Limit, s.Window, s.WindowMs, s.PhaseMs, s.Cal, region
	next.merge(u)
	if next == cur {
		return nil
	}
	if s.Regions == nil {
		s.Regions = map[string]UsageRecord{}
	}
	s.Regions[region] = next
	return s
}
