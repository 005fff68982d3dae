package core

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"leasehold/internal/seeded"
	"leasehold/lease"
	"leasehold/regionagent/store"
)

// ErrUnknownLimit: the limit is not in the region's snapshot.
var ErrUnknownLimit = errors.New("core: unknown limit")

// ItemError is bad input in one item of a Check. It wraps ErrUnknownLimit
// for an unknown limit; otherwise it is invalid input in Field (wrapping
// store.ErrCrossSlot for limits that cannot be spent in one call).
type ItemError struct {
	Index  int    // the item
	Field  string // "limit_id" or "cost"
	Reason string
	Err    error // ErrUnknownLimit; store.ErrCrossSlot (limits not checkable together); nil for other invalid input
}

func (e *ItemError) Error() string { return e.Field + ": " + e.Reason }
func (e *ItemError) Unwrap() error { return e.Err }

// MaxLimitID is the longest limit id a Check may name.
const MaxLimitID = 200

// Item is one limit and cost of a Check.
type Item struct {
	Limit string
	Cost  int64 // 0 means 1
}

// Step is what a Check needs next.
type Step int8

// Steps.
const (
	// StepSpend: spend Costs from Keys in Store, all or nothing, and hand
	// the result to Spent.
	StepSpend Step = iota + 1
	// StepWait: wait until one of the Keys' limits changes (a Ready's
	// Wake names it) or Until, then call Woke.
	StepWait
	// StepCount: admit the request under its limits' fallback modes
	// (Count, all or nothing, never past a cap: store.FallbackAdd) and hand
	// the outcome to Counted.
	StepCount
	// StepDone: Answers (or Err) are final.
	StepDone
	// StepTake: take Costs[0] from the token bucket RateKey in Store (a
	// bucket limit) and hand the result to Taken.
	StepTake
)

// Answer is the decision for one item of a Check.
type Answer struct {
	Allowed    bool
	Reason     Reason
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	Limit      int64
	Window     time.Duration
	// Phase is the window limit's phase offset (its windows start at k x
	// Window + Phase on the allocator's clock).
	Phase time.Duration
	// Cal is the calendar of a calendar limit (zero otherwise): Window is
	// then the length of the window the Check was decided in.
	Cal     lease.Calendar
	Version int64
	// WouldDeny is, for a limit in shadow mode, the reason enforcement
	// would have denied the item (ReasonOverLimit or ReasonUnavailable):
	// Allowed is then true and Reason ReasonOK. 0 otherwise.
	WouldDeny Reason
}

// Check is one Check on its way through the Core. Begin makes it; the
// caller carries out its Step and hands the result back until Step is
// StepDone. A Check belongs to one Core and one caller at a time.
type Check struct {
	Step  Step
	Store Store
	Keys  []store.Key // StepSpend: one per item; StepWait: the limits to wait on
	Costs []int64
	// Counted (StepSpend; nil until a spend of the Check was refused) is,
	// per item, whether an earlier spend of this Check in the same key and
	// store was refused with the item's cost counted as denied: the store
	// does not count it again, and moves it to admitted if it pays now
	// (bucket.SpendOp.Counted). A Check that waits for a lease and spends
	// again then counts once in the region's demand.
	Counted []bool
	// Deposit (StepSpend in the Shared store; nil for most spends) is the
	// region's standing share of a window (standing.go): deposit it
	// before the spend, in the same pipeline, and hand its outcome to
	// Deposited before the spend's to Spent.
	Deposit *Deposit
	Until   time.Time           // StepWait
	Count   []store.FallbackAdd // StepCount
	RateKey store.RateKey       // StepTake
	// TakeShadow: the take is of a limit in shadow mode (StepTake): the
	// store counts a take it cannot pay as a would-deny, uncharged.
	TakeShadow bool
	// StepDone:
	Answers  []Answer
	Result   Result
	StoreErr bool  // a spend was not decided by the store
	Err      error // an *ItemError
	// Demand and Since are set once a spend of one limit was decided:
	// the demand for it the Core measures (cost per second; the region's,
	// or in process this replica's), and how long before this Check this
	// replica last Checked it or reserved from it (0 for its first). The
	// agent looks for hot limits only among those with demand or checked
	// again soon, so a limit used once costs nothing more.
	Demand float64
	Since  time.Duration

	sts      []*limitState
	wins     []lease.Window
	deadline time.Time // for a lease
	lookupBy time.Time // for a limit sync
	items    []Item
	after    SyncToken // the syncs started before it arrived
	lookup   bool      // waiting for a limit sync: a limit of the Check was not in the snapshot
	// shadowed is, in a Check of shadow and enforced limits, the reason
	// each shadow item would have been denied for (0: it would not): those
	// items were taken out of the spend (cost 0), and the enforced ones
	// decide. nil in other Checks.
	shadowed    []Reason
	shadowCosts []int64
	failed      int     // the item whose spend was refused (a spent pool)
	deposit     Deposit // backs Deposit

	// one backs the slices of a Check of one item (most Checks), so that
	// such a Check allocates only itself.
	one struct {
		item [1]Item
		key  [1]store.Key
		cost [1]int64
		st   [1]*limitState
		win  [1]lease.Window
		ans  [1]Answer
		cnt  [1]bool
	}
}

