package allocator

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "leasehold/proto/leasehold/v1"
)

// SlotStatus is what quotactl windows and the status page show of a
// concurrency limit: N, the slot shares in force, and the slots held as
// the holders last reported (with their share requests).
type SlotStatus struct {
	N, Leased, Held, HeldMax int64
	// Bound is the most slots held at any instant, all regions: N plus
	// the A of every region whose fallback is local:A (a region cut off
	// from the allocator holds at most A of its own; closed regions add
	// nothing).
	Bound int64
	// BoundMax is the largest bound in force whenever this leader
	// recorded slots held (with N the largest of the version in force and
	// of the slot shares still in force, each granted under its own N):
	// after N was lowered (a change, or the end of an override that raised
	// it) slots held under the old N are not taken back, so HeldMax may be
	// above Bound; above BoundMax it is a bug.
	BoundMax int64
	Shares   []ShareInForce
}

// slotBound is N plus every region's local fallback A.
func slotBound(l *Limit) int64 {
	b := l.Tokens
	for _, fb := range l.Proto.GetFallback() {
		if fb.GetKind() == pb.FallbackKind_FALLBACK_KIND_LOCAL {
			b += fb.GetLocalTokens()
		}
	}
	return b
}

// slotBoundNow is the bound at now of a concurrency limit whose version
// in force is l and whose shares are st: slotBound(l), with N the largest
// of l's and of the N every slot share still in force was granted under
// (slots held under a larger N are not taken back when N is lowered).
func slotBoundNow(l *Limit, st *shareState, now time.Time) int64 {
	n := l.Tokens
	for _, gs := range st.byRegion {
		for _, g := range gs {
			if g.inForce(now) {
				n = max(n, g.LimitN)
			}
		}
	}
	return slotBound(l) + n - l.Tokens
}

// SlotStatus returns a concurrency limit's slot shares in force now. It
// is served by the leader (ErrNotLeader elsewhere); ErrNotFound for a
// limit that is not a concurrency limit.
func (a *Allocator) SlotStatus(limit string) (SlotStatus, error) {
	t, err := a.currentTerm()
	if err != nil {
		return SlotStatus{}, err
	}
	now := a.opt.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.core.slotStatus(now, limit)
}

func (c *Core) slotStatus(now time.Time, limit string) (SlotStatus, error) {
	l, ok := c.limit(limit) // a tenant of a plan too; a plan is not a limit
	if !ok || !l.At(now).IsConcurrency() {
		return SlotStatus{}, fmt.Errorf("%w: concurrency limit %q", ErrNotFound, limit)
	}
	return SlotStatus{N: l.At(now).Tokens, Bound: slotBound(l.At(now)), Leased: c.ReservedSlots(limit, now), Held: c.HeldSlots(limit, now),
		HeldMax: c.HeldSlotsMax(limit), BoundMax: max(slotBound(l.At(now)), c.boundMax[limit]), Shares: c.SharesInForce(limit, now)}, nil
}

// slotCollector exports each concurrency limit's bound (N plus the local
// fallbacks' A), the slots its shares in force lease,
// and the slots held as the holders reported, now and at most.
type slotCollector struct {
	a                                        *Allocator
	bound, leased, held, heldMost, boundMost *prometheus.Desc
}

func newSlotCollector(a *Allocator) *slotCollector {
	return &slotCollector{a: a,
		bound: prometheus.NewDesc("leasehold_concurrency_bound_slots",
			"The bound on the slots a concurrency limit holds at any instant, all regions: N, plus A for every region whose fallback is local:A.", []string{"limit"}, nil),
		leased: prometheus.NewDesc("leasehold_concurrency_leased_slots",
			"Slots of a concurrency limit leased to regions by the shares that may still be in force, each region at its largest (<= N).", []string{"limit"}, nil),
		held: prometheus.NewDesc("leasehold_concurrency_held_slots",
			"Slots of a concurrency limit held, all regions, as the regions last reported with their share requests (up to half a share's life old).", []string{"limit"}, nil),
		heldMost: prometheus.NewDesc("leasehold_concurrency_held_max_slots",
			"The most slots of a concurrency limit reported held together since this leader started: above leasehold_concurrency_bound_max_slots is a bug.", []string{"limit"}, nil),
		boundMost: prometheus.NewDesc("leasehold_concurrency_bound_max_slots",
			"The largest bound of a concurrency limit in force when this leader recorded slots held (N of the version or of a slot share in force, plus the local fallbacks' A): after N was lowered, held slots above the new bound are not taken back.", []string{"limit"}, nil),
	}
}

func (c *slotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.bound
	ch <- c.leased
	ch <- c.held
	ch <- c.heldMost
	ch <- c.boundMost
}

func (c *slotCollector) Collect(ch chan<- prometheus.Metric) {
	var rows []SlotStatus
	var ids []string
	err := c.a.View(func(now time.Time, core *Core) {
		core.eachLimit(func(id string, l *Limit) { // tenants of concurrency plans too, not the plans
			if l.At(now).IsConcurrency() {
				st, _ := core.slotStatus(now, id)
				rows, ids = append(rows, st), append(ids, id)
			}
		})
	})
	if err != nil {
		return // a follower exports none
	}
	for i, r := range rows {
		ch <- prometheus.MustNewConstMetric(c.bound, prometheus.GaugeValue, float64(r.Bound), ids[i])
		ch <- prometheus.MustNewConstMetric(c.leased, prometheus.GaugeValue, float64(r.Leased), ids[i])
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(r.Held), ids[i])
		ch <- prometheus.MustNewConstMetric(c.heldMost, prometheus.GaugeValue, float64(r.HeldMax), ids[i])
		ch <- prometheus.MustNewConstMetric(c.boundMost, prometheus.GaugeValue, float64(r.BoundMax), ids[i])
	}
}
