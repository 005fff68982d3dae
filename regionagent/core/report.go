package core

import (
	"container/heap"
	"slices"
	"strings"
	"time"
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

// use returns the Core's record of a window a limit spent in. A new
// record schedules its window's final read (a report round after its end)
// and its forgetting (keyGrace after its end).
func (c *Core) use(now time.Time, st *limitState, s Store, window int64) *winUse {
	k := winKey{s, window}
	u := st.windows[k]
	if u == nil {
		u = &winUse{end: c.WindowEnd(st.l.Windows().ByIndex(window))}
		st.windows[k] = u
		c.pending[st.id] = st
		c.unfinal++
		heap.Push(&c.ends, endEvent{due: u.end.Add(c.opt.reportEvery), st: st, k: k, u: u})
		heap.Push(&c.ends, endEvent{due: u.end.Add(c.opt.keyGrace), st: st, k: k, u: u, expire: true})
		if c.reportAt.IsZero() {
			c.reportAt = now.Add(c.opt.reportEvery)
		}
	}
	return u
}

// dirty marks a window of a limit as spent in since its last report: a
// window in progress waits in the report budget's queue (by its limit), an
// ended one is read at the next round whatever the budget.
func (c *Core) dirty(now time.Time, st *limitState, s Store, window int64) *winUse {
	u := c.use(now, st, s, window)
	u.dirty = true
	switch {
	case c.ended(u, now):
		c.late = append(c.late, seenRef{st, winKey{s, window}, u})
	case !st.inProgress:
		st.inProgress = true
		st.progressAt = c.lastRound
		heap.Push(&c.progress, st)
	}
	return u
}

// ended reports whether a window's final read is due (a report round after
// its end: another replica's last spends have been counted by then).
func (c *Core) ended(u *winUse, now time.Time) bool { return !now.Before(u.end.Add(c.opt.reportEvery)) }

func (c *Core) hasReports(st *limitState) bool { return len(st.windows) > 0 }

// report asks for the counts of the windows with spends since their last
// report, at most maxProgress limits' windows in progress per round (the
// ones waiting longest first), and of every window once more after its
// end (another replica may have spent in it after this one's last report,
// and may have crashed); all asks for every window still kept (the agent
// is stopping). It visits only the limits with something to read or to
// send: its cost follows traffic, not the number of limits held.
func (c *Core) report(now time.Time, all bool) {
	var touched []*limitState
	read := func(st *limitState, k winKey) {
		if len(st.reads[0])+len(st.reads[1]) == 0 {
			touched = append(touched, st)
		}
		st.reads[k.store] = append(st.reads[k.store], k.window)
	}
	valid := func(st *limitState, k winKey, u *winUse) bool {
		return c.states[st.id] == st && st.windows[k] == u
	}
	if all {
		for _, id := range sortedIDs(c.pending) {
			st := c.pending[id]
			for k, u := range st.windows {
				c.setFinal(u, u.final || c.ended(u, now))
				u.dirty = false
				read(st, k)
			}
		}
	} else {
		// Windows whose end came: their final read, or their forgetting.
		for c.ends.Len() > 0 && !c.ends[0].due.After(now) {
			e := heap.Pop(&c.ends).(endEvent)
			switch {
			case !valid(e.st, e.k, e.u):
			case e.expire:
				c.setFinal(e.u, true)
				delete(e.st.windows, e.k) // its bucket has expired: nothing left to read
				if len(e.st.reads[0])+len(e.st.reads[1]) == 0 {
					touched = append(touched, e.st)
				}
			case !e.u.final:
				e.u.dirty = false
				c.setFinal(e.u, true)
				read(e.st, e.k)
			}
		}
		// Ended windows spent in again (late spends, failed reports).
		for _, r := range c.late {
			if valid(r.st, r.k, r.u) && r.u.dirty {
				r.u.dirty = false
				c.setFinal(r.u, true)
				read(r.st, r.k)
			}
		}
		clear(c.late)
		c.late = c.late[:0]
		// A limit read anyway has its windows in progress read with it,
		// outside the budget.
		for _, st := range touched {
			c.readProgress(now, st, read)
		}
		// Then the budget: the limits whose windows in progress waited
		// longest.
		for n := 0; n < c.opt.maxProgress && c.progress.Len() > 0; {
			st := heap.Pop(&c.progress).(*limitState)
			st.inProgress = false
			if c.states[st.id] == st && c.readProgress(now, st, read) {
				n++
			}
		}
		c.lastRound = now
	}
	for _, id := range sortedIDs(c.retrying) {
		st := c.retrying[id]
		c.queueUnreturned(st)
		if len(st.unreturned) == 0 {
			delete(c.retrying, id)
		}
	}
	slices.SortFunc(touched, func(a, b *limitState) int { return strings.Compare(a.id, b.id) })
	for _, st := range touched {
		for s := range st.reads {
			if ws := st.reads[s]; len(ws) > 0 {
				slices.Sort(ws)
				c.ready.Reports = append(c.ready.Reports, ReportRead{Store: Store(s), Limit: st.id, HashTag: st.l.key(0).HashTag,
					Windows: slices.Clone(ws)})
				st.reads[s] = ws[:0]
			}
		}
		for k, u := range st.windows {
			if u.final && !u.dirty {
				delete(st.windows, k)
			}
		}
		if len(st.windows) == 0 {
			if len(st.unreturned) == 0 {
				delete(c.pending, st.id)
			}
			c.schedule(st, now) // it may be forgotten once idle
		}
	}
	// Rounds go on while a window waits for its final read, or returns
	// for the allocator to acknowledge.
	if !all && (c.unfinal > 0 || len(c.retrying) > 0) {
		c.reportAt = now.Add(c.opt.reportEvery)
	}
}

// setFinal sets u.final, keeping the count of windows not final.
func (c *Core) setFinal(u *winUse, final bool) {
	switch {
	case final && !u.final:
		c.unfinal--
	case !final && u.final:
		c.unfinal++
	}
	u.final = final
}

// readProgress reads st's windows in progress that were spent in since
// their last report; it reports whether there was any.
func (c *Core) readProgress(now time.Time, st *limitState, read func(*limitState, winKey)) bool {
	found := false
	for k, u := range st.windows {
		if u.dirty && !c.ended(u, now) {
			u.dirty = false
			read(st, k)
			found = true
		}
	}
	if found {
		st.reportedAt = now
	}
	return found
}

// progressHeap orders the limits waiting for a read of their windows in
// progress: the longest waiting first (progressAt: the report round before
// they were spent in, or their last read), ties by id.
type progressHeap []*limitState

func (h progressHeap) Len() int { return len(h) }
func (h progressHeap) Less(i, j int) bool {
	if c := h[i].progressAt.Compare(h[j].progressAt); c != 0 {
		return c < 0
	}
	return h[i].id < h[j].id
}
func (h progressHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *progressHeap) Push(x any)   { *h = append(*h, x.(*limitState)) }
func (h *progressHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return st
}

// endEvent is a window's final read (a report round after its end) or,
// with expire, its forgetting (its bucket has expired).
type endEvent struct {
	due    time.Time
	st     *limitState
	k      winKey
	u      *winUse
	expire bool
}

// endHeap orders end events by when they are due (ties by limit and
// window, so that runs repeat).
type endHeap []endEvent

func (h endHeap) Len() int { return len(h) }
func (h endHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if c := a.due.Compare(b.due); c != 0 {
		return c < 0
	}
	if a.st.id != b.st.id {
		return a.st.id < b.st.id
	}
	if a.k != b.k {
		return a.k.store < b.k.store || a.k.store == b.k.store && a.k.window < b.k.window
	}
	return !a.expire && b.expire
}
func (h endHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)   { *h = append(*h, x.(endEvent)) }
func (h *endHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = endEvent{}
	*h = old[:len(old)-1]
	return e
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
		c.setFinal(c.dirty(now, st, r.Store, w), false)
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
// Seen (their list is kept as spends report counts, from the first Seen
// on), so its cost follows traffic, not the number of limits.
func (c *Core) Seen(since time.Time) []WindowSeen {
	c.seenUsed = true
	out := make([]WindowSeen, 0, len(c.seen))
	for _, r := range c.seen {
		r.u.seenNew = false
		if c.states[r.st.id] == r.st && r.st.windows[r.k] == r.u && r.u.seenAt.After(since) {
			out = append(out, WindowSeen{Limit: r.st.id, Window: r.k.window, End: r.u.end, Length: r.st.l.Windows().ByIndex(r.k.window).Length,
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