// noteDenied records the items of a refused spend whose cost the store
// counted as denied (Counted).
func (chk *Check) noteDenied(res store.SpendResult) {
	if chk.Counted == nil {
		if len(chk.sts) == 1 {
			chk.Counted = chk.one.cnt[:]
		} else {
			chk.Counted = make([]bool, len(chk.sts))
		}
	}
	for i, kr := range res.Keys {
		if !kr.Allowed && chk.Costs[i] > 0 {
			chk.Counted[i] = true
		}
	}
}

// respend makes the Check spend again at now: in the window of now (a
// boundary may have passed) and the store in use. An item counted as
// denied in another key or store is no longer counted.
func (c *Core) respend(now time.Time, chk *Check) {
	c.name(now, chk)
	if s := c.store(); s != chk.Store {
		clear(chk.Counted)
		chk.Store = s
	}
	chk.Step = StepSpend
	c.attachStanding(now, chk)
}

// answers returns n zero answers (in the Check itself when n is 1).
func (chk *Check) answers(n int) []Answer {
	if n == 1 {
		chk.one.ans[0] = Answer{}
		return chk.one.ans[:]
	}
	return make([]Answer, n)
}

// Lookup reports whether a Check at StepWait waits for a limit sync (one
// of its limits is not in the snapshot): the caller has one sent soon,
// SyncStart after now. One sync answers every Check waiting, so the caller
// may batch them (the agent sends at most one every 100 ms).
func (chk *Check) Lookup() bool { return chk.Step == StepWait && chk.lookup }

// Begin starts a Check of items at now; the caller must answer by
// deadline (the Core's wait bound applies too).
func (c *Core) Begin(now time.Time, items []Item, deadline time.Time) *Check {
	if len(items) == 1 {
		return c.BeginOne(now, items[0], deadline)
	}
	chk := &Check{Costs: make([]int64, len(items)), Keys: make([]store.Key, len(items))}
	return c.begin(now, chk, items, deadline)
}

// BeginOne is Begin of one item. The Check is taken from a pool: one
// the caller gives back with Release costs no allocation.
func (c *Core) BeginOne(now time.Time, it Item, deadline time.Time) *Check {
	chk := checkPool.Get().(*Check)
	chk.one.item[0] = it
	chk.Costs, chk.Keys = chk.one.cost[:], chk.one.key[:]
	return c.begin(now, chk, chk.one.item[:], deadline)
}

// checkPool holds the Checks of one item given back with Release.
var checkPool = sync.Pool{New: func() any { return new(Check) }}

// Release gives back a Check of one item (BeginOne) once it is done and
// its caller has read its answer: nothing may use it afterwards, and
// nothing else may still hold it (a store call it started that its
// caller gave up on reads its Costs: such a Check is not released).
// Other Checks are left to the garbage collector.
func Release(chk *Check) {
	if chk == nil || chk.Step != StepDone || len(chk.Costs) != 1 || &chk.Costs[0] != &chk.one.cost[0] {
		return
	}
	*chk = Check{}
	checkPool.Put(chk)
}

func (c *Core) begin(now time.Time, chk *Check, items []Item, deadline time.Time) *Check {
	chk.deadline, chk.lookupBy = now.Add(c.opt.wait), now.Add(c.opt.lookupWait)
	if !deadline.IsZero() {
		chk.deadline, chk.lookupBy = minTime(chk.deadline, deadline), minTime(chk.lookupBy, deadline)
	}
	for i, it := range items {
		switch {
		case it.Limit == "":
			return chk.fail(&ItemError{Index: i, Field: "limit_id", Reason: "required"})
		case len(it.Limit) > MaxLimitID:
			return chk.fail(&ItemError{Index: i, Field: "limit_id", Reason: "longer than " + strconv.Itoa(MaxLimitID) + " characters"})
		}
	}
	chk.items, chk.after = items, c.syncs
	c.resolve(now, chk)
	return chk
}

