package core

import (
	"strconv"
	"strings"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// round is one renewal round of a limit in flight.
type round struct {
	seq     uint64
	store   Store
	lock    Unlock // the renewal lock the round takes, if Lock
	locked  bool
	waiting int // acquires, deposits and closes not yet answered
}

// Round asks the caller to read a limit's bucket for a renewal decision:
// take the limit's renewal lock first when Lock is set (one replica of the
// region renews a limit at a time), then read Key. Hand the result to
// RoundRead.
type Round struct {
	Limit string
	Store Store
	Lock  bool
	Key   store.Key
	seq   uint64
}

// RoundResult is the outcome of a Round.
type RoundResult struct {
	// Locked: the lock was taken (true when the Round asked for none).
	Locked bool
	// Balance is the bucket as read, and NowMs the store's now at the read
	// (milliseconds on the store's clock, the clock of Balance's times).
	Balance store.BalanceResult
	NowMs   int64
	// Err: the lock or the read failed (the store did not answer).
	Err error
}

// Acquire asks the allocator for one lease. The caller sends the
// Acquires of one Ready in as few calls as it can and hands the replies to
// Acquired (with when the call was sent and answered), or the failure to
// AcquireFailed. An unanswered request is sent again, unchanged, by a
// later round: the allocator replays the lease it granted for it.
type Acquire struct {
	Limit     string
	RequestID string
	Next      bool // the window after the current one
	Demand    float64
	Held      int64
	Want      int64
}

// Grant is the allocator's answer to one Acquire.
type Grant struct {
	OK      bool   // false: refused (Message says why)
	Message string // for a refusal
	LeaseID string
	Tokens  int64
	// Window names the window the answer is for; WindowLen its length
	// and WindowPhase its phase offset.
	Window      int64
	WindowLen   time.Duration
	WindowPhase time.Duration
	// WindowCal is the window's calendar (zero for fixed windows).
	WindowCal  lease.Calendar
	StartsIn   time.Duration
	ExpiresIn  time.Duration
	WindowLeft time.Duration
	PoolLeft   int64
	// ShareSpent: nothing granted because this region used its share of
	// the window while other regions' demand claims the rest.
	ShareSpent bool
	Replayed   bool
}

// Deposit asks the caller to store a lease in a bucket: spendable from
// Start (zero: at once) strictly before Deadline, the bucket's key kept
// until KeyExpiry. Times are on the agent's clock; the caller converts
// them to the store's clock conservatively (a deadline never later, a
// start never earlier). Hand the outcome to Deposited.
type Deposit struct {
	Limit     string
	Store     Store
	Key       store.Key
	LeaseID   string
	Tokens    int64
	Start     time.Time
	Deadline  time.Time
	KeyExpiry time.Time
	next      bool
	// standing: the region's standing share (standing.go), under an id
	// every replica deposits the same: a deposit that fails or is refused
	// is not returned (another replica's may be in the bucket, spent).
	standing bool
}

// Close asks the caller to close leases of a bucket (their unspent tokens
// are returned); hand the outcome to Closed.
type Close struct {
	Limit string
	Store Store
	Key   store.Key
	IDs   []string
	round *round
}

// Return tells the allocator that a lease is closed with Unspent tokens
// left. Returns are idempotent by lease id. Hand the outcome of sending
// them to ReturnsDone.
type Return struct {
	Limit   string
	LeaseID string
	Unspent int64
}

// kick starts a renewal round of a limit unless one is in flight or
// another replica was seen renewing it just now. Every event that may
// need a renewal kicks: a spend below the low-water mark, a denied spend,
// a lease about to expire or a window about to end while the limit has
// demand.
func (c *Core) kick(st *limitState, now time.Time) {
	if st.round != nil || now.Before(st.lockedUntil) || st.awaitReturn && now.Before(st.awaitUntil) {
		return
	}
	l, ok := c.limits[st.id]
	if !ok {
		return // deleted: nothing to renew
	}
	if l.IsBucket() {
		c.kickShare(st, now)
		return
	}
	s := c.store()
	c.roundSeq++
	st.round = &round{seq: c.roundSeq, store: s, lock: Unlock{Limit: st.id, HashTag: l.key(0).HashTag}}
	c.stats.Rounds++
	c.ready.Rounds = append(c.ready.Rounds, Round{Limit: st.id, Store: s, Lock: s == Shared,
		Key: l.key(c.WindowOf(now, l).Index), seq: c.roundSeq})
}

// Renew starts a renewal round of a limit now (unless one is in flight):
// an operator's or a test's "look at this limit", and what a limit change
// asks for. A limit the Core holds no state for gets one.
func (c *Core) Renew(now time.Time, limit string) {
	l, ok := c.limits[limit]
	if !ok {
		return
	}
	st := c.state(l)
	st.lockedUntil = time.Time{}
	c.kick(st, now)
}

// Unreturned counts the returns the allocator has not acknowledged.
func (c *Core) Unreturned() int {
	n := 0
	for _, st := range c.states {
		n += len(st.unreturned)
	}
	return n
}

// UnreturnedOf lists a limit's returns the allocator has not acknowledged.
func (c *Core) UnreturnedOf(limit string) []Return {
	if st := c.states[limit]; st != nil {
		return append([]Return(nil), st.unreturned...)
	}
	return nil
}

// RoundRead plans a round from its bucket: closes expired and surplus
// leases, asks for a lease of this window when the balance is below the
// low-water mark (or a denied cost exceeds it), and for the next window's
// near the boundary.
func (c *Core) RoundRead(now time.Time, r Round, res RoundResult) {
	st := c.states[r.Limit]
	if st == nil || st.round == nil || st.round.seq != r.seq {
		if res.Err == nil && res.Locked && r.Lock {
			c.ready.Unlocks = append(c.ready.Unlocks, Unlock{Limit: r.Limit, HashTag: r.Key.HashTag})
		}
		return
	}
	rd := st.round
	switch {
	case res.Err != nil:
		rd.locked = r.Lock // the lock may be held: release it
		c.endRound(st, now)
		return
	case !res.Locked:
		// Another replica renews this limit; its deposit reaches the shared
		// bucket, where this replica's spends find it.
		st.lockedUntil = now.Add(c.opt.lockRetry)
		c.endRound(st, now)
		return
	}
	rd.locked = r.Lock
	c.stats.RoundsLocked++
	l, ok := c.limits[r.Limit]
	if !ok {
		c.endRound(st, now)
		return
	}
	w := c.WindowOf(now, l)
	if w.Index != r.Key.Window {
		w = l.Windows().ByIndex(r.Key.Window) // plan the window that was read
	}
	bal := res.Balance
	if r.Store != Local {
		st.foundUnanswered(w.Index, bal)
	}
	d := st.demandIn(r.Store)
	d.Observe(now, w.Index, bal.Admitted+bal.Denied+counter(bal, store.CounterFallback))
	rate := d.Rate(now)
	if counter(bal, store.CounterPoolSpent) > 0 && st.spentWindow < w.Index && st.liftedWindow != w.Index {
		st.markSpent(w.Index, now, false, r.Store == Local)
	}
	next := st.nextWindow
	if r.Store == Local {
		next = st.localNext
	}
	p := PlanRenewal(PlanInput{NowMs: res.NowMs, Left: c.WindowEnd(w).Sub(now), Rate: rate, TTL: l.TTL,
		Lead: c.opt.lead, Every: c.opt.every, Bucket: bal,
		Spent:   st.spentWindow == w.Index && now.Sub(st.spentAt) < c.opt.spentRetry,
		Pending: st.pending != nil, NextDone: next == w.Index+1, KickCost: st.kickCost})
	if p.Acquire {
		// Only what comes back in time to be spent counts: a lease
		// ending in the window's last moments returns after it.
		useful := c.WindowEnd(w).Sub(now) - boundaryWait - 2*maxOneWay
		st.comingBack, st.comingBackWin = returnable(bal, res.NowMs+useful.Milliseconds()), w.Index
		c.acquire(st, rd, false, rate, p.Held, p.Want)
	}
	if p.AcquireNext && (c.busy(st, now) || st.pendingNext != nil) {
		c.acquire(st, rd, true, rate, 0, 0)
	}
	if ids := p.Closing(); len(ids) > 0 {
		rd.waiting++
		c.ready.Closes = append(c.ready.Closes, Close{Limit: st.id, Store: r.Store, Key: r.Key, IDs: ids, round: rd})
	}
	c.queueUnreturned(st)
	if rd.waiting == 0 {
		c.endRound(st, now)
	}
}

// returnable is what the region's leases in b will give back to the pool
// before endMs (the store's clock): the unspent tokens of its expired
// leases and of the leases that end before endMs (sub-leases are not the
// allocator's).
func returnable(b store.BalanceResult, endMs int64) int64 {
	var n int64
	for _, e := range b.Expired {
		if !strings.HasPrefix(e.ID, store.SubLeasePrefix) {
			n += e.Remaining
		}
	}
	for _, o := range b.Open {
		if o.DeadlineMs < endMs && !strings.HasPrefix(o.ID, store.SubLeasePrefix) {
			n += o.Remaining
		}
	}
	return n
}

func counter(b store.BalanceResult, name string) int64 {
	for _, x := range b.Counters {
		if x.Name == name {
			return x.Value
		}
	}
	return 0
}

// acquire asks for a lease, or sends the unanswered request again as is.
func (c *Core) acquire(st *limitState, rd *round, next bool, rate float64, held, want int64) {
	req := st.pending
	if next {
		req = st.pendingNext
	}
	if req == nil {
		req = &Acquire{Limit: st.id, RequestID: c.requestID(), Next: next, Demand: rate, Held: held, Want: want}
		if next {
			st.pendingNext = req
		} else {
			st.pending = req
		}
	}
	c.byRequest[req.RequestID] = st
	rd.waiting++
	c.ready.Acquires = append(c.ready.Acquires, *req)
}

// markSpent records that window w's pool (share: this region's share of
// it) is spent, as learned at now; local: learned without the region's
// shared bucket (see limitState.spentLocal).
func (st *limitState) markSpent(w int64, now time.Time, share, local bool) {
	st.spentWindow, st.spentAt, st.shareSpent, st.spentLocal = w, now, share, local
}

// step counts one answered action of a limit's round.
func (c *Core) step(st *limitState, rd *round, now time.Time) {
	if rd == nil || st.round != rd {
		return
	}
	rd.waiting--
	if rd.waiting <= 0 {
		c.endRound(st, now)
	}
}

func (c *Core) endRound(st *limitState, now time.Time) {
	if rd := st.round; rd != nil && rd.locked {
		c.ready.Unlocks = append(c.ready.Unlocks, rd.lock)
	}
	st.round = nil
	c.changed[st.id] = true
	c.schedule(st, now)
}

// maxOneWay caps the one-way delay an allocator reply is assumed to take.
const maxOneWay = 150 * time.Millisecond

// Acquired hands the Core the allocator's answers to reqs (grants[i]
// answers reqs[i]), from a call sent at sent and answered at recv.
func (c *Core) Acquired(sent, recv time.Time, reqs []Acquire, grants []Grant) {
	for i, req := range reqs {
		st := c.byRequest[req.RequestID]
		if st == nil || i >= len(grants) {
			continue // answered before (a duplicate reply)
		}
		delete(c.byRequest, req.RequestID)
		rd := st.round
		if req.Next && st.pendingNext != nil && st.pendingNext.RequestID == req.RequestID {
			st.pendingNext = nil
		} else if st.pending != nil && st.pending.RequestID == req.RequestID {
			st.pending = nil
		}
		st.failing = false
		st.kickCost = 0
		if st.fallbackOn {
			st.fallbackOn = false // the allocator answers again: the fallback is over
			c.ready.Fallback = append(c.ready.Fallback, FallbackMark{Limit: st.id})
		}
		c.changed[st.id] = true
		g := grants[i]
		if !g.OK {
			c.stats.RenewalsRejected++
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteRefused, Limit: st.id, Text: g.Message})
			c.step(st, rd, recv)
			continue
		}
		if g.Tokens <= 0 {
			c.stats.RenewalsEmpty++
			if g.PoolLeft == 0 || g.ShareSpent {
				w := g.Window
				if g.WindowLen <= 0 {
					// An answer naming no window: the one current at the reply.
					w = c.WindowOf(recv, &st.l).Index
					if req.Next {
						w++
					}
				}
				inFlight := st.returningIn(w) > 0
				if !req.Next && !g.ShareSpent && (st.comingBackWin == w && st.comingBack > 0 || inFlight) {
					// The region's own leases hold the pool and give their
					// unspent tokens back when they end, or gave them back
					// and the allocator has not credited them yet (a lease
					// closed by an earlier round, no longer in the bucket
					// this round read): renew then. While a return is in
					// flight, only its acknowledgement renews.
					st.awaitReturn, st.awaitUntil = true, time.Time{}
					if inFlight {
						st.awaitUntil = recv.Add(c.opt.spentRetry)
					}
					c.step(st, rd, recv)
					continue
				}
				// Asked without the shared bucket (Redis down, or the round
				// in flight is of the in-process store): the pool may be
				// held by the region's leases in it.
				local := c.redisDown || rd != nil && rd.store == Local
				if w >= st.spentWindow {
					st.markSpent(w, recv, g.ShareSpent && g.PoolLeft > 0, local)
				}
				if !req.Next && !st.shareSpent && !st.unansweredIn(w) {
					// Every replica's spends then say the pool is spent (in
					// process, this replica's only: a mark learned without
					// the shared bucket must not reach it; and none while
					// this replica's deposit of the window may land yet).
					s := Shared
					if local {
						s = Local
					}
					c.ready.Counters = append(c.ready.Counters, CounterOp{Store: s,
						Key: st.l.key(w), Name: store.CounterPoolSpent, Delta: 1})
				}
			}
			c.step(st, rd, recv)
			continue
		}
		c.stats.RenewalsGranted++
		if g.WindowLeft > 0 && !g.Replayed && g.WindowLen > 0 && (g.WindowCal.Loc != nil) == (st.l.Cal.Loc != nil) {
			// (A grant of a calendar limit that names no calendar, or the
			// reverse, cannot name its window's end: it leaves the
			// estimate as it is.)
			// The allocator's clock, seen from here: it answered at
			// allocNow, about half the call's round trip before the reply
			// arrived (at most maxOneWay: a call that was retried says
			// nothing about the path). Naming windows late would spend a
			// new window's first Checks against the old window's pool.
			// The window's end on the allocator's clock, named by the
			// grant itself (its index, length and phase), less what was
			// left of it.
			sched := lease.WindowsOf(g.WindowLen, g.WindowPhase)
			if g.WindowCal.Loc != nil {
				sched = lease.CalendarWindows(g.WindowCal)
			}
			end := sched.ByIndex(g.Window).End()
			allocNow := time.Duration(end.UnixNano()) - g.WindowLeft
			answered := recv.Add(-min(recv.Sub(sent)/2, maxOneWay))
			c.offset, c.offsetSet = allocNow-time.Duration(answered.UnixNano()), true
		}
		deadline := lease.Deadline(sent, g.ExpiresIn, c.margin(g.ExpiresIn))
		var start time.Time
		if g.StartsIn > 0 {
			start = lease.StartAt(recv, g.StartsIn)
		}
		if !deadline.After(start) || !deadline.After(recv) {
			// Expired on arrival, or before it starts: never spendable.
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteReturning, Limit: st.id, Lease: g.LeaseID,
				Text: "lease expires before it can be spent"})
			c.returnLease(st, Return{Limit: st.id, LeaseID: g.LeaseID, Unspent: g.Tokens})
			c.step(st, rd, recv)
			continue
		}
		// The key outlives the window by the grace, so reports still read
		// it; the window ends window_left after the allocator answered, so
		// no later than recv + window_left.
		expiry := recv.Add(g.WindowLeft)
		if deadline.After(expiry) {
			expiry = deadline
		}
		c.ready.Deposits = append(c.ready.Deposits, Deposit{Limit: st.id, Store: c.store(),
			Key: st.l.key(g.Window), LeaseID: g.LeaseID, Tokens: g.Tokens,
			Start: start, Deadline: deadline, KeyExpiry: expiry.Add(c.opt.keyGrace), next: req.Next})
	}
}

