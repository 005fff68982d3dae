package regionagent

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// Run syncs limits, renews leases, returns expired ones and reports usage
// until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.buckets.Load(ctx); err != nil {
		a.log.Warn("loading Redis scripts failed; they load on first use", "err", err)
	}
	var wg sync.WaitGroup
	loops := []func(context.Context){a.syncLoop, a.clockLoop, a.renewLoop, a.reportLoop, a.redisProbeLoop,
		a.failover.run} // failover.go
	for _, f := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	wg.Wait()
	// A last usage report on the way out, so the region's final counts
	// reach the allocator even if no replica of the region stays up.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	a.report(fctx)
	cancel()
	return ctx.Err()
}

// every runs fn now and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) syncLoop(ctx context.Context) {
	every(ctx, a.opt.syncEvery, func() {
		if err := a.syncLimits(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("limit sync failed", "err", err)
		}
	})
}

// syncLimits refreshes the limit cache from the allocator.
func (a *Agent) syncLimits(ctx context.Context) error {
	var resp *pb.SyncLimitsResponse
	sent := a.opt.now()
	err := a.alloc.call(ctx, func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error {
		var err error
		resp, err = cl.SyncLimits(ctx, &pb.SyncLimitsRequest{Region: a.cfg.Region, KnownRevision: a.limits.rev()}, opts...)
		return err
	})
	if err != nil {
		return err
	}
	recv := a.opt.now()
	if resp.AllocatorUnixNanos != 0 && a.allocOffset.Load() == 0 {
		mid := sent.Add(recv.Sub(sent) / 2)
		a.allocOffset.Store(resp.AllocatorUnixNanos - mid.UnixNano())
	}
	if resp.Unchanged {
		a.limits.markSynced()
		return nil
	}
	a.limits.replace(resp.Revision, resp.Limits, a.cfg.Region)
	return nil
}

// clockLoop keeps the Redis clock estimate fresh.
func (a *Agent) clockLoop(ctx context.Context) {
	every(ctx, 30*time.Second, func() {
		if a.rh.isDown() {
			return // the prober syncs the clock when Redis answers again
		}
		if err := a.syncClock(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("Redis clock sync failed", "err", err)
		}
	})
}

// redisTime reads Redis's clock, or the test's.
type redisTime struct{ a *Agent }

func (r redisTime) Time(ctx context.Context) (time.Time, error) {
	if r.a.opt.redisNow != nil {
		return r.a.opt.redisNow(), nil
	}
	return r.a.cfg.Redis.Time(ctx).Result()
}

func (a *Agent) syncClock(ctx context.Context) error {
	best := time.Duration(math.MaxInt64)
	var cs bucket.ClockSync
	for range 5 {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		sent := a.opt.now()
		rt, err := redisTime{a}.Time(rctx)
		recv := a.opt.now()
		cancel()
		if err != nil {
			return err
		}
		c, err := bucket.NewClockSync(sent, recv, rt)
		if err != nil {
			return err
		}
		if c.RTT() < best {
			best, cs = c.RTT(), c
		}
	}
	a.clockMu.Lock()
	a.clock = cs
	a.clockMu.Unlock()
	a.clockOK.Store(true)
	return nil
}

// redisMsAt is the agent instant now on Redis's clock, in ms.
func (a *Agent) redisMsAt(now time.Time) int64 {
	if a.opt.redisNow != nil {
		return a.opt.redisNow().UnixMilli()
	}
	cs, ok := a.clockSync()
	if !ok {
		return now.UnixMilli()
	}
	return cs.ToRedis(now)
}

func (a *Agent) clockSync() (bucket.ClockSync, bool) {
	a.clockMu.Lock()
	defer a.clockMu.Unlock()
	return a.clock, a.clockOK.Load()
}

// renewLoop evaluates every active limit each tick, and a kicked limit at
// once.
func (a *Agent) renewLoop(ctx context.Context) {
	t := time.NewTicker(a.opt.renewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-a.kicks:
			a.evaluate(ctx, id)
		case <-t.C:
			a.evaluateAll(ctx, a.activeLimits())
		}
	}
}

// evalWorkers bounds how many limits are evaluated at once, so one slow
// limit (an allocator call retrying) does not hold up the others.
const evalWorkers = 8