// resolve finds the Check's limits in the snapshot. A limit the snapshot
// does not have is looked up: the Check waits for a limit sync sent after
// it arrived (one sync serves every Check waiting), so a limit created a
// moment ago is enforced from its first Check, and NOT_FOUND is said only
// by a sync that started after the question. Without a snapshot from the
// allocator that can answer (never synced, or the allocator unreachable
// and the snapshot restored from the region's store) the Check is
// UNAVAILABLE: the agent does not know, and says so.
func (c *Core) resolve(now time.Time, chk *Check) {
	items := chk.items
	if c.resolver != nil {
		defer c.unbindStateless(items) // a Check refused before its limits had state keeps nothing
	}
	if !c.synced && !c.restored {
		// No snapshot of the region's limits at all: the agent does not
		// know whether the limit exists, let alone its budget.
		c.notSynced(chk, len(items))
		return
	}
	for i, it := range items {
		if c.limits[it.Limit] != nil || c.bind(it.Limit) {
			continue
		}
		switch {
		case !c.synced || c.allocDown:
			c.notSynced(chk, len(items)) // the snapshot cannot say the limit does not exist
		case c.syncedTo > chk.after: // a sync started after the Check arrived
			chk.fail(&ItemError{Index: i, Field: "limit_id", Err: ErrUnknownLimit,
				Reason: strconv.Quote(it.Limit) + " is not a limit of region " + c.cfg.Region})
		case now.Before(chk.lookupBy):
			c.lookups[it.Limit] = true
			chk.Step, chk.Until, chk.lookup = StepWait, chk.lookupBy, true
			chk.Keys = chk.Keys[:len(items)]
			for j, x := range items {
				chk.Keys[j] = store.Key{Limit: x.Limit}
			}
		default:
			c.notSynced(chk, len(items)) // no sync answered in time
		}
		return
	}
	chk.lookup = false
	if c.cfg.SameSlotRequired {
		if j := splitTag(items, func(i int) *Limit { return c.limits[items[i].Limit] }); j > 0 {
			a, b := c.limits[items[0].Limit], c.limits[items[j].Limit]
			reason := describeTag(a) + " and " + describeTag(b) + " do not share a hash tag, and this region's Redis" +
				" is a Cluster: one CheckMulti spends its limits atomically, in one slot. "
			chk.fail(&ItemError{Index: j, Field: "limit_id", Reason: reason + fixTags, Err: store.ErrCrossSlot})
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteCrossSlot, Limit: a.ID, Text: reason})
			return
		}
	}
	if ie := checkBucketItems(items, func(i int) *Limit { return c.limits[items[i].Limit] }); ie != nil {
		chk.fail(ie)
		return
	}
	if len(items) == 1 {
		chk.sts, chk.wins = chk.one.st[:], chk.one.win[:]
	} else {
		chk.sts, chk.wins = make([]*limitState, len(items)), make([]lease.Window, len(items))
	}
	for i, it := range items {
		l := c.limits[it.Limit]
		cost := it.Cost
		if cost == 0 {
			cost = 1
		}
		if !l.IsBucket() && (cost < 0 || cost > l.Tokens) {
			chk.fail(&ItemError{Index: i, Field: "cost",
				Reason: "must be 1.." + strconv.FormatInt(l.Tokens, 10) + " (the limit's G), got " + strconv.FormatInt(it.Cost, 10)})
			return
		}
		st := c.state(l)
		wasActive := c.active(st, now)
		st.prevCheck, st.lastCheck = st.lastCheck, now
		if !wasActive {
			c.schedule(st, now)
		}
		chk.sts[i], chk.Costs[i] = st, cost
	}
	if chk.sts[0].l.IsBucket() {
		c.beginTake(chk) // checkBucketItems: alone in its Check
		return
	}
	c.name(now, chk)
	chk.Step, chk.Store = StepSpend, c.store()
	c.attachStanding(now, chk)
}

// fixTags says how to make limits checkable together.
const fixTags = "Give the limits checked together one hash_tag (e.g. the tenant; set when a limit is created), or check them in separate calls"

