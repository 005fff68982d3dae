package statuspage

import (
	"time"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

// A concurrency limit (at most N slots held at once) has no windows: the
// page shows N, the bound at every instant (N plus the local fallbacks'
// A), the slots its shares in force lease, the slots held as the regions
// last reported, the most reported held together, and the slot shares
// in force.

// isConcurrency tells whether l is a concurrency limit.
func isConcurrency(l *pb.Limit) bool { return l.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY }

// slotSummary is a concurrency limit's slots now, as its row and page
// show them.
type slotSummary struct {
	Bound, Leased, Held, HeldMax int64
	OverBound                    bool
}

// slotShareRow is a slot share in force.
type slotShareRow struct {
	Region, Holder     string
	Slots, Admit, Held int64
	Expires            time.Time
	Seq                int64
}

// slotsView is the concurrency part of a limit's page.
type slotsView struct {
	Shares []slotShareRow
}

// slotStatus returns a concurrency limit's slot status; ok false when it
// cannot be had from this replica (the fetcher says why).
func (f *fetcher) slotStatus(id string) (allocator.SlotStatus, bool) {
	if f.follower || f.err != nil {
		return allocator.SlotStatus{}, false
	}
	st, err := f.src.SlotStatus(id)
	if err == nil {
		return st, true
	}
	f.note(err)
	return allocator.SlotStatus{}, false
}

// slotsRow fills a concurrency limit's table row: its slots now (when
// this replica knows them), and a critical alert when more were ever
// reported held together than the bound allows.
func slotsRow(rw *row, st allocator.SlotStatus, ok bool) {
	rw.Slots, rw.Window = true, "concurrency"
	if !ok {
		return
	}
	s := slotSummary{Bound: st.Bound, Leased: st.Leased, Held: st.Held, HeldMax: st.HeldMax, OverBound: st.HeldMax > max(st.Bound, st.BoundMax)}
	rw.SlotsNow = &s
	if s.OverBound {
		rw.Alerts, rw.Level = append(rw.Alerts, alertTag{"held > bound", "crit"}), "crit"
	}
}

// newSlotsView builds the concurrency part of a limit's page (the shares
// in the allocator's order: by region and holder, newest first).
func newSlotsView(st allocator.SlotStatus) *slotsView {
	sv := &slotsView{}
	for _, s := range st.Shares {
		sv.Shares = append(sv.Shares, slotShareRow{Region: s.Region, Holder: s.Holder, Slots: s.Slots, Admit: s.Admit,
			Held: s.Held, Expires: s.ExpiresAt, Seq: s.Seq})
	}
	return sv
}
