package simulations

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"leasehold/allocator"
	"leasehold/lease"
	"leasehold/overshoot"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// Agent settings, as regionagent's defaults.
const (
	renewEvery   = 250 * time.Millisecond
	renewLead    = 2 * time.Second
	marginFixed  = 2 * time.Millisecond
	marginPPM    = 1000
	coldWait     = 500 * time.Millisecond
	allocTimeout = time.Second
	allocRetry   = 5 * time.Second
	spentRetry   = time.Second
	idleAfter    = 5 * time.Minute
	keyGrace     = 2 * time.Minute
	clockEvery   = 30 * time.Second
	takeover     = 5 * time.Second // etcd session TTL: a follower takes over
	grantsKeep   = time.Minute     // grant retention after a window
)

const (
	counterPoolSpent = "pool_spent"
)

// leasehold runs the real allocator core in the home region and one agent
// per region, each with its in-memory bucket.
type leasehold struct {
	w      *world
	alloc  *allocNode
	agents []*agent
	limits []*allocator.Limit
	byID   map[string]int
}

func newLeasehold(w *world) *leasehold {
	lh := &leasehold{w: w, byID: map[string]int{}}
	regions := make([]string, len(w.sc.Regions))
	for i, r := range w.sc.Regions {
		regions[i] = r.Name
	}
	slices.Sort(regions)
	for i, ls := range w.sc.Limits {
		lh.limits = append(lh.limits, &allocator.Limit{ID: ls.ID, Tokens: ls.G, Window: w.sc.Window, Regions: regions,
			TTL: ls.TTL, MinChunk: ls.MinChunk, MaxChunk: ls.MaxChunk, Version: 1})
		lh.byID[ls.ID] = i
	}
	lh.alloc = newAllocNode(lh)
	for i := range w.sc.Regions {
		lh.agents = append(lh.agents, newAgent(lh, i))
	}
	return lh
}

func (lh *leasehold) start() {
	lh.alloc.start()
	for _, a := range lh.agents {
		a.start()
	}
}

func (lh *leasehold) check(region, limit int, start time.Duration, done func(outcome, time.Duration)) {
	lh.agents[region].check(limit, start, done)
}

func (lh *leasehold) fault(f Fault, begin bool) {
	switch f.Kind {
	case AllocatorFailover:
		if begin {
			lh.alloc.die()
		} else {
			lh.alloc.rebuild()
		}
	case RegionLoss:
		lh.agents[f.Region].up = false
	case Partition:
		if a := lh.agents[f.Region]; begin && a.heldAtCut < 0 {
			if st := a.states[lh.w.sc.Series]; st != nil {
				now := a.now()
				a.heldAtCut = a.bucket.Balance(BKey{Limit: st.l.ID, Window: a.windowOf(now, st.l).Index}, a.redisMs()).Spendable
			}
		}
	}
}

func (lh *leasehold) finish(r *Result) {
	sc := lh.w.sc
	rec := lh.w.rec
	r.AllocCallsPerSec = float64(lh.alloc.calls) / sc.Duration().Seconds()
	r.BoundNote = "overshoot.Compute per window"
	for li := range sc.Limits {
		g := sc.Limits[li].G
		for wi := range sc.Windows {
			led := lh.alloc.ledger[ledgerKey{li, rec.base + int64(wi)}]
			var granted, returned int64
			if led != nil {
				granted, returned = led.granted, led.credited
			}
			ow := rec.overshootWindow(li, wi, granted, returned)
			b := overshoot.Compute(ow)
			if b.Infinite {
				r.BoundInfinite = true
			} else {
				r.Bound = max(r.Bound, b.Total)
			}
			if !b.Covers(overshoot.Observed(ow)) {
				r.BoundViolations++
			}
			r.LeaseStrandedG = max(r.LeaseStrandedG, float64(overshoot.Stranded(ow))/float64(g))
		}
	}
	var late, useless, refused int64
	for _, a := range lh.agents {
		late += a.lateSpends
		useless += a.useless
		refused += a.refused
	}
	r.LateSpends = late
	if late > 0 {
		r.Notes = append(r.Notes, "spends outside their lease's window: "+strconv.FormatInt(late, 10))
	}
	if lh.alloc.failovers > 0 {
		r.Notes = append(r.Notes, "allocator failovers: "+strconv.Itoa(lh.alloc.failovers)+
			", grants lost uncommitted: "+strconv.FormatInt(lh.alloc.lostUncommitted, 10))
	}
	for _, a := range lh.agents {
		if a.heldAtCut >= 0 {
			r.Notes = append(r.Notes, "tokens "+a.name+" held when cut off: "+strconv.FormatInt(a.heldAtCut, 10))
		}
	}
	if useless+refused > 0 {
		r.Notes = append(r.Notes, "leases returned undeposited: "+strconv.FormatInt(useless+refused, 10))
	}
}

