package regionagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// leaseStore is where the core's store actions go: the region's shared
// Redis bucket (redisStore) or this replica's in-process store (memStore)
// while Redis is down. Times are on the agent's clock; each store converts
// them to its own, conservatively.
type leaseStore interface {
	// spend decides one all-or-nothing spend; counted is core.Check.Counted.
	spend(ctx context.Context, keys []store.Key, costs []int64, counted []bool) (store.SpendResult, error)
	// rounds carries out renewal rounds: each one's renewal lock, when
	// it asks for one (the in-process store has none to take: only this
	// replica spends it), and its bucket read; out[i] answers rs[i].
	rounds(ctx context.Context, rs []core.Round) []core.RoundResult
	// deposits stores leases; res[i] and errs[i] answer ds[i].
	deposits(ctx context.Context, ds []core.Deposit) (res []store.DepositResult, errs []error)
	close(ctx context.Context, key store.Key, id string) (store.CloseResult, error)
	add(ctx context.Context, key store.Key, name string, delta int64) (int64, error)
	// admitFallback admits one request under its limits' fallback modes,
	// all or nothing, never past a cap (store.FallbackAdd).
	admitFallback(ctx context.Context, adds []store.FallbackAdd) (bool, []int64, error)
	// usage reads the counts the reads ask for, and names their reporter
	// at the allocator; out[i] answers reads[i].
	usage(ctx context.Context, reads []core.ReportRead) []usageOut
}

// usageOut is what one report read found.
type usageOut struct {
	reporter string
	usage    []*pb.Usage // windows with anything counted
	err      error
}

// ---- the region's Redis ----

// redisStore is the region's shared bucket in Redis. Spends are batched
// (spender.go); deadlines are converted to Redis's clock with the Redis
// clock sync; every call's outcome feeds the Redis health breaker.
type redisStore struct {
	a       *Agent
	b       *bucket.Buckets
	spender *spender

	clockMu sync.Mutex // protects clock, clockOK
	clock   bucket.ClockSync
	clockOK bool
}

func newRedisStore(a *Agent, b *bucket.Buckets) *redisStore {
	s := &redisStore{a: a, b: b}
	s.spender = newSpender(b, a.opt.flushers, a.opt.maxBatch, a.opt.redisTimeout, func(n int, took time.Duration, err error) {
		a.m.batch.Observe(float64(n))
		a.m.batchDur.Observe(took.Seconds())
		if errors.Is(err, errBatchAbandoned) {
			a.log.Warn("a spend batch's Redis call did not return in twice its timeout: its Checks are answered by the fail mode, the call is left behind",
				"checks", n, "timeout", a.opt.redisTimeout)
		}
		a.observeRedis(err)
	})
	s.spender.begin, s.spender.decide = a.beginBatch, a.decideBatch
	return s
}

func (s *redisStore) stop() { s.spender.close() }

// nowMs is the "now" passed to scripts: 0 lets Redis use TIME.
func (s *redisStore) nowMs() int64 {
	if s.a.opt.redisNow == nil {
		return 0
	}
	return s.a.opt.redisNow().UnixMilli()
}

func (s *redisStore) spend(ctx context.Context, keys []store.Key, costs []int64, counted []bool) (store.SpendResult, error) {
	return s.spendCarrying(ctx, keys, costs, counted, nil)
}

// spendCarrying is spend with the deposit a Check carries (its
// core.Check.Deposit; nil: none), made before the spend in the same
// pipeline: SpendResult.Deposited or DepositErr is its outcome.
func (s *redisStore) spendCarrying(ctx context.Context, keys []store.Key, costs []int64, counted []bool, d *core.Deposit) (store.SpendResult, error) {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = bucket.KeyOf(k)
	}
	r, err := s.spender.spend(ctx, ks, costs, counted, s.nowMs(), s.carried(d))
	if err != nil {
		return store.SpendResult{}, err
	}
	res, serr := r.res, crossSlot(r.err)
	res.Err = crossSlot(res.Err)
	release(r) // res.Keys is the batch's, not the pooled request's
	return res, serr
}

// reserveInBatch makes a reservation (a chunk, a client's sub-lease, a
// settle-later decision) in a spend batch's pipeline: one round trip with
// the Checks and other reservations of the moment, where a call of its
// own would cost a round trip and a pair of system calls on both sides.
func (s *redisStore) reserveInBatch(ctx context.Context, op bucket.ReserveOp) (bucket.Reservation, error) {
	return inBatch(ctx, s, bucket.SpendOp{Reserve: &op}, func(r *store.SpendResult) bucket.Reservation { return r.Reserved })
}

