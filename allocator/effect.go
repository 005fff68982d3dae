package allocator

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/internal/limitspec"
	"leasehold/internal/planbind"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// limitFields flattens the fields of a limit that a person sets, by the
// names a FieldChange uses: "limit_tokens", "window", "regions", "mode",
// "fallback.<region>", "lease.ttl", "lease.min_chunk", "lease.max_chunk",
// when set "lease.standing", "owner", "description", "tags.<key>", "hash_tag", "shadow", when set
// "settle_grace", "debt_policy", and for a bucket limit "kind", "rate"
// (e.g. "100/s") and "burst_tokens". A nil limit has none.
func limitFields(l *pb.Limit) map[string]string {
	if l == nil {
		return map[string]string{}
	}
	m := map[string]string{
		"limit_tokens":    strconv.FormatInt(l.LimitTokens, 10),
		"window":          l.GetWindow().AsDuration().String(),
		"regions":         strings.Join(slices.Sorted(slices.Values(l.Regions)), ","),
		"mode":            limitspec.ModeName(l.Mode),
		"lease.ttl":       l.GetLease().GetTtl().AsDuration().String(),
		"lease.min_chunk": strconv.FormatInt(l.GetLease().GetMinChunk(), 10),
		"lease.max_chunk": strconv.FormatInt(l.GetLease().GetMaxChunk(), 10),
		"owner":           l.Owner,
		"description":     l.Description,
		"hash_tag":        l.HashTag,
	}
	if n := l.GetLease().GetStanding(); n != 0 {
		m["lease.standing"] = strconv.FormatInt(n, 10) // absent: no standing shares
	}
	if p := l.GetWindowPhase().AsDuration(); p != 0 {
		m["window_phase"] = p.String() // absent: windows aligned on multiples of W
	}
	if c := l.GetCalendar(); c != nil {
		m["calendar"] = c.GetUnit() + " " + c.GetZone() // absent: fixed windows
	}
	if l.SettleGrace != nil {
		m["settle_grace"] = l.SettleGrace.AsDuration().String()
	}
	if l.DebtPolicy != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED {
		m["debt_policy"] = strings.ToLower(strings.TrimPrefix(l.DebtPolicy.String(), "DEBT_POLICY_"))
	}
	if l.Shadow {
		m["shadow"] = "true" // absent: enforced
	}
	if len(l.Binds) > 0 {
		m["binds"] = strings.Join(slices.Sorted(slices.Values(l.Binds)), ",")
	}
	for id, c := range l.Contracts {
		m["contracts."+id] = limitspec.FormatContract(c)
	}
	if o := l.GetOverride(); o != nil {
		m["override"] = "until " + o.GetEndsAt().AsTime().UTC().Format(time.RFC3339Nano) + ", then version in force before it"
	}
	if l.Kind == pb.LimitKind_LIMIT_KIND_BUCKET {
		period := time.Second
		if l.RatePeriod != nil {
			period = l.RatePeriod.AsDuration()
		}
		m["kind"] = "bucket"
		m["rate"] = limitspec.FormatRate(l.RateTokens, period)
		m["burst_tokens"] = strconv.FormatInt(l.BurstTokens, 10)
	}
	for _, r := range l.Regions {
		m["fallback."+r] = limitspec.FallbackName(l.Fallback[r])
	}
	for k, v := range l.Tags {
		m["tags."+k] = v
	}
	return m
}

// fieldOrder lists the fixed fields in the order a diff shows them;
// fallback.* and tags.* follow their neighbours, by name.
var fieldOrder = []string{"limit_tokens", "window", "window_phase", "calendar", "kind", "rate", "burst_tokens", "regions", "mode", "fallback.", "lease.ttl",
	"lease.min_chunk", "lease.max_chunk", "lease.standing", "owner", "description", "tags.", "hash_tag", "settle_grace", "debt_policy", "shadow", "override", "binds", "contracts."}

func fieldRank(f string) int {
	for i, p := range fieldOrder {
		if f == p || strings.HasSuffix(p, ".") && strings.HasPrefix(f, p) {
			return i
		}
	}
	return len(fieldOrder)
}

// diffLimits lists the fields that differ between two limits (either may
// be nil), in a stable order. Versions and effective times are not
// fields a person sets and are not compared.
func diffLimits(old, next *pb.Limit) []*pb.FieldChange {
	a, b := limitFields(old), limitFields(next)
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(x, y string) int {
		if rx, ry := fieldRank(x), fieldRank(y); rx != ry {
			return rx - ry
		}
		return strings.Compare(x, y)
	})
	var out []*pb.FieldChange
	for _, k := range keys {
		if a[k] != b[k] {
			out = append(out, &pb.FieldChange{Field: k, Old: a[k], New: b[k]})
		}
	}
	return out
}

// boundOf is the overshoot bound of a window of l with no faults: 0 for a
// strict limit, the sum of the LOCAL allowances, or infinite with a
// region in OPEN.
func boundOf(l *pb.Limit) (tokens int64, infinite bool) {
	if l.Mode == pb.Mode_MODE_STRICT {
		return 0, false
	}
	for _, r := range l.Regions {
		switch fb := l.Fallback[r]; fb.GetKind() {
		case pb.FallbackKind_FALLBACK_KIND_OPEN:
			return 0, true
		case pb.FallbackKind_FALLBACK_KIND_LOCAL:
			tokens += fb.LocalTokens
		}
	}
	return tokens, false
}