// ---- allocator ----

type ledgerKey struct {
	limit  int
	window int64
}

type ledgerEntry struct{ granted, credited int64 }

// allocNode is the allocator leader: the real Core, with etcd played as "a
// commit takes sc.Commit". A grant is answered only once committed; a
// failover loses what was not committed, and the next leader rebuilds a
// Core from the committed records.
type allocNode struct {
	lh        *leasehold
	core      *allocator.Core
	term      int
	commitAt  map[string]time.Duration              // lease id -> commit instant, this term
	committed map[int64]map[string]*allocator.Grant // etcd: window -> lease id -> record
	ledger    map[ledgerKey]*ledgerEntry            // committed granted / credited per (limit, window)
	calls     int64
	failovers int
	// lostUncommitted counts grants decided but not committed when the
	// leader died (never answered, so never spent).
	lostUncommitted int64
}

func newAllocNode(lh *leasehold) *allocNode {
	a := &allocNode{lh: lh, committed: map[int64]map[string]*allocator.Grant{}, ledger: map[ledgerKey]*ledgerEntry{}}
	a.core = a.newCore()
	a.commitAt = map[string]time.Duration{}
	return a
}

func (a *allocNode) newCore() *allocator.Core {
	c := allocator.NewCore()
	for _, l := range a.lh.limits {
		c.SetLimit(l)
	}
	return c
}

func (a *allocNode) start() {
	w := a.lh.w
	var gc func()
	gc = func() {
		if w.allocUp {
			now := w.sc.Home.At(w.eng.Now())
			for _, k := range a.core.Expired(now, grantsKeep) {
				a.core.Forget(k)
			}
			cur := lease.WindowOf(now, w.sc.Window).Index
			for win := range a.committed {
				if win < cur-2 {
					delete(a.committed, win)
				}
			}
		}
		w.eng.After(30*time.Second, gc)
	}
	w.eng.After(30*time.Second, gc)
}

func (a *allocNode) die() {
	a.term++
	for id, at := range a.commitAt {
		if at > a.lh.w.eng.Now() {
			a.lostUncommitted++
			_ = id
		}
	}
	a.commitAt = map[string]time.Duration{}
	a.failovers++
}

// rebuild is the new leader loading every committed grant.
func (a *allocNode) rebuild() {
	a.core = a.newCore()
	wins := make([]int64, 0, len(a.committed))
	for win := range a.committed {
		wins = append(wins, win)
	}
	slices.Sort(wins)
	for _, win := range wins {
		ids := make([]string, 0, len(a.committed[win]))
		for id := range a.committed[win] {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			g := *a.committed[win][id]
			a.core.Restore(&g)
		}
	}
}