// AcquireFailed tells the Core that reqs went unanswered (the allocator
// could not be reached in the call's retry budget). They stay pending and
// are sent again, as they are, by the limit's next round. canceled: the
// agent is stopping; the limits are not marked failing.
func (c *Core) AcquireFailed(now time.Time, reqs []Acquire, canceled bool) {
	for _, req := range reqs {
		st := c.byRequest[req.RequestID]
		if st == nil {
			continue
		}
		c.stats.RenewalsFailed++
		if !canceled {
			if !st.failing {
				c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteFallback, Limit: st.id})
			}
			st.failing, st.failedAt = true, now
		}
		c.changed[st.id] = true
		c.step(st, st.round, now)
	}
}

// Deposited hands the Core a deposit's outcome. err != nil: the deposit
// failed; unanswered says the store did not answer, so the deposit may
// have landed: the lease then stays stranded (returning it could let its
// tokens be spent twice; if it landed, a later round finds it expired and
// returns it). A deposit refused for any other reason is returned whole.
func (c *Core) Deposited(now time.Time, d Deposit, res store.DepositResult, err error, unanswered bool) {
	st := c.states[d.Limit]
	if st == nil {
		return
	}
	c.changed[st.id] = true
	defer c.step(st, st.round, now)
	switch {
	case err != nil && unanswered:
		c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteStranded, Limit: st.id, Lease: d.LeaseID, Text: err.Error()})
		if d.Store == Shared {
			st.noteUnanswered(d.Key.Window, d.LeaseID)
		}
		return
	case err != nil && d.standing:
		// The share is the region's, counted at the allocator whatever
		// happens here; another replica may hold it.
		c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteStranded, Limit: st.id, Lease: d.LeaseID, Text: err.Error()})
		return
	case err != nil:
		c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteReturning, Limit: st.id, Lease: d.LeaseID, Text: err.Error()})
		c.returnLease(st, Return{Limit: st.id, LeaseID: d.LeaseID, Unspent: d.Tokens})
		return
	case res.Status != store.Deposited && res.Status != store.AlreadyDeposited && d.standing:
		// Closed already (the replica that closed it returns it), or
		// expired: nothing to spend or return here.
		return
	case res.Status != store.Deposited && res.Status != store.AlreadyDeposited:
		c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteReturning, Limit: st.id, Lease: d.LeaseID,
			Text: "the store refused the deposit: " + res.Status.String()})
		c.returnLease(st, Return{Limit: st.id, LeaseID: d.LeaseID, Unspent: d.Tokens})
		return
	}
	if res.Status == store.Deposited {
		c.stats.LeasedTokens[d.Store] += d.Tokens
	}
	if !st.holds(d.LeaseID) {
		st.holdings = append(st.holdings, holding{store: d.Store, key: d.Key, id: d.LeaseID, deadline: d.Deadline, start: d.Start})
		// Its close at the deadline goes on the limit's timer. A round's
		// end reschedules its limit (nextDue leaves a limit in a round to
		// it), so only a deposit outside one (a standing share's, carried
		// by a Check) schedules here: one timer entry per change, not a
		// stale one per lease left in the heap until its deadline.
		if st.round == nil {
			c.schedule(st, now)
		}
	}
	if d.next {
		if d.Store == Local {
			st.localNext = d.Key.Window
		} else {
			st.nextWindow = d.Key.Window
		}
	}
}