// releaseInBatch ends a reservation in a spend batch's pipeline
// (reserveInBatch).
func (s *redisStore) releaseInBatch(ctx context.Context, op bucket.ReleaseOp) (bucket.ReleaseResult, error) {
	return inBatch(ctx, s, bucket.SpendOp{Release: &op}, func(r *store.SpendResult) bucket.ReleaseResult { return r.Released })
}

// inBatch sends op with the next spend batch and returns its result
// (picked from the batch's) and error.
func inBatch[T any](ctx context.Context, s *redisStore, op bucket.SpendOp, pick func(*store.SpendResult) T) (T, error) {
	r := spendReqPool.Get().(*spendReq)
	r.op = op
	r, err := s.spender.submit(ctx, r)
	if err != nil {
		var zero T
		return zero, err
	}
	res, err := pick(&r.res), r.err
	release(r)
	return res, err
}

// crossSlot marks a Redis Cluster's CROSSSLOT refusal (keys of several
// slots in one call) as store.ErrCrossSlot, for the core: no retry can
// succeed.
func crossSlot(err error) error {
	if err != nil && redis.HasErrorPrefix(err, "CROSSSLOT") {
		return fmt.Errorf("%w: %w", store.ErrCrossSlot, err)
	}
	return err
}

// lastClock is Redis's clock as last synced; ok is false before the first
// sync.
func (s *redisStore) lastClock() (cs bucket.ClockSync, ok bool) {
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	return s.clock, s.clockOK
}

// syncedClock is lastClock, synced first if it never was.
func (s *redisStore) syncedClock(ctx context.Context) (bucket.ClockSync, error) {
	if cs, ok := s.lastClock(); ok {
		return cs, nil
	}
	if err := s.a.syncClock(ctx); err != nil {
		return bucket.ClockSync{}, err
	}
	cs, _ := s.lastClock()
	return cs, nil
}

func (s *redisStore) setClock(cs bucket.ClockSync) {
	s.clockMu.Lock()
	s.clock, s.clockOK = cs, true
	s.clockMu.Unlock()
}

// msAt is the agent instant t on Redis's clock, in ms (rounded down).
func (s *redisStore) msAt(t time.Time) int64 {
	if s.a.opt.redisNow != nil {
		return s.a.opt.redisNow().UnixMilli()
	}
	cs, ok := s.lastClock()
	if !ok {
		return t.UnixMilli()
	}
	return cs.ToRedis(t)
}

var errUselessLease = errors.New("regionagent: lease expires before it starts")

// errNotCarried: a deposit a Check carried was not sent with its spend
// (Redis's clock not known yet, or the lease useless on it).
var errNotCarried = errors.New("regionagent: the deposit was not sent (no Redis clock yet, or it cannot be spent on Redis's clock)")

// carried is the deposit a Check carries (nil: none) on Redis's clock as
// last synced, for its spend's pipeline; nil when it cannot be sent
// (errNotCarried, seen by carriedOutcome). It never waits for a clock
// sync: it runs in a spend batch, under the core's lock.
func (s *redisStore) carried(d *core.Deposit) *bucket.Deposit {
	if d == nil {
		return nil
	}
	cs, ok := s.lastClock()
	if !ok {
		return nil
	}
	dep, err := s.onRedis(cs, *d)
	if err != nil {
		return nil
	}
	return &dep
}

// onRedis is d with its times on Redis's clock (cs): the deadline rounded
// down and the start up, so the lease is never spendable outside the
// agent's own span of it.
func (s *redisStore) onRedis(cs bucket.ClockSync, d core.Deposit) (bucket.Deposit, error) {
	dep := bucket.Deposit{Key: bucket.KeyOf(d.Key), LeaseID: d.LeaseID, Tokens: d.Tokens,
		DeadlineMs: cs.ToRedis(d.Deadline), NowMs: s.nowMs()}
	if !d.Start.IsZero() {
		dep.StartMs = cs.ToRedisStart(d.Start)
	}
	if dep.DeadlineMs <= dep.StartMs {
		return bucket.Deposit{}, errUselessLease
	}
	dep.ExpireAtMs = max(cs.ToRedis(d.KeyExpiry), dep.DeadlineMs)
	return dep, nil
}