// persist records g as committed (etcd).
func (a *allocNode) persist(g *allocator.Grant) {
	m := a.committed[g.Window]
	if m == nil {
		m = map[string]*allocator.Grant{}
		a.committed[g.Window] = m
	}
	prev := m[g.LeaseID]
	c := *g
	m[g.LeaseID] = &c
	li := a.lh.byID[g.Limit]
	k := ledgerKey{li, g.Window}
	e := a.ledger[k]
	if e == nil {
		e = &ledgerEntry{}
		a.ledger[k] = e
	}
	if prev == nil {
		e.granted += g.Tokens
	}
	if g.Returned && (prev == nil || !prev.Returned) {
		e.credited += g.Credited
	}
}

type acquireReply struct {
	code  pb.ItemCode
	lease *pb.Lease
}

// acquire handles one AcquireLeases item arriving from region.
func (a *allocNode) acquire(region string, req allocator.AcquireRequest, reply func(acquireReply)) {
	w := a.lh.w
	t := w.eng.Now()
	d := a.core.Acquire(w.sc.Home.At(t), region, req)
	switch {
	case d.New:
		g := d.Grant
		at := t + w.sc.Commit
		a.commitAt[g.LeaseID] = at
		term := a.term
		w.eng.At(at, func() {
			if term != a.term {
				return // the leader died before the commit
			}
			a.persist(g)
			reply(acquireReply{lease: g.ToProto(w.sc.Home.At(w.eng.Now()))})
		})
	case d.Replayed:
		g := d.Grant
		at := max(t, a.commitAt[g.LeaseID])
		term := a.term
		w.eng.At(at, func() {
			if term != a.term {
				return
			}
			reply(acquireReply{lease: g.ToProto(w.sc.Home.At(w.eng.Now()))})
		})
	default:
		reply(acquireReply{code: d.Code})
	}
}

// giveBack handles one ReturnLeases call: every return is decided, the
// changed records are committed together, then the call is answered.
func (a *allocNode) giveBack(region string, rs []allocator.ReturnRequest, reply func()) {
	w := a.lh.w
	t := w.eng.Now()
	var changed []*allocator.Grant
	for _, r := range rs {
		d, err := a.core.Return(w.sc.Home.At(t), region, r)
		if err == nil && d.Grant != nil {
			changed = append(changed, d.Grant)
		}
	}
	if len(changed) == 0 {
		reply()
		return
	}
	term := a.term
	w.eng.At(t+w.sc.Commit, func() {
		if term != a.term {
			return
		}
		for _, g := range changed {
			a.persist(g)
		}
		reply()
	})
}

// ---- region agent ----

type leaseReq struct {
	id         string
	next       bool
	demand     float64
	held, want int64
	started    time.Duration
	attempt    int
	done       bool
	backoff    time.Duration
	onDone     func(acquireReply, bool)
	li         int                       // limit index (acquires)
	returns    []allocator.ReturnRequest // a ReturnLeases call
}

type waiter struct {
	start time.Duration
	key   BKey
	done  func(outcome, time.Duration)
	over  bool
}

type limState struct {
	li          int
	l           *allocator.Limit
	demand      *core.Demand
	pending     *leaseReq
	pendingNext *leaseReq
	spentWindow int64
	spentAt     time.Time
	nextWindow  int64
	kickCost    int64
	failing     bool
	fresh       bool
	busy        bool
	kicked      bool
	kickQueued  bool
	lastActive  time.Time
	waiters     []*waiter
}

// agent is a region agent with one replica: the Check path, the renewal
// round (the real PlanRenewal), deposits with the agent's conservative
// deadlines, closes and returns. Its allocator calls are retried with the
// same request id, one attempt at a time, as regionagent's client does.
type agent struct {
	lh        *leasehold
	ri        int
	name      string
	clock     Clock // the agent's host
	redis     Clock // the region's Redis
	bucket    *Bucket
	cs        bucket.ClockSync
	offset    int64 // allocator clock - agent clock, ns
	states    []*limState
	active    []int // limit indexes with a state, in creation order
	seq       uint64
	rng       *rand.Rand
	up        bool
	heldAtCut int64
	ticks     int64

	lateSpends, useless, refused int64
}