// evaluateAll evaluates limits on up to evalWorkers goroutines.
func (a *Agent) evaluateAll(ctx context.Context, ids []string) {
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(evalWorkers, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				a.evaluate(ctx, id)
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}

// activeLimits lists the limits seen recently and forgets idle ones.
func (a *Agent) activeLimits() []string {
	now := a.opt.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.states))
	for id, st := range a.states {
		st.mu.Lock()
		idle := now.Sub(st.lastActive) > a.opt.idleAfter && st.pending == nil && st.pendingNext == nil
		st.mu.Unlock()
		if idle {
			delete(a.states, id)
			continue
		}
		ids = append(ids, id)
	}
	a.m.active.Set(float64(len(ids)))
	return ids
}

// evaluate looks at one limit: learns the regional demand from the bucket,
// closes and returns expired leases, and renews (this window, and the next
// one near the boundary) when the balance runs low. Only the replica that
// holds the limit's renewal lock in Redis renews. While Redis is down each
// replica renews its in-process leases for itself (evaluateLocal); once it
// answers again, they are returned first (drainLocal).
func (a *Agent) evaluate(ctx context.Context, id string) {
	l := a.limits.get(id)
	if l == nil {
		return
	}
	a.mu.Lock()
	st := a.states[id]
	a.mu.Unlock()
	if st == nil {
		return
	}
	if a.rh.isDown() {
		a.evaluateLocal(ctx, l, st)
		return
	}
	a.drainLocal(ctx, l, st)
	now := a.opt.now()
	w := a.windowOf(now, l)
	key := bucket.Key(id, w.Index)
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	bal, err := a.buckets.Balance(rctx, key, a.redisNowMs())
	cancel()
	a.observeRedis(err)
	if err != nil {
		a.log.Debug("renewal: reading the bucket failed", "limit", id, "err", err)
		return // Redis down: after a few failures, in-process leases (evaluateLocal)
	}
	rate := a.observeDemand(st, w.Index, bal, now)
	a.failover.sawAdmitted(l, w.Index, bal.Admitted, now) // failover.go
	st.mu.Lock()
	for _, c := range bal.Counters {
		if c.Name == counterPoolSpent && c.Value > 0 && st.spentWindow != w.Index {
			st.spentWindow, st.spentAt = w.Index, now
			st.notify()
		}
	}
	kickCost := st.kickCost
	spent := st.spentWindow == w.Index && now.Sub(st.spentAt) < spentRetry
	havePending := st.pending != nil
	nextDone := st.nextWindow == w.Index+1
	st.mu.Unlock()

	nowMs := a.redisMsAt(now)
	p := core.PlanRenewal(core.PlanInput{NowMs: nowMs, Left: a.windowEnd(w).Sub(now), Rate: rate, TTL: l.ttl,
		Lead: a.opt.lead, Every: a.opt.renewEvery, Bucket: bal, Spent: spent, Pending: havePending,
		NextDone: nextDone, KickCost: kickCost})
	a.log.Debug("renewal: evaluated", "limit", id, "window", w.Index, "spendable", bal.Spendable, "held", p.Held,
		"pending", bal.Pending, "rate", rate, "low", p.Low, "acquire", p.Acquire, "next", p.AcquireNext,
		"surplus", len(p.Surplus), "expired", len(p.Close))
	a.retMu.Lock()
	unreturned := len(a.unreturned[id]) > 0
	a.retMu.Unlock()
	if unreturned {
		a.returnLeases(ctx, id, nil)
	}
	if p.Idle() {
		return
	}
	lockKey := bucket.LockKey(id)
	lctx, lcancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	got, err := a.buckets.TryLock(lctx, lockKey, a.cfg.ReplicaID, a.opt.allocRetryFor+5*time.Second)
	lcancel()
	if err != nil || !got {
		a.log.Debug("renewal: lock not taken", "limit", id, "err", err)
		return // another replica renews this limit
	}
	defer func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), a.opt.redisTimeout)
		_ = a.buckets.Unlock(uctx, lockKey, a.cfg.ReplicaID)
		ucancel()
	}()
	// Acquire first: returns are not urgent, a dry region is. Then every
	// lease closed in this round goes back in one call (one WAN round trip,
	// not one per lease: after a burst a region may hold a dozen small
	// leases that expire together).
	if p.Acquire {
		a.acquire(ctx, l, st, false, rate, p.Held, p.Want, false)
	}
	if p.AcquireNext {
		a.acquire(ctx, l, st, true, rate, 0, 0, false)
	}
	a.closeAndReturn(ctx, l, key, p.Closing())
}