func (st *limitState) holds(id string) bool {
	for _, h := range st.holdings {
		if h.id == id {
			return true
		}
	}
	return false
}

// Closed hands the Core the outcome of closing cl.IDs (res[i], or errs[i]
// when that close failed). Closing is idempotent in the store and returns
// at the allocator, so a lease found closed already is returned again (the
// replica that closed it may have crashed before returning it); only sub-
// lease tokens (no allocator lease) and unknown leases are not returned.
func (c *Core) Closed(now time.Time, cl Close, res []store.CloseResult, errs []error) {
	st := c.states[cl.Limit]
	if st == nil {
		return
	}
	for i, id := range cl.IDs {
		if i >= len(res) || i < len(errs) && errs[i] != nil {
			continue // still in the store: a later round finds it expired
		}
		st.drop(id)
		if res[i].Unknown || strings.HasPrefix(id, store.SubLeasePrefix) {
			continue
		}
		c.returnLease(st, Return{Limit: st.id, LeaseID: id, Unspent: res[i].Unspent})
	}
	c.step(st, cl.round, now)
	c.schedule(st, now)
}

func (st *limitState) drop(id string) {
	for i, h := range st.holdings {
		if h.id == id {
			st.holdings = append(st.holdings[:i], st.holdings[i+1:]...)
			return
		}
	}
}

