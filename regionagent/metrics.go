package regionagent

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"leasehold/regionagent/core"
)

// resultCrossSlot is the checks_total result of a CheckMulti refused
// because its limits cannot be spent in one Redis Cluster slot.
const resultCrossSlot = "cross_slot"

// metrics are the agent's Prometheus metrics, on the Registerer of Config.
type metrics struct {
	checks  *prometheus.CounterVec
	checkOK prometheus.Counter // checks{result="ok"}, bound once
	// checkBy holds checks{result=r} for every result the core names,
	// bound once: a Check counts itself without hashing its label.
	checkBy     map[core.Result]prometheus.Counter
	chunkChecks prometheus.Counter
	// chunkReleased counts what chunks gave back, by outcome.
	chunkReleased *prometheus.CounterVec
	checkDur      prometheus.Histogram
	batch         prometheus.Histogram
	batchDur      prometheus.Histogram
	leaseTokens   prometheus.Counter
	returned      prometheus.Counter
	fallbackMode  *prometheus.GaugeVec
	reports       *prometheus.CounterVec
	// groupRedirects counts lease requests sent again to the allocator
	// group a WRONG_GROUP answer named (groups.go).
	groupRedirects prometheus.Counter
	// settles counts Settle calls by result; settleTokens the tokens they
	// moved, by kind.
	settles      *prometheus.CounterVec
	settleTokens *prometheus.CounterVec
	// slotAcquires counts AcquireSlot answers by result (slots.go).
	slotAcquires *prometheus.CounterVec
	// standing counts the standing-share deposits this replica's Checks
	// carried, by result (carriedOutcome).
	standing *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_agent_checks_total",
			Help: "Check decisions, by result: ok, over_limit, unavailable, fallback, fallback_denied, redis_error, not_synced, would_deny (admitted: its limits are in shadow mode and enforcement would have denied it); cross_slot: a CheckMulti refused (InvalidArgument) because its limits do not share a hash tag on Redis Cluster.",
		}, []string{"result"}),
		checkDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_agent_check_duration_seconds",
			Help:    "Time to decide a Check inside the agent (Redis round trip included).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_agent_spend_batch_checks",
			Help:    "Checks per Redis pipeline.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		batchDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_agent_spend_batch_seconds",
			Help:    "Time a spend batch's Redis pipeline took, as the agent saw it: from sending it to its answer (or to its abandonment, after twice the Redis timeout).",
			Buckets: prometheus.ExponentialBuckets(0.000025, 2, 16),
		}),
		leaseTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_leased_tokens_total",
			Help: "Tokens deposited in the region's buckets from leases.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_returned_tokens_total",
			Help: "Unspent tokens of closed leases returned to the allocator.",
		}),
		fallbackMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "leasehold_agent_fallback_mode",
			Help: "Fail mode in force per limit while the agent cannot get leases: 1 closed (denying), 2 local, 3 open (absent otherwise).",
		}, []string{"limit"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_agent_usage_reports_total",
			Help: "Usage reports sent to the allocator, by result.",
		}, []string{"result"}),
		groupRedirects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_group_redirects_total",
			Help: "Lease requests sent again to the allocator group that a WRONG_GROUP answer named (the agent's group map or window estimate was behind).",
		}),
	}
	m.checkOK = m.checks.WithLabelValues("ok")
	// Every result from the start, at 0: a panel of fallbacks has data
	// (zero) on a healthy system, and rate() sees the first one.
	m.checkBy = map[core.Result]prometheus.Counter{core.ResultOK: m.checkOK}
	for _, r := range []core.Result{core.ResultOverLimit, core.ResultUnavailable, core.ResultFallback,
		core.ResultFallbackDenied, core.ResultStoreError, core.ResultNotSynced, core.ResultWouldDeny} {
		m.checkBy[r] = m.checks.WithLabelValues(string(r))
	}
	m.checks.WithLabelValues(resultCrossSlot)
	m.chunkChecks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "leasehold_agent_chunk_checks_total",
		Help: "Checks decided in memory from a chunk of a hot limit (also counted in leasehold_agent_checks_total as ok).",
	})
	m.chunkReleased = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_agent_chunk_released_tokens_total",
		Help: "Unspent tokens of chunks given back, by outcome: returned (spendable again), lost (their leases had closed and the chunk's deadline passed: stranded), failed (the release failed: counted as spent).",
	}, []string{"outcome"})
	for _, o := range []string{"returned", "lost", "failed"} {
		m.chunkReleased.WithLabelValues(o) // every series from the start
	}
	m.settles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_agent_settles_total",
		Help: "Settles of settle-later Checks, by result: settled, replayed (settled before: answered again), unknown (no such decision), refused (after the settle grace, or another actual cost), failed (Redis error).",
	}, []string{"result"})
	m.settleTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_agent_settle_tokens_total",
		Help: "Tokens moved by settles, by kind: charged (taken from the window's balance), refunded, overrun (admitted beyond the window's leases: the bound's settlement term), debt (overrun carried into the next window).",
	}, []string{"kind"})
	for _, r := range []string{"settled", "replayed", "unknown", "refused", "failed"} {
		m.settles.WithLabelValues(r)
	}
	for _, k := range []string{"charged", "refunded", "overrun", "debt"} {
		m.settleTokens.WithLabelValues(k)
	}
	m.slotAcquires = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_agent_slot_acquires_total",
		Help: "AcquireSlot answers of concurrency limits, by result: ok (a slot held), fallback (a slot held under the region's local fallback while the allocator is unreachable), over_limit (every slot the region may hold is held), unavailable (no share and none to be had, or Redis down).",
	}, []string{"result"})
	for _, r := range []string{"ok", "fallback", "over_limit", "unavailable"} {
		m.slotAcquires.WithLabelValues(r)
	}
	m.standing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_agent_standing_shares_total",
		Help: "Standing-share deposits this replica's Checks carried, by result: deposited (this replica's deposit put the region's share in the bucket), found (another replica's was there already), not_used (not sent, refused or failed: the share is left to the region's other replicas, or stranded for the window).",
	}, []string{"result"})
	for _, r := range []string{"deposited", "found", "not_used"} {
		m.standing.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.chunkChecks, m.chunkReleased, m.checks, m.checkDur, m.batch, m.batchDur, m.leaseTokens, m.returned, m.fallbackMode, m.reports,
			m.groupRedirects, m.settles, m.settleTokens, m.slotAcquires, m.standing)
	}
	return m
}