// observeDemand feeds the bucket's regional admitted + denied count into
// the limit's rate estimate and returns the rate (tokens/s).
func (a *Agent) observeDemand(st *limitState, window int64, bal bucket.BalanceResult, now time.Time) float64 {
	count := bal.Admitted + bal.Denied
	for _, c := range bal.Counters {
		if c.Name == counterFallback {
			count += c.Value
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.demand.Observe(now, window, count)
	return st.demand.Rate(now)
}

// acquire asks the allocator for one lease (or replays the unanswered
// request) and deposits it in the region's bucket, or (local) in process.
func (a *Agent) acquire(ctx context.Context, l *limitView, st *limitState, next bool, rate float64, held, want int64, local bool) {
	st.mu.Lock()
	req := st.pending
	if next {
		req = st.pendingNext
	}
	if req == nil {
		choice := pb.WindowChoice_WINDOW_CHOICE_CURRENT
		if next {
			choice = pb.WindowChoice_WINDOW_CHOICE_NEXT
		}
		req = &pb.LeaseRequest{
			RequestId: a.cfg.ReplicaID + "-" + a.nonce + "-" + strconv.FormatUint(a.seq.Add(1), 10),
			LimitId:   l.id, Window: choice, DemandPerSecond: rate, HeldTokens: held, WantTokens: want,
		}
		if next {
			st.pendingNext = req
		} else {
			st.pending = req
		}
	}
	st.mu.Unlock()

	if a.onAcquire != nil {
		a.onAcquire(true)
		defer a.onAcquire(false)
	}
	sent := a.opt.now()
	var resp *pb.AcquireLeasesResponse
	err := a.alloc.call(ctx, func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error {
		var err error
		resp, err = cl.AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: a.cfg.Region, Requests: []*pb.LeaseRequest{req}}, opts...)
		return err
	})
	recv := a.opt.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		// Unanswered: the request stays pending and is sent again, as is.
		a.m.renewals.WithLabelValues("failed").Inc()
		if !st.failing && ctx.Err() == nil {
			a.log.Warn("lease request failed; entering fallback until the allocator answers", "limit", l.id, "err", err)
		}
		st.failing = ctx.Err() == nil
		st.notify()
		return
	}
	if next {
		st.pendingNext = nil
	} else {
		st.pending = nil
	}
	st.failing = false
	st.kickCost = 0
	if st.fallbackOn {
		// The allocator answers again: the fallback is over.
		st.fallbackOn = false
		a.m.fallbackMode.DeleteLabelValues(l.id)
	}
	res := resp.Results[0]
	if res.Code != pb.ItemCode_ITEM_CODE_OK {
		a.m.renewals.WithLabelValues("rejected").Inc()
		a.log.Warn("lease request refused", "limit", l.id, "code", res.Code, "message", res.Message)
		st.notify()
		return
	}
	ls := res.Lease
	if ls == nil || ls.Tokens == 0 {
		a.m.renewals.WithLabelValues("empty").Inc()
		a.log.Debug("renewal: nothing granted", "limit", l.id, "next", next)
		if ls != nil && ls.PoolLeft == 0 || ls == nil {
			// The allocator names the window it answered for; without it
			// (an older allocator) the window current at the reply.
			w := a.windowOf(recv, l)
			if next {
				w = w.Next()
			}
			if ls != nil && ls.Window != nil {
				w.Index = ls.WindowIndex
			}
			st.spentWindow, st.spentAt = max(st.spentWindow, w.Index), recv
			if !next && !local {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.opt.redisTimeout)
				_, _ = a.buckets.AddCounter(rctx, bucket.Key(l.id, w.Index), counterPoolSpent, 1)
				cancel()
			}
		}
		st.notify()
		return
	}
	a.m.renewals.WithLabelValues("granted").Inc()
	a.log.Debug("renewal: leased", "limit", l.id, "lease", ls.LeaseId, "tokens", ls.Tokens, "window", ls.WindowIndex,
		"starts_in", ls.StartsIn.AsDuration(), "expires_in", ls.ExpiresIn.AsDuration(), "pool_left", ls.PoolLeft)
	// The allocator's clock, seen from here: its window ends window_left
	// after it answered, which is no earlier than when we received.
	// A replayed lease, or one whose window is over, says nothing about
	// the allocator's clock now.
	if wl := ls.WindowLeft.AsDuration(); wl > 0 && !res.Replayed {
		allocNow := (ls.WindowIndex+1)*ls.Window.AsDuration().Nanoseconds() - wl.Nanoseconds()
		a.allocOffset.Store(allocNow - recv.UnixNano())
	}
	var derr error
	if local {
		derr = a.depositLocal(l, ls, sent, recv)
	} else {
		derr = a.deposit(ctx, l, ls, sent, recv)
		a.observeRedis(derr)
	}
	switch {
	case derr != nil && !local && redisUnavailable(derr):
		// Redis did not answer: the deposit may have landed (a timeout
		// after the write), so returning the lease could let its tokens
		// be spent twice. It stays stranded (undershoot); if it did land,
		// the renewal round that finds it expired closes and returns it.
		a.log.Warn("deposit unanswered; the lease stays stranded", "limit", l.id, "lease", ls.LeaseId, "err", derr)
	case derr != nil:
		a.log.Warn("deposit failed; returning the lease", "limit", l.id, "lease", ls.LeaseId, "in_process", local, "err", derr)
		a.returnLeases(ctx, l.id, []*pb.LeaseReturn{{LimitId: l.id, LeaseId: ls.LeaseId, Unspent: ls.Tokens}})
	case next && local:
		st.localNext = ls.WindowIndex
	case next:
		st.nextWindow = ls.WindowIndex
	}
	st.notify()
}