// rounds carries out renewal rounds of the shared store in one pipeline
// (bucket.Batch): each round's lock, when it asks for one, and its bucket
// read. A round whose lock another replica holds ignores its read.
func (s *redisStore) rounds(ctx context.Context, rs []core.Round) []core.RoundResult {
	x := s.b.Batch()
	type sent struct{ lock, read int }
	idx := make([]sent, len(rs))
	for i, r := range rs {
		idx[i].lock = -1
		if r.Lock {
			idx[i].lock = x.TryLock(lockKey(r), s.a.cfg.ReplicaID, lockLease)
		}
		idx[i].read = x.Balance(bucket.KeyOf(r.Key), s.nowMs())
	}
	now := s.a.opt.now()
	x.Exec(ctx)
	nowMs := s.msAt(now)
	out := make([]core.RoundResult, len(rs))
	var firstErr error
	for i, r := range rs {
		res := core.RoundResult{Locked: true}
		if idx[i].lock >= 0 {
			res.Locked, res.Err = x.Locked(idx[i].lock)
		}
		if res.Err == nil && res.Locked {
			if idx[i].lock >= 0 {
				s.a.locks.add(lockKey(r)) // extended until unlocked (locks.go)
			}
			res.Balance, res.Err = x.BalanceOf(idx[i].read)
			res.NowMs = nowMs
		}
		if firstErr == nil {
			firstErr = res.Err
		}
		out[i] = res
	}
	s.a.observeRedis(firstErr)
	return out
}

