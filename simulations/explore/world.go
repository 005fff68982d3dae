package explore

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
	"leasehold/simulations"
)

// The model's fixed parameters. One limit, two regions, one clock (every
// host and Redis agree on the time: the explorer is after interleavings,
// the simulator after clock skew).
const (
	limitID = "L"
	window  = 10 * time.Second
	ttl     = 4 * time.Second
	// lockTTL is the renewal lock's expiry without an unlock (the region
	// agent's: its call retry budget plus 5 s).
	lockTTL = core.DefaultCallRetry + 5*time.Second
	// horizon is how far from its start a run may go: past one window
	// boundary and into the next window's renewals.
	horizon = 2 * window
)

// t0 is the model's start: 5 s before a window boundary, so that a run
// reaches, within a few steps, a lease that expires inside its window (and
// is returned with credit), a renewal clamped to the boundary, the next
// window's early lease and the boundary itself.
var t0 = time.Unix(1_800_000_000, 0).Truncate(window).Add(window - 5*time.Second)

var regionNames = [2]string{"eu", "us"}

var (
	errRedisDown = errors.New("explore: redis down")
	errTimeout   = errors.New("explore: redis timed out")
	errCallFail  = errors.New("explore: allocator call failed")
)

// world is one state of the model: the real cores, the model stores and
// network, and the ledger the invariants are checked against. Everything
// in it is reached from the value itself (no globals), so its digest is
// the state.
type world struct {
	sc  *Scope
	now time.Time

	limit  allocator.Limit // as the allocator has it (the current version)
	etcd   etcd
	leader *allocNode
	zombie []*allocNode // deposed leaders; their pending commits may still try
	terms  int

	regions [2]*region
	// calls are the allocator calls not settled, by id: the replica's
	// name and its call number, so that calls of different replicas keep
	// their names whatever the order they were made in (and equal states
	// reached in different orders digest alike).
	calls   map[string]*call
	batches int // batch ids

	left budget // events of each kind still allowed
	led  ledger
	bad  *Violation
}

// budget counts the events of each kind a trace may still use.
type budget struct {
	checks, lose, retry, fail, leader, outage, rollback, limit, restart int
}

// etcd is the model of the allocator's etcd: the election keys (their
// create revisions) and the durable grant records, one per lease id.
type etcd struct {
	rev      int64
	election map[string]int64 // key -> create revision
	grants   map[string]allocator.Grant
}

// holds evaluates an etcd compare of the kind the allocator's fence makes
// (a key's create revision against a number) on the model.
func (e *etcd) holds(c clientv3.Cmp) bool {
	pc := c.GetCompare()
	if pc.Target != etcdserverpb.Compare_CREATE {
		panic("explore: the model etcd evaluates create-revision compares only, not " + pc.Target.String())
	}
	have := e.election[string(pc.Key)] // 0 when absent, as etcd says
	want := pc.GetCreateRevision()
	switch pc.Result {
	case etcdserverpb.Compare_EQUAL:
		return have == want
	case etcdserverpb.Compare_NOT_EQUAL:
		return have != want
	case etcdserverpb.Compare_GREATER:
		return have > want
	case etcdserverpb.Compare_LESS:
		return have < want
	}
	panic("explore: compare result " + pc.Result.String())
}

// allocNode is one allocator leader term: the real allocator.Core, its
// fence, and the batches it decided but has not committed.
type allocNode struct {
	term    int
	core    *allocator.Core
	fence   allocator.Fence
	pending []*batch
}

// batch is one group commit: the records a term decided, and the calls
// whose answers wait for it.
type batch struct {
	id      int
	records []allocator.Grant
	waiting []string // call ids
}

// call is one allocator call of an agent replica (AcquireLeases or
// ReturnLeases). Its request may be in flight (several copies after a
// retry), then served (its answer waits for the commits it needs), then its
// answer in flight; the replica takes the first answer and ignores later
// ones, as the region agent's client does.
type call struct {
	id        string
	region    int
	replica   int
	acquire   bool
	reqs      []core.Acquire
	rets      []core.Return
	sent      time.Time
	inflight  int   // copies of the request on their way to the allocator
	needs     []int // batch ids the served answer waits for
	term      int   // the term that served it (its answer dies with the term)
	decisions []allocator.Decision
	answering bool // the answer is on its way to the replica
	done      bool // the replica has its answer, or gave up
}