func newAgent(lh *leasehold, ri int) *agent {
	r := lh.w.sc.Regions[ri]
	return &agent{lh: lh, ri: ri, name: r.Name, clock: r.Agent, redis: r.Redis,
		bucket: NewBucket(keyGrace.Milliseconds()), states: make([]*limState, len(lh.limits)),
		rng: stream(lh.w.seed, 3, uint64(ri)), up: true, heldAtCut: -1}
}

func (a *agent) eng() *Engine { return a.lh.w.eng }

func (a *agent) now() time.Time { return a.clock.At(a.eng().Now()) }

func (a *agent) redisMs() int64 { return a.redis.Ms(a.eng().Now()) }

func (a *agent) start() {
	w := a.lh.w
	// SyncLimits: learn the allocator's clock from one round trip.
	t := w.eng.Now()
	half := w.sc.Regions[a.ri].RTT / 2
	sent := a.clock.At(t)
	allocNs := w.sc.Home.At(t + half).UnixNano()
	recv := a.clock.At(t + 2*half)
	mid := sent.Add(recv.Sub(sent) / 2)
	a.offset = allocNs - mid.UnixNano()
	a.syncClock()
	w.eng.After(time.Duration(a.rng.Int64N(int64(renewEvery))), a.tick)
}

// syncClock samples Redis TIME five times and keeps the tightest sample
// (bucket.ClockSync, the agent's own conversion).
func (a *agent) syncClock() {
	if !a.up {
		return
	}
	t := a.eng().Now()
	best := time.Duration(math.MaxInt64)
	for range 5 {
		d1 := 100*time.Microsecond + time.Duration(a.rng.Int64N(int64(400*time.Microsecond)))
		d2 := 100*time.Microsecond + time.Duration(a.rng.Int64N(int64(400*time.Microsecond)))
		sent := a.clock.At(t)
		rt := a.redis.At(t + d1).Truncate(time.Microsecond)
		recv := a.clock.At(t + d1 + d2)
		c, err := bucket.NewClockSync(sent, recv, rt)
		if err == nil && c.RTT() < best {
			best, a.cs = c.RTT(), c
		}
		t += d1 + d2
	}
	a.eng().After(clockEvery, a.syncClock)
}

func (a *agent) windowOf(now time.Time, l *allocator.Limit) lease.Window {
	return lease.WindowOf(now.Add(time.Duration(a.offset)), l.Window)
}

func (a *agent) windowEnd(w lease.Window) time.Time {
	return w.End().Add(-time.Duration(a.offset))
}

func (a *agent) state(li int, now time.Time) *limState {
	st := a.states[li]
	if st == nil {
		l := a.lh.limits[li]
		prior := float64(l.Tokens) / l.Window.Seconds() / float64(max(1, len(l.Regions)))
		st = &limState{li: li, l: l, demand: core.NewDemand(prior), spentWindow: -1, nextWindow: -1, fresh: true}
		a.states[li] = st
		a.active = append(a.active, li)
	}
	st.lastActive = now
	return st
}

// check is the Check path: spend from the bucket; below the low-water mark
// after a spend, kick a renewal; denied, kick and (once, for a fresh limit)
// wait for the first lease.
func (a *agent) check(li int, start time.Duration, done func(outcome, time.Duration)) {
	if !a.up {
		return
	}
	now := a.now()
	st := a.state(li, now)
	w := a.windowOf(now, st.l)
	key := BKey{Limit: st.l.ID, Window: w.Index}
	a.decide(st, key, w, start, done, true)
}