// splitTag returns the first item whose limit (limitOf(i)) has another
// hash tag than the first item's, or -1.
func splitTag(items []Item, limitOf func(i int) *Limit) int {
	tag := limitOf(0).Tag()
	for j := 1; j < len(items); j++ {
		if limitOf(j).Tag() != tag {
			return j
		}
	}
	return -1
}

// describeTag names a limit and its hash tag for an error message.
func describeTag(l *Limit) string {
	if l.HashTag == "" || l.HashTag == l.ID {
		return strconv.Quote(l.ID) + " (no hash_tag: its id is its tag)"
	}
	return strconv.Quote(l.ID) + " (hash_tag " + strconv.Quote(l.HashTag) + ")"
}

// crossSlot refuses a Check whose keys the store would not take in one
// call (a Redis Cluster's CROSSSLOT, where the Core was not told to
// require one slot): invalid input, named, never a fallback or a retry,
// and noted for the log.
func (c *Core) crossSlot(chk *Check) {
	j := splitTag(chk.items, func(i int) *Limit { return &chk.sts[i].l })
	reason := "the region's Redis refused to spend these limits in one call (CROSSSLOT: their keys are in different Redis Cluster slots). "
	if j > 0 {
		reason = "the region's Redis refused to spend " + describeTag(&chk.sts[0].l) + " and " + describeTag(&chk.sts[j].l) +
			" in one call (CROSSSLOT: their keys are in different Redis Cluster slots). "
	}
	note := Note{Kind: NoteCrossSlot, Limit: chk.sts[0].id, Text: reason}
	chk.fail(&ItemError{Index: max(j, 0), Field: "limit_id", Reason: reason + fixTags, Err: store.ErrCrossSlot})
	c.ready.Notes = append(c.ready.Notes, note)
}

// notSynced answers a Check UNAVAILABLE: the agent does not know.
func (c *Core) notSynced(chk *Check, n int) {
	chk.Answers = chk.answers(n)
	for i := range chk.Answers {
		chk.Answers[i] = Answer{Reason: ReasonUnavailable, RetryAfter: c.jitter(time.Second, time.Second)}
	}
	chk.Step, chk.Result = StepDone, ResultNotSynced
}

func (chk *Check) fail(err *ItemError) *Check {
	chk.Step, chk.Err = StepDone, err
	return chk
}

// name sets the Check's windows and keys at now.
func (c *Core) name(now time.Time, chk *Check) {
	for i, st := range chk.sts {
		chk.wins[i] = c.WindowOf(now, &st.l)
		k := st.l.key(chk.wins[i].Index)
		if chk.Counted != nil && k != chk.Keys[i] {
			chk.Counted[i] = false
		}
		chk.Keys[i] = k
	}
}

func (c *Core) answer(now time.Time, chk *Check, reason Reason) {
	chk.Answers = chk.answers(len(chk.sts))
	for i, st := range chk.sts {
		chk.Answers[i] = Answer{Allowed: reason == ReasonOK || reason == ReasonFallback, Reason: reason,
			Limit: st.l.Tokens, Window: st.l.lengthOf(chk.wins[i]), Phase: st.l.Phase, Cal: st.l.Cal, Version: st.l.Version,
			ResetAfter: max(0, c.WindowEnd(chk.wins[i]).Sub(now))}
	}
	chk.Step = StepDone
}

// Spent hands a Check the result of its spend (err: the store did not
// decide it).
func (c *Core) Spent(now time.Time, chk *Check, res store.SpendResult, err error) {
	c.spent(now, chk, res, err)
	c.shadow(now, chk)
}