// deposits stores leases in one pipeline, each with its deadline on
// Redis's clock: never later than the agent's, so never later than the
// allocator's expiry.
func (s *redisStore) deposits(ctx context.Context, ds []core.Deposit) ([]store.DepositResult, []error) {
	res, errs := make([]store.DepositResult, len(ds)), make([]error, len(ds))
	cs, err := s.syncedClock(ctx)
	if err != nil {
		s.a.observeRedis(err)
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	x := s.b.Batch()
	idx := make([]int, len(ds))
	for i, d := range ds {
		idx[i] = -1
		dep, err := s.onRedis(cs, d)
		if err != nil {
			errs[i] = err
			continue
		}
		idx[i] = x.Deposit(dep)
	}
	x.Exec(ctx)
	var firstErr error
	for i := range ds {
		if idx[i] < 0 {
			continue
		}
		res[i], errs[i] = x.DepositOf(idx[i])
		if firstErr == nil {
			firstErr = errs[i]
		}
	}
	s.a.observeRedis(firstErr)
	return res, errs
}

func (s *redisStore) close(ctx context.Context, key store.Key, id string) (store.CloseResult, error) {
	r, err := s.b.Close(ctx, bucket.KeyOf(key), id, s.nowMs())
	s.a.observeRedis(err)
	return r, err
}

func (s *redisStore) add(ctx context.Context, key store.Key, name string, delta int64) (int64, error) {
	v, err := s.b.AddCounter(ctx, bucket.KeyOf(key), name, delta)
	s.a.observeRedis(err)
	return v, err
}

func (s *redisStore) admitFallback(ctx context.Context, adds []store.FallbackAdd) (bool, []int64, error) {
	in := make([]bucket.FallbackAdd, len(adds))
	for i, x := range adds {
		in[i] = bucket.FallbackAdd{Key: bucket.KeyOf(x.Key), Cost: x.Cost, Cap: x.Cap, Mode: x.Mode}
	}
	ok, vals, err := s.b.AdmitFallback(ctx, in)
	s.a.observeRedis(err)
	return ok, vals, crossSlot(err)
}

// unlocks releases renewal locks in one pipeline (a lock that expired or
// that another replica took meanwhile is left alone).
func (s *redisStore) unlocks(ctx context.Context, us []core.Unlock) {
	x := s.b.Batch()
	for _, u := range us {
		k := bucket.LockKey(u.HashTag, u.Limit)
		s.a.locks.remove(k)
		x.Unlock(k, s.a.cfg.ReplicaID)
	}
	x.Exec(ctx)
}

// usage reads each limit's windows and epoch in one call, the calls of
// up to maxUsageBatch limits in one pipeline (bucket.Batch). The reporter
// names the bucket's counts of one Redis incarnation (see bucket.Epoch):
// every replica reports the same counts under the same name (the
// allocator keeps the highest), and counts that restart from zero after
// Redis lost its data are a new reporter, added to the old. Limits without
// an epoch yet (first reported) get one, with one read of the server's
// run_id for all of them, and are read again.
func (s *redisStore) usage(ctx context.Context, reads []core.ReportRead) []usageOut {
	out := make([]usageOut, len(reads))
	all := make([]int, len(reads))
	for i := range all {
		all[i] = i
	}
	s.readUsage(ctx, reads, all, out)
	var missing []int
	for i := range out {
		if errors.Is(out[i].err, errNoEpoch) {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return out
	}
	refs := make([]bucket.LimitRef, len(missing))
	for k, i := range missing {
		refs[k] = bucket.LimitRef{ID: reads[i].Limit, HashTag: reads[i].HashTag}
	}
	rctx, cancel := context.WithTimeout(ctx, s.a.opt.redisTimeout)
	err := s.b.SetEpochs(rctx, refs)
	cancel()
	s.a.observeRedis(err)
	if err != nil {
		for _, i := range missing {
			out[i] = usageOut{err: err}
		}
		return out
	}
	s.readUsage(ctx, reads, missing, out)
	return out
}

// maxUsageBatch bounds the limits whose usage one pipeline reads: a report
// round reads up to a thousand (core.WithReports), and Redis runs a
// pipeline's calls back to back, so one pipeline of them all would hold up
// other clients' spends while it ran.
const maxUsageBatch = 64

// readUsage reads the usage of reads[i] for each i in which into out[i],
// in pipelines of up to maxUsageBatch limits (a limit's calls, one per
// bucket.MaxUsageWindows windows, share a pipeline).
func (s *redisStore) readUsage(ctx context.Context, reads []core.ReportRead, which []int, out []usageOut) {
	for len(which) > 0 {
		n := min(len(which), maxUsageBatch)
		x := s.b.Batch()
		first := make([]int, n) // each limit's first call in x
		for k, i := range which[:n] {
			r := reads[i]
			first[k] = x.Len()
			for off := 0; off < len(r.Windows); off += bucket.MaxUsageWindows {
				x.Usage(bucket.LimitRef{ID: r.Limit, HashTag: r.HashTag}, r.Windows[off:min(len(r.Windows), off+bucket.MaxUsageWindows)])
			}
		}
		rctx, cancel := context.WithTimeout(ctx, s.a.opt.redisTimeout)
		x.Exec(rctx)
		cancel()
		var firstErr error
		for k, i := range which[:n] {
			var err error
			out[i], err = usageFrom(reads[i], x, first[k])
			if firstErr == nil {
				firstErr = err
			}
		}
		s.a.observeRedis(firstErr)
		which = which[n:]
	}
}

// usageFrom is a limit's usage from its calls in x, the first at index
// first: one per bucket.MaxUsageWindows of r's windows. err is the Redis
// error among them, if any (for the store's health).
func usageFrom(r core.ReportRead, x *bucket.Batch, first int) (usageOut, error) {
	var o usageOut
	var counts []bucket.WindowCounts
	for off, j := 0, first; off < len(r.Windows); off, j = off+bucket.MaxUsageWindows, j+1 {
		epoch, c, err := x.UsageOf(j)
		switch {
		case err != nil:
			return usageOut{err: err}, err
		case epoch == "":
			return usageOut{err: errNoEpoch}, nil
		case o.reporter != "" && o.reporter != bucketReporter(epoch):
			return usageOut{err: errEpochChanged}, nil
		}
		o.reporter = bucketReporter(epoch)
		counts = append(counts, c...)
	}
	if err := vocab.ValidateRequestID("reporter", o.reporter); err != nil {
		return usageOut{err: err}, nil
	}
	for _, c := range counts {
		if u := usageOf(r.Limit, c.Window, c.Admitted, c.Denied, c.Counters); u.Admitted+u.Denied+u.FallbackAdmitted+u.WouldDenyChecks > 0 {
			o.usage = append(o.usage, u)
		}
	}
	return o, nil
}

func bucketReporter(epoch string) string { return "bucket-" + epoch }

// ---- this replica's in-process store ----

// memStore holds the leases an agent replica acquires for itself while
// its region's Redis is down, and spends them in process. It is a
// [store.Mem] (the Redis scripts' semantics: idempotent deposits,
// all-or-nothing spends from the earliest deadline, closes counted once)
// on the agent's own monotonic clock: milliseconds since the store was
// made. Deadlines round down and starts round up to the millisecond, so a
// token is never spent after its lease's agent deadline (invariant 4).
//
// Its per-window counters are this replica's alone and are reported under
// the replica's own reporter name. Safe for concurrent use.
type memStore struct {
	epoch time.Time // the instant of ms 0 on the agent's clock
	rep   string
	now   func() time.Time // the agent's clock

	mu  sync.Mutex // protects mem
	mem *store.Mem
}

func newMemStore(now func() time.Time, reporter string) *memStore {
	return &memStore{epoch: now(), now: now, rep: reporter, mem: store.NewMem(bucket.DefaultOrphanTTL.Milliseconds())}
}

// ms is t on the store's clock, rounded down.
func (s *memStore) ms(t time.Time) int64 {
	d := t.Sub(s.epoch)
	ms := int64(d / time.Millisecond)
	if d < 0 && d%time.Millisecond != 0 {
		ms--
	}
	return ms
}

// msUp is t on the store's clock, rounded up.
func (s *memStore) msUp(t time.Time) int64 {
	ms := s.ms(t)
	if t.Sub(s.epoch)%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// clockNow is the agent's now (the store has no clock of its own).
func (s *memStore) clockNow() time.Time { return s.now() }

func (s *memStore) spend(_ context.Context, keys []store.Key, costs []int64, counted []bool) (store.SpendResult, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(keys) == 1 {
		kr := s.mem.Spend1(keys[0], costs[0], counted != nil && counted[0], nowMs)
		r := store.SpendResult{Allowed: kr.Allowed, Failed: -1, Keys: []store.KeyResult{kr}}
		if !kr.Allowed {
			r.Failed = 0
		}
		return r, nil
	}
	return s.mem.Spend(keys, costs, counted, nowMs)
}

func (s *memStore) deposit(_ context.Context, d core.Deposit) (store.DepositResult, error) {
	now := s.clockNow()
	dep := store.Deposit{Key: d.Key, LeaseID: d.LeaseID, Tokens: d.Tokens, DeadlineMs: s.ms(d.Deadline), NowMs: s.ms(now)}
	if !d.Start.IsZero() {
		dep.StartMs = s.msUp(d.Start)
	}
	if dep.DeadlineMs <= dep.StartMs || dep.DeadlineMs <= dep.NowMs {
		return store.DepositResult{}, errUselessLease
	}
	dep.ExpireAtMs = max(s.ms(d.KeyExpiry), dep.DeadlineMs)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.Deposit(dep)
}

func (s *memStore) close(_ context.Context, key store.Key, id string) (store.CloseResult, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.Close(key, id, nowMs)
}

func (s *memStore) read(_ context.Context, key store.Key) (store.BalanceResult, int64, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.Balance(key, nowMs), nowMs, nil
}

func (s *memStore) add(_ context.Context, key store.Key, name string, delta int64) (int64, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.AddCounter(key, name, delta, nowMs)
}

func (s *memStore) admitFallback(_ context.Context, adds []store.FallbackAdd) (bool, []int64, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.AdmitFallback(adds, nowMs)
}

// rounds reads each round's bucket; there is no lock to take (only this
// replica spends its in-process store).
func (s *memStore) rounds(ctx context.Context, rs []core.Round) []core.RoundResult {
	out := make([]core.RoundResult, len(rs))
	for i, r := range rs {
		out[i].Locked = true
		out[i].Balance, out[i].NowMs, out[i].Err = s.read(ctx, r.Key)
	}
	return out
}

func (s *memStore) deposits(ctx context.Context, ds []core.Deposit) ([]store.DepositResult, []error) {
	res, errs := make([]store.DepositResult, len(ds)), make([]error, len(ds))
	for i, d := range ds {
		res[i], errs[i] = s.deposit(ctx, d)
	}
	return res, errs
}

// usage reads this replica's in-process counts, reported under its own
// name.
func (s *memStore) usage(_ context.Context, reads []core.ReportRead) []usageOut {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]usageOut, len(reads))
	for i, r := range reads {
		out[i].reporter = s.rep
		for _, w := range r.Windows {
			b := s.mem.Balance(store.Key{Limit: r.Limit, Window: w, HashTag: r.HashTag}, nowMs)
			if u := usageOf(r.Limit, w, b.Admitted, b.Denied, b.Counters); u.Admitted+u.Denied+u.FallbackAdmitted+u.WouldDenyChecks > 0 {
				out[i].usage = append(out[i].usage, u)
			}
		}
	}
	return out
}

// sweep forgets the buckets expired at now.
func (s *memStore) sweep(now time.Time) {
	nowMs := s.ms(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem.Sweep(nowMs)
}

// localReporter names this process's in-process counts at the allocator:
// the replica id and the process nonce, so a restarted replica (whose
// counts start again from zero) is a new reporter, and the allocator sums
// replicas and the shared bucket without counting anything twice.
func localReporter(replicaID, nonce string) string {
	suffix := "." + nonce
	if len(replicaID)+len(suffix) > vocab.MaxRequestIDLen {
		replicaID = replicaID[:vocab.MaxRequestIDLen-len(suffix)]
	}
	return replicaID + suffix
}