var errUselessLease = errors.New("lease expires before it starts")

// deposit stores a lease in the region's bucket with its agent deadline on
// Redis's clock: never later than the allocator's expiry.
func (a *Agent) deposit(ctx context.Context, l *limitView, ls *pb.Lease, sent, recv time.Time) error {
	cs, ok := a.clockSync()
	if !ok {
		if err := a.syncClock(ctx); err != nil {
			return err
		}
		cs, _ = a.clockSync()
	}
	deadline := lease.Deadline(sent, ls.ExpiresIn.AsDuration(), a.opt.safetyMargin(ls.ExpiresIn.AsDuration()))
	start := lease.StartAt(recv, ls.StartsIn.AsDuration())
	d := bucket.Deposit{
		Key:        bucket.Key(l.id, ls.WindowIndex),
		LeaseID:    ls.LeaseId,
		Tokens:     ls.Tokens,
		StartMs:    cs.ToRedisStart(start),
		DeadlineMs: cs.ToRedis(deadline),
		NowMs:      a.redisNowMs(),
	}
	if ls.StartsIn.AsDuration() <= 0 {
		// A lease of the running window is spendable at once; only a
		// next-window lease must wait (and its start is rounded up).
		d.StartMs = 0
	}
	if d.DeadlineMs <= d.StartMs {
		return errUselessLease
	}
	// The key outlives the window by a grace period, so usage reports
	// still read its counters; the window ends window_left after the
	// allocator answered, so no later than recv + window_left.
	windowEnd := recv.Add(ls.WindowLeft.AsDuration())
	d.ExpireAtMs = max(cs.ToRedis(windowEnd), d.DeadlineMs) + a.opt.keyGrace.Milliseconds()
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	defer cancel()
	res, err := a.buckets.Deposit(rctx, d)
	if err != nil {
		return err
	}
	switch res.Status {
	case bucket.Deposited:
		a.m.leaseTokens.Add(float64(ls.Tokens))
		return nil
	case bucket.AlreadyDeposited:
		return nil
	}
	return errors.New("bucket refused the deposit: " + res.Status.String())
}

// closeAndReturn closes leases in the bucket and returns their unspent
// tokens to the allocator in one call. Closing is idempotent in Redis and
// returns are idempotent at the allocator, so a replica that crashed
// between the two is covered by the next one that closes again.
func (a *Agent) closeAndReturn(ctx context.Context, l *limitView, key string, ids []string) {
	var rets []*pb.LeaseReturn
	for _, id := range ids {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		res, err := a.buckets.Close(rctx, key, id, a.redisNowMs())
		cancel()
		if err != nil {
			a.log.Debug("renewal: closing failed", "limit", l.id, "lease", id, "err", err)
			continue
		}
		if strings.HasPrefix(id, bucket.SubLeasePrefix) {
			// Released sub-lease tokens: no allocator lease to return them
			// to; they are lost to the window (undershoot).
			continue
		}
		rets = append(rets, &pb.LeaseReturn{LimitId: l.id, LeaseId: id, Unspent: res.Unspent})
	}
	if len(rets) > 0 {
		a.returnLeases(ctx, l.id, rets)
	}
}