// registerCore registers the metrics read from the agent's core at scrape
// time: its cumulative counts and how many limits it holds state for.
func (m *metrics) registerCore(reg prometheus.Registerer, a *Agent) {
	if reg != nil {
		reg.MustRegister(coreCollector{a}, slotsCollector{a})
	}
}

var slotsDesc = prometheus.NewDesc("leasehold_agent_slots",
	"Concurrency limits this replica served recently: the region's slots held (kind held, as this replica last saw them in Redis) and the slots its share in force allows (kind share, 0: none).",
	[]string{"limit", "kind"}, nil)

// slotsCollector exports the replica's slot plans at scrape time; a
// limit with no share in force and nothing held is left out.
type slotsCollector struct{ a *Agent }

func (c slotsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- slotsDesc }

func (c slotsCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.a.opt.now()
	c.a.slots.mu.Lock()
	defer c.a.slots.mu.Unlock()
	for id, p := range c.a.slots.plans {
		var n int64
		if p.InForce(now) {
			n = p.N
		}
		if n == 0 && p.held == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(p.held), id, "held")
		ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(n), id, "share")
	}
}

var (
	renewalsDesc = prometheus.NewDesc("leasehold_agent_renewals_total",
		"Lease requests to the allocator, by result: granted, empty (nothing granted), failed (unanswered), rejected (refused).",
		[]string{"result"}, nil)
	roundsDesc = prometheus.NewDesc("leasehold_agent_renewal_rounds_total",
		"Renewal rounds started (a bucket read under the renewal lock), and those that got the lock.",
		[]string{"lock"}, nil)
	activeDesc = prometheus.NewDesc("leasehold_agent_active_limits",
		"Limits this replica holds state for: seen in a Check recently, or with leases, returns or reports outstanding.",
		nil, nil)
	chunkLimitsDesc = prometheus.NewDesc("leasehold_agent_chunk_limits",
		"Limits the chunks' client keeps state for (known: a limit with demand or checked again within a minute, kept until a minute unused), and of those the ones holding a chunk, a Reserve in flight or a denial (holding).",
		[]string{"state"}, nil)
	chunkTokensDesc = prometheus.NewDesc("leasehold_agent_chunk_tokens",
		"Tokens of the region's balance this replica holds in chunks: reserved from the region's bucket, neither spent nor given back yet.",
		nil, nil)
	syncedDesc = prometheus.NewDesc("leasehold_agent_synced",
		"1 once the agent has had its region's limits from the allocator since it started; 0 before (every Check UNAVAILABLE, or a restored snapshot enforced).",
		nil, nil)
	infoDesc = prometheus.NewDesc("leasehold_agent_info",
		"Always 1: the agent's region and replica id, to join on instance (e.g. a region label for leasehold_agent_fallback_mode).",
		[]string{"region", "replica"}, nil)
)