// returnLease queues a return, with the limit's unacknowledged ones.
func (c *Core) returnLease(st *limitState, r Return) {
	c.queueUnreturned(st)
	c.ready.Returns = append(c.ready.Returns, r)
	st.inFlight(c, r)
}

func (c *Core) queueUnreturned(st *limitState) {
	if len(st.unreturned) > 0 && !c.allocDown {
		c.ready.Returns = append(c.ready.Returns, st.unreturned...)
		st.inFlight(c, st.unreturned...)
		st.unreturned = nil
	}
}

// inFlight lists returns handed out, at most maxReturns of them (the
// oldest dropped: a return whose outcome never comes is not waited for).
func (st *limitState) inFlight(c *Core, rs ...Return) {
	st.returning = lastReturns(append(st.returning, rs...), c.opt.maxReturns)
}

// lastReturns keeps the last n of rs (the oldest dropped), in rs's array.
func lastReturns(rs []Return, n int) []Return {
	if len(rs) <= n {
		return rs
	}
	return append(rs[:0], rs[len(rs)-n:]...)
}

// returningIn is the unspent tokens of window w that the limit's returns
// in flight or unacknowledged give back to the pool.
func (st *limitState) returningIn(w int64) int64 {
	var n int64
	for _, rs := range [][]Return{st.returning, st.unreturned} {
		for _, r := range rs {
			if lw, ok := LeaseWindow(r.LeaseID); ok && lw == w {
				n += r.Unspent
			}
		}
	}
	return n
}