func (c *Core) spent(now time.Time, chk *Check, res store.SpendResult, err error) {
	chk.Deposit = nil // carried out (Deposited)
	if errors.Is(err, store.ErrCrossSlot) || errors.Is(res.Err, store.ErrCrossSlot) {
		c.crossSlot(chk)
		return
	}
	if err != nil || res.Err != nil || len(res.Keys) != len(chk.sts) {
		// The store cannot answer, so the region cannot decide from it: the
		// fail mode applies (the caller's Redis health tracking moves
		// Checks to the in-process store after a few such failures).
		chk.StoreErr = true
		c.fallback(now, chk)
		return
	}
	for i, kr := range res.Keys {
		st := chk.sts[i]
		c.observe(now, st, chk.Store, chk.Keys[i], kr)
		if !st.timedBusy && c.busy(st, now) {
			c.schedule(st, now) // its renewals before expiry and before the window's end
		}
	}
	if len(chk.sts) == 1 {
		st := chk.sts[0]
		chk.Demand = st.demandIn(chk.Store).Measured(now)
		if !st.prevCheck.IsZero() {
			chk.Since = st.lastCheck.Sub(st.prevCheck)
		}
	}
	defer func() {
		if chk.Step == StepDone && len(chk.Answers) == len(res.Keys) && chk.Result != ResultFallback &&
			chk.Result != ResultFallbackDenied {
			for i, kr := range res.Keys {
				chk.Answers[i].Remaining = kr.Balance
			}
		}
	}()
	if res.Allowed {
		c.answer(now, chk, ReasonOK)
		for i, kr := range res.Keys {
			st := chk.sts[i]
			if kr.Balance < c.lowWater(st, chk.Store, chk.wins[i], now) {
				c.kick(st, now)
			}
		}
		chk.Result = ResultOK
		return
	}
	chk.noteDenied(res)
	f := res.Failed
	if f < 0 || f >= len(chk.sts) {
		f = 0
	}
	chk.failed = f
	st, w := chk.sts[f], chk.wins[f]
	if res.Keys[f].PoolSpent && st.spentWindow < w.Index && st.liftedWindow != w.Index {
		// Another replica learned that the window's pool is spent.
		st.markSpent(w.Index, now, false, chk.Store == Local)
	}
	st.kickCost = max(st.kickCost, chk.Costs[f])
	if end := c.WindowEnd(w); st.spentWindow == w.Index && end.Sub(now) < boundaryWait && now.Before(chk.deadline) {
		// The window ends in a moment (and the agent names windows on an
		// estimate of the allocator's clock): wait for the next one rather
		// than refuse a request the next window's pool may admit.
		chk.Step, chk.Until = StepWait, minTime(chk.deadline, end.Add(time.Millisecond))
		return
	}
	if st.spentWindow == w.Index {
		if now.Sub(st.spentAt) >= c.opt.spentRetry {
			c.kick(st, now) // returns while the window is open may have refilled the pool
		}
		if chk.Store == Local || st.spentLocal || st.unansweredIn(w.Index) {
			// The pool is spent by the allocator's books, which count the
			// leases the region holds in its shared bucket; this replica
			// cannot reach it (Redis down or too slow: a late reply may
			// have deposited there since the pool was said spent), or the
			// mark was learned while it could not, or a deposit of the
			// window that Redis did not answer may land in it yet, so it
			// cannot say the region spent what it was granted:
			// UNAVAILABLE, never an OVER_LIMIT a client's denial cache
			// would hold to the window's end.
			c.unavailable(now, chk, time.Second, time.Second)
			return
		}
		c.answer(now, chk, ReasonOverLimit)
		for i := range chk.Answers {
			if st.shareSpent {
				chk.Answers[i].RetryAfter = c.jitter(c.opt.spentRetry, c.opt.spentRetry)
			} else {
				reset := chk.Answers[i].ResetAfter
				chk.Answers[i].RetryAfter = c.jitter(reset, reset/10)
			}
		}
		chk.Result = ResultOverLimit
		return
	}
	if c.allocDown || st.failing && now.Sub(st.failedAt) < c.opt.spentRetry {
		// The allocator cannot be reached: the fail mode applies. A limit
		// whose own request failed asks again a second later (the
		// allocator may be back before anything says so).
		c.fallback(now, chk)
		return
	}
	c.kick(st, now)
	if now.Before(chk.deadline) {
		chk.Step = StepWait
		chk.Until = chk.deadline
		if st.round == nil && st.lockedUntil.After(now) && st.lockedUntil.Before(chk.Until) {
			chk.Until = st.lockedUntil // another replica renews: look again then
		}
		return
	}
	c.unavailable(now, chk, 50*time.Millisecond, 50*time.Millisecond)
}