func (a *agent) decide(st *limState, key BKey, w lease.Window, start time.Duration, done func(outcome, time.Duration), cold bool) {
	eng := a.eng()
	t := eng.Now()
	now := a.clock.At(t)
	kr := a.bucket.Spend1(key, 1, a.redis.Ms(t))
	ok, balance := kr.Allowed, kr.Balance
	rtt := a.lh.w.sc.LocalRTT
	if ok {
		// A lease of window key.Window spent at t must lie in that window
		// of the allocator's clock (true time): the agent's deadlines
		// guarantee it.
		if lease.WindowOf(a.lh.w.sc.Home.At(t), st.l.Window).Index != key.Window {
			a.lateSpends++
		}
		eng.After(rtt, func() { done(admitted, t) })
		if balance < a.lowWater(st, w, now) {
			a.kick(st)
		}
		return
	}
	st.kickCost = max(st.kickCost, 1)
	spent := st.spentWindow == w.Index
	failing := st.failing
	fresh := st.fresh
	st.fresh = false
	if !spent && !failing {
		a.kick(st)
		if cold && fresh {
			wt := &waiter{start: start, key: key, done: done}
			st.waiters = append(st.waiters, wt)
			eng.After(coldWait, func() {
				if wt.over {
					return
				}
				wt.over = true
				done(denied, eng.Now())
			})
			return
		}
	}
	o := denied
	if failing && !spent {
		o = unavailable
	}
	eng.After(rtt, func() { done(o, t) })
}

// notify wakes the requests waiting for the limit's first lease.
func (a *agent) notify(st *limState) {
	ws := st.waiters
	st.waiters = nil
	for _, wt := range ws {
		if wt.over {
			continue
		}
		wt.over = true
		w := lease.Window{Index: wt.key.Window, Length: st.l.Window}
		a.decide(st, wt.key, w, wt.start, wt.done, false)
	}
}

func (a *agent) lowWater(st *limState, w lease.Window, now time.Time) int64 {
	rate := st.demand.Rate(now)
	left := a.windowEnd(w).Sub(now)
	return max(1, min(lease.LowWater(rate, renewLead), int64(math.Ceil(rate*left.Seconds()))))
}

func (a *agent) kick(st *limState) {
	if st.busy {
		st.kicked = true
		return
	}
	if st.kickQueued {
		return
	}
	st.kickQueued = true
	a.eng().After(0, func() {
		st.kickQueued = false
		a.evaluate(st)
	})
}

// tick is the renewal loop: every active limit, every renewEvery.
func (a *agent) tick() {
	if !a.up {
		return
	}
	now := a.now()
	kept := a.active[:0]
	for _, li := range a.active {
		st := a.states[li]
		if now.Sub(st.lastActive) > idleAfter && st.pending == nil && st.pendingNext == nil && !st.busy {
			a.states[li] = nil
			continue
		}
		kept = append(kept, li)
	}
	a.active = kept
	for _, li := range a.active {
		a.evaluate(a.states[li])
	}
	a.ticks++
	if a.ticks%40 == 0 {
		a.bucket.Sweep(a.redisMs())
	}
	a.eng().After(renewEvery, a.tick)
}

