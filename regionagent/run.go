package regionagent

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"leasehold/internal/limitspec"
	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Run syncs limits, carries out the core's work and reports usage until
// ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.running.Store(&ctx)
	if err := a.shared.b.Load(ctx); err != nil {
		a.log.Warn("loading Redis scripts failed; they load on first use", "err", err)
	}
	// Redis's clock before the first Check: a standing share's deposit
	// rides with a Check's spend only once it is known (carried), and a
	// share not carried is left to the other replicas for its window.
	if err := a.syncClock(ctx); err != nil && ctx.Err() == nil {
		a.log.Warn("Redis clock sync failed; it is tried again", "err", vocab.Cap(err.Error(), maxLogValue))
	}
	// One sync before anything else; if the allocator does not answer,
	// the snapshot the region kept.
	if err := a.syncLimits(ctx); err != nil && ctx.Err() == nil {
		a.restoreSnapshot(ctx)
	}
	var wg sync.WaitGroup
	loops := []func(context.Context){a.syncLoop, a.clockLoop, a.workLoop, a.redisProbeLoop,
		a.failover.run, a.lockLoop} // failover.go, locks.go
	for _, f := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	wg.Wait()
	// A last usage report on the way out, so the region's final counts
	// reach the allocator even if no replica of the region stays up.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	a.running.Store(&fctx)
	now := a.opt.now()
	a.withCore(func(c *core.Core) { c.FinalReport(now) })
	a.settle(fctx)
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

// minSyncGap is the least time between two limit syncs: a sync a Check
// asks for (a limit not in the snapshot) comes at most this soon after the
// last, so a flood of unknown ids costs at most ten syncs a second, each
// answering every Check that arrived before it was sent.
const minSyncGap = 100 * time.Millisecond

func (a *Agent) syncLoop(ctx context.Context) {
	t := time.NewTimer(a.opt.syncEvery)
	defer t.Stop()
	last := a.opt.now()
	for {
		asked := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.syncNow:
			asked = true
		case <-a.alloc.reconnected: // the allocator is back (alloc_ready.go)
			asked = true
		}
		if d := minSyncGap - a.opt.now().Sub(last); asked && d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d): // batching the syncs Checks (and reconnects) ask for
			}
		}
		last = a.opt.now()
		if err := a.syncLimits(ctx); err != nil && ctx.Err() == nil {
			a.notes.callFailed(a.log, "limit sync", 1, err)
		}
		a.local.sweep(a.opt.now())
		a.slots.forgetIdle(a.opt.now(), a.opt.idleAfter)
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(a.opt.syncEvery)
	}
}

// syncLimits refreshes the core's snapshot of the region's limits. The
// call also probes the allocator's health: it is retried only for one
// attempt's timeout (enough to follow a redirect to the leader), so that a
// dead allocator is known within a few seconds, and a healed one at the
// next sync.
func (a *Agent) syncLimits(ctx context.Context) error {
	if a.groups.active() {
		return a.syncGroups(ctx) // groups.go
	}
	var resp *pb.SyncLimitsResponse
	a.mu.Lock()
	rev := a.core.Revision()
	tok := a.core.SyncStart()
	a.mu.Unlock()
	sent := a.opt.now()
	err := a.alloc.callFor(ctx, a.opt.allocTimeout, func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error {
		var err error
		resp, err = cl.SyncLimits(ctx, &pb.SyncLimitsRequest{Region: a.cfg.Region, KnownRevision: rev}, opts...)
		return err
	})
	if err != nil {
		return err
	}
	recv := a.opt.now()
	if resp.Group != "" {
		// The allocator is one group of several: its limits are a share
		// of the region's. Learn the map and sync every group instead.
		if err := a.groups.learn(resp.GroupMap, resp.GroupMapRevision); err != nil {
			return err
		}
		if a.groups.active() {
			return a.syncGroups(ctx)
		}
		return errors.New("regionagent: an allocator group answered without a group map")
	}
	var taken time.Time
	if resp.AllocatorUnixNanos != 0 {
		taken = time.Unix(0, resp.AllocatorUnixNanos)
	}
	a.withCore(func(c *core.Core) {
		if !taken.IsZero() {
			c.SetAllocatorClock(sent, recv, taken)
		}
		if resp.Unchanged {
			c.Synced(tok, taken)
			return
		}
		ls, plans := coreLimits(resp.Limits, a.cfg.Region)
		c.SetPlans(plans)
		c.SetLimits(tok, resp.Revision, ls, taken)
	})
	a.syncOnce.Do(func() { close(a.synced) })
	if !resp.Unchanged && !taken.IsZero() {
		a.saveSnapshot(ctx, resp)
	}
	return nil
}

// coreLimits splits a snapshot of the region's limits into the limits the
// core checks and the resolver of the ids its plans bind (nil without
// plans), with the allocator's resolution (planbind): a plan's record is
// never checked itself.
func coreLimits(pls []*pb.Limit, region string) ([]core.Limit, core.Resolver) {
	ls := make([]core.Limit, 0, len(pls))
	var plans []*pb.Limit
	for _, l := range pls {
		if planbind.IsPlan(l.Id) {
			plans = append(plans, l)
			continue
		}
		ls = append(ls, limitOf(l, region))
	}
	if len(plans) == 0 {
		return ls, nil
	}
	tbl := planbind.NewTable(plans)
	byID := make(map[string]*pb.Limit, len(plans))
	for _, p := range plans {
		byID[p.Id] = p
	}
	return ls, func(id string) (core.Limit, bool) {
		pid, ok := tbl.Match(id)
		if !ok || vocab.ValidateLimitID("id", id) != nil {
			return core.Limit{}, false
		}
		l := planbind.Resolve(byID[pid], id)
		if !slices.Contains(l.Regions, region) {
			return core.Limit{}, false // a contract's regions leave this one out
		}
		return limitOf(l, region), true
	}
}

