package regionagent

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"leasehold/lease"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"leasehold/internal/history"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/client"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Config is the required wiring of an Agent.
type Config struct {
	// Region this agent serves, e.g. "eu".
	Region string
	// Allocators are the allocator replicas' gRPC addresses; the agent
	// follows redirects to the leader.
	Allocators []string
	// DialOptions for the allocator connections (credentials at least).
	DialOptions []grpc.DialOption
	// Redis is the region's Redis (standalone, Sentinel or Cluster). A
	// *redis.ClusterClient makes the agent refuse a CheckMulti of limits
	// with different hash tags (InvalidArgument): they cannot be spent
	// atomically in one slot.
	Redis redis.UniversalClient
	// ReplicaID names this agent replica (request ids and locks); default
	// random.
	ReplicaID string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

type options struct {
	now           func() time.Time
	redisNow      func() time.Time // nil: Redis TIME
	lead          time.Duration
	slack         time.Duration
	margin        time.Duration // fixed part of the safety margin
	driftPPM      float64       // clock rate error covered, per million
	wait          time.Duration
	lookupWait    time.Duration
	syncEvery     time.Duration
	reportEvery   time.Duration
	allocTimeout  time.Duration
	allocRetryFor time.Duration
	redisTimeout  time.Duration
	keyGrace      time.Duration
	idleAfter     time.Duration
	flushers      int
	maxBatch      int
	debit         bool
	snapshotFile  string
	chunks        ChunkConfig
	hist          *history.Recorder // nil: no history (history.go)
	onWait        func(*core.Check) // nil: none (withWaitObserver)
}

// Option changes an optional setting.
type Option func(*options)

// withWaitObserver has fn called each time a Check begins a wait on the
// agent's clock. The tests' world uses it to see a Check that waits, in
// a burst of waits too short to catch in a.waiters, for a moment its
// standing clock never reaches (harness_test.go, watchStuckChecks).
func withWaitObserver(fn func(*core.Check)) Option { return func(o *options) { o.onWait = fn } }

// WithClock replaces the agent's clock (tests drive leases with it).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithRedisClock makes the agent pass Redis's "now" to every script
// explicitly instead of letting Redis use TIME (tests drive Redis's clock
// with it; production leaves it unset).
func WithRedisClock(now func() time.Time) Option { return func(o *options) { o.redisNow = now } }

// WithRenewal sets the renewal lead time (renew when the balance would
// last less than this at the current demand, and this long before an
// active limit's lease expires) and the slack before a window's end at
// which an active limit's next window's lease is fetched (lead + slack
// before the end). Defaults 2s and 250ms.
func WithRenewal(lead, slack time.Duration) Option {
	return func(o *options) { o.lead, o.slack = lead, slack }
}

// WithSafetyMargin sets how much earlier than the allocator's expiry the
// agent's deadline falls: fixed + expires_in x driftPPM / 1e6. Deadlines
// are already measured from when the request was sent and converted to
// Redis's clock with the conservative bound, so the margin only has to
// cover clock drift (rate) between hosts over the lease's life, plus
// rounding. Defaults 2ms and 1000 ppm (5x the drift of commodity clocks).
func WithSafetyMargin(fixed time.Duration, driftPPM float64) Option {
	return func(o *options) { o.margin, o.driftPPM = fixed, driftPPM }
}

// WithColdWait bounds how long a Check that the region's balance cannot
// pay for waits for a lease, when the window's pool is not known to be
// spent (the first Check of a limit, or a renewal in flight). A Check not
// decided in time is UNAVAILABLE with a short retry-after, never
// OVER_LIMIT. Default 500ms; the call's own deadline bounds it too.
func WithColdWait(d time.Duration) Option { return func(o *options) { o.wait = d } }

// WithLookupWait bounds how long a Check of a limit the agent's snapshot
// does not have waits for a limit sync started after it arrived: a limit
// created a moment ago is enforced from its first Check, and NOT_FOUND is
// said only once such a sync found no limit. Not answered in time (the
// allocator slow or unreachable), the Check is UNAVAILABLE. Default 1s;
// the call's own deadline bounds it too.
func WithLookupWait(d time.Duration) Option { return func(o *options) { o.lookupWait = d } }

// WithIntervals sets how often limits are synced and usage is reported
// (only windows with spends since the last report). Defaults 1s and 2s.
func WithIntervals(sync, report time.Duration) Option {
	return func(o *options) { o.syncEvery, o.reportEvery = sync, report }
}

// WithTimeouts sets the per-attempt allocator timeout, how long an
// allocator call is retried, and the Redis timeout. Defaults 1s, 5s, 250ms.
func WithTimeouts(alloc, allocRetry, redisTimeout time.Duration) Option {
	return func(o *options) { o.allocTimeout, o.allocRetryFor, o.redisTimeout = alloc, allocRetry, redisTimeout }
}

// WithBatching sets how many Redis pipelines may be in flight and how many
// spends one may carry. Defaults 4 and 128.
func WithBatching(flushers, maxBatch int) Option {
	return func(o *options) { o.flushers, o.maxBatch = max(1, flushers), max(1, maxBatch) }
}

// WithRollbackDebit says whether the agent debits the spends a Redis
// failover forgot from the rolled-back buckets (default true). Without the
// debit the estimate is still reported, and the bound still carries it;
// the region may then re-spend the forgotten tokens (overshoot the bound
// explains) and return them to the pool.
func WithRollbackDebit(on bool) Option { return func(o *options) { o.debit = on } }

// Agent is one replica of a region agent: the shell around a core.Core
// (package regionagent/core) that carries out its actions — spends in
// Redis, batched; allocator calls, batched; deposits, closes, returns and
// usage reports — and feeds their results back. Safe for concurrent use.
type Agent struct {
	cfg    Config
	opt    options
	log    *slog.Logger
	m      *metrics
	alloc  *allocClient
	groups *groupRoutes // the allocator groups, when there are several (groups.go)
	shared *redisStore
	local  *memStore

	mu      sync.Mutex // protects core, waiters, wokeSeq
	core    *core.Core
	waiters map[string][]*waiter // Checks waiting for a limit's state to change
	// A Check decides to wait under a.mu and begins its wait under a.mu
	// again, a moment later; the work loop takes a Ready's wakes under
	// a.mu and delivers them after carrying the Ready out. A wake
	// delivered between the Check's two moments would be lost, and the
	// Check would sleep to its deadline. So each Ready with wakes takes a
	// number (wakeSeq, counted under a.mu), wokeSeq is the highest whose
	// wakes were delivered, and a Check that finds a Ready taken after
	// its decision delivered already looks again at once (wait).
	wakeSeq atomic.Uint64
	wokeSeq uint64

	// rh is Redis's health; while it is down, Checks are decided from
	// the leases this replica holds in process.
	rh *redisHealth
	lm *localMetrics
	// failover watches Redis for failovers that lost writes (failover.go).
	failover *failoverWatcher

	synced   chan struct{} // closed after the first successful sync
	syncOnce sync.Once

	// nonce makes this process's request ids new even when a replica is
	// restarted with the same id (the allocator remembers request ids for
	// the retention, and would replay old leases).
	nonce string
	// localRep is the reporter name of this process's in-process counts.
	localRep string

	wake     chan struct{} // (1) the core has actions ready
	syncNow  chan struct{} // (1) a Check waits for a limit sync
	inflight tracker       // actions being carried out, allocator calls in flight
	calls    callQueues
	notes    noteLog
	running  atomic.Pointer[context.Context] // Run's context: background calls end with it
	chunks   *client.Client                  // hot limits' chunks (chunks.go); nil: off
	locks    heldLocks                       // renewal locks held, extended while held (locks.go)
	slots    slotPlans                       // concurrency limits' slot shares (slots.go)
}

// New returns an agent; call Run to start its background work.
func New(cfg Config, opts ...Option) (*Agent, error) {
	if err := vocab.ValidateRegion("region", cfg.Region); err != nil {
		return nil, fmt.Errorf("regionagent: %w", err)
	}
	if len(cfg.Allocators) == 0 {
		return nil, errors.New("regionagent: Config.Allocators is required")
	}
	if cfg.Redis == nil {
		return nil, errors.New("regionagent: Config.Redis is required")
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = cfg.Region + "-" + randomHex(4)
	}
	if err := vocab.ValidateRequestID("replica id", cfg.ReplicaID); err != nil {
		return nil, fmt.Errorf("regionagent: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	o := options{
		now: time.Now, lead: 2 * time.Second, slack: 250 * time.Millisecond, margin: 2 * time.Millisecond, driftPPM: 1000,
		wait: 500 * time.Millisecond, lookupWait: time.Second, syncEvery: time.Second, reportEvery: 2 * time.Second,
		allocTimeout: core.DefaultCallTimeout, allocRetryFor: core.DefaultCallRetry, redisTimeout: 250 * time.Millisecond,
		keyGrace: 2 * time.Minute, idleAfter: 5 * time.Minute, flushers: 4, maxBatch: 128, debit: true,
	}
	for _, f := range opts {
		f(&o)
	}
	a := &Agent{
		cfg:     cfg,
		opt:     o,
		log:     cfg.Logger.With("region", cfg.Region, "replica", cfg.ReplicaID),
		m:       newMetrics(cfg.Registerer),
		waiters: map[string][]*waiter{},
		rh:      newRedisHealth(),
		lm:      newLocalMetrics(cfg.Registerer),
		synced:  make(chan struct{}),
		nonce:   randomHex(4),
		wake:    make(chan struct{}, 1),
		syncNow: make(chan struct{}, 1),
	}
	a.localRep = localReporter(cfg.ReplicaID, a.nonce)
	// On Redis Cluster one script call takes keys of one slot only, so a
	// CheckMulti needs limits that share a hash tag (the core refuses
	// others, naming them).
	_, cluster := cfg.Redis.(*redis.ClusterClient)
	a.core = core.New(core.Config{Region: cfg.Region, RequestPrefix: cfg.ReplicaID + "-" + a.nonce, Seed: randomSeed(),
		SameSlotRequired: cluster},
		core.WithLead(o.lead, o.slack), core.WithSafetyMargin(o.margin, o.driftPPM), core.WithWait(o.wait), core.WithLookupWait(o.lookupWait),
		core.WithIdle(5*time.Second, o.idleAfter), core.WithReports(o.reportEvery, o.keyGrace))
	a.alloc = newAllocClient(cfg.Allocators, o.allocTimeout, o.allocRetryFor, o.now, a.allocatorHealth, cfg.DialOptions...)
	a.groups = newGroupRoutes(func(group string, addrs []string) *allocClient {
		return newAllocClient(addrs, o.allocTimeout, o.allocRetryFor, o.now, func(up bool) { a.groups.setHealth(group, up) }, cfg.DialOptions...)
	}, a.allocatorHealth)
	a.shared = newRedisStore(a, bucket.New(cfg.Redis))
	a.local = newMemStore(o.now, a.localRep)
	a.calls.acquires.send = a.sendAcquires
	a.calls.returns.send = a.sendReturns
	a.calls.reports.send = a.sendReports
	a.calls.closes.send = a.closeAll
	a.calls.shares.send = a.sendShares
	a.failover = newFailoverWatcher(a) // failover.go
	a.chunks = a.newChunks()
	a.m.registerCore(cfg.Registerer, a) // reads a.chunks
	return a, nil
}

// Region returns the agent's region.
func (a *Agent) Region() string { return a.cfg.Region }

// ReplicaID returns this replica's id.
func (a *Agent) ReplicaID() string { return a.cfg.ReplicaID }

// Ready is closed once the agent has a snapshot of its region's limits:
// from the allocator, or restored from what it kept (Redis, its file)
// when it started while the allocator was unreachable.
func (a *Agent) Ready() <-chan struct{} { return a.synced }

// closeWait bounds how long Close waits for the work in flight.
const closeWait = 10 * time.Second

// Close releases the agent's connections; call after Run returned. It
// waits for the calls in flight, at most closeWait.
func (a *Agent) Close() {
	a.closeChunks()
	// Every call in flight has its own timeout; this bound only keeps a
	// bug (work that never ends) from hanging the process's shutdown.
	if !a.inflight.waitFor(closeWait) {
		a.log.Warn("closing with work still in flight", "waited", closeWait)
	}
	a.shared.stop()
	a.alloc.close()
	a.groups.close()
}

// store returns the lease store s names.
func (a *Agent) store(s core.Store) leaseStore {
	if s == core.Local {
		return a.local
	}
	return a.shared
}

// withCore runs fn on the core under the agent's lock, and wakes the work
// loop if fn left actions ready.
func (a *Agent) withCore(fn func(c *core.Core)) {
	a.mu.Lock()
	fn(a.core)
	a.unlockCore()
}

// signal wakes the work loop.
func (a *Agent) signal() {
	select {
	case a.wake <- struct{}{}:
	default: // already woken
	}
}

// Decision is the answer to one check.
type Decision struct {
	Allowed    bool
	Reason     pb.Reason
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	Limit      int64
	Window     time.Duration
	// Phase is the phase offset of the limit's windows (0: none).
	Phase time.Duration
	// Cal is a calendar limit's calendar (zero for fixed windows): Window
	// is then the length of the window the check was decided in.
	Cal     lease.Calendar
	Version int64
	// DecisionID names an admitted settle-later check (CheckSettleLater)
	// for Settle, until SettleWithin has passed.
	DecisionID   string
	SettleWithin time.Duration
	// WouldDeny: the limit is in shadow mode and enforcement would have
	// denied the check for this reason (Allowed is true); 0 otherwise.
	WouldDeny pb.Reason
}

// CheckItem is one limit and cost of a check.
type CheckItem struct {
	Limit string
	Cost  int64
}

// Check decides one request of cost against limit. cost 0 means 1.
func (a *Agent) Check(ctx context.Context, limit string, cost int64) (Decision, error) {
	d, err := a.checkOne(ctx, CheckItem{Limit: limit, Cost: cost})
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			fe.Field = fe.Field[len("checks[0]."):]
		}
	}
	return d, err
}