type region struct {
	name      string
	redis     *store.Mem
	replicaOf *store.Mem // Redis's replica: the primary as of the last advance
	down      bool       // Redis does not answer, and the replicas know
	// timeouts: Redis takes every write but its answers are lost (each
	// call times out), and the replicas have not noticed yet.
	timeouts bool
	locks    map[string]lockHold
	reps     []*replica
}

type lockHold struct {
	holder int
	until  time.Time
}

type replica struct {
	name   string
	core   *core.Core
	local  *store.Mem
	parked []*core.Check // Checks at StepWait
	calls  int           // calls made
	starts int           // restarts so far
	seed   uint64
}

func newWorld(sc *Scope) *world {
	w := &world{sc: sc, now: t0, calls: map[string]*call{}}
	w.left = budget{checks: sc.Checks, lose: sc.Lose, retry: sc.Retry, fail: sc.Fail, leader: sc.LeaderChanges,
		outage: sc.RedisOutages, rollback: sc.Rollbacks, limit: sc.LimitChanges, restart: sc.Restarts}
	w.limit = allocator.Limit{ID: limitID, Tokens: sc.Tokens, Window: window, Regions: regionNames[:], TTL: ttl, Version: 1}
	w.etcd = etcd{election: map[string]int64{}, grants: map[string]allocator.Grant{}}
	w.led = newLedger()
	w.elect()
	for ri, name := range regionNames {
		r := &region{name: name, redis: store.NewMem(0), locks: map[string]lockHold{}}
		r.replicaOf = r.redis.Clone()
		for i := range sc.Replicas[ri] {
			rep := &replica{name: fmt.Sprintf("%s-%d", name, i), local: store.NewMem(0), seed: uint64(10*ri + i + 1)}
			rep.core = core.New(core.Config{Region: name, RequestPrefix: rep.name, Seed: rep.seed})
			w.sync(rep)
			r.reps = append(r.reps, rep)
		}
		w.regions[ri] = r
	}
	return w
}

// sync is a replica's limit sync answering: the limits, and the
// allocator's clock read by its round trip.
func (w *world) sync(rep *replica) {
	rep.core.SetLimits(rep.core.SyncStart(), w.limit.Version, []core.Limit{w.coreLimit()}, w.now)
	rep.core.SetAllocatorClock(w.now, w.now, w.now)
}

// restart is replica i of region ri killed and started again: a new core
// (new request ids), not synced yet; its in-process leases, its waiting
// Checks and its calls die with the old process (copies of a request
// already sent may still reach the allocator). The renewal lock is the
// replica id's, so the new process takes it again.
func (w *world) restart(ri, i int) {
	rep := w.regions[ri].reps[i]
	rep.starts++
	rep.core = core.New(core.Config{Region: regionNames[ri], RequestPrefix: fmt.Sprintf("%s-r%d", rep.name, rep.starts),
		Seed: rep.seed + uint64(100*rep.starts)})
	rep.local = store.NewMem(0)
	rep.parked = nil
	for _, c := range w.calls {
		if c.region == ri && c.replica == i {
			c.done, c.answering = true, false
		}
	}
	for j := range w.led.leases {
		if l := &w.led.leases[j]; l.region == ri && l.replica == i {
			l.closed = true // gone with the process's memory
		}
	}
}

// coreLimit is the limit as the agents' limit sync gives it to their cores.
func (w *world) coreLimit() core.Limit {
	return core.Limit{ID: limitID, Tokens: w.limit.Tokens, Window: window, Phase: w.limit.Phase, TTL: ttl, Mode: core.ModeStrict,
		Fallback: w.sc.Fallback, Version: w.limit.Version, Regions: len(regionNames)}
}