// limitOf is what the core needs of a limit, for region.
func limitOf(l *pb.Limit, region string) core.Limit {
	out := core.Limit{ID: l.Id, Tokens: l.LimitTokens, Window: dur(l.Window), Phase: dur(l.WindowPhase), TTL: dur(l.GetLease().GetTtl()),
		Standing: l.GetLease().GetStanding(), Mode: core.Mode(l.Mode), Version: l.Version, Regions: len(l.Regions), HashTag: l.HashTag,
		SettleGrace: limitspec.SettleGrace(l), CarryDebt: l.DebtPolicy != pb.DebtPolicy_DEBT_POLICY_FORGIVE, Shadow: l.Shadow, Plan: l.Plan}
	if l.Kind == pb.LimitKind_LIMIT_KIND_BUCKET && l.RateTokens > 0 {
		out.Rate, out.RatePeriod, out.Burst = l.RateTokens, time.Second, l.BurstTokens
		if l.RatePeriod != nil {
			out.RatePeriod = l.RatePeriod.AsDuration()
		}
	}
	if l.Kind == pb.LimitKind_LIMIT_KIND_CONCURRENCY && l.LimitTokens > 0 {
		out.Slots, out.Tokens = l.LimitTokens, 0
	}
	if l.Calendar != nil {
		// The process's one location of the zone (zones.Load), so that
		// every schedule of the limit compares equal.
		out.Cal = limitspec.Schedule(l).Cal
	}
	if fb := l.Fallback[region]; fb != nil {
		out.Fallback = core.Fallback{Kind: core.FallbackKind(fb.Kind), LocalTokens: fb.LocalTokens}
	}
	return out
}

// clockLoop keeps the Redis clock estimate fresh.
func (a *Agent) clockLoop(ctx context.Context) {
	every(ctx, 30*time.Second, func() {
		if a.rh.isDown() {
			return // the prober syncs the clock when Redis answers again
		}
		if err := a.syncClock(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("Redis clock sync failed", "err", vocab.Cap(err.Error(), maxLogValue))
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

// syncClock samples Redis's TIME five times and keeps the sample with the
// smallest round trip (bucket.ClockSync).
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
	a.shared.setClock(cs)
	return nil
}

// allocatorHealth is told when the allocator stops or starts answering.
func (a *Agent) allocatorHealth(up bool) {
	now := a.opt.now()
	if up {
		a.log.Info("allocator answers again")
	} else {
		a.log.Warn("allocator unreachable: limits apply their fallback when their region runs dry")
	}
	a.withCore(func(c *core.Core) { c.SetAllocatorHealth(now, up) })
}

// ---- usage reports ----

// sendReports reads the counts the core asks for and reports them, one
// ReportUsage call per reporter: the shared bucket's under its epoch's
// name (every replica reports alike; the allocator's max-merge keeps them
// once), the in-process store's under this replica's.
func (a *Agent) sendReports(ctx context.Context, reads []core.ReportRead) {
	byStore := [2][]core.ReportRead{}
	for _, r := range reads {
		byStore[r.Store] = append(byStore[r.Store], r)
	}
	byReporter := map[string][]*pb.Usage{}
	readsOf := map[string][]core.ReportRead{}
	var failed []core.ReportRead
	for s, rs := range byStore {
		if len(rs) == 0 {
			continue
		}
		outs := a.store(core.Store(s)).usage(ctx, rs)
		for i, o := range outs {
			if o.err != nil {
				failed = append(failed, rs[i])
				continue
			}
			byReporter[o.reporter] = append(byReporter[o.reporter], o.usage...)
			readsOf[o.reporter] = append(readsOf[o.reporter], rs[i])
		}
	}
	for rep, usage := range byReporter {
		var err error
		if a.groups.active() {
			if len(a.reportByGroup(ctx, rep, usage)) > 0 { // groups.go
				err = errors.New("an allocator group did not take the report")
			}
		} else {
			err = reportTo(ctx, a.alloc, a.cfg.Region, rep, usage)
		}
		if err != nil {
			a.m.reports.WithLabelValues("failed").Inc()
			failed = append(failed, readsOf[rep]...)
		} else if len(usage) > 0 {
			a.m.reports.WithLabelValues("ok").Inc()
		}
	}
	if len(failed) > 0 {
		now := a.opt.now()
		a.withCore(func(c *core.Core) {
			for _, r := range failed {
				c.ReportDone(now, r, false)
			}
		})
	}
}

// usageOf turns a window's counters into a usage record.
func usageOf(limit string, window, admitted, denied int64, counters []store.Counter) *pb.Usage {
	u := &pb.Usage{LimitId: limit, WindowIndex: window, Admitted: admitted, Denied: denied}
	for _, c := range counters {
		switch c.Name {
		case store.CounterFallback:
			u.FallbackAdmitted = c.Value
		case store.CounterModeLocal:
			u.Fallback = max(u.Fallback, pb.FallbackKind_FALLBACK_KIND_LOCAL)
		case store.CounterModeOpen:
			u.Fallback = pb.FallbackKind_FALLBACK_KIND_OPEN
		case store.CounterReleased:
			u.Released = c.Value
		case store.CounterSettleOverrun:
			u.SettleOverrun = c.Value
		case store.CounterWouldDeny:
			u.WouldDeny = c.Value
		case store.CounterWouldDenyChecks:
			u.WouldDenyChecks = c.Value
		}
	}
	return u
}