// checkOne decides a request of one limit: from the limit's chunk if one
// can (in memory), else by the store, after which the chunks are told of
// a limit with demand enough to be hot.
func (a *Agent) checkOne(ctx context.Context, item CheckItem) (Decision, error) {
	if d, ok := a.fromChunk(ctx, item.Limit, item.Cost); ok {
		return d, nil
	}
	start := a.opt.now()
	r := checkReq()
	r.cs.one[0] = core.Item{Limit: item.Limit, Cost: item.Cost}
	r.cs.items, r.cs.deadline = r.cs.one[:], a.checkDeadline(ctx, start)
	chk, spendAt, seq, err := a.startCheck(ctx, r)
	if err != nil {
		return Decision{}, err
	}
	spendAt, err = a.runCheck(ctx, start, chk, spendAt, seq)
	if err != nil {
		return Decision{}, err // not released: a spend it gave up on may still read it
	}
	if a.opt.hist != nil {
		a.recordCheck([]CheckItem{item}, chk, spendAt)
	}
	d := decisionOf(chk.Answers[0])
	if chk.Store == core.Local && d.Reason == pb.Reason_REASON_OK && d.WouldDeny == 0 {
		a.lm.admitted.Add(float64(chk.Costs[0]))
	}
	tell := a.chunks != nil && d.Limit > 0 && a.chunkCandidate(chk.Demand, chk.Since)
	core.Release(chk)
	if tell {
		a.chunks.AskedOf(item.Limit, item.Cost, d.Limit)
	}
	return d, nil
}

