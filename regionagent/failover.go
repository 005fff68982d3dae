package regionagent

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// Redis failover with lost writes (ARCHITECTURE.md, failure table): spends
// are written to the region's Redis primary and replicated asynchronously.
// When a replica that lagged is promoted, the spends of the lag are
// forgotten and the region's balance goes back up by their tokens.
//
// The failoverWatcher notices and answers:
//
//   - It polls INFO replication of the primary (every master on Cluster)
//     about once a second and follows its replication history: the
//     master_replid, the offset over time, and the offset every online
//     replica acknowledged. From them it knows, at each poll, since when
//     writes may be unreplicated: the replication lag it sees.
//   - A new master_replid whose master_replid2 is the old id is a promoted
//     replica, holding the old history up to second_repl_offset - 1; the
//     same id at a lower offset is a rollback. Either cut loses the writes
//     made on the old primary from the newest sample at or below the kept
//     offset until the old primary stopped answering (or the detection).
//   - For each active (limit, window) the watcher estimates the forgotten
//     spends (estimateLoss: that span x the region's admit rate just
//     before, at least what it saw counted on the old primary and missing
//     on the new, at most what the window can have spent), adds it to the
//     window's cumulative redis_rollback_tokens (reported with the usage,
//     under a reporter of its own),
//     and debits it from the bucket on the new primary, so the forgotten
//     spends cannot be spent, or returned to the allocator, again.
//   - A new id with no link to the old one is a restart or a node of
//     unknown history: counted and logged, not charged. A restart that
//     emptied Redis is the missing-bucket handling's case (bucket epochs);
//     its buckets may already hold new leases, which a debit would wrongly
//     take.
//
// The debit is a sub-lease reservation (bucket.Reserve) under an id named
// after the cut, never released: every agent replica that notices the
// same cut debits the same reservation, which Redis takes once. Its tokens
// count as admitted, standing in for the forgotten spends.
//
// Each replica keeps its cumulative estimates in memory; all replicas
// report under one reporter name and the allocator keeps the largest, so a
// cut noticed by several replicas counts once.
//
// Safe for concurrent use.
type failoverWatcher struct {
	a       *Agent
	every   time.Duration // poll interval
	timeout time.Duration // per poll
	m       *failoverMetrics
	debit   bool // debit the estimate from the rolled-back buckets (WithRollbackDebit)

	mu       sync.Mutex // protects the fields below
	repl     replState
	seen     map[failKey]*seenCount
	rates    map[string]*core.Demand // admit rate per limit, from bucket admitted counts
	rollback map[failKey]*rollbackTotal
	seenAt   time.Time         // the core's readings up to here were taken
	reported map[failKey]int64 // estimates the allocator acknowledged
	// No window in seen or rollback ends before pruneAt (pruneAny: some
	// window is held), so a poll before pruneAt plus the key grace has
	// nothing to forget and scans nothing: a poll's cost follows traffic,
	// not the windows held (a day's window is held all day).
	pruneAt  time.Time
	pruneAny bool
}

// failKey is one (limit, window).
type failKey struct {
	limit  string
	window int64
}

// seenCount is the largest admitted count read for a window.
type seenCount struct {
	admitted int64
	at       time.Time // the last reading at that count
	end      time.Time // the window's end (agent clock): when to forget it
}

// rollbackTotal is a window's cumulative estimate of forgotten spends.
type rollbackTotal struct {
	tokens int64
	end    time.Time
}

// failoverPoll is how often the watcher reads INFO replication.
const failoverPoll = time.Second

func newFailoverWatcher(a *Agent) *failoverWatcher {
	return &failoverWatcher{
		a: a, every: failoverPoll, timeout: a.opt.redisTimeout, m: newFailoverMetrics(a.cfg.Registerer), debit: a.opt.debit,
		seen: map[failKey]*seenCount{}, rates: map[string]*core.Demand{}, rollback: map[failKey]*rollbackTotal{},
		reported: map[failKey]int64{},
	}
}

