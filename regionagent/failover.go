package regionagent

import (
	"cmp"
	"context"
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
	noDebit bool // tests: estimate and report only, to show what the debit prevents

	mu       sync.Mutex // protects the fields below
	repl     replState
	seen     map[failKey]*seenCount
	rates    map[string]*core.Demand // admit rate per limit, from bucket admitted counts
	rollback map[failKey]*rollbackTotal
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
		a: a, every: failoverPoll, timeout: a.opt.redisTimeout, m: newFailoverMetrics(a.cfg.Registerer),
		seen: map[failKey]*seenCount{}, rates: map[string]*core.Demand{}, rollback: map[failKey]*rollbackTotal{},
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
	key  failKey
	loss windowLoss
}

// targets lists the active limits' windows that overlap the cut's span:
// the windows read since they started, and each limit's window at the
// cut. On Cluster every limit is a target, whichever master failed over
// (see docs/design.md): an over-estimate for the limits of other shards.
func (f *failoverWatcher) targets(c replCut) []target {
	f.a.mu.Lock()
	ids := make([]string, 0, len(f.a.states))
	for id := range f.a.states {
		ids = append(ids, id)
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
	for _, id := range ids {
		l := f.a.limits.get(id)
		if l == nil {
			continue
		}
		if wins[id] == nil {
			wins[id] = map[int64]bool{}
		}
		wins[id][f.a.windowOf(c.LossTo, l).Index] = true
		rate := 0.0
		if d := f.rates[id]; d != nil {
			rate = d.Rate(c.LossTo)
		}
		for idx := range wins[id] {
			end := f.a.windowEnd(lease.Window{Index: idx, Length: l.window})
			start := end.Add(-l.window)
			if !end.After(c.LossFrom) || !start.Before(c.LossTo) {
				continue // the window does not overlap the lost span
			}
			t := target{key: failKey{id, idx}, loss: windowLoss{Start: start, End: end, Rate: rate, After: -1}}
			if s := f.seen[t.key]; s != nil {
				t.loss.Seen, t.loss.SeenAt = s.admitted, s.at
			}
			out = append(out, t)
		}
	}
	return out
}

// settle reads one target's bucket on the new primary, estimates, records
// the estimate and debits it. It returns the estimate, the observed part
// and the tokens debited.
func (f *failoverWatcher) settle(ctx context.Context, now time.Time, c replCut, t target) (est, obs, debited int64) {
	key := bucket.Key(t.key.limit, t.key.window)
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	bal, err := f.a.buckets.Balance(rctx, key, f.a.redisNowMs())
	cancel()
	if err == nil {
		t.loss.After = bal.Admitted
		t.loss.Exists = bal.Admitted+bal.Denied > 0 || len(bal.Counters) > 0 || len(bal.Open) > 0 || len(bal.Expired) > 0
	}
	est, obs = estimateLoss(c, t.loss)
	if est > 0 && t.loss.Exists && est < math.MaxInt64 && !f.noDebit {
		rctx, cancel := context.WithTimeout(ctx, f.timeout)
		r, err := f.a.buckets.Reserve(rctx, key, c.ID, est, 1, f.a.redisNowMs())
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
		}
		rt.tokens = addSat(rt.tokens, est)
	}
	// The new primary's count is the base from now on: a later cut is
	// measured against it, not against the spends this one forgot.
	if t.loss.After >= 0 {
		f.seen[t.key] = &seenCount{admitted: t.loss.After + debited, at: now, end: t.loss.End}
	}
	return est, obs, debited
}

// sawAdmitted records a reading of a window's admitted count (hook in the
// renewal loop's evaluate): the watcher's admit rate and the counts a cut
// is measured against.
func (f *failoverWatcher) sawAdmitted(l *limitView, window, admitted int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := failKey{l.id, window}
	s := f.seen[k]
	if s == nil {
		s = &seenCount{end: f.a.windowEnd(lease.Window{Index: window, Length: l.window})}
		f.seen[k] = s
	}
	if admitted >= s.admitted {
		s.admitted, s.at = admitted, now
	}
	d := f.rates[l.id]
	if d == nil {
		d = core.NewDemand(0)
		f.rates[l.id] = d
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
// usage entries carrying only redis_rollback_tokens (hook in report, under
// failoverReporter). Reports are cumulative: a repeat changes nothing.
func (f *failoverWatcher) usage() []*pb.Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
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
// the key grace): nothing of them is read or reported any more.
func (f *failoverWatcher) pruneLocked(now time.Time) {
	old := now.Add(-f.a.opt.keyGrace)
	for k, s := range f.seen {
		if s.end.Before(old) {
			delete(f.seen, k)
		}
	}
	for k, rt := range f.rollback {
		if rt.end.Before(old) {
			delete(f.rollback, k)
		}
	}
	for id := range f.rates {
		if f.a.limits.get(id) == nil {
			delete(f.rates, id)
		}
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
	if reg != nil {
		reg.MustRegister(m.failovers, m.lag, m.replicas, m.rollback, m.debited)
	}
	return m
}