// effect computes what a change of limit id does to the running window
// at now: stored is the stored limit (nil: the change creates it), next
// the new record (nil: a delete, or a put that changes nothing, then
// unchanged is !deleting).
func (c *Core) effect(now time.Time, id string, stored, next *pb.Limit, deleting bool) *pb.ChangeEffect {
	e := &pb.ChangeEffect{LimitId: id}
	switch {
	case deleting:
		e.Action = "delete"
		e.Changes = diffLimits(stored, nil)
		e.EffectiveFrom = timestamppb.New(now)
	case stored == nil:
		e.Action = "create"
	case next == nil:
		e.Action = "unchanged"
		next = stored
	default:
		e.Action = "update"
	}
	if next != nil {
		if e.Action != "unchanged" {
			e.Changes = diffLimits(stored, next)
		}
		e.EffectiveFrom = next.EffectiveFrom
		e.NewLimitTokens = next.LimitTokens
		e.Bound, e.BoundInfinite = boundOf(next)
	}
	if planbind.IsPlan(id) {
		c.planEffect(now, e, id, next, deleting)
		if windowless(stored) || windowless(next) {
			windowlessEffect(e, stored, next) // its tenants' limits have no windows
		}
		return e
	}
	if windowless(stored) || windowless(next) {
		windowlessEffect(e, stored, next)
		return e
	}
	if stored == nil {
		e.PoolAfter = c.pool(decodeVersion(next), nil)
		return e
	}
	cur := decodeVersion(inForce(stored, now))
	w := cur.Windows().Of(now)
	e.WindowStart = timestamppb.New(w.Start())
	e.CurrentLimitTokens = cur.Tokens
	ws := c.windows[windowKey{id, w.Index}]
	if ws != nil {
		e.Granted = ws.granted - ws.credited
	}
	for _, u := range c.RegionUsage(id, w.Index) {
		e.Admitted += u.NetAdmitted() + u.FallbackAdmitted
	}
	poolNow := c.pool(cur, ws)
	var demands []lease.RegionDemand
	if l, ok := c.limit(id); ok {
		demands = c.reported(now, l.At(now))
	}
	switch {
	case deleting:
		e.PoolAfter = 0
	case e.Action == "unchanged" || !governsNow(next, now):
		// The running window finishes under the version in force; the
		// change is judged on the first window it governs.
		e.PoolAfter = poolNow
		if e.Action != "unchanged" {
			nv := decodeVersion(next)
			// Over the whole first window the change governs: its own
			// length under each version (a calendar window's varies).
			at := now
			if ef := next.GetEffectiveFrom(); ef != nil {
				at = ef.AsTime()
			}
			before := denying(demands, cur, cur.Tokens, cur.Windows().Of(at).Length, false)
			after := denying(demands, nv, nv.Tokens, nv.Windows().Of(at).Length, false)
			e.RegionsDenying = started(before, after)
		}
	default:
		nv := decodeVersion(next)
		nw := nv.Windows().Of(now)
		nws := ws
		if nw != w {
			nws = c.windows[windowKey{id, nw.Index}]
		}
		e.PoolAfter = c.pool(nv, nws)
		before := denying(demands, cur, poolNow, w.Left(now), true)
		after := denying(demands, nv, e.PoolAfter, nw.Left(now), true)
		e.RegionsDenying = started(before, after)
	}
	return e
}

// governsNow reports whether the record governs the running window.
func governsNow(next *pb.Limit, now time.Time) bool {
	return !scheduled(next, now)
}

// denying returns the regions of v whose demand over left exceeds what
// they would have: what they hold (when held) plus their demand-weighted
// share of pool.
func denying(demands []lease.RegionDemand, v *Limit, pool int64, left time.Duration, held bool) []string {
	var sum float64
	for _, d := range demands {
		if v.HasRegion(d.Region) {
			sum += d.Rate
		}
	}
	var out []string
	for _, d := range demands {
		if !v.HasRegion(d.Region) || d.Rate <= 0 {
			continue
		}
		have := float64(pool) * d.Rate / sum
		if held {
			have += float64(d.Held)
		}
		if d.Rate*left.Seconds() > have {
			out = append(out, d.Region)
		}
	}
	slices.Sort(out)
	return out
}

// started lists the regions in after that are not in before.
func started(before, after []string) []string {
	var out []string
	for _, r := range after {
		if !slices.Contains(before, r) {
			out = append(out, r)
		}
	}
	return out
}

// windowlessEffect sets what the effect of a change of a bucket or
// concurrency limit (or plan) says: such a limit has no window, pool or
// window bound, so no G and no bound; its kind, and a concurrency
// limit's new N. The rest is its changes and when they govern (at once).
func windowlessEffect(e *pb.ChangeEffect, stored, next *pb.Limit) {
	e.NewLimitTokens, e.Bound, e.BoundInfinite = 0, 0, false
	e.Kind = pb.LimitKind_LIMIT_KIND_BUCKET
	if isConcurrency(stored) || isConcurrency(next) {
		e.Kind = pb.LimitKind_LIMIT_KIND_CONCURRENCY
		if next != nil {
			e.NewLimitTokens = next.LimitTokens // N
		}
	}
}