// run polls until ctx ends.
func (f *failoverWatcher) run(ctx context.Context) {
	every(ctx, f.every, func() { f.poll(ctx) })
}

// nodeInfo is one primary's INFO replication, or the error reading it.
type nodeInfo struct {
	node string
	text string
	err  error
}

// primaryNode names the primary of a standalone or Sentinel deployment:
// one history, whichever address serves it.
const primaryNode = "primary"

// infos reads INFO replication from the deployment's primaries.
func (f *failoverWatcher) infos(ctx context.Context) []nodeInfo {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if c, ok := f.a.cfg.Redis.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var out []nodeInfo
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			s, err := n.Info(ctx, "replication").Result()
			mu.Lock()
			out = append(out, nodeInfo{node: n.Options().Addr, text: s, err: err})
			mu.Unlock()
			return nil
		})
		if err != nil && len(out) == 0 {
			// The cluster's layout is unknown: every followed master failed.
			f.mu.Lock()
			for n := range f.repl.tracks {
				out = append(out, nodeInfo{node: n, err: err})
			}
			f.mu.Unlock()
		}
		return out
	}
	s, err := f.a.cfg.Redis.Info(ctx, "replication").Result()
	return []nodeInfo{{node: primaryNode, text: s, err: err}}
}

// poll reads the primaries once and handles any cut history.
func (f *failoverWatcher) poll(ctx context.Context) {
	f.readCore()
	infos := f.infos(ctx)
	now := f.a.opt.now()
	var cuts []replCut
	f.mu.Lock()
	for _, n := range infos {
		if n.err != nil {
			f.repl.failed(now, n.node)
			continue
		}
		info, err := parseReplInfo(n.text)
		if err != nil {
			f.a.log.Warn("failover watch: unreadable INFO replication", "node", n.node, "err", err)
			f.repl.failed(now, n.node)
			continue
		}
		if c, ok := f.repl.observe(now, n.node, info); ok {
			cuts = append(cuts, c)
		}
	}
	f.repl.forget(now.Add(-10 * time.Minute))
	lag, replicas := f.repl.lag()
	f.pruneLocked(now)
	f.mu.Unlock()
	f.m.lag.Set(lag)
	f.m.replicas.Set(float64(replicas))
	for _, c := range cuts {
		f.handle(ctx, now, c)
	}
	f.report(ctx)
}

// readCore takes the admitted counts the agent's spends saw since the last
// poll (the core keeps the largest per window): the watcher's admit rates
// and the counts a cut is measured against.
func (f *failoverWatcher) readCore() {
	f.a.mu.Lock()
	seen := f.a.core.Seen(f.seenAt)
	f.a.mu.Unlock()
	for _, s := range seen {
		f.saw(s.Limit, s.Window, s.End, s.Admitted, s.At)
		f.seenAt = maxTime(f.seenAt, s.At)
	}
}

// report sends the rollback estimates the allocator has not acknowledged
// (cumulative per window, under failoverReporter).
func (f *failoverWatcher) report(ctx context.Context) {
	f.mu.Lock()
	var usage []*pb.Usage
	for _, u := range f.usageLocked() {
		if f.reported[failKey{u.LimitId, u.WindowIndex}] != u.RedisRollbackTokens {
			usage = append(usage, u)
		}
	}
	f.mu.Unlock()
	if len(usage) == 0 {
		return
	}
	var err error
	if f.a.groups.active() {
		if len(f.a.reportByGroup(ctx, failoverReporter, usage)) > 0 { // groups.go
			err = errors.New("an allocator group did not take the report")
		}
	} else {
		err = reportTo(ctx, f.a.alloc, f.a.cfg.Region, failoverReporter, usage)
	}
	if err != nil {
		f.a.m.reports.WithLabelValues("failed").Inc()
		return
	}
	f.a.m.reports.WithLabelValues("ok").Inc()
	f.mu.Lock()
	for _, u := range usage {
		f.reported[failKey{u.LimitId, u.WindowIndex}] = u.RedisRollbackTokens
	}
	f.mu.Unlock()
}