// checkDeadline is when a Check begun at start must be answered: the
// caller's deadline (on the wall clock) less answerSlack, on our clock;
// zero when the caller set none.
func (a *Agent) checkDeadline(ctx context.Context, start time.Time) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return start.Add(time.Until(d) - answerSlack)
	}
	return time.Time{}
}

// maxMulti bounds the limits of one CheckMulti.
const maxMulti = 16

// answerSlack is kept from a caller's deadline: a Check answers that much
// before the caller gives up, so an undecided Check is UNAVAILABLE rather
// than a timeout.
const answerSlack = 5 * time.Millisecond

// CheckMulti decides one request against several limits: every limit
// admits it and is charged, or none is charged. A request of one limit is
// a Check (a hot limit's is decided from its chunk, in memory); a request
// of several goes to the store.
func (a *Agent) CheckMulti(ctx context.Context, items []CheckItem) ([]Decision, error) {
	if len(items) != 1 {
		return a.checkMulti(ctx, items)
	}
	d, err := a.checkOne(ctx, items[0])
	if err != nil {
		return nil, err
	}
	return []Decision{d}, nil
}

func (a *Agent) checkMulti(ctx context.Context, items []CheckItem) ([]Decision, error) {
	if len(items) == 0 {
		return nil, fieldErr("checks", "at least one check is required")
	}
	if len(items) > maxMulti {
		return nil, fieldErr("checks", "at most %d per call, got %d", maxMulti, len(items))
	}
	start := a.opt.now()
	r := checkReq()
	r.cs.items, r.cs.deadline = make([]core.Item, len(items)), a.checkDeadline(ctx, start)
	for i, it := range items {
		r.cs.items[i] = core.Item{Limit: it.Limit, Cost: it.Cost}
	}
	chk, spendAt, seq, err := a.startCheck(ctx, r)
	if err != nil {
		return nil, err
	}
	spendAt, err = a.runCheck(ctx, start, chk, spendAt, seq)
	if err != nil {
		return nil, err
	}
	if a.opt.hist != nil {
		a.recordCheck(items, chk, spendAt)
	}
	out := make([]Decision, len(chk.Answers))
	for i, an := range chk.Answers {
		out[i] = decisionOf(an)
	}
	if chk.Store == core.Local {
		for i, d := range out {
			if d.Reason == pb.Reason_REASON_OK && d.WouldDeny == 0 {
				a.lm.admitted.Add(float64(chk.Costs[i]))
			}
		}
	}
	return out, nil
}