// evaluate is regionagent's evaluate: read the bucket, learn the demand,
// plan with PlanRenewal, then acquire, acquire next, and return every
// closed lease in one call, one step after another.
func (a *agent) evaluate(st *limState) {
	if !a.up || st.busy {
		return
	}
	now := a.now()
	l := st.l
	w := a.windowOf(now, l)
	key := BKey{Limit: l.ID, Window: w.Index}
	bal := a.bucket.Balance(key, a.redisMs())
	st.demand.Observe(now, w.Index, bal.Admitted+bal.Denied)
	rate := st.demand.Rate(now)
	for _, c := range bal.Counters {
		if c.Name == counterPoolSpent && c.Value > 0 && st.spentWindow != w.Index {
			st.spentWindow, st.spentAt = w.Index, now
			a.notify(st)
		}
	}
	spent := st.spentWindow == w.Index && now.Sub(st.spentAt) < spentRetry
	p := core.PlanRenewal(core.PlanInput{NowMs: a.cs.ToRedis(now), Left: a.windowEnd(w).Sub(now),
		Rate: rate, TTL: l.TTL, Lead: renewLead, Every: renewEvery, Bucket: bal, Spent: spent,
		Pending: st.pending != nil, NextDone: st.nextWindow == w.Index+1, KickCost: st.kickCost})
	if p.Idle() {
		return
	}
	st.busy = true
	var steps []func(next func())
	ids := make([]string, 0, len(p.Close)+len(p.Surplus))
	for _, e := range p.Close {
		ids = append(ids, e.ID)
	}
	for _, o := range p.Surplus {
		ids = append(ids, o.ID)
	}
	if p.Acquire {
		steps = append(steps, func(next func()) { a.acquire(st, false, rate, p.Held, p.Want, next) })
	}
	if p.AcquireNext {
		steps = append(steps, func(next func()) { a.acquire(st, true, rate, 0, 0, next) })
	}
	if len(ids) > 0 {
		// As regionagent: acquire first, then one ReturnLeases call for
		// every lease closed in this round.
		steps = append(steps, func(next func()) { a.closeAndReturn(st, key, ids, next) })
	}
	var run func(i int)
	run = func(i int) {
		if i == len(steps) || !a.up {
			st.busy = false
			if st.kicked {
				st.kicked = false
				a.kick(st)
			}
			return
		}
		steps[i](func() { run(i + 1) })
	}
	run(0)
}

func (a *agent) closeAndReturn(st *limState, key BKey, ids []string, next func()) {
	req := &leaseReq{}
	for _, id := range ids {
		res, err := a.bucket.Close(key, id, a.redisMs())
		if err != nil {
			continue
		}
		req.returns = append(req.returns, allocator.ReturnRequest{Limit: st.l.ID, LeaseID: id, Unspent: res.Unspent})
	}
	if len(req.returns) == 0 {
		next()
		return
	}
	a.call(req, func(_ acquireReply, _ bool) { next() })
}

// call sends req to the allocator and retries it unchanged (same request
// id) after each per-attempt timeout, with jittered exponential backoff,
// for up to allocRetry; onDone gets the first answer, or ok false.
func (a *agent) call(req *leaseReq, onDone func(acquireReply, bool)) {
	eng := a.eng()
	req.started = eng.Now()
	req.backoff = 50 * time.Millisecond
	req.onDone = onDone
	a.attempt(req)
}

func (a *agent) attempt(req *leaseReq) {
	eng := a.eng()
	req.attempt++
	n := req.attempt
	w := a.lh.w
	answer := func(r acquireReply) {
		w.net.Send(homeHost, a.name, func() {
			if req.done || req.attempt != n || !a.up {
				return
			}
			req.done = true
			req.onDone(r, true)
		})
	}
	w.net.Send(a.name, homeHost, func() {
		if !w.allocUp {
			return
		}
		alloc := w.impl.(*leasehold).alloc
		alloc.calls++
		if req.returns != nil {
			alloc.giveBack(a.name, req.returns, func() { answer(acquireReply{}) })
			return
		}
		alloc.acquire(a.name, allocator.AcquireRequest{RequestID: req.id, Limit: a.lh.limits[req.li].ID,
			Next: req.next, Demand: req.demand, Held: req.held, Want: req.want}, answer)
	})
	eng.After(allocTimeout, func() {
		if req.done || req.attempt != n {
			return
		}
		if eng.Now()-req.started+req.backoff >= allocRetry || !a.up {
			req.done = true
			req.onDone(acquireReply{}, false)
			return
		}
		d := req.backoff/2 + time.Duration(a.rng.Int64N(int64(req.backoff)))
		req.backoff = min(req.backoff*3/2, time.Second)
		eng.After(d, func() {
			if !req.done {
				a.attempt(req)
			}
		})
	})
}

