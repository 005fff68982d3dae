package regionagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
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
	// Redis is the region's Redis (standalone, Sentinel or Cluster).
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
	renewEvery    time.Duration
	margin        time.Duration // fixed part of the safety margin
	driftPPM      float64       // clock rate error covered, per million
	coldWait      time.Duration
	syncEvery     time.Duration
	reportEvery   time.Duration
	allocTimeout  time.Duration
	allocRetryFor time.Duration
	redisTimeout  time.Duration
	keyGrace      time.Duration
	idleAfter     time.Duration
	flushers      int
	maxBatch      int
}

// Option changes an optional setting.
type Option func(*options)

// WithClock replaces the agent's clock (tests drive leases with it).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithRedisClock makes the agent pass Redis's "now" to every script
// explicitly instead of letting Redis use TIME (tests drive Redis's clock
// with it; production leaves it unset).
func WithRedisClock(now func() time.Time) Option { return func(o *options) { o.redisNow = now } }

// WithRenewal sets the renewal lead time (renew when the balance would
// last less than this at the current demand; also how early the next
// window's lease is fetched) and how often active limits are checked.
// Defaults 2s and 250ms.
func WithRenewal(lead, every time.Duration) Option {
	return func(o *options) { o.lead, o.renewEvery = lead, every }
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

// safetyMargin for a lease that expires in d.
func (o *options) safetyMargin(d time.Duration) time.Duration {
	return o.margin + time.Duration(float64(d)*o.driftPPM/1e6)
}

// WithColdWait bounds how long the first Check of a limit the region holds
// no lease for waits for its first lease. Default 500ms.
func WithColdWait(d time.Duration) Option { return func(o *options) { o.coldWait = d } }

// WithIntervals sets how often limits are synced and usage is reported.
// Defaults 1s and 2s.
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

// Agent is one replica of a region agent. Safe for concurrent use.
type Agent struct {
	cfg     Config
	opt     options
	log     *slog.Logger
	buckets *bucket.Buckets
	spend   *spender
	alloc   *allocClient
	limits  *limitCache
	m       *metrics
	// failover watches Redis for failovers that lost writes (failover.go).
	failover *failoverWatcher

	// rh is Redis's health; while it is down, Checks are decided from
	// the leases this replica holds in process (local).
	rh    *redisHealth
	local *localStore
	lm    *localMetrics
	// localRep is the reporter name of this process's in-process counts.
	localRep string

	// allocOffset is the allocator's clock minus the agent's, in ns, as
	// last estimated; it only names windows (lease timing never uses it).
	allocOffset atomic.Int64
	clockMu     sync.Mutex // protects clock
	clock       bucket.ClockSync
	clockOK     atomic.Bool

	mu     sync.Mutex // protects states
	states map[string]*limitState

	retMu sync.Mutex // protects unreturned
	// unreturned are returns of closed leases the allocator has not
	// acknowledged (it was unreachable), by limit: sent again until it does.
	unreturned map[string][]*pb.LeaseReturn

	seq atomic.Uint64 // request id sequence
	// nonce makes this process's request ids new even when a replica is
	// restarted with the same id (the allocator remembers request ids for
	// the retention, and would replay old leases).
	nonce string
	kicks chan string // limits whose renewal a Check asked for

	// onAcquire, if set (tests), is called around every allocator request.
	onAcquire func(start bool)
}

// limitState is the agent replica's view of one active limit.
type limitState struct {
	id string

	mu          sync.Mutex // protects the fields below
	lastActive  time.Time
	demand      *core.Demand          // regional, from the bucket's counters
	pending     *pb.LeaseRequest // an acquire not yet answered: retried as is
	pendingNext *pb.LeaseRequest
	spentWindow int64     // window whose pool the allocator said is spent (-1: none)
	spentAt     time.Time // when that was learned; returns can refill the pool, so it is retried
	nextWindow  int64     // window for which a next-window lease was deposited
	failing     bool      // the allocator could not be reached on the last try
	kickCost    int64     // largest cost denied since the last renewal
	fresh       bool      // no Check of this limit has waited for a first lease yet
	fallbackOn  bool      // a fallback mode was applied since the last grant (the gauge shows it)
	changed     chan struct{}

	// While Redis is down (see localhealth.go):
	localDemand  *core.Demand // this replica's own demand, from its in-process counters
	localNext    int64   // window for which a next-window lease is held in process
	localEpisode uint64  // the Redis-down episode in which a Check waited for a first in-process lease
}

// New returns an agent; call Run to start its background work.
func New(cfg Config, opts ...Option) (*Agent, error) {
	if err := allocator.ValidateRegion("region", cfg.Region); err != nil {
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
	if err := allocator.ValidateRequestID("replica id", cfg.ReplicaID); err != nil {
		return nil, fmt.Errorf("regionagent: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	o := options{
		now: time.Now, lead: 2 * time.Second, renewEvery: 250 * time.Millisecond, margin: 2 * time.Millisecond, driftPPM: 1000,
		coldWait: 500 * time.Millisecond, syncEvery: time.Second, reportEvery: 2 * time.Second,
		allocTimeout: time.Second, allocRetryFor: 5 * time.Second, redisTimeout: 250 * time.Millisecond,
		keyGrace: 2 * time.Minute, idleAfter: 5 * time.Minute, flushers: 4, maxBatch: 128,
	}
	for _, f := range opts {
		f(&o)
	}
	a := &Agent{
		cfg:     cfg,
		opt:     o,
		log:     cfg.Logger.With("region", cfg.Region, "replica", cfg.ReplicaID),
		buckets: bucket.New(cfg.Redis),
		alloc:   newAllocClient(cfg.Allocators, o.allocTimeout, o.allocRetryFor, cfg.DialOptions...),
		limits:  newLimitCache(),
		m:       newMetrics(cfg.Registerer),
		states:  map[string]*limitState{},
		kicks:   make(chan string, 1024),
		nonce:   randomHex(4),
		rh:      newRedisHealth(),
		local:   newLocalStore(o.now()),
		lm:      newLocalMetrics(cfg.Registerer),
	}
	a.localRep = localReporter(cfg.ReplicaID, a.nonce)
	a.spend = newSpender(a.buckets, o.flushers, o.maxBatch, o.redisTimeout, func(n int, err error) {
		a.m.batch.Observe(float64(n))
		a.observeRedis(err)
	})
	a.failover = newFailoverWatcher(a) // failover.go
	return a, nil
}

// Region returns the agent's region.
func (a *Agent) Region() string { return a.cfg.Region }

// ReplicaID returns this replica's id.
func (a *Agent) ReplicaID() string { return a.cfg.ReplicaID }

// Ready is closed once the agent has its limits from the allocator.
func (a *Agent) Ready() <-chan struct{} { return a.limits.synced }

// Close releases the agent's connections; call after Run returned.
func (a *Agent) Close() {
	a.spend.close()
	a.alloc.close()
}

// redisNowMs is the "now" passed to scripts: 0 lets Redis use TIME.
func (a *Agent) redisNowMs() int64 {
	if a.opt.redisNow == nil {
		return 0
	}
	return a.opt.redisNow().UnixMilli()
}

// windowOf names the window of limit l that contains the agent's now.
func (a *Agent) windowOf(now time.Time, l *limitView) lease.Window {
	return lease.WindowOf(now.Add(time.Duration(a.allocOffset.Load())), l.window)
}

// windowEnd is the end of w on the agent's clock.
func (a *Agent) windowEnd(w lease.Window) time.Time {
	return w.End().Add(-time.Duration(a.allocOffset.Load()))
}

func (a *Agent) state(l *limitView, now time.Time) *limitState {
	id := l.id
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.states[id]
	if st == nil {
		st = &limitState{id: id, demand: core.NewDemand(l.prior()), spentWindow: -1, nextWindow: -1,
			fresh: true, changed: make(chan struct{}), localDemand: core.NewDemand(l.prior()), localNext: -1}
		a.states[id] = st
	}
	st.mu.Lock()
	st.lastActive = now
	st.mu.Unlock()
	return st
}

// notify wakes Checks waiting for this limit's state to change.
func (st *limitState) notify() {
	close(st.changed)
	st.changed = make(chan struct{})
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
	Version    int64
}

// CheckItem is one limit and cost of a check.
type CheckItem struct {
	Limit string
	Cost  int64
}

// Check decides one request of cost against limit. cost 0 means 1.
func (a *Agent) Check(ctx context.Context, limit string, cost int64) (Decision, error) {
	ds, err := a.CheckMulti(ctx, []CheckItem{{Limit: limit, Cost: cost}})
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			fe.Field = fe.Field[len("checks[0]."):]
		}
		return Decision{}, err
	}
	return ds[0], nil
}

// maxMulti bounds the limits of one CheckMulti.
const maxMulti = 16

// CheckMulti decides one request against several limits: every limit
// admits it and is charged, or none is charged.
func (a *Agent) CheckMulti(ctx context.Context, items []CheckItem) ([]Decision, error) {
	start := time.Now()
	if len(items) == 0 {
		return nil, fieldErr("checks", "at least one check is required")
	}
	if len(items) > maxMulti {
		return nil, fieldErr("checks", "at most %d per call, got %d", maxMulti, len(items))
	}
	now := a.opt.now()
	views := make([]*limitView, len(items))
	sts := make([]*limitState, len(items))
	keys := make([]string, len(items))
	costs := make([]int64, len(items))
	wins := make([]lease.Window, len(items))
	for i, it := range items {
		// The field prefix is built only for an error: not on the hot path.
		f := func(name string) string { return fmt.Sprintf("checks[%d].%s", i, name) }
		if it.Limit == "" {
			return nil, fieldErr(f("limit_id"), "required")
		}
		if len(it.Limit) > 200 {
			return nil, fieldErr(f("limit_id"), "longer than 200 characters")
		}
		l := a.limits.get(it.Limit)
		if l == nil {
			return nil, fmt.Errorf("%w: %q is not a limit of region %s", ErrUnknownLimit, it.Limit, a.cfg.Region)
		}
		cost := it.Cost
		if cost == 0 {
			cost = 1
		}
		if cost < 0 || cost > l.tokens {
			return nil, fieldErr(f("cost"), "must be 1..%d (the limit's G), got %d", l.tokens, it.Cost)
		}
		views[i], costs[i] = l, cost
		sts[i] = a.state(l, now)
		wins[i] = a.windowOf(now, l)
		keys[i] = bucket.Key(l.id, wins[i].Index)
	}
	ds, err := a.decide(ctx, now, views, sts, keys, costs, wins, true)
	a.m.checkDur.Observe(time.Since(start).Seconds())
	return ds, err
}

// decide spends and shapes the answers; cold allows one wait for a first
// lease.
func (a *Agent) decide(ctx context.Context, now time.Time, views []*limitView, sts []*limitState, keys []string,
	costs []int64, wins []lease.Window, cold bool) ([]Decision, error) {
	var changed []chan struct{}
	if cold {
		changed = make([]chan struct{}, len(sts))
		for i, st := range sts {
			st.mu.Lock()
			changed[i] = st.changed
			st.mu.Unlock()
		}
	}
	res, local, serr, err := a.spendAny(ctx, now, views, keys, costs, wins)
	if err != nil {
		return nil, err
	}
	out := make([]Decision, len(views))
	for i, l := range views {
		out[i] = Decision{Limit: l.tokens, Window: l.window, Version: l.version,
			ResetAfter: max(0, a.windowEnd(wins[i]).Sub(now))}
		if serr == nil && i < len(res.Keys) {
			out[i].Remaining = res.Keys[i].Balance
		}
	}
	if serr != nil {
		// Redis cannot answer: the region cannot decide from its bucket
		// (after a few such failures the breaker serves from in-process
		// leases instead).
		a.m.checks.WithLabelValues("redis_error").Inc()
		a.log.Debug("spend failed", "err", serr)
		return a.fallback(ctx, now, views, sts, keys, costs, wins, out)
	}
	allowed, failed := res.Allowed, res.Failed
	if allowed {
		for i, st := range sts {
			out[i].Allowed, out[i].Reason = true, pb.Reason_REASON_OK
			if out[i].Remaining < a.lowWaterOf(st, views[i], wins[i], now, local) {
				a.kick(st.id)
			}
			if local {
				a.lm.admitted.Add(float64(costs[i]))
			}
		}
		a.m.checks.WithLabelValues("ok").Inc()
		return out, nil
	}
	// Denied: the limit at index failed lacked tokens.
	if failed < 0 || failed >= len(sts) {
		failed = 0
	}
	st, w := sts[failed], wins[failed]
	st.mu.Lock()
	st.kickCost = max(st.kickCost, costs[failed])
	spent := st.spentWindow == w.Index
	failing := st.failing || a.alloc.br.open(time.Now())
	coldState := st.fresh
	st.fresh = false
	if local {
		// The first Check of an outage waits, like a cold one, for the
		// replica's first in-process lease.
		ep := a.rh.episode.Load()
		coldState = st.localEpisode != ep
		st.localEpisode = ep
	}
	st.mu.Unlock()
	if !spent && !failing {
		a.kick(st.id)
		if cold && coldState && a.opt.coldWait > 0 {
			// The region holds nothing for this window yet: wait once,
			// briefly, for the first lease, then try again.
			t := time.NewTimer(a.opt.coldWait)
			defer t.Stop()
			select {
			case <-changed[failed]:
				return a.decide(ctx, a.opt.now(), views, sts, keys, costs, wins, false)
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	if failing && !spent {
		return a.fallback(ctx, now, views, sts, keys, costs, wins, out)
	}
	for i := range out {
		out[i].Reason = pb.Reason_REASON_OVER_LIMIT
		out[i].RetryAfter = a.retryAfter(spent, out[i].ResetAfter)
	}
	a.m.checks.WithLabelValues("over_limit").Inc()
	return out, nil
}

// spendAny spends from the region's shared bucket, or from the leases
// this replica holds in process while Redis is down (then without any
// Redis call). err is the caller's context ending; serr a spend that was
// not decided.
func (a *Agent) spendAny(ctx context.Context, now time.Time, views []*limitView, keys []string, costs []int64,
	wins []lease.Window) (res bucket.SpendResult, local bool, serr, err error) {
	if !a.rh.isDown() {
		r, err := a.spend.spend(ctx, keys, costs, a.redisNowMs())
		if err != nil {
			return res, false, nil, err
		}
		res, serr = r.res, r.err
		release(r) // res.Keys is the batch's, not the pooled request's
		return res, false, serr, nil
	}
	limits := make([]string, len(views))
	windows := make([]int64, len(views))
	for i, l := range views {
		limits[i], windows[i] = l.id, wins[i].Index
	}
	return a.local.spend(limits, windows, costs, now), true, nil, nil
}

// retryAfter: when the window's pool is spent, its reset (jittered up to
// 10%); otherwise the region is only briefly dry while a renewal is in
// flight, and the answer is short (50-100 ms), which also tells clients'
// denial caches not to hold it.
func (a *Agent) retryAfter(spent bool, reset time.Duration) time.Duration {
	if spent {
		return reset + time.Duration(mrand.Int64N(int64(reset/10)+1))
	}
	return 50*time.Millisecond + time.Duration(mrand.Int64N(int64(50*time.Millisecond)))
}

// markFallback exports the limit's fail mode as in force, once per
// episode (leases coming back remove it).
func (a *Agent) markFallback(st *limitState, l *limitView) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.fallbackOn {
		st.fallbackOn = true
		a.m.fallbackMode.WithLabelValues(l.id).Set(float64(l.fallback.Kind))
	}
}

// fallback answers when the region cannot get tokens: per limit, CLOSED
// denies with UNAVAILABLE, LOCAL admits up to A per window (counted in the
// bucket; while Redis is down as well it denies like CLOSED), OPEN admits
// (counted). Every limit of the request must admit.
func (a *Agent) fallback(ctx context.Context, now time.Time, views []*limitView, sts []*limitState, keys []string,
	costs []int64, wins []lease.Window, out []Decision) ([]Decision, error) {
	unavailable := func() ([]Decision, error) {
		for i, l := range views {
			if l.fallback.Kind == pb.FallbackKind_FALLBACK_KIND_CLOSED {
				a.markFallback(sts[i], l)
			}
		}
		for i := range out {
			out[i].Allowed, out[i].Reason = false, pb.Reason_REASON_UNAVAILABLE
			out[i].RetryAfter = time.Second + time.Duration(mrand.Int64N(int64(time.Second)))
		}
		a.m.checks.WithLabelValues("unavailable").Inc()
		return out, nil
	}
	for _, l := range views {
		if l.fallback.Kind != pb.FallbackKind_FALLBACK_KIND_LOCAL && l.fallback.Kind != pb.FallbackKind_FALLBACK_KIND_OPEN {
			return unavailable()
		}
	}
	// Fallback admits are counted in the shared bucket, or in process
	// while Redis is down too (and reported as this replica's). LOCAL's
	// "at most A per window in the region" needs the shared count: without
	// Redis every replica would admit A, so it denies, as CLOSED does.
	local := a.rh.isDown()
	if local {
		for _, l := range views {
			if l.fallback.Kind == pb.FallbackKind_FALLBACK_KIND_LOCAL {
				return unavailable()
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	defer cancel()
	add := func(i int, name string, delta int64) (int64, error) {
		if local {
			return a.local.add(views[i].id, wins[i].Index, name, delta, now), nil
		}
		v, err := a.buckets.AddCounter(rctx, keys[i], name, delta)
		a.observeRedis(err)
		return v, err
	}
	var taken []int
	undo := func() {
		for _, j := range taken {
			_, _ = add(j, counterFallback, -costs[j])
		}
	}
	for i, l := range views {
		v, err := add(i, counterFallback, costs[i])
		if err != nil {
			undo()
			return unavailable()
		}
		taken = append(taken, i)
		mode := counterModeOpen
		if l.fallback.Kind == pb.FallbackKind_FALLBACK_KIND_LOCAL {
			mode = counterModeLocal
			if v > l.fallback.LocalTokens {
				undo()
				for k := range out {
					out[k].Allowed, out[k].Reason = false, pb.Reason_REASON_OVER_LIMIT
					out[k].RetryAfter = a.retryAfter(true, out[k].ResetAfter)
				}
				a.m.checks.WithLabelValues("fallback_denied").Inc()
				return out, nil
			}
			out[i].Remaining = l.fallback.LocalTokens - v
		}
		_, _ = add(i, mode, 0) // marks the mode in force this window
		a.markFallback(sts[i], l)
	}
	for i := range out {
		out[i].Allowed, out[i].Reason = true, pb.Reason_REASON_FALLBACK
	}
	a.m.checks.WithLabelValues("fallback").Inc()
	return out, nil
}

// spentRetry is how long a replica trusts "the pool is spent" before it
// asks again: returns credited while the window is open refill the pool.
const spentRetry = time.Second

// Bucket counters beside admitted and denied.
const (
	counterFallback  = "fallback_admitted"
	counterModeLocal = "mode_local"
	counterModeOpen  = "mode_open"
	// counterPoolSpent is set when the allocator said the window's pool is
	// spent, so every replica answers OVER_LIMIT with the window's reset.
	counterPoolSpent = "pool_spent"
)

// lowWater is the limit's low-water mark at now (see lowWater in plan.go).
func (a *Agent) lowWater(st *limitState, l *limitView, w lease.Window, now time.Time) int64 {
	return a.lowWaterOf(st, l, w, now, false)
}

// lowWaterOf is lowWater from the region's demand, or (local) from this
// replica's own while it serves from in-process leases.
func (a *Agent) lowWaterOf(st *limitState, l *limitView, w lease.Window, now time.Time, local bool) int64 {
	st.mu.Lock()
	d := st.demand
	if local {
		d = st.localDemand
	}
	rate := d.Rate(now)
	st.mu.Unlock()
	return core.LowWater(rate, a.opt.lead, a.windowEnd(w).Sub(now))
}

// kick asks the renewal loop to look at a limit now.
func (a *Agent) kick(id string) {
	select {
	case a.kicks <- id:
	default: // the loop is busy; its next tick will see the limit
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
