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
// allocator counts for the window. Only in the region's shared store:
// replicas spending in process (Redis down) each hold their own, and a
// share is the region's.

// NoStandingShares makes the Core leave standing shares unused: with
// allocator groups, each group's allocator has a clock of its own, and
// the Core keeps one estimate. The allocators still count the shares as
// granted: they are stranded (an undershoot, never more than G).
func (c *Core) NoStandingShares() { c.noStanding = true }

// clockBounds bound the allocator's clock, as read by one call: it was
// alloc at some instant between sent and recv (agent clock), so at agent
// time t it was within [t + lo, t + hi] then, and drifts from there.
type clockBounds struct {
	lo, hi time.Duration
	at     time.Time // recv
	set    bool
}

// shareSpan returns when window w's standing share may be spent, on the
// agent's clock: from the first instant the allocator's clock is surely
// past w's start to the last it is surely before w's end, each less the
// safety margin for the drift since the exchange. ok is false when the
// clock was never read or nothing of w is sure.
func (c *Core) shareSpan(w lease.Window) (start, deadline time.Time, ok bool) {
	b := c.clock
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
	if l.Standing <= 0 || c.noStanding || st.standingWin >= w.Index || !c.synced || c.takenAt.Before(w.Start()) {
		return false
	}
	start, deadline, ok := c.shareSpan(w)
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