// handle estimates, records, reports and compensates one cut.
func (f *failoverWatcher) handle(ctx context.Context, now time.Time, c replCut) {
	f.m.failovers.WithLabelValues(c.Kind).Inc()
	level := slog.LevelWarn
	if c.Kind == cutUnlinked {
		level = slog.LevelInfo // usually a restart: the missing-bucket handling's case
	}
	f.a.log.Log(ctx, level, "Redis replication history cut: writes since the last replicated point may be lost",
		"kind", c.Kind, "node", c.Node, "old_replid", c.OldID, "new_replid", c.NewID, "kept_offset", c.Point,
		"lost_bytes", c.LostBytes, "lag_seen", c.LagSeen, "loss_span", c.Lag())
	var total, debited int64
	for _, t := range f.targets(c) {
		est, obs, deb := f.settle(ctx, now, c, t)
		total += est
		debited += deb
		if est > 0 {
			f.a.log.Warn("Redis failover: spends may be forgotten; counted in the window's bound and debited",
				"limit", t.key.limit, "window", t.key.window, "rollback_tokens", est, "observed", obs, "debited", deb,
				"rate", t.loss.Rate, "kind", c.Kind)
		}
	}
	f.m.rollback.Add(float64(total))
	f.m.debited.Add(float64(debited))
}

// target is one (limit, window) a cut may have touched.
type target struct {
	key     failKey
	hashTag string // the limit's (store.Key)
	loss    windowLoss
}

// targets lists the active limits' windows that overlap the cut's span:
// the windows read since they started, and each limit's window at the
// cut. On Cluster every limit is a target, whichever master failed over
// (see docs/design.md): an over-estimate for the limits of other shards.
func (f *failoverWatcher) targets(c replCut) []target {
	type lim struct {
		id      string
		hashTag string
		sched   lease.Windows
		atCut   int64 // the window at the cut
	}
	var lims []lim
	f.a.mu.Lock()
	for _, id := range f.a.core.ActiveLimits() {
		l, ok := f.a.core.Limit(id)
		if !ok {
			continue
		}
		lims = append(lims, lim{id: id, hashTag: l.HashTag, sched: l.Windows(), atCut: f.a.core.WindowOf(c.LossTo, &l).Index})
	}
	f.a.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	wins := map[string]map[int64]bool{}
	for k := range f.seen {
		if wins[k.limit] == nil {
			wins[k.limit] = map[int64]bool{}
		}
		wins[k.limit][k.window] = true
	}
	var out []target
	for _, x := range lims {
		if wins[x.id] == nil {
			wins[x.id] = map[int64]bool{}
		}
		wins[x.id][x.atCut] = true
		rate := 0.0
		if d := f.rates[x.id]; d != nil {
			rate = d.Rate(c.LossTo)
		}
		idxs := make([]int64, 0, len(wins[x.id]))
		for idx := range wins[x.id] {
			idxs = append(idxs, idx)
		}
		slices.Sort(idxs)
		for _, idx := range idxs {
			end := f.windowEnd(x.id, idx, x.sched)
			start := end.Add(-x.sched.ByIndex(idx).Length)
			if !end.After(c.LossFrom) || !start.Before(c.LossTo) {
				continue // the window does not overlap the lost span
			}
			t := target{key: failKey{x.id, idx}, hashTag: x.hashTag, loss: windowLoss{Start: start, End: end, Rate: rate, After: -1, Ahead: f.a.chunkAhead()}}
			if s := f.seen[t.key]; s != nil {
				t.loss.Seen, t.loss.SeenAt = s.admitted, s.at
			}
			out = append(out, t)
		}
	}
	return out
}