// current reports whether w is the limit's window at now.
func (c *Core) current(st *limitState, w int64, now time.Time) bool {
	l, ok := c.limits[st.id]
	return ok && c.WindowOf(now, l).Index == w
}

// returned takes r off the limit's returns in flight.
func (st *limitState) returned(r Return) {
	for i, x := range st.returning {
		if x.LeaseID == r.LeaseID {
			st.returning = append(st.returning[:i], st.returning[i+1:]...)
			return
		}
	}
}

// LeaseWindow is the window index a lease id names (the allocator's
// lease ids start with it: "<window>/<region>/<request id>").
func LeaseWindow(id string) (int64, bool) {
	w, _, ok := strings.Cut(id, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(w, 10, 64)
	return n, err == nil
}

// ReturnsDone hands the Core the outcome of sending rets: on err they are
// kept, at most the cap per limit (the oldest dropped first), and sent
// again with the limit's next returns, when the allocator answers again,
// or on the retry timer.
func (c *Core) ReturnsDone(now time.Time, rets []Return, err error) {
	if err == nil {
		for _, r := range rets {
			st := c.states[r.Limit]
			if st == nil {
				continue
			}
			st.returned(r)
			if st.awaitReturn {
				// The pool has the tokens back: the renewal it waited for.
				st.awaitReturn = false
				c.kick(st, now)
			}
			if w, ok := LeaseWindow(r.LeaseID); ok && r.Unspent > 0 && c.current(st, w, now) {
				// The pool has tokens of the window again: a spent mark
				// learned before (from the allocator, or another
				// replica's pool_spent counter, perhaps while this return
				// was on its way) is lifted, and the limit renews (one
				// not marked spent renews when a spend finds it dry).
				st.liftedWindow = w
				if st.spentWindow == w && !st.shareSpent {
					st.spentWindow, st.spentLocal = -1, false
					c.kick(st, now)
				}
			}
		}
		return
	}
	for _, r := range rets {
		st := c.states[r.Limit]
		if st == nil {
			l := Limit{ID: r.Limit}
			if p := c.limits[r.Limit]; p != nil {
				l = *p
			}
			st = c.state(&l)
		}
		st.returned(r) // kept below, with the limit's unacknowledged ones
		dup := false
		for _, u := range st.unreturned {
			if u.LeaseID == r.LeaseID {
				dup = true
				break
			}
		}
		if !dup {
			st.unreturned = append(st.unreturned, r)
			c.pending[st.id] = st
			c.retrying[st.id] = st
		}
		if len(st.unreturned) > c.opt.maxReturns {
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteReturnLost, Limit: st.id,
				Text: "unacknowledged returns over the cap were dropped"})
			st.unreturned = lastReturns(st.unreturned, c.opt.maxReturns)
		}
		c.retryLater(now)
	}
}

// retryLater makes sure the report timer runs, which also sends
// unacknowledged returns again.
func (c *Core) retryLater(now time.Time) {
	if at := now.Add(c.opt.retryEvery); c.reportAt.IsZero() || at.Before(c.reportAt) {
		c.reportAt = at
	}
}

// drainLocal closes every in-process lease of a limit (Redis answers
// again: the region goes back to one shared balance).
func (c *Core) drainLocal(now time.Time, st *limitState) {
	var local []holding
	kept := st.holdings[:0]
	for _, h := range st.holdings {
		if h.store == Local {
			local = append(local, h)
			continue
		}
		kept = append(kept, h)
	}
	st.holdings = kept
	if len(local) > 0 {
		c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteDrained, Limit: st.id})
		c.closeHoldings(st, local)
	}
	_ = now
}
