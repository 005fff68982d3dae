package simulations

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"leasehold/allocator"
	"leasehold/lease"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Parameters of the simulated shell (not decisions of the agent: those are
// the core's, with its defaults, which are the region agent's).
const (
	// clockEvery is how often the shell samples its Redis's clock (the
	// region agent's clock loop).
	clockEvery = 30 * time.Second
	// callBackoff is the first retry interval of an allocator call; it
	// grows x1.5 up to a second, +-50% jitter (the region agent's client).
	callBackoff = 50 * time.Millisecond
)

var (
	errUselessLease = errors.New("simulations: lease expires before it starts")
	errCallFailed   = errors.New("simulations: allocator call failed")
)

// agent is a region agent with one replica: a real core.Core (package
// regionagent/core) inside a thin simulated shell that carries out its
// actions on virtual time, as regionagent's shell does for real:
//
//   - Checks: the core's steps run on the region's bucket, a store.Mem on
//     the region's Redis clock; a Check that must wait waits until a
//     Ready's Wake names its limit or until its Until;
//   - Ready: rounds read the bucket (one replica: the renewal lock is
//     always this one's), deposits convert the core's agent-clock times to
//     Redis's clock with bucket.ClockSync as regionagent's redisStore does,
//     closes, counters and reports (acknowledged at once: the simulator's
//     bound uses its own recorder) are carried out on the spot; the
//     acquires of one Ready go in one call to the allocator node, its
//     returns in another, over the simulated network;
//   - timers: one engine event at the core's NextWake, which calls Tick.
//
// Allocator health: the shell has no circuit breaker and never calls
// core.SetAllocatorHealth; a call that fails for good is AcquireFailed,
// and the core applies the limit's fallback for a while and then asks
// again on the next Check. (The region agent's breaker would, after three
// failed calls, put every limit in its fallback at once and probe with the
// limit sync. With the closed fallback of every scenario both answer
// UNAVAILABLE; here a Check may first wait for a round in flight, up to
// the core's wait bound.)
//
// Store operations take no virtual time; a Check's answer reaches the
// gateway the scenario's LocalRTT after its decision.
type agent struct {
	lh     *leasehold
	ri     int
	name   string
	clock  Clock // the agent's host
	redis  Clock // the region's Redis
	bucket *Bucket
	cs     bucket.ClockSync
	core   *core.Core
	rng    *rand.Rand // Redis clock samples, call retry jitter
	up     bool

	waiters map[string][]wakeup // Checks waiting on a limit's change, by limit id

	// The pending timer event: at timerAt (true time) if timerSet; an
	// event whose generation is not timerGen is stale and does nothing.
	timerAt  time.Duration
	timerSet bool
	timerGen uint64
	ticksAt  time.Duration // the instant of the last timer event,
	ticksN   int           // and how many ran then (a guard against a spin)

	heldAtCut   int64
	lateSpends  int64
	undeposited int64
}

// waiter is one Check on its way through the core, and the gateway's
// callback for its answer.
type waiter struct {
	chk     *core.Check
	done    func(outcome, time.Duration)
	waits   uint64 // waits so far; a wake-up names the wait it ends
	waiting bool
}

// wakeup ends wait number n of a waiter, if it is still that wait.
type wakeup struct {
	w *waiter
	n uint64
}

func newAgent(lh *leasehold, ri int) *agent {
	r := lh.w.sc.Regions[ri]
	return &agent{lh: lh, ri: ri, name: r.Name, clock: r.Agent, redis: r.Redis,
		bucket: NewBucket(bucket.DefaultOrphanTTL.Milliseconds()),
		core:   core.New(core.Config{Region: r.Name, RequestPrefix: r.Name, Seed: stream(lh.w.seed, 4, uint64(ri)).Uint64() | 1}),
		rng:    stream(lh.w.seed, 3, uint64(ri)), up: true, waiters: map[string][]wakeup{}, heldAtCut: -1}
}

func (a *agent) eng() *Engine { return a.lh.w.eng }

func (a *agent) now() time.Time { return a.clock.At(a.eng().Now()) }

func (a *agent) redisMs() int64 { return a.redis.Ms(a.eng().Now()) }

// coreLimit is a limit as the agent's limit sync gives it to the core:
// strict, closed fallback (every scenario's).
func coreLimit(l *allocator.Limit) core.Limit {
	return core.Limit{ID: l.ID, Tokens: l.Tokens, Window: l.Window, Phase: l.Phase, TTL: l.TTL, Mode: core.ModeStrict,
		Fallback: core.Fallback{Kind: core.FallbackClosed}, Version: l.Version, Regions: len(l.Regions),
		Rate: l.Rate, RatePeriod: l.RatePeriod, Burst: l.Burst}
}

func (a *agent) start() {
	w := a.lh.w
	a.syncClock()
	// SyncLimits, done before the traffic starts: the limits, and the
	// allocator's clock read by its round trip (it only names windows).
	t, rtt := w.eng.Now(), w.sc.Regions[a.ri].RTT
	ls := make([]core.Limit, len(a.lh.limits))
	for i, l := range a.lh.limits {
		ls[i] = coreLimit(l)
	}
	a.core.SetLimits(a.core.SyncStart(), 1, ls, time.Time{})
	a.core.SetAllocatorClock(a.clock.At(t-rtt), a.clock.At(t), w.sc.Home.At(t-rtt/2))
	a.drain()
}

// syncClock samples Redis TIME five times and keeps the tightest sample
// (bucket.ClockSync, the agent's own conversion). It also sweeps the
// bucket's expired keys, as Redis's active expiry would.
func (a *agent) syncClock() {
	if !a.up {
		return
	}
	t := a.eng().Now()
	a.bucket.Sweep(a.redis.Ms(t))
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

// held is what the region's bucket holds of limit li now.
func (a *agent) held(li int) int64 {
	l, ok := a.core.Limit(a.lh.limits[li].ID)
	if !ok {
		return 0
	}
	key := BKey{Limit: l.ID, Window: a.core.WindowOf(a.now(), &l).Index}
	return a.bucket.Balance(key, a.redisMs()).Spendable
}

// ---- Checks ----

// check is a gateway's Check of one token of limit li.
func (a *agent) check(li int, done func(outcome, time.Duration)) {
	if !a.up {
		return
	}
	items := []core.Item{{Limit: a.lh.limits[li].ID, Cost: 1}}
	w := &waiter{chk: a.core.Begin(a.now(), items, time.Time{}), done: done}
	a.step(w)
	a.drain()
}

// step carries out a Check's steps until it waits or is decided.
func (a *agent) step(w *waiter) {
	chk := w.chk
	for {
		t := a.eng().Now()
		switch chk.Step {
		case core.StepSpend:
			res, err := a.bucket.Spend(chk.Keys, chk.Costs, chk.Counted, a.redis.Ms(t))
			if err == nil && res.Allowed {
				a.checkSpend(chk, t)
			}
			a.core.Spent(a.clock.At(t), chk, res, err)
		case core.StepTake:
			res, err := a.bucket.Take(chk.RateKey, chk.Costs[0], a.redis.Ms(t), chk.TakeShadow)
			a.core.Taken(a.clock.At(t), chk, res, err)
		case core.StepCount:
			ok, vals, err := a.bucket.AdmitFallback(chk.Count, a.redis.Ms(t))
			a.core.Counted(a.clock.At(t), chk, ok, vals, err)
		case core.StepWait:
			a.wait(w)
			return
		default: // core.StepDone
			a.answer(w, t)
			return
		}
	}
}

// checkSpend counts tokens spent outside their lease's window: a lease of
// window k spent at true time t must lie in window k of the allocator's
// clock, which the agent's deadlines and starts guarantee.
func (a *agent) checkSpend(chk *core.Check, t time.Duration) {
	home := a.lh.w.sc.Home.At(t)
	for i, k := range chk.Keys {
		if lease.WindowOf(home, a.lh.w.sc.Window).Index != k.Window {
			a.lateSpends += chk.Costs[i]
		}
	}
}

// answer sends a decided Check's outcome to its gateway.
func (a *agent) answer(w *waiter, t time.Duration) {
	chk := w.chk
	if chk.Err != nil {
		// Every Check names a limit of the snapshot with cost 1.
		panic("simulations: agent " + a.name + ": " + chk.Err.Error())
	}
	o := unavailable // UNAVAILABLE: not synced, fallback closed, no lease in time
	switch chk.Answers[0].Reason {
	case core.ReasonOK, core.ReasonFallback:
		o = admitted
	case core.ReasonOverLimit:
		o = denied
	}
	a.eng().After(a.lh.w.sc.LocalRTT, func() { w.done(o, t) })
}

// wait parks a Check until a Ready's Wake names one of its limits, or its
// Until (agent clock) comes.
func (a *agent) wait(w *waiter) {
	w.waits++
	w.waiting = true
	up := wakeup{w, w.waits}
	for _, k := range w.chk.Keys {
		a.waiters[k.Limit] = append(a.waiters[k.Limit], up)
	}
	a.eng().At(a.clock.When(w.chk.Until), func() { a.resume(up) })
}

// resume hands a waiting Check back to the core and carries on with it.
func (a *agent) resume(up wakeup) {
	w := up.w
	if !a.up || !w.waiting || w.waits != up.n {
		return // ended already (woken, or its wait ran out), or the region is gone
	}
	w.waiting = false
	a.core.Woke(a.now(), w.chk)
	a.step(w)
	a.drain()
}

// ---- the core's actions ----

// drain carries out every action the core has ready, and those they lead
// to, then sets the timer to the core's next wake-up.
func (a *agent) drain() {
	for range 10000 {
		if !a.core.HasReady() {
			a.schedule()
			return
		}
		a.execute(a.core.Ready())
	}
	panic("simulations: agent " + a.name + ": the core's actions never settle")
}

func (a *agent) execute(rd core.Ready) {
	now, ms := a.now(), a.redisMs()
	var woken []wakeup
	for _, id := range rd.Wake {
		woken = append(woken, a.waiters[id]...)
		delete(a.waiters, id)
	}
	if len(woken) > 0 {
		// They look again once this Ready is carried out (the deposit
		// that woke them has landed by then).
		a.eng().After(0, func() {
			for _, up := range woken {
				a.resume(up)
			}
		})
	}
	for _, r := range rd.Rounds {
		// One replica per region: the renewal lock is always this one's.
		a.core.RoundRead(now, r, core.RoundResult{Locked: true, Balance: a.bucket.Balance(r.Key, ms), NowMs: ms})
	}
	for _, d := range rd.Deposits {
		res, err := a.deposit(d)
		a.core.Deposited(now, d, res, err, false)
	}
	for _, cl := range rd.Closes {
		res := make([]store.CloseResult, len(cl.IDs))
		errs := make([]error, len(cl.IDs))
		for i, id := range cl.IDs {
			res[i], errs[i] = a.bucket.Close(cl.Key, id, ms)
		}
		a.core.Closed(now, cl, res, errs)
	}
	for _, op := range rd.Counters {
		_, _ = a.bucket.AddCounter(op.Key, op.Name, op.Delta, a.redisMs())
	}
	// rd.Unlocks: there is no lock to release (one replica).
	for _, r := range rd.Reports {
		a.core.ReportDone(now, r, true)
	}
	for _, n := range rd.Notes {
		if n.Kind == core.NoteReturning {
			a.undeposited++ // a lease that could not be deposited goes back whole
		}
	}
	for _, in := range rd.Installs {
		// The deadline on Redis's clock rounded down (never later than
		// the agent's), as regionagent's store does.
		sh := in.Share
		sh.DeadlineMs = max(1, a.cs.ToRedis(in.Deadline))
		res, err := a.bucket.InstallShare(store.ShareInstall{Key: in.Key, Share: sh,
			ExpireAtMs: max(a.cs.ToRedis(in.Deadline.Add(time.Minute)), sh.DeadlineMs), NowMs: ms})
		a.core.ShareInstalled(now, in, res, err)
	}
	if len(rd.Acquires) > 0 {
		a.sendAcquires(rd.Acquires)
	}
	if len(rd.Shares) > 0 {
		a.sendShares(rd.Shares)
	}
	if len(rd.Returns) > 0 {
		a.sendReturns(rd.Returns)
	}
}

// deposit stores a lease in the bucket, its times converted to Redis's
// clock as regionagent's redisStore does: the deadline with the lower
// bound of the clock offset (never later than the agent's deadline), the
// start with the upper bound (never earlier than the agent's start), the
// key's expiry no earlier than the deadline.
func (a *agent) deposit(d core.Deposit) (store.DepositResult, error) {
	dep := Deposit{Key: d.Key, LeaseID: d.LeaseID, Tokens: d.Tokens, DeadlineMs: a.cs.ToRedis(d.Deadline),
		NowMs: a.redisMs()}
	if !d.Start.IsZero() {
		dep.StartMs = a.cs.ToRedisStart(d.Start)
	}
	if dep.DeadlineMs <= dep.StartMs {
		return store.DepositResult{}, errUselessLease
	}
	dep.ExpireAtMs = max(a.cs.ToRedis(d.KeyExpiry), dep.DeadlineMs)
	return a.bucket.Deposit(dep)
}

// schedule keeps one engine event pending at the core's next wake-up (its
// agent-clock instant converted to true time); a later schedule makes the
// pending one stale.
func (a *agent) schedule() {
	next, ok := a.core.NextWake()
	if !ok {
		if a.timerSet {
			a.timerGen++
			a.timerSet = false
		}
		return
	}
	at := a.clock.When(next)
	if a.timerSet && at == a.timerAt {
		return
	}
	a.timerGen++
	gen := a.timerGen
	a.timerAt, a.timerSet = at, true
	a.eng().At(at, func() {
		if gen != a.timerGen || !a.up {
			return
		}
		a.timerSet = false
		if t := a.eng().Now(); t != a.ticksAt {
			a.ticksAt, a.ticksN = t, 0
		}
		if a.ticksN++; a.ticksN > 1000 {
			panic("simulations: agent " + a.name + ": the core's next wake-up stays at " + next.String())
		}
		a.core.Tick(a.now())
		a.drain()
	})
}

// ---- allocator calls ----

// call is one allocator call: each attempt goes to the home region over
// the network and is given up after core.DefaultCallTimeout; the call is
// sent again unchanged (same request ids) with jittered exponential
// backoff, as regionagent's client does, until core.DefaultCallRetry has
// passed, and then it fails for good.
type call struct {
	// serve runs at the allocator for every attempt that reaches it; it
	// hands reply the function that delivers the answer to the agent.
	serve   func(alloc *allocNode, reply func(deliver func()))
	failed  func()
	started time.Duration
	backoff time.Duration
	attempt int
	open    bool // the attempt's answer is still awaited
	done    bool
}

func (a *agent) call(serve func(*allocNode, func(func())), failed func()) {
	c := &call{serve: serve, failed: failed, started: a.eng().Now(), backoff: callBackoff}
	a.attempt(c)
}

func (a *agent) attempt(c *call) {
	eng, w := a.eng(), a.lh.w
	c.attempt++
	c.open = true
	n := c.attempt
	w.net.Send(a.name, homeHost, func() {
		if !w.allocUp {
			return
		}
		a.lh.alloc.calls++
		c.serve(a.lh.alloc, func(deliver func()) {
			w.net.Send(homeHost, a.name, func() {
				if c.done || !c.open || c.attempt != n || !a.up {
					return // a duplicate, or an answer to an attempt given up
				}
				c.done = true
				deliver()
				a.drain()
			})
		})
	})
	eng.After(core.DefaultCallTimeout, func() {
		if c.done || c.attempt != n {
			return
		}
		c.open = false
		if !a.up {
			c.done = true
			return
		}
		if eng.Now()-c.started+c.backoff >= core.DefaultCallRetry {
			c.done = true
			c.failed()
			a.drain()
			return
		}
		d := c.backoff/2 + time.Duration(a.rng.Int64N(int64(c.backoff)))
		c.backoff = min(c.backoff*3/2, time.Second)
		eng.After(d, func() { a.attempt(c) })
	})
}

// sendAcquires sends the acquires of one Ready in one AcquireLeases call.
func (a *agent) sendAcquires(reqs []core.Acquire) {
	in := make([]allocator.AcquireRequest, len(reqs))
	for i, r := range reqs {
		in[i] = allocator.AcquireRequest{RequestID: r.RequestID, Limit: r.Limit, Next: r.Next, Demand: r.Demand,
			Held: r.Held, Want: r.Want}
	}
	sent := a.now()
	a.call(func(alloc *allocNode, reply func(func())) {
		alloc.acquire(a.name, in, func(gs []core.Grant) {
			reply(func() { a.core.Acquired(sent, a.now(), reqs, gs) })
		})
	}, func() { a.core.AcquireFailed(a.now(), reqs, false) })
}

// sendReturns sends the returns of one Ready in one ReturnLeases call.
func (a *agent) sendReturns(rets []core.Return) {
	in := make([]allocator.ReturnRequest, len(rets))
	for i, r := range rets {
		in[i] = allocator.ReturnRequest{Limit: r.Limit, LeaseID: r.LeaseID, Unspent: r.Unspent}
	}
	a.call(func(alloc *allocNode, reply func(func())) {
		alloc.giveBack(a.name, in, func() {
			reply(func() { a.core.ReturnsDone(a.now(), rets, nil) })
		})
	}, func() { a.core.ReturnsDone(a.now(), rets, errCallFailed) })
}

// sendShares sends the share requests of one Ready in one AcquireShares
// call.
func (a *agent) sendShares(reqs []core.ShareAcquire) {
	in := make([]allocator.ShareAcquire, len(reqs))
	for i, r := range reqs {
		in[i] = allocator.ShareAcquire{RequestID: r.RequestID, Limit: r.Limit, Demand: r.Demand, Holder: r.Holder, Admitted: r.Admitted}
	}
	sent := a.now()
	a.call(func(alloc *allocNode, reply func(func())) {
		alloc.acquireShares(a.name, in, func(rs []core.ShareReply) {
			reply(func() { a.core.SharesAcquired(sent, a.now(), reqs, rs) })
		})
	}, func() { a.core.ShareAcquireFailed(a.now(), reqs, false) })
}