// windowEnd is the end of a limit's window on the agent's clock: from the
// readings when the watcher has them, else from the core's naming. f.mu is
// held (the agent's lock is taken after it, never before).
func (f *failoverWatcher) windowEnd(id string, idx int64, sched lease.Windows) time.Time {
	if s := f.seen[failKey{id, idx}]; s != nil {
		return s.end
	}
	f.a.mu.Lock()
	defer f.a.mu.Unlock()
	return f.a.core.WindowEnd(sched.ByIndex(idx))
}

// settle reads one target's bucket on the new primary, estimates, records
// the estimate and debits it. It returns the estimate, the observed part
// and the tokens debited.
func (f *failoverWatcher) settle(ctx context.Context, now time.Time, c replCut, t target) (est, obs, debited int64) {
	key := bucket.Key(t.hashTag, t.key.limit, t.key.window)
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	bal, err := f.a.shared.b.Balance(rctx, key, f.a.shared.nowMs())
	cancel()
	if err == nil {
		t.loss.After = bal.Admitted
		t.loss.Exists = bal.Admitted+bal.Denied > 0 || len(bal.Counters) > 0 || len(bal.Open) > 0 || len(bal.Expired) > 0
	}
	est, obs = estimateLoss(c, t.loss)
	if est > 0 && t.loss.Exists && est < math.MaxInt64 && f.debit {
		rctx, cancel := context.WithTimeout(ctx, f.timeout)
		r, err := f.a.shared.b.Reserve(rctx, key, c.ID, est, 1, f.a.shared.nowMs())
		cancel()
		switch {
		case err != nil:
			f.a.log.Warn("Redis failover: debiting the bucket failed; the bound still carries the estimate",
				"limit", t.key.limit, "window", t.key.window, "err", err)
		case r.Status == bucket.Reserved || r.Status == bucket.ReplayedReservation:
			debited = r.Granted
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if est > 0 {
		rt := f.rollback[t.key]
		if rt == nil {
			rt = &rollbackTotal{end: t.loss.End}
			f.rollback[t.key] = rt
			f.holdUntil(rt.end)
		}
		rt.tokens = addSat(rt.tokens, est)
	}
	// The new primary's count is the base from now on: a later cut is
	// measured against it, not against the spends this one forgot.
	if t.loss.After >= 0 {
		f.seen[t.key] = &seenCount{admitted: t.loss.After + debited, at: now, end: t.loss.End}
		f.holdUntil(t.loss.End)
	}
	return est, obs, debited
}

// sawAdmitted records a reading of a window's admitted count taken by a
// renewal round's read.
func (f *failoverWatcher) sawAdmitted(limit string, window, admitted int64, now time.Time) {
	f.a.mu.Lock()
	l, ok := f.a.core.Limit(limit)
	var end time.Time
	if ok {
		end = f.a.core.WindowEnd(l.Windows().ByIndex(window))
	}
	f.a.mu.Unlock()
	if ok {
		f.saw(limit, window, end, admitted, now)
	}
}

// saw records a reading of a window's admitted count: the watcher's admit
// rate and the counts a cut is measured against.
func (f *failoverWatcher) saw(limit string, window int64, end time.Time, admitted int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := failKey{limit, window}
	s := f.seen[k]
	if s == nil {
		s = &seenCount{end: end}
		f.seen[k] = s
		f.holdUntil(end)
	}
	if admitted >= s.admitted {
		s.admitted, s.at = admitted, now
	}
	d := f.rates[limit]
	if d == nil {
		d = core.NewDemand(0)
		f.rates[limit] = d
	}
	d.Observe(now, window, admitted)
}

// failoverReporter is the reporter name of the rollback estimates: one
// name for every replica of the region, so the allocator keeps the largest
// estimate of a window (a cut noticed by several replicas counts once),
// apart from the bucket's counts, whose reporter changes with the bucket
// epoch.
const failoverReporter = "redis-failover"

// usage returns the cumulative estimate of every window that has one, as
// usage entries carrying only redis_rollback_tokens (reported under
// failoverReporter). Reports are cumulative: a repeat changes nothing.
func (f *failoverWatcher) usage() []*pb.Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usageLocked()
}

func (f *failoverWatcher) usageLocked() []*pb.Usage {
	out := make([]*pb.Usage, 0, len(f.rollback))
	for k, rt := range f.rollback {
		out = append(out, &pb.Usage{LimitId: k.limit, WindowIndex: k.window, RedisRollbackTokens: rt.tokens})
	}
	slices.SortFunc(out, func(a, b *pb.Usage) int {
		if c := strings.Compare(a.LimitId, b.LimitId); c != 0 {
			return c
		}
		return cmp.Compare(a.WindowIndex, b.WindowIndex)
	})
	return out
}

// rollbackTokens is the cumulative estimate of one window (tests, status).
func (f *failoverWatcher) rollbackTokens(limit string, window int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rt := f.rollback[failKey{limit, window}]; rt != nil {
		return rt.tokens
	}
	return 0
}

// pruneLocked forgets windows whose buckets have expired (their end plus
// the key grace): nothing of them is read or reported any more; and the
// admit rates of limits with no window left.
func (f *failoverWatcher) pruneLocked(now time.Time) {
	old := now.Add(-f.a.opt.keyGrace)
	if !f.pruneAny || !f.pruneAt.Before(old) {
		return
	}
	f.pruneAny = false
	for k, s := range f.seen {
		if s.end.Before(old) {
			delete(f.seen, k)
		} else {
			f.holdUntil(s.end)
		}
	}
	for k, rt := range f.rollback {
		if rt.end.Before(old) {
			delete(f.rollback, k)
			delete(f.reported, k)
		} else {
			f.holdUntil(rt.end)
		}
	}
	// A limit with no window left to watch needs no admit rate: the
	// watcher's state follows traffic and is gone a key grace after it.
	live := make(map[string]bool, len(f.seen))
	for k := range f.seen {
		live[k.limit] = true
	}
	for id := range f.rates {
		if !live[id] {
			delete(f.rates, id)
		}
	}
}

// holdUntil notes a window held that ends at end (pruneAt).
func (f *failoverWatcher) holdUntil(end time.Time) {
	if !f.pruneAny || end.Before(f.pruneAt) {
		f.pruneAt, f.pruneAny = end, true
	}
}

// failoverMetrics are the watcher's metrics, on the agent's Registerer.
type failoverMetrics struct {
	failovers *prometheus.CounterVec
	lag       prometheus.Gauge
	replicas  prometheus.Gauge
	rollback  prometheus.Counter
	debited   prometheus.Counter
}

func newFailoverMetrics(reg prometheus.Registerer) *failoverMetrics {
	m := &failoverMetrics{
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_agent_redis_failovers_total",
			Help: "Cut Redis replication histories seen, by kind: promoted (a replica took over), rollback (same id, lower offset), unlinked (a restart or a node of unknown history).",
		}, []string{"kind"}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_agent_redis_replication_lag_seconds",
			Help: "Age of the oldest write to the Redis primary not yet acknowledged by every online replica, at the last poll (the largest over Cluster masters); NaN when no replica was ever seen.",
		}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_agent_redis_replicas",
			Help: "Online replicas of the Redis primary at the last poll (the fewest over Cluster masters).",
		}),
		rollback: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_redis_rollback_tokens_total",
			Help: "Estimated spends forgotten by Redis failovers, added to the windows' redis_rollback bound term.",
		}),
		debited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_redis_rollback_debited_tokens_total",
			Help: "Tokens debited from rolled-back buckets after Redis failovers, so forgotten spends are not spent again.",
		}),
	}
	m.lag.Set(math.NaN())
	for _, k := range []string{cutPromoted, cutRollback, cutUnlinked} {
		m.failovers.WithLabelValues(k) // every kind from the start, at 0
	}
	if reg != nil {
		reg.MustRegister(m.failovers, m.lag, m.replicas, m.rollback, m.debited)
	}
	return m
}