// step carries out one step of a Check; seq is a.wakeSeq from before
// the step that decided a wait.
func (a *Agent) step(ctx context.Context, chk *core.Check, seq uint64) error {
	switch chk.Step {
	case core.StepSpend:
		var res store.SpendResult
		var err error
		if chk.Deposit != nil && chk.Store == core.Shared {
			res, err = a.shared.spendCarrying(ctx, chk.Keys, chk.Costs, chk.Counted, chk.Deposit)
		} else {
			res, err = a.store(chk.Store).spend(ctx, chk.Keys, chk.Costs, chk.Counted)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := a.opt.now()
		a.withCore(func(c *core.Core) {
			a.carriedOutcome(c, now, chk, res, err)
			c.Spent(now, chk, res, err)
		})
	case core.StepWait:
		return a.wait(ctx, chk, seq)
	case core.StepTake:
		res, err := a.take(ctx, chk.Store, chk.RateKey, chk.Costs[0], chk.TakeShadow)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := a.opt.now()
		a.withCore(func(c *core.Core) { c.Taken(now, chk, res, err) })
	case core.StepCount:
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		ok, vals, err := a.store(chk.Store).admitFallback(rctx, chk.Count)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := a.opt.now()
		a.withCore(func(c *core.Core) { c.Counted(now, chk, ok, vals, err) })
	}
	return nil
}

// checkStart is a Check's first step as a spend batch carries it out
// (spender.start): begun in the core with the rest of its batch, spent in
// Redis with them, and handed its result, under one lock of the core and
// one clock read per batch for each of the two. The Check's goroutine
// takes no lock shared by all limits on this path.
type checkStart struct {
	items    []core.Item
	one      [1]core.Item // items of a Check of one limit
	deadline time.Time    // zero: none
	chk      *core.Check  // set by the batch
}

// startCheck begins the Check of r.cs (a request from checkReq) and
// carries out its first spend with a batch; spendAt is when the batch was
// sent (zero when the Check did not spend in Redis: it goes on in
// runCheck). It releases r. seq is a.wakeSeq from before the Check
// began (wait).
func (a *Agent) startCheck(ctx context.Context, r *spendReq) (chk *core.Check, spendAt time.Time, seq uint64, err error) {
	seq = a.wakeSeq.Load()
	r, err = a.shared.spender.start(ctx, r)
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	chk, spendAt = r.cs.chk, r.at
	release(r)
	return chk, spendAt, seq, nil
}

// beginBatch begins the Checks of a spend batch in the core (spender.begin):
// one lock and one clock read for the batch. A Check that does not spend
// in Redis first (it waits, it is answered, Redis is down) is skipped: its
// goroutine carries it on.
func (a *Agent) beginBatch(reqs []*spendReq) {
	var now time.Time
	locked := false
	for _, r := range reqs {
		cs := r.check
		if cs == nil {
			continue // a plain spend: its op is set
		}
		if !locked {
			a.mu.Lock()
			now, locked = a.opt.now(), true
		}
		if len(cs.items) == 1 {
			cs.chk = a.core.BeginOne(now, cs.items[0], cs.deadline)
		} else {
			cs.chk = a.core.Begin(now, cs.items, cs.deadline)
		}
		chk := cs.chk
		if chk.Step == core.StepTake && chk.Store == core.Shared {
			// A bucket limit's take rides in the same pipeline.
			r.op = bucket.SpendOp{Keys: []string{bucket.RateKeyOf(chk.RateKey)}, Costs: chk.Costs[:1], NowMs: a.shared.nowMs(), Take: true, Shadow: chk.TakeShadow}
			r.at = now
			continue
		}
		if chk.Step != core.StepSpend || chk.Store != core.Shared {
			r.skip = true
			continue
		}
		ks := r.key[:]
		if len(chk.Keys) != 1 {
			ks = make([]string, len(chk.Keys))
		}
		for i, k := range chk.Keys {
			ks[i] = bucket.KeyOf(k)
		}
		r.op, r.at = bucket.SpendOp{Keys: ks, Costs: chk.Costs, NowMs: a.shared.nowMs(), Deposit: a.shared.carried(chk.Deposit)}, now
	}
	if locked {
		a.unlockCore()
	}
}

// decideBatch hands the Checks of a spend batch their results in the core
// (spender.decide): one lock and one clock read for the batch.
func (a *Agent) decideBatch(reqs []*spendReq) {
	var now time.Time
	locked := false
	for _, r := range reqs {
		if r.check == nil || r.skip {
			continue
		}
		if !locked {
			a.mu.Lock()
			now, locked = a.opt.now(), true
		}
		res, err := r.res, crossSlot(r.err)
		res.Err = crossSlot(res.Err)
		if r.op.Take {
			if err == nil {
				err = res.Err
			}
			a.core.Taken(now, r.check.chk, res.Take, err)
			continue
		}
		a.carriedOutcome(a.core, now, r.check.chk, res, err)
		a.core.Spent(now, r.check.chk, res, err)
	}
	if locked {
		a.unlockCore()
	}
}

// carriedOutcome hands the core the outcome of the deposit chk carried
// with its spend (res, err: the spend's), if it carried one, before the
// spend's own outcome: Deposited, as for any deposit.
func (a *Agent) carriedOutcome(c *core.Core, now time.Time, chk *core.Check, res store.SpendResult, err error) {
	d := chk.Deposit
	if d == nil {
		return
	}
	derr := res.DepositErr
	switch {
	case err != nil:
		derr = err
	case derr == nil && res.Deposited.Status == 0:
		derr = errNotCarried
	}
	// In the bucket (this replica's deposit, or another's found there),
	// or not used.
	inBucket := derr == nil && (res.Deposited.Status == store.Deposited || res.Deposited.Status == store.AlreadyDeposited)
	switch {
	case !inBucket:
		a.m.standing.WithLabelValues("not_used").Inc()
	case res.Deposited.Status == store.Deposited:
		a.m.leaseTokens.Add(float64(d.Tokens))
		a.m.standing.WithLabelValues("deposited").Inc()
	default:
		a.m.standing.WithLabelValues("found").Inc()
	}
	if inBucket && a.opt.hist != nil {
		if l, ok := c.Resolve(d.Limit); ok {
			a.recordShare(now, l, *d)
		}
	}
	c.Deposited(now, *d, res.Deposited, derr, derr != nil && redisUnavailable(derr))
}

// unlockCore releases a.mu, waking the work loop if the core has actions
// ready.
func (a *Agent) unlockCore() {
	ready := a.core.HasReady()
	a.mu.Unlock()
	if ready {
		a.signal()
	}
}

// runCheck carries a begun Check through its steps to its answer, counts
// it, and maps its error; spendAt is when its last spend was sent (for
// the history, only when one is recorded); seq is a.wakeSeq from before
// the Check began.
func (a *Agent) runCheck(ctx context.Context, start time.Time, chk *core.Check, spendAt time.Time, seq uint64) (time.Time, error) {
	for chk.Step != core.StepDone {
		if a.opt.hist != nil && chk.Step == core.StepSpend {
			spendAt = a.opt.now()
		}
		next := a.wakeSeq.Load() // before this step, which may decide a wait
		if err := a.step(ctx, chk, seq); err != nil {
			return spendAt, err
		}
		seq = next
	}
	if chk.StoreErr {
		a.m.checked(core.ResultStoreError)
	}
	a.m.checkDur.Observe(a.opt.now().Sub(start).Seconds())
	if chk.Err != nil {
		var ie *core.ItemError
		if errors.As(chk.Err, &ie) && errors.Is(ie, core.ErrUnknownLimit) {
			return spendAt, fmt.Errorf("%w: %s", ErrUnknownLimit, ie.Reason)
		}
		if errors.Is(chk.Err, store.ErrCrossSlot) {
			a.m.checks.WithLabelValues(resultCrossSlot).Inc()
		}
		if errors.As(chk.Err, &ie) {
			return spendAt, fieldErr("checks["+strconv.Itoa(ie.Index)+"]."+ie.Field, "%s", ie.Reason)
		}
		return spendAt, chk.Err
	}
	a.m.checked(chk.Result)
	return spendAt, nil
}

// waiter is one wait of a Check, listed under each limit it waits on (a
// CheckMulti under several, or under one limit more than once): ch is
// closed once, by the first of them to change. a.mu protects woken. chk
// is the Check: one Check may wait several times in a row.
type waiter struct {
	ch    chan struct{}
	woken bool
	chk   *core.Check
}

// wait blocks until one of the Check's limits changes (a Ready names it in
// Wake), its Until passes, or ctx ends; then the Check resumes. seq is
// a.wakeSeq from before the step that decided the wait: if wakes of a
// Ready taken since were delivered already, one may have been the
// Check's, and it resumes at once.
func (a *Agent) wait(ctx context.Context, chk *core.Check, seq uint64) error {
	if a.opt.onWait != nil {
		a.opt.onWait(chk)
	}
	a.mu.Lock()
	if a.wokeSeq > seq {
		a.core.Woke(a.opt.now(), chk)
		a.mu.Unlock()
		return nil
	}
	wt := &waiter{ch: make(chan struct{}), chk: chk}
	ch := wt.ch
	for _, k := range chk.Keys {
		a.waiters[k.Limit] = append(a.waiters[k.Limit], wt)
	}
	a.mu.Unlock()
	a.signal() // the round the core just kicked
	if chk.Lookup() {
		select {
		case a.syncNow <- struct{}{}:
		default: // a sync is asked for already
		}
	}
	t := time.NewTimer(max(0, chk.Until.Sub(a.opt.now())))
	defer t.Stop()
	var err error
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	a.mu.Lock()
	for _, k := range chk.Keys {
		ws := a.waiters[k.Limit]
		for i, w := range ws {
			if w == wt {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(a.waiters, k.Limit)
		} else {
			a.waiters[k.Limit] = ws
		}
	}
	if err == nil {
		a.core.Woke(a.opt.now(), chk)
	}
	a.mu.Unlock()
	return err
}

// wakeLocked ends the waits on limits; a.mu is held.
func (a *Agent) wakeLocked(ids []string) {
	for _, id := range ids {
		for _, w := range a.waiters[id] {
			if !w.woken {
				w.woken = true
				close(w.ch)
			}
		}
		delete(a.waiters, id)
	}
}

func decisionOf(an core.Answer) Decision {
	return Decision{Allowed: an.Allowed, Reason: pb.Reason(an.Reason), Remaining: an.Remaining, RetryAfter: an.RetryAfter,
		ResetAfter: an.ResetAfter, Limit: an.Limit, Window: an.Window, Phase: an.Phase, Cal: an.Cal, Version: an.Version, WouldDeny: pb.Reason(an.WouldDeny)}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}
