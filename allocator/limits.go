package allocator

import (
	"slices"
	"time"

	"leasehold/internal/limitspec"
	"leasehold/internal/zones"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Limit is the allocator's view of a limit, decoded once from its record.
// Immutable once built: a change replaces the value.
type Limit struct {
	ID     string
	Tokens int64         // G
	Window time.Duration // W
	Phase  time.Duration // the windows' phase offset φ (0 <= φ < W)
	// Cal, when its Loc is set, gives the version calendar windows
	// (Limit.calendar) instead: Window and Phase are then 0, and each
	// window has its own length.
	Cal      lease.Calendar
	Regions  []string      // sorted
	TTL      time.Duration // lease ttl (<= W)
	MinChunk int64
	MaxChunk int64
	// Standing is each region's standing share of every window: counted
	// as granted to each of Regions from the window's start, without a
	// request or a record (Limit.standingTotal).
	Standing int64
	Version  int64
	// Kind is what the limit counts. A BUCKET limit has a rate of Rate
	// tokens per RatePeriod and a burst of Burst tokens instead of Tokens
	// per Window; its regions hold rate shares (shares.go).
	Kind       pb.LimitKind
	Rate       int64
	RatePeriod time.Duration
	Burst      int64
	Proto      *pb.Limit // as stored, for Admin and SyncLimits
	// EffectiveFrom is when this version starts to govern; Previous is the
	// version that governs before it (nil when none is scheduled).
	// Windows are decided by the version that governs their start.
	EffectiveFrom time.Time
	Previous      *Limit
	// OverrideEnds is when an override (this version) ends and After, the
	// version in force before it, governs again (nil: no override). The
	// end is stored state read against the clock: every replica, a new
	// leader included, switches at the same instant, and nothing has to
	// be written for it.
	OverrideEnds time.Time
	After        *Limit
}

// At returns the version of l that governs instant t: Previous before
// EffectiveFrom, After from OverrideEnds on, l otherwise.
func (l *Limit) At(t time.Time) *Limit {
	if l.Previous != nil && t.Before(l.EffectiveFrom) {
		return l.Previous
	}
	if l.After != nil && !t.Before(l.OverrideEnds) {
		return l.After
	}
	return l
}

// forIndex returns the version whose window of that index this is. An
// index means a different instant under each version's window length;
// the version that governs the start of its reading wins, and when both
// readings are governed by their own version (window lengths differ), the
// reading nearest to now.
func (l *Limit) forIndex(index int64, now time.Time) *Limit {
	if l.Previous == nil && l.After == nil {
		return l
	}
	var best *Limit
	var bestDist time.Duration
	for _, v := range []*Limit{l, l.Previous, l.After} {
		if v == nil {
			continue
		}
		start := v.Windows().ByIndex(index).Start()
		if l.At(start) != v {
			continue
		}
		d := now.Sub(start)
		if d < 0 {
			d = -d
		}
		if best == nil || d < bestDist {
			best, bestDist = v, d
		}
	}
	if best == nil {
		return l.At(now)
	}
	return best
}

// standingTotal is what the version's standing shares take from each of
// its windows' pools: every region's, whether or not it spends them.
func (l *Limit) standingTotal() int64 { return l.Standing * int64(len(l.Regions)) }

// HasRegion reports whether region r spends this limit.
func (l *Limit) HasRegion(r string) bool {
	_, ok := slices.BinarySearch(l.Regions, r)
	return ok
}

// decodeLimit turns a validated, stored limit into the core's view, with
// the version it replaces while that one is still in force.
func decodeLimit(p *pb.Limit) *Limit {
	l := decodeVersion(p)
	if p.Previous != nil && p.EffectiveFrom != nil {
		l.EffectiveFrom = p.EffectiveFrom.AsTime()
		l.Previous = decodeVersion(p.Previous)
	}
	if o := p.GetOverride(); o.GetAfter() != nil && o.GetEndsAt() != nil {
		l.OverrideEnds = o.EndsAt.AsTime()
		l.After = decodeVersion(afterOf(p))
	}
	return l
}

// overriding reports whether the stored limit p is an override still in
// force at now.
func overriding(p *pb.Limit, now time.Time) bool {
	o := p.GetOverride()
	return o.GetAfter() != nil && o.GetEndsAt() != nil && now.Before(o.EndsAt.AsTime())
}

// overrideEnded reports whether the stored limit p is an override that
// ended at or before now.
func overrideEnded(p *pb.Limit, now time.Time) bool {
	o := p.GetOverride()
	return o.GetAfter() != nil && o.GetEndsAt() != nil && !now.Before(o.EndsAt.AsTime())
}

// afterOf is the version an override of p reverts to, as it governs: the
// stored record's version number (a version names a record), in force
// from the override's end.
func afterOf(p *pb.Limit) *pb.Limit {
	v := cloneLimit(p.Override.After)
	v.Previous, v.Override = nil, nil
	v.Version, v.EffectiveFrom = p.Version, p.Override.EndsAt
	return v
}

func decodeVersion(p *pb.Limit) *Limit {
	l := &Limit{
		ID:       p.Id,
		Tokens:   p.LimitTokens,
		Window:   p.Window.AsDuration(),
		Phase:    p.GetWindowPhase().AsDuration(),
		Regions:  slices.Sorted(slices.Values(p.Regions)),
		TTL:      p.GetLease().GetTtl().AsDuration(),
		MinChunk: p.GetLease().GetMinChunk(),
		MaxChunk: p.GetLease().GetMaxChunk(),
		Standing: p.GetLease().GetStanding(),
		Version:  p.Version,
		Kind:     p.Kind,
		Rate:     p.RateTokens,
		Burst:    p.BurstTokens,
		Proto:    p,
	}
	if p.Calendar != nil {
		l.Cal = limitspec.Schedule(p).Cal
	}
	if l.Kind == pb.LimitKind_LIMIT_KIND_BUCKET {
		l.RatePeriod = time.Second
		if p.RatePeriod != nil {
			l.RatePeriod = p.RatePeriod.AsDuration()
		}
	}
	return l
}

// Windows is the window schedule of the version: its calendar windows,
// or its W and φ.
func (l *Limit) Windows() lease.Windows {
	if l.Cal.Loc != nil {
		return lease.CalendarWindows(l.Cal)
	}
	return lease.WindowsOf(l.Window, l.Phase)
}

// schedOf names the windows of a stored record from its length and phase
// offset in milliseconds, or from its calendar (cal, zones.Format: a
// calendar record's wms is the length of its own window, informational).
// A calendar whose zone does not load (a record written by a newer
// version, or a damaged one) names no windows: its reports are empty
// rather than wrong.
func schedOf(wms, phms int64, cal string) lease.Windows {
	if cal != "" {
		c, err := zones.Parse(cal)
		if err != nil {
			return lease.Windows{}
		}
		return lease.CalendarWindows(c)
	}
	return lease.WindowsOf(time.Duration(wms)*time.Millisecond, time.Duration(phms)*time.Millisecond)
}

// IsBucket reports whether l is a bucket limit (rate and burst).
func (l *Limit) IsBucket() bool { return l.Kind == pb.LimitKind_LIMIT_KIND_BUCKET }

// IsConcurrency reports whether l is a concurrency limit: at most Tokens
// (N) slots held at once, granted as slot shares.
func (l *Limit) IsConcurrency() bool { return l.Kind == pb.LimitKind_LIMIT_KIND_CONCURRENCY }

// Windowless reports whether l has no windows: its regions get shares
// (bucket and concurrency limits), not leases.
func (l *Limit) Windowless() bool { return l.IsBucket() || l.IsConcurrency() }

// scheduled reports whether the stored limit p still waits for a change
// to come into force at now.
func scheduled(p *pb.Limit, now time.Time) bool {
	return p.GetPrevious() != nil && p.GetEffectiveFrom() != nil && now.Before(p.EffectiveFrom.AsTime())
}

// inForce returns the version of the stored limit p that governs now,
// without a previous version: what agents enforce.
func inForce(p *pb.Limit, now time.Time) *pb.Limit {
	if overrideEnded(p, now) {
		return afterOf(p)
	}
	if scheduled(p, now) {
		v := cloneLimit(p.Previous)
		v.Previous = nil
		return v
	}
	if p.GetPrevious() == nil {
		return p
	}
	v := cloneLimit(p)
	v.Previous = nil
	return v
}

// asShown returns the stored limit p as readers see it at now: the
// previous version is kept only while it is still in force.
func asShown(p *pb.Limit, now time.Time) *pb.Limit {
	if overrideEnded(p, now) {
		return afterOf(p)
	}
	if p.GetPrevious() == nil || scheduled(p, now) {
		return p
	}
	v := cloneLimit(p)
	v.Previous = nil
	return v
}
