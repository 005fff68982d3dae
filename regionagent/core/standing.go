package core

import (
	"time"

	"leasehold/lease"
)

// Standing shares. A limit with a standing share (Limit.Standing) gives
// each of its regions that many tokens of every window, counted as
// granted by the allocator from the window's start, without a request.
// A Check's spend, the first of this replica in a window of a limit with a
// share, carries the share's deposit (Check.Deposit: a Deposit like a
// lease's, under lease.StandingLeaseID, the same id on every replica, so
// the bucket takes it once), made before the spend in the same pipeline:
// the limit's first Checks of a window are decided in one round trip to
// Redis, with no call to the allocator. The share is then a holding like
// any lease: closed at its deadline, its unspent tokens returned.
//
// The share may be spent only while the allocator's clock is surely in
// its window, so its start and deadline on the agent's clock come from
// clockBounds (the latest clock exchange with the allocator: its clock
// was read somewhere between the call's send and receipt), less the
// safety margin for the drift since the exchange. And it is deposited
// only from a snapshot of the limits taken in the window (on the
// allocator's clock): the share changes only at window boundaries (the
// allocator refuses other changes), so that snapshot has the share the
// allocator counts for the window. With allocator groups, the clock and
// the snapshot are those of the group that owns the window, whose
// allocator counts the share (SetShareGroups). Only in the region's
// shared store: replicas spending in process (Redis down) each hold
// their own, and a share is the region's.

// SetShareGroups tells the Core that allocator groups own the limits'
// windows (nil: one allocator). owner names the group whose allocator
// counts the standing share of limit's window starting at start (on the
// allocator's clock), with ok false when the Core's definition of the
// limit is not that group's own (the window's owner did not send it): the
// share is then left unused, since the tokens would count with no
// allocator. Each group's allocator has a clock of its own: a share is
// spent within the bounds of its owner's clock, from a snapshot its owner
// took in the window (SetGroupClock); a group whose clock was never read
// leaves its shares unused.
func (c *Core) SetShareGroups(owner func(limit string, start time.Time) (group string, ok bool)) {
	c.shareOwner = owner
}

// groupClock is what the Core knows of one allocator group's clock: the
// bounds from its latest sync, and when that sync's snapshot of the
// group's limits was taken (its clock).
type groupClock struct {
	bounds clockBounds
	taken  time.Time
}

// SetGroupClock records group's allocator clock as read by a limit sync
// sent at sent and answered at recv, alloc being the clock the answer
// carried (its snapshot was taken then): the bounds a standing share of a
// window that group owns is spent within (SetShareGroups).
func (c *Core) SetGroupClock(group string, sent, recv, alloc time.Time) {
	if c.groupClocks == nil {
		c.groupClocks = map[string]groupClock{}
	}
	c.groupClocks[group] = groupClock{bounds: boundsOf(sent, recv, alloc), taken: alloc}
}

// boundsOf bounds the allocator's clock read as alloc by a call sent at
// sent and answered at recv.
func boundsOf(sent, recv, alloc time.Time) clockBounds {
	return clockBounds{lo: alloc.Sub(recv), hi: alloc.Sub(sent), at: recv, set: !recv.Before(sent)}
}

// shareClock returns the bounds of the clock of the allocator that counts
// the share of st's window w (unset: never read), and when the snapshot
// of the limits the Core holds was taken on that clock; ok false when no
// allocator may count it (a definition not its owner's).
func (c *Core) shareClock(st *limitState, w lease.Window) (b clockBounds, taken time.Time, ok bool) {
	if c.shareOwner == nil {
		return c.clock, c.takenAt, true
	}
	group, ok := c.shareOwner(st.id, w.Start())
	g := c.groupClocks[group]
	return g.bounds, g.taken, ok
}

// clockBounds bound the allocator's clock, as read by one call: it was
// alloc at some instant between sent and recv (agent clock), so at agent
// time t it was within [t + lo, t + hi] then, and drifts from there.
type clockBounds struct {
	lo, hi time.Duration
	at     time.Time // recv
	set    bool
}

// shareSpan returns when window w's standing share may be spent, on the
// agent's clock, by the allocator's clock bounds b: from the first instant
// that clock is surely past w's start to the last it is surely before w's
// end, each less the safety margin for the drift since the exchange. ok is
// false when the clock was never read or nothing of w is sure.
func (c *Core) shareSpan(b clockBounds, w lease.Window) (start, deadline time.Time, ok bool) {
	if !b.set {
		return time.Time{}, time.Time{}, false
	}
	start = w.Start().Add(-b.lo)
	start = start.Add(c.margin(max(0, start.Sub(b.at))))
	deadline = w.End().Add(-b.hi)
	deadline = deadline.Add(-c.margin(max(0, deadline.Sub(b.at))))
	return start, deadline, deadline.After(start)
}

// attachStanding gives a Check about to spend in the shared store the
// deposit of the region's standing share of the first of its limits that
// has one due (Check.Deposit), or none.
func (c *Core) attachStanding(now time.Time, chk *Check) {
	chk.Deposit = nil
	if chk.Store != Shared {
		return
	}
	for i, st := range chk.sts {
		if c.standingDue(st, chk.wins[i], now, &chk.deposit) {
			chk.Deposit = &chk.deposit
			return
		}
	}
}

// standingDue sets d to the deposit of the region's standing share of
// st's window w, if this replica has not tried it in w yet and the share
// can be spent at now, and reports whether it did (the replica then
// counts it as tried).
func (c *Core) standingDue(st *limitState, w lease.Window, now time.Time, d *Deposit) bool {
	l := &st.l
	if l.Standing <= 0 || st.standingWin >= w.Index || !c.synced {
		return false
	}
	clock, taken, ok := c.shareClock(st, w)
	if !ok || taken.Before(w.Start()) {
		return false
	}
	start, deadline, ok := c.shareSpan(clock, w)
	if !ok || now.Before(start) || !now.Before(deadline) {
		return false
	}
	st.standingWin = w.Index
	expiry := c.WindowEnd(w)
	if deadline.After(expiry) {
		expiry = deadline
	}
	*d = Deposit{Limit: st.id, Store: Shared, Key: l.key(w.Index),
		LeaseID: lease.StandingLeaseID(w.Index, c.cfg.Region), Tokens: l.Standing,
		Start: start, Deadline: deadline, KeyExpiry: expiry.Add(c.opt.keyGrace), standing: true}
	return true
}