// returnLeases tells the allocator leases are closed with unspent tokens.
func (a *Agent) returnLeases(ctx context.Context, limit string, rets []*pb.LeaseReturn) {
	a.retMu.Lock()
	if old := a.unreturned[limit]; len(old) > 0 {
		seen := map[string]bool{}
		for _, r := range rets {
			seen[r.LeaseId] = true
		}
		for _, r := range old {
			if !seen[r.LeaseId] {
				rets = append(rets, r)
			}
		}
		delete(a.unreturned, limit)
	}
	a.retMu.Unlock()
	if len(rets) == 0 {
		return
	}
	err := a.alloc.call(ctx, func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error {
		_, err := cl.ReturnLeases(ctx, &pb.ReturnLeasesRequest{Region: a.cfg.Region, Returns: rets}, opts...)
		return err
	})
	if err != nil {
		a.log.Warn("lease return failed; sent again when the allocator answers", "limit", limit, "leases", len(rets), "err", err)
		a.retMu.Lock()
		if a.unreturned == nil {
			a.unreturned = map[string][]*pb.LeaseReturn{}
		}
		a.unreturned[limit] = append(a.unreturned[limit], rets...)
		if n := len(a.unreturned[limit]); n > maxUnreturned {
			a.unreturned[limit] = a.unreturned[limit][n-maxUnreturned:]
		}
		a.retMu.Unlock()
		return
	}
	for _, r := range rets {
		a.m.returned.Add(float64(r.Unspent))
	}
}

// maxUnreturned bounds the unacknowledged returns kept per limit.
const maxUnreturned = 1024

// reportLoop sends the regional usage counts of the current and previous
// windows of every active limit: the shared bucket's counts, which every
// replica reports alike under the bucket's reporter name (the allocator's
// max-merge keeps them once), and this replica's in-process counts from
// while Redis was down, under its own reporter name (the allocator sums
// reporters).
func (a *Agent) reportLoop(ctx context.Context) {
	every(ctx, a.opt.reportEvery, func() { a.report(ctx) })
}

// maxReportBack bounds how many past windows a usage report covers.
const maxReportBack = 30

func (a *Agent) report(ctx context.Context) {
	now := a.opt.now()
	byReporter := map[string][]*pb.Usage{}
	for _, id := range a.activeLimits() {
		l := a.limits.get(id)
		if l == nil {
			continue
		}
		w := a.windowOf(now, l)
		// Every window whose bucket may still exist is reported, so windows
		// that closed while the allocator was unreachable are reported
		// once it is back (reports are cumulative; repeats are no-ops).
		back := min(int64(maxReportBack), int64(a.opt.keyGrace/l.window)+1)
		if !a.rh.isDown() {
			if rep, u := a.bucketUsage(ctx, id, w.Index-back, w.Index); len(u) > 0 {
				byReporter[rep] = append(byReporter[rep], u...)
			}
		}
		if u := a.localUsage(id, w.Index-back, w.Index, now); len(u) > 0 {
			byReporter[a.localRep] = append(byReporter[a.localRep], u...)
		}
	}
	a.local.sweep(now)
	if u := a.failover.usage(); len(u) > 0 { // failover.go: redis_rollback_tokens
		byReporter[failoverReporter] = u
	}
	for rep, usage := range byReporter {
		err := a.alloc.call(ctx, func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error {
			_, err := cl.ReportUsage(ctx, &pb.ReportUsageRequest{Region: a.cfg.Region, Reporter: rep, Usage: usage}, opts...)
			return err
		})
		if err != nil {
			a.m.reports.WithLabelValues("failed").Inc()
			continue
		}
		a.m.reports.WithLabelValues("ok").Inc()
	}
}

// bucketUsage reads the shared bucket's counts of windows from..to of a
// limit and names their reporter by the buckets' epoch. Redis restarted
// empty starts its counters again from zero; the allocator merges a
// reporter's cumulative counts with max, so the new counts are reported
// under the new epoch's name and add to the old ones instead of hiding
// below them. The epoch is read before and after the counts: if it
// changed in between (a restart), nothing is reported this round.
func (a *Agent) bucketUsage(ctx context.Context, id string, from, to int64) (string, []*pb.Usage) {
	epoch := func() (string, error) {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		defer cancel()
		e, err := a.buckets.Epoch(rctx, id)
		a.observeRedis(err)
		return e, err
	}
	before, err := epoch()
	if err != nil {
		return "", nil
	}
	var usage []*pb.Usage
	for idx := from; idx <= to; idx++ {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		bal, err := a.buckets.Balance(rctx, bucket.Key(id, idx), a.redisNowMs())
		cancel()
		if err != nil {
			continue
		}
		if u := usageOf(id, idx, bal); u.Admitted+u.Denied+u.FallbackAdmitted > 0 {
			usage = append(usage, u)
		}
	}
	after, err := epoch()
	if err != nil || after != before {
		return "", nil
	}
	rep := bucketReporter(before)
	if allocator.ValidateRequestID("reporter", rep) != nil {
		a.log.Warn("unusable bucket epoch; not reporting the bucket's counts", "limit", id, "epoch", before)
		return "", nil
	}
	return rep, usage
}
