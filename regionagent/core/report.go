package core

import (
	"slices"
	"strings"
	"time"

	"leasehold/lease"
)

// ReportRead asks the caller to read the cumulative counters of Windows of
// a limit in Store and report them to the allocator (the shared store's
// under the bucket's reporter name, the in-process store's under the
// replica's). Hand the outcome to ReportDone.
type ReportRead struct {
	Store   Store
	Limit   string
	HashTag string // the limit's (store.Key)
	Windows []int64
}

// use returns the Core's record of a window a limit spent in.
func (c *Core) use(now time.Time, st *limitState, s Store, window int64) *winUse {
	k := winKey{s, window}
	u := st.windows[k]
	if u == nil {
		u = &winUse{end: c.WindowEnd(lease.Window{Index: window, Length: st.l.Window})}
		st.windows[k] = u
		c.pending[st.id] = st
		if c.reportAt.IsZero() {
			c.reportAt = now.Add(c.opt.reportEvery)
		}
	}
	return u
}

func (c *Core) hasReports(st *limitState) bool { return len(st.windows) > 0 }

// report asks for the counts of every window with spends since its last
// report, and of every window once more after its end (another replica
// may have spent in it after this one's last report, and may have
// crashed); all asks for every window still kept (the agent is stopping).
func (c *Core) report(now time.Time, all bool) {
	pending := false
	deferred := c.progressDeferred(now, all)
	for _, id := range sortedIDs(c.pending) {
		st := c.pending[id]
		readProgress := !deferred[id]
		if readProgress {
			st.reportedAt = now
		}
		c.queueUnreturned(st)
		pending = pending || len(st.unreturned) > 0
		if len(st.windows) == 0 {
			if len(st.unreturned) == 0 {
				delete(c.pending, id)
			}
			continue
		}
		var byStore [2][]int64
		for k, u := range st.windows {
			ended := !now.Before(u.end.Add(c.opt.reportEvery))
			switch {
			case now.After(u.end.Add(c.opt.keyGrace)):
				delete(st.windows, k) // its bucket has expired: nothing left to read
				continue
			case all || ended && !u.final || u.dirty && (readProgress || ended):
				u.dirty = false
				u.final = u.final || ended
				byStore[k.store] = append(byStore[k.store], k.window)
			}
			if !u.final {
				pending = true
			}
		}
		for s, ws := range byStore {
			if len(ws) > 0 {
				slices.Sort(ws)
				c.ready.Reports = append(c.ready.Reports, ReportRead{Store: Store(s), Limit: id, HashTag: st.l.key(0).HashTag, Windows: ws})
			}
		}
		for k, u := range st.windows {
			if u.final && !u.dirty {
				delete(st.windows, k)
			}
		}
		if len(st.windows) == 0 {
			if len(st.unreturned) == 0 {
				delete(c.pending, id)
			}
			c.schedule(st, now) // it may be forgotten once idle
		}
	}
	if pending && !all {
		c.reportAt = now.Add(c.opt.reportEvery)
	}
}

// progressDeferred returns the limits whose windows in progress wait for
// a later round (nil: none do): beyond the maxProgress limits with such
// windows to read, those read longest ago first (ties by id). A limit
// whose ended window is read anyway is not counted: its windows in
// progress go in the same read.
func (c *Core) progressDeferred(now time.Time, all bool) map[string]bool {
	if all || len(c.pending) <= c.opt.maxProgress {
		return nil
	}
	var want []*limitState
	for _, st := range c.pending {
		progress, ended := false, false
		for _, u := range st.windows {
			e := !now.Before(u.end.Add(c.opt.reportEvery))
			ended = ended || e && !u.final
			progress = progress || u.dirty && !e
		}
		if progress && !ended {
			want = append(want, st)
		}
	}
	if len(want) <= c.opt.maxProgress {
		return nil
	}
	slices.SortFunc(want, func(a, b *limitState) int {
		if c := a.reportedAt.Compare(b.reportedAt); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	deferred := make(map[string]bool, len(want)-c.opt.maxProgress)
	for _, st := range want[c.opt.maxProgress:] {
		deferred[st.id] = true
	}
	return deferred
}

// ReportDone hands the Core a report's outcome: a report that did not
// reach the allocator is asked for again at the next report.
func (c *Core) ReportDone(now time.Time, r ReportRead, ok bool) {
	if ok {
		return
	}
	st := c.states[r.Limit]
	if st == nil {
		return
	}
	for _, w := range r.Windows {
		u := c.use(now, st, r.Store, w)
		u.dirty = true
		u.final = false
	}
	if c.reportAt.IsZero() {
		c.reportAt = now.Add(c.opt.reportEvery)
	}
}

// FinalReport asks for the counts of every window kept, at once (the
// agent is stopping: its last counts should reach the allocator even if
// no replica of the region stays up).
func (c *Core) FinalReport(now time.Time) { c.report(now, true) }

// WindowSeen is the largest admitted count a spend of this replica saw in
// one window of a limit, and when.
type WindowSeen struct {
	Limit    string
	Window   int64
	End      time.Time // the window's end, agent clock
	Length   time.Duration
	Admitted int64
	At       time.Time
}

// Seen lists, for the windows of the shared store the Core still keeps,
// the largest admitted count seen since since (the failover watcher's
// readings). It reads only the windows whose count rose since the last
// Seen (their list is kept as spends report counts), so its cost follows
// traffic, not the number of limits.
func (c *Core) Seen(since time.Time) []WindowSeen {
	var out []WindowSeen
	for _, r := range c.seen {
		r.u.seenNew = false
		if c.states[r.st.id] == r.st && r.st.windows[r.k] == r.u && r.u.seenAt.After(since) {
			out = append(out, WindowSeen{Limit: r.st.id, Window: r.k.window, End: r.u.end, Length: r.st.l.Window,
				Admitted: r.u.admitted, At: r.u.seenAt})
		}
	}
	clear(c.seen)
	c.seen = c.seen[:0]
	slices.SortFunc(out, func(a, b WindowSeen) int {
		if a.Limit != b.Limit {
			return strings.Compare(a.Limit, b.Limit)
		}
		return int(a.Window - b.Window)
	})
	return out
}

// ActiveLimits lists the limits the Core holds state for, sorted.
func (c *Core) ActiveLimits() []string { return c.sortedStates() }