// elect makes a new leader term: a new election key, a core rebuilt from
// the durable grants (as a new leader loads etcd), a fence on the key.
func (w *world) elect() {
	if w.leader != nil {
		delete(w.etcd.election, w.leader.fence.Key)
		w.zombie = append(w.zombie, w.leader)
	}
	w.terms++
	w.etcd.rev++
	key := fmt.Sprintf("leader/%d", w.terms)
	w.etcd.election[key] = w.etcd.rev
	n := &allocNode{term: w.terms, core: allocator.NewCore(), fence: allocator.Fence{Key: key, Rev: w.etcd.rev}}
	l := w.limit
	n.core.SetLimit(&l)
	ids := make([]string, 0, len(w.etcd.grants))
	for id := range w.etcd.grants {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		g := w.etcd.grants[id]
		n.core.Restore(&g)
	}
	w.leader = n
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// ---- the agent shell ----

// store returns the bucket store s of replica rep of region r.
func (r *region) store(rep *replica, s core.Store) *store.Mem {
	if s == core.Local {
		return rep.local
	}
	return r.redis
}

// drain carries out every action a replica's core has ready, and what
// they lead to, as the region agent's shell does; allocator calls become
// calls in flight.
func (w *world) drain(ri, i int) {
	rep := w.regions[ri].reps[i]
	for range 1000 {
		if !rep.core.HasReady() {
			return
		}
		w.execute(ri, i, rep.core.Ready())
	}
	panic("explore: " + rep.name + ": the core's actions never settle")
}

func (w *world) execute(ri, i int, rd core.Ready) {
	r, rep := w.regions[ri], w.regions[ri].reps[i]
	now, nowMs := w.now, ms(w.now)
	c := rep.core
	for _, rr := range rd.Rounds {
		switch {
		case rr.Store == core.Shared && (r.down || r.timeouts):
			c.RoundRead(now, rr, core.RoundResult{Err: errRedisDown})
		case rr.Lock && !r.lock(rr.Limit, i, now):
			c.RoundRead(now, rr, core.RoundResult{})
		default:
			c.RoundRead(now, rr, core.RoundResult{Locked: true, Balance: r.store(rep, rr.Store).Balance(rr.Key, nowMs), NowMs: nowMs})
		}
	}
	for _, d := range rd.Deposits {
		if d.Store == core.Shared && r.down {
			c.Deposited(now, d, store.DepositResult{}, errRedisDown, false)
			continue
		}
		dep := store.Deposit{Key: d.Key, LeaseID: d.LeaseID, Tokens: d.Tokens, DeadlineMs: ms(d.Deadline), NowMs: nowMs}
		if !d.Start.IsZero() {
			dep.StartMs = ms(d.Start.Add(time.Millisecond - 1)) // never earlier than the agent's start
		}
		dep.ExpireAtMs = max(ms(d.KeyExpiry), dep.DeadlineMs)
		if dep.DeadlineMs <= dep.StartMs {
			c.Deposited(now, d, store.DepositResult{}, errors.New("explore: lease expires before it starts"), false)
			continue
		}
		res, err := r.store(rep, d.Store).Deposit(dep)
		if err == nil && res.Status == store.Deposited {
			w.led.deposit(w, ri, i, d.Store, dep)
		}
		if d.Store == core.Shared && r.timeouts {
			c.Deposited(now, d, store.DepositResult{}, errTimeout, true) // it landed; the agent cannot know
			continue
		}
		c.Deposited(now, d, res, err, false)
	}
	for _, cl := range rd.Closes {
		res := make([]store.CloseResult, len(cl.IDs))
		errs := make([]error, len(cl.IDs))
		for j, id := range cl.IDs {
			if cl.Store == core.Shared && r.down {
				errs[j] = errRedisDown
				continue
			}
			res[j], errs[j] = r.store(rep, cl.Store).Close(cl.Key, id, nowMs)
			if errs[j] == nil {
				w.led.close(ri, i, cl.Store, cl.Key, id)
			}
			if cl.Store == core.Shared && r.timeouts {
				res[j], errs[j] = store.CloseResult{}, errTimeout
			}
		}
		c.Closed(now, cl, res, errs)
	}
	for _, op := range rd.Counters {
		if op.Store == core.Shared && r.down {
			continue
		}
		_, _ = r.store(rep, op.Store).AddCounter(op.Key, op.Name, op.Delta, nowMs)
	}
	for _, u := range rd.Unlocks {
		if h, ok := r.locks[u.Limit]; ok && h.holder == i {
			delete(r.locks, u.Limit)
		}
	}
	for _, rr := range rd.Reports {
		// The bound is rebuilt from the buckets' counters (reportedModes);
		// the allocator's report path is not part of the model.
		c.ReportDone(now, rr, true)
	}
	if len(rd.Acquires) > 0 {
		w.newCall(&call{region: ri, replica: i, acquire: true, reqs: rd.Acquires, sent: now, inflight: 1})
	}
	if len(rd.Returns) > 0 {
		w.newCall(&call{region: ri, replica: i, rets: rd.Returns, sent: now, inflight: 1})
	}
	var woken []*core.Check
	for _, id := range rd.Wake {
		keep := rep.parked[:0]
		for _, chk := range rep.parked {
			if slices.ContainsFunc(chk.Keys, func(k store.Key) bool { return k.Limit == id }) {
				woken = append(woken, chk)
			} else {
				keep = append(keep, chk)
			}
		}
		rep.parked = keep
	}
	for _, chk := range woken {
		c.Woke(now, chk)
		w.step(ri, i, chk)
	}
}

func (w *world) newCall(c *call) {
	rep := w.regions[c.region].reps[c.replica]
	rep.calls++
	c.id = fmt.Sprintf("%s#%d", rep.name, rep.calls)
	w.calls[c.id] = c
}

// prune forgets the calls that are settled: answered or given up, with no
// copy of the request left on its way.
func (w *world) prune() {
	for id, c := range w.calls {
		if c.done && c.inflight == 0 {
			delete(w.calls, id)
		}
	}
}

// lock takes (or keeps) a limit's renewal lock for replica i.
func (r *region) lock(limit string, i int, now time.Time) bool {
	if h, ok := r.locks[limit]; ok && h.holder != i && now.Before(h.until) {
		return false
	}
	r.locks[limit] = lockHold{holder: i, until: now.Add(lockTTL)}
	return true
}

// check is a gateway's Check of one token at replica i of region ri.
func (w *world) check(ri, i int) {
	rep := w.regions[ri].reps[i]
	chk := rep.core.Begin(w.now, []core.Item{{Limit: limitID, Cost: 1}}, time.Time{})
	w.step(ri, i, chk)
	w.drain(ri, i)
}

// step carries out a Check's steps until it waits or is decided.
func (w *world) step(ri, i int, chk *core.Check) {
	r, rep := w.regions[ri], w.regions[ri].reps[i]
	for range 100 {
		nowMs := ms(w.now)
		switch chk.Step {
		case core.StepSpend:
			if chk.Store == core.Shared && r.down {
				rep.core.Spent(w.now, chk, store.SpendResult{}, errRedisDown)
				continue
			}
			res, err := r.store(rep, chk.Store).Spend(chk.Keys, chk.Costs, chk.Counted, nowMs)
			if chk.Store == core.Shared && r.timeouts {
				// Spent in Redis, but the answer is lost: not admitted.
				rep.core.Spent(w.now, chk, store.SpendResult{}, errTimeout)
				continue
			}
			if err == nil && res.Allowed {
				for j, k := range chk.Keys {
					w.led.admit(w, ri, i, chk.Store, k, chk.Costs[j], false)
				}
			}
			rep.core.Spent(w.now, chk, res, err)
		case core.StepCount:
			if chk.Store == core.Shared && r.down {
				rep.core.Counted(w.now, chk, false, nil, errRedisDown)
				continue
			}
			ok, vals, err := r.store(rep, chk.Store).AdmitFallback(chk.Count, nowMs)
			if chk.Store == core.Shared && r.timeouts {
				rep.core.Counted(w.now, chk, false, nil, errTimeout)
				continue
			}
			if err == nil && ok {
				for _, a := range chk.Count {
					w.led.admit(w, ri, i, chk.Store, a.Key, a.Cost, true)
				}
			}
			rep.core.Counted(w.now, chk, ok, vals, err)
		case core.StepWait:
			rep.parked = append(rep.parked, chk)
			return
		default: // StepDone
			if chk.Err != nil {
				w.fail("check", "%s: a Check of the limit failed as invalid: %v", rep.name, chk.Err)
			}
			if a := chk.Answers[0]; a.Allowed && !rep.core.IsSynced() {
				w.fail("fail-open", "%s admitted a Check (%v) before its first limit sync", rep.name, a.Reason)
			}
			w.led.answers[chk.Answers[0].Reason]++
			return
		}
	}
	panic("explore: " + rep.name + ": a Check never settles")
}

// ---- the allocator ----

// serve is the allocator (the current leader) taking one copy of call c's
// request: every item decided in order by the real core, the new records
// in one batch; the answer waits for that batch and for the batches of
// any grant it replays. Without leader changes in scope a batch commits at
// once.
func (w *world) serve(c *call) {
	c.inflight--
	n := w.leader
	b := &batch{id: w.batches}
	needs := map[int]bool{}
	lookup := func(leaseID string) {
		for _, p := range n.pending {
			if slices.ContainsFunc(p.records, func(g allocator.Grant) bool { return g.LeaseID == leaseID }) {
				needs[p.id] = true
			}
		}
	}
	region := regionNames[c.region]
	var decs []allocator.Decision
	if c.acquire {
		for _, r := range c.reqs {
			d := n.core.Acquire(w.now, region, allocator.AcquireRequest{RequestID: r.RequestID, Limit: r.Limit,
				Next: r.Next, Demand: r.Demand, Held: r.Held, Want: r.Want})
			switch {
			case d.New:
				b.records = append(b.records, *d.Grant)
			case d.Replayed:
				lookup(d.Grant.LeaseID)
			}
			decs = append(decs, d)
		}
	} else {
		for _, r := range c.rets {
			d, err := n.core.Return(w.now, region, allocator.ReturnRequest{Limit: r.Limit, LeaseID: r.LeaseID, Unspent: r.Unspent})
			if err != nil {
				w.fail("return", "the allocator refused a return of %s: %v", r.LeaseID, err)
				continue
			}
			switch {
			case d.Code != pb.ItemCode_ITEM_CODE_OK && d.Code != pb.ItemCode_ITEM_CODE_WINDOW_CLOSED:
				// The agent returns only leases it was granted.
				w.fail("return", "the allocator answered a return of %s with %s: %s", r.LeaseID, d.Code, d.Message)
			case d.Grant != nil:
				b.records = append(b.records, *d.Grant)
			case d.Duplicate:
				lookup(r.LeaseID)
			}
		}
	}
	if len(b.records) > 0 {
		w.batches++
		needs[b.id] = true
		n.pending = append(n.pending, b)
	}
	if c.done || c.answering || c.needs != nil {
		// The replica takes the first answer only; a later copy's decisions
		// are made (and committed) all the same.
		if len(b.records) > 0 {
			w.commitNow(n, b)
		}
		return
	}
	c.term, c.decisions = n.term, decs
	c.needs = []int{}
	for id := range needs {
		c.needs = append(c.needs, id)
	}
	slices.Sort(c.needs)
	if len(b.records) > 0 {
		b.waiting = append(b.waiting, c.id)
	}
	for _, p := range n.pending {
		if p != b && needs[p.id] {
			p.waiting = append(p.waiting, c.id)
		}
	}
	if len(b.records) > 0 {
		w.commitNow(n, b)
	}
	if len(c.needs) == 0 {
		c.answering = true
	}
}

// commitNow commits b at once unless leader changes are in scope (then a
// commit is an event of its own, so a leader change can come between a
// decision and its commit).
func (w *world) commitNow(n *allocNode, b *batch) {
	if w.sc.LeaderChanges == 0 {
		w.commit(n, b)
	}
}

// commit is batch b of term n reaching etcd: one transaction under the
// term's fence (the real allocator.Fence compare, evaluated on the model).
func (w *world) commit(n *allocNode, b *batch) {
	n.pending = slices.DeleteFunc(n.pending, func(p *batch) bool { return p == b })
	if !w.etcd.holds(n.fence.Cmp()) {
		// Fenced: nothing written; the answers that wait on it are never
		// sent (the agent retries with the same request ids).
		for _, id := range b.waiting {
			if c := w.calls[id]; c != nil && c.term == n.term && !c.done {
				c.needs, c.answering = nil, false // unless a newer term served it since
			}
		}
		return
	}
	if n != w.leader {
		w.fail("fencing", "term %d's commit landed after term %d was elected", n.term, w.leader.term)
	}
	w.etcd.rev++
	for _, g := range b.records {
		w.led.persist(w, g)
		w.etcd.grants[g.LeaseID] = g
		if g.Returned {
			// A record Return handed out is durable: its credit goes to
			// the pool, once per record, as the allocator does.
			n.core.Credit(&g)
		}
	}
	for _, id := range b.waiting {
		c := w.calls[id]
		if c == nil {
			continue
		}
		c.needs = slices.DeleteFunc(c.needs, func(x int) bool { return x == b.id })
		if len(c.needs) == 0 && c.needs != nil && !c.done {
			c.answering = true
		}
	}
}

// deliver hands call c's answer to its replica.
func (w *world) deliver(c *call) {
	c.answering, c.done = false, true
	rep := w.regions[c.region].reps[c.replica]
	if !c.acquire {
		rep.core.ReturnsDone(w.now, c.rets, nil)
		w.drain(c.region, c.replica)
		return
	}
	gs := make([]core.Grant, len(c.reqs))
	for i, d := range c.decisions {
		gs[i] = simulations.GrantOf(w.now, regionNames[c.region],
			allocator.AcquireRequest{RequestID: c.reqs[i].RequestID, Limit: c.reqs[i].Limit}, d)
		w.led.answered(w, c.reqs[i].RequestID, gs[i])
	}
	rep.core.Acquired(c.sent, w.now, c.reqs, gs)
	w.drain(c.region, c.replica)
}

// giveUp is the replica's client giving call c up (its retry budget spent).
func (w *world) giveUp(c *call) {
	c.done, c.answering = true, false
	rep := w.regions[c.region].reps[c.replica]
	if c.acquire {
		rep.core.AcquireFailed(w.now, c.reqs, false)
	} else {
		rep.core.ReturnsDone(w.now, c.rets, errCallFail)
	}
	w.drain(c.region, c.replica)
}

// ---- time ----

// nextTimer is the earliest instant at which a replica's timer or a parked
// Check's wait bound falls due, if any.
func (w *world) nextTimer() (time.Time, bool) {
	var at time.Time
	found := false
	take := func(t time.Time) {
		if !found || t.Before(at) {
			at, found = t, true
		}
	}
	for _, r := range w.regions {
		for _, rep := range r.reps {
			if t, ok := rep.core.NextWake(); ok {
				take(t)
			}
			for _, chk := range rep.parked {
				take(chk.Until)
			}
		}
	}
	return at, found
}

// advance moves time to t, running every timer and wait bound that falls
// due on the way at its instant, in order. Then Redis's replica catches up
// with its primary (a failover loses only what was written since).
func (w *world) advance(t time.Time) {
	for range 10000 {
		at, ok := w.nextTimer()
		if !ok || at.After(t) {
			break
		}
		w.now = maxTime(w.now, at)
		w.fire()
	}
	w.now = t
	w.fire()
	for _, r := range w.regions {
		r.replicaOf = r.redis.Clone()
		w.led.replicated(r)
	}
}

// fire runs what is due at now: each replica's Tick, and the parked Checks
// whose wait ran out.
func (w *world) fire() {
	for ri, r := range w.regions {
		for i, rep := range r.reps {
			if t, ok := rep.core.NextWake(); ok && !t.After(w.now) {
				rep.core.Tick(w.now)
			}
			var due []*core.Check
			keep := rep.parked[:0]
			for _, chk := range rep.parked {
				if !chk.Until.After(w.now) {
					due = append(due, chk)
				} else {
					keep = append(keep, chk)
				}
			}
			rep.parked = keep
			for _, chk := range due {
				rep.core.Woke(w.now, chk)
				w.step(ri, i, chk)
			}
			w.drain(ri, i)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// instants are the times an advance may stop at, after now and no later
// than the next timer (which a real process would not sleep past): that
// timer, the window boundary and the instant before it, every deposited
// lease's deadline and the instant before it, and every lease's start.
func (w *world) instants() []time.Time {
	limit, ok := w.nextTimer()
	end := t0.Add(horizon)
	if !ok || limit.After(end) {
		limit = end
	}
	var out []time.Time
	add := func(t time.Time) {
		if t.After(w.now) && !t.After(limit) && !slices.ContainsFunc(out, t.Equal) {
			out = append(out, t)
		}
	}
	add(limit)
	b := w.limit.Windows().Of(w.now).End()
	add(b)
	add(b.Add(-time.Millisecond))
	for _, d := range w.led.leases {
		add(time.UnixMilli(d.deadlineMs))
		add(time.UnixMilli(d.deadlineMs - 1))
		add(time.UnixMilli(d.startMs))
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// ---- faults ----

// setRedis takes region ri's Redis down or brings it back; its replicas
// notice at once (each agent's health probe).
func (w *world) setRedis(ri int, up bool) {
	r := w.regions[ri]
	r.down, r.timeouts = !up, false
	for i, rep := range r.reps {
		rep.core.SetRedisHealth(w.now, up)
		w.drain(ri, i)
	}
}

// rollback is a Redis failover of region ri that loses every write since
// its replica last caught up: the replica, promoted, is the new primary.
func (w *world) rollback(ri int) {
	r := w.regions[ri]
	w.led.rolledBack(r)
	r.redis = r.replicaOf.Clone()
}

// changeLimit lowers or raises G (by one, within 1..Tokens+1) at once in
// the allocator and every agent (a limit change applied at now).
func (w *world) changeLimit(g int64) {
	w.limit.Tokens = g
	w.limit.Version++
	l := w.limit
	w.leader.core.SetLimit(&l)
	for ri, r := range w.regions {
		for i, rep := range r.reps {
			if rep.core.IsSynced() {
				w.sync(rep)
				w.drain(ri, i)
			}
		}
	}
}