// acquire asks for one lease (or replays the unanswered request) and
// deposits it, as regionagent's acquire.
func (a *agent) acquire(st *limState, next bool, rate float64, held, want int64, then func()) {
	req := st.pending
	if next {
		req = st.pendingNext
	}
	if req == nil {
		a.seq++
		req = &leaseReq{id: a.name + "-" + strconv.FormatUint(a.seq, 10), next: next, demand: rate, held: held, want: want,
			li: st.li}
		if next {
			st.pendingNext = req
		} else {
			st.pending = req
		}
	}
	req.done = false
	sent := a.now()
	a.call(req, func(r acquireReply, ok bool) {
		defer then()
		recv := a.now()
		if !ok {
			st.failing = true
			a.notify(st)
			return
		}
		if next {
			st.pendingNext = nil
		} else {
			st.pending = nil
		}
		st.failing = false
		st.kickCost = 0
		if r.code != pb.ItemCode_ITEM_CODE_OK {
			a.notify(st)
			return
		}
		ls := r.lease
		if ls == nil || ls.Tokens == 0 {
			if ls == nil || ls.PoolLeft == 0 {
				// As regionagent: the spent window is named from the
				// reply's arrival.
				w := a.windowOf(recv, st.l)
				if next {
					w = w.Next()
				}
				st.spentWindow, st.spentAt = max(st.spentWindow, w.Index), recv
				if !next {
					_, _ = a.bucket.AddCounter(BKey{Limit: st.l.ID, Window: w.Index}, counterPoolSpent, 1, a.redisMs())
				}
			}
			a.notify(st)
			return
		}
		wl := ls.WindowLeft.AsDuration()
		allocNow := (ls.WindowIndex+1)*ls.Window.AsDuration().Nanoseconds() - wl.Nanoseconds()
		a.offset = allocNow - recv.UnixNano()
		if err := a.deposit(st, ls, sent, recv); err != nil {
			a.useless++
			ret := &leaseReq{returns: []allocator.ReturnRequest{{Limit: st.l.ID, LeaseID: ls.LeaseId, Unspent: ls.Tokens}}}
			a.call(ret, func(acquireReply, bool) {})
		} else if next {
			st.nextWindow = ls.WindowIndex
		}
		a.notify(st)
	})
}

type depositErr string

func (e depositErr) Error() string { return string(e) }

// deposit stores a lease with its agent deadline on Redis's clock: from
// the send, minus the safety margin, converted with the conservative bound.
func (a *agent) deposit(st *limState, ls *pb.Lease, sent, recv time.Time) error {
	expiresIn := ls.ExpiresIn.AsDuration()
	margin := marginFixed + time.Duration(float64(expiresIn)*marginPPM/1e6)
	deadline := lease.Deadline(sent, expiresIn, margin)
	start := lease.StartAt(recv, ls.StartsIn.AsDuration())
	d := Deposit{Key: BKey{Limit: st.l.ID, Window: ls.WindowIndex}, LeaseID: ls.LeaseId, Tokens: ls.Tokens,
		StartMs: a.cs.ToRedisStart(start), DeadlineMs: a.cs.ToRedis(deadline), NowMs: a.redisMs()}
	if ls.StartsIn.AsDuration() <= 0 {
		d.StartMs = 0
	}
	if d.DeadlineMs <= d.StartMs {
		return depositErr("lease expires before it starts")
	}
	windowEnd := recv.Add(ls.WindowLeft.AsDuration())
	d.ExpireAtMs = max(a.cs.ToRedis(windowEnd), d.DeadlineMs) + keyGrace.Milliseconds()
	res, err := a.bucket.Deposit(d)
	if err != nil {
		return err
	}
	if res.Status != bucket.Deposited && res.Status != bucket.AlreadyDeposited {
		a.refused++
		return depositErr("refused: " + res.Status.String())
	}
	return nil
}