// coreCollector exports the core's counts.
type coreCollector struct{ a *Agent }

func (c coreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- renewalsDesc
	ch <- roundsDesc
	ch <- activeDesc
	ch <- chunkLimitsDesc
	ch <- chunkTokensDesc
	ch <- snapshotAgeDesc
	ch <- snapshotSourceDesc
	ch <- syncedDesc
	ch <- infoDesc
}

func (c coreCollector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.Lock()
	st, active := c.a.core.Stats(), c.a.core.Active()
	synced, restored, taken := c.a.core.Snapshot()
	c.a.mu.Unlock()
	age, src := math.NaN(), 0.0
	if synced || restored {
		age = c.a.snapshotAge(taken).Seconds()
	}
	if restored {
		src = 1
	}
	ch <- prometheus.MustNewConstMetric(snapshotAgeDesc, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(snapshotSourceDesc, prometheus.GaugeValue, src)
	ch <- prometheus.MustNewConstMetric(syncedDesc, prometheus.GaugeValue, b2f(synced))
	ch <- prometheus.MustNewConstMetric(infoDesc, prometheus.GaugeValue, 1, c.a.cfg.Region, c.a.ReplicaID())
	counter := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	counter(renewalsDesc, st.RenewalsGranted, "granted")
	counter(renewalsDesc, st.RenewalsEmpty, "empty")
	counter(renewalsDesc, st.RenewalsFailed, "failed")
	counter(renewalsDesc, st.RenewalsRejected, "rejected")
	counter(roundsDesc, st.Rounds, "tried")
	counter(roundsDesc, st.RoundsLocked, "taken")
	ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(active))
	if c.a.chunks != nil {
		ch <- prometheus.MustNewConstMetric(chunkLimitsDesc, prometheus.GaugeValue, float64(c.a.chunks.Limits()), "known")
		ch <- prometheus.MustNewConstMetric(chunkLimitsDesc, prometheus.GaugeValue, float64(c.a.chunks.Holding()), "holding")
		ch <- prometheus.MustNewConstMetric(chunkTokensDesc, prometheus.GaugeValue, float64(c.a.chunks.HeldTokens()))
	}
}

// observeChunkRelease counts one chunk release's outcome.
func (m *metrics) observeChunkRelease(unspent, returned int64, err error) {
	if err != nil {
		m.chunkReleased.WithLabelValues("failed").Add(float64(unspent))
		return
	}
	m.chunkReleased.WithLabelValues("returned").Add(float64(returned))
	if lost := unspent - returned; lost > 0 {
		m.chunkReleased.WithLabelValues("lost").Add(float64(lost))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// checked counts one Check of result r.
func (m *metrics) checked(r core.Result) {
	if c, ok := m.checkBy[r]; ok {
		c.Inc()
		return
	}
	m.checks.WithLabelValues(string(r)).Inc()
}