// boundaryWait: a Check refused by a spent pool this close to the
// window's end waits for the next window instead: about the error of the
// window naming (the allocator's clock is estimated from replies), short
// enough that a region over its limit at the boundary is not held up.
const boundaryWait = 50 * time.Millisecond

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Woke resumes a waiting Check at now: it spends again (in the window of
// now, should a boundary have passed), or, if it waited for a limit sync,
// looks its limits up again.
func (c *Core) Woke(now time.Time, chk *Check) {
	if chk.lookup {
		c.resolve(now, chk)
		return
	}
	if chk.sts[0].l.IsBucket() {
		c.beginTake(chk)
		return
	}
	c.respend(now, chk)
}

// unavailable answers UNAVAILABLE: the region cannot decide. The short
// retry-after also tells clients' denial caches not to hold the answer.
func (c *Core) unavailable(now time.Time, chk *Check, retry, jitter time.Duration) {
	c.answer(now, chk, ReasonUnavailable)
	for i := range chk.Answers {
		chk.Answers[i].RetryAfter = c.jitter(retry, jitter)
	}
	chk.Result = ResultUnavailable
}

// fallback answers when the region cannot get tokens: per limit, closed
// denies with UNAVAILABLE, local admits up to A per window (counted in the
// shared store; while Redis is down it denies like closed, because "at
// most A in the region" needs the shared count and replicas counting alone
// would admit replicas x A), open admits (counted). Every limit of the
// Check must admit.
func (c *Core) fallback(now time.Time, chk *Check) {
	closed := false
	for _, st := range chk.sts {
		switch st.l.Fallback.kind() {
		case FallbackLocal:
			// (A >= 1 is validated where limits are written; a local:0
			// would admit nothing.)
			closed = closed || chk.Store == Local || st.l.Fallback.LocalTokens <= 0
		case FallbackOpen:
		default:
			closed = true
		}
	}
	if closed {
		for _, st := range chk.sts {
			if st.l.Fallback.kind() == FallbackClosed {
				c.markFallback(st, FallbackClosed)
			}
		}
		c.unavailable(now, chk, time.Second, time.Second)
		return
	}
	chk.Step = StepCount
	chk.Count = make([]store.FallbackAdd, len(chk.sts))
	for i, st := range chk.sts {
		add := store.FallbackAdd{Key: chk.Keys[i], Cost: chk.Costs[i], Mode: store.CounterModeOpen}
		if f := st.l.Fallback; f.kind() == FallbackLocal {
			add.Cap, add.Mode = f.LocalTokens, store.CounterModeLocal
			if seeded.On(seeded.UncountedFallback) {
				add.Mode = ""
			}
		}
		chk.Count[i] = add
	}
}

// Counted hands a Check the outcome of its fallback admission: ok, and the
// counters after it (values[i] belongs to Count[i]); err: the store did
// not decide it.
func (c *Core) Counted(now time.Time, chk *Check, ok bool, values []int64, err error) {
	c.counted(now, chk, ok, values, err)
	c.shadow(now, chk)
}

func (c *Core) counted(now time.Time, chk *Check, ok bool, values []int64, err error) {
	if errors.Is(err, store.ErrCrossSlot) {
		c.crossSlot(chk)
		return
	}
	if err != nil || len(values) != len(chk.Count) {
		c.unavailable(now, chk, time.Second, time.Second)
		return
	}
	if !ok && chk.StoreErr {
		// The fallback applies because a spend went unanswered (Redis
		// slow or failing), not because the region is cut off: its
		// bucket may hold unspent tokens, so a spent fallback allowance
		// does not say the region spent what it was granted.
		c.unavailable(now, chk, time.Second, time.Second)
		return
	}
	if !ok {
		c.answer(now, chk, ReasonOverLimit)
		for j := range chk.Answers {
			chk.Answers[j].RetryAfter = c.jitter(chk.Answers[j].ResetAfter, chk.Answers[j].ResetAfter/10)
		}
		chk.Result = ResultFallbackDenied
		return
	}
	c.answer(now, chk, ReasonFallback)
	for i, st := range chk.sts {
		kind := st.l.Fallback.kind()
		if kind == FallbackLocal {
			chk.Answers[i].Remaining = max(0, st.l.Fallback.LocalTokens-values[i])
		}
		c.markFallback(st, kind)
		c.dirty(now, st, chk.Store, chk.Keys[i].Window)
	}
	chk.Result = ResultFallback
}

// shadow turns a denial of limits in shadow mode into an admission that
// says it would have been denied, once the Check is decided exactly as if
// enforced (waits, renewals and fallbacks included): a shadow limit is
// tried on real traffic with the decisions it would make. A Check of
// shadow limits only is admitted and counted. In a Check that also names
// enforced limits, the shadow limits are taken out of the spend (cost 0,
// their would-be reason kept) and the Check is spent again: the enforced
// limits decide, all or nothing as ever, and the shadow ones are counted
// only if the request is admitted. A Check the agent cannot place
// (unknown limit, not synced) is never turned: the agent does not know
// the limit is in shadow mode.
func (c *Core) shadow(now time.Time, chk *Check) {
	if chk.Step != StepDone || chk.Err != nil || chk.Result == ResultNotSynced || len(chk.Answers) != len(chk.sts) {
		return
	}
	if chk.Answers[0].Allowed {
		if chk.shadowed != nil {
			for i, r := range chk.shadowed {
				if r != 0 {
					c.wouldDeny(now, chk, i, r, chk.shadowCost(i))
				}
			}
		}
		return
	}
	all, any := true, false
	for i, st := range chk.sts {
		if !st.l.Shadow {
			all = false
		} else if chk.Costs[i] > 0 {
			any = true
		}
	}
	if !any || !all && chk.Result == ResultOverLimit && !chk.sts[chk.failed].l.Shadow {
		return // an enforced limit's pool is spent: denied, whatever the shadow ones say
	}
	reason := chk.Answers[0].Reason
	if all {
		for i := range chk.sts {
			c.wouldDeny(now, chk, i, reason, chk.Costs[i])
		}
		chk.Result = ResultWouldDeny
		return
	}
	if chk.shadowed == nil {
		chk.shadowed = make([]Reason, len(chk.sts))
		chk.shadowCosts = make([]int64, len(chk.sts))
	}
	for i, st := range chk.sts {
		if st.l.Shadow && chk.Costs[i] > 0 {
			chk.shadowed[i], chk.shadowCosts[i], chk.Costs[i] = reason, chk.Costs[i], 0
		}
	}
	chk.Answers, chk.Result = nil, ""
	c.respend(now, chk)
}

// shadowCost is item i's cost before the shadow items were taken out of
// the spend.
func (chk *Check) shadowCost(i int) int64 {
	if chk.shadowCosts != nil && chk.shadowCosts[i] > 0 {
		return chk.shadowCosts[i]
	}
	return chk.Costs[i]
}

// wouldDeny admits item i of a Check that enforcement would have denied
// for reason, and counts it in its window's bucket (reported to the
// allocator with the window's other counters).
func (c *Core) wouldDeny(now time.Time, chk *Check, i int, reason Reason, cost int64) {
	a := &chk.Answers[i]
	a.Allowed, a.Reason, a.WouldDeny, a.RetryAfter = true, ReasonOK, reason, 0
	st, key := chk.sts[i], chk.Keys[i]
	c.ready.Counters = append(c.ready.Counters,
		CounterOp{Store: chk.Store, Key: key, Name: store.CounterWouldDeny, Delta: cost},
		CounterOp{Store: chk.Store, Key: key, Name: store.CounterWouldDenyChecks, Delta: 1})
	c.dirty(now, st, chk.Store, key.Window)
}

// markFallback exports the limit's fail mode as in force, once per episode
// (a grant ends it).
func (c *Core) markFallback(st *limitState, kind FallbackKind) {
	if !st.fallbackOn {
		st.fallbackOn = true
		c.ready.Fallback = append(c.ready.Fallback, FallbackMark{Limit: st.id, Kind: kind})
	}
}

// observe learns from one key's part of a spend: the demand, the window's
// use (for reports), the admitted count (for failover estimates).
func (c *Core) observe(now time.Time, st *limitState, s Store, key store.Key, kr store.KeyResult) {
	st.demandIn(s).Observe(now, key.Window, kr.Admitted+kr.Denied)
	u := c.dirty(now, st, s, key.Window)
	if kr.Admitted > u.admitted {
		u.admitted, u.seenAt = kr.Admitted, now
		if s == Shared && c.seenUsed && !u.seenNew {
			u.seenNew = true
			c.seen = append(c.seen, seenRef{st, winKey{s, key.Window}, u})
		}
	}
}

// lowWater is the limit's low-water mark at now in window w (LowWater), from the region's demand or, in process, the replica's.
func (c *Core) lowWater(st *limitState, s Store, w lease.Window, now time.Time) int64 {
	return LowWater(st.demandIn(s).Rate(now), c.opt.lead, c.WindowEnd(w).Sub(now))
}

// jitter returns base plus up to spread, at random.
func (c *Core) jitter(base, spread time.Duration) time.Duration {
	if spread <= 0 {
		return base
	}
	return base + time.Duration(c.rng.Int64N(int64(spread)+1))
}

// ---- sub-leases ----

// Reservation names the bucket a sub-lease reservation of limit takes
// from at now (the shared store; while Redis is down there is none: ok
// false), and counts the limit as checked.
func (c *Core) Reservation(now time.Time, limit string) (l Limit, key store.Key, ok bool, err error) {
	lp := c.limits[limit]
	if lp == nil {
		if !c.synced {
			return Limit{}, store.Key{}, false, nil
		}
		return Limit{}, store.Key{}, false, &ItemError{Field: "limit_id", Err: ErrUnknownLimit,
			Reason: strconv.Quote(limit) + " is not a limit of region " + c.cfg.Region}
	}
	if lp.IsConcurrency() {
		return *lp, store.Key{}, false, nil // refused by the caller: no window state
	}
	st := c.state(lp)
	wasActive := c.active(st, now)
	// A chunk stands for the Checks it decides: two reservations a few
	// seconds apart are traffic, as two Checks are (busy: the limit's
	// leases are renewed ahead and its next window's fetched early).
	st.prevCheck, st.lastCheck = st.lastCheck, now
	if !wasActive {
		c.schedule(st, now)
	}
	return *lp, lp.key(c.WindowOf(now, lp).Index), !c.redisDown, nil
}

// Reserved learns from a reservation's outcome (granted, and the bucket's
// balance after it) and answers its reason and retry-after: a refused
// reservation is OVER_LIMIT only when the pool is known spent; otherwise
// the region is only dry while a renewal it kicks is in flight.
func (c *Core) Reserved(now time.Time, key store.Key, granted bool, balance, minTokens int64) Answer {
	st := c.states[key.Limit]
	if st == nil {
		return Answer{Reason: ReasonUnavailable, RetryAfter: c.jitter(time.Second, time.Second)}
	}
	w := st.l.Windows().ByIndex(key.Window)
	a := Answer{Limit: st.l.Tokens, Window: st.l.lengthOf(w), Phase: st.l.Phase, Cal: st.l.Cal, Version: st.l.Version, Remaining: balance,
		ResetAfter: max(0, c.WindowEnd(w).Sub(now))}
	if granted {
		a.Allowed, a.Reason = true, ReasonOK
		if balance < c.lowWater(st, Shared, w, now) {
			c.kick(st, now)
		}
		return a
	}
	st.kickCost = max(st.kickCost, minTokens)
	c.kick(st, now)
	if st.spentWindow == key.Window && !st.spentLocal && !st.unansweredIn(key.Window) {
		// (A spent pool the replica cannot hold against the region's
		// bucket, as in spent, is not OVER_LIMIT.)
		a.Reason, a.RetryAfter = ReasonOverLimit, c.jitter(a.ResetAfter, a.ResetAfter/10)
		return a
	}
	a.Reason, a.RetryAfter = ReasonUnavailable, c.jitter(50*time.Millisecond, 50*time.Millisecond)
	return a
}

// ---- settle-later decisions ----

// ErrSettleTooLate: a settle-later decision's window is too long over for
// its settlement to be counted (its counts are no longer read and
// reported).
var ErrSettleTooLate = errors.New("core: too late to settle")

// Settlement names the buckets a settle-later decision of limit made in
// window is settled in at now: the window's, and the next window's (where
// an overrun is carried). The decision's own settle-by time is kept with
// it in the store; this refuses (ErrSettleTooLate), whatever that says,
// a window whose counts have been read for the last time (a report round
// before it is forgotten), so no settlement goes unreported. The limit is
// counted as in use, as Reservation does.
func (c *Core) Settlement(now time.Time, limit string, window int64) (l Limit, key, next store.Key, err error) {
	lp := c.limits[limit]
	if lp == nil {
		if !c.synced {
			return Limit{}, store.Key{}, store.Key{}, nil
		}
		return Limit{}, store.Key{}, store.Key{}, &ItemError{Field: "limit_id", Err: ErrUnknownLimit,
			Reason: strconv.Quote(limit) + " is not a limit of region " + c.cfg.Region}
	}
	end := c.WindowEnd(lp.Windows().ByIndex(window))
	if now.After(end.Add(c.opt.keyGrace - c.opt.reportEvery)) {
		return *lp, store.Key{}, store.Key{}, ErrSettleTooLate
	}
	c.state(lp)
	return *lp, lp.key(window), lp.key(window + 1), nil
}

// Charged learns that the counts of the shared store's windows of keys
// changed outside a spend (a settle-later decision or its settlement):
// they are read and reported like spent windows.
func (c *Core) Charged(now time.Time, keys ...store.Key) {
	for _, k := range keys {
		if st := c.states[k.Limit]; st != nil {
			c.dirty(now, st, Shared, k.Window)
		}
	}
}
