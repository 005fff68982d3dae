package allocator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the allocator's Prometheus metrics, registered on the
// Registerer given in Config (never the global registry).
type metrics struct {
	grants        *prometheus.CounterVec
	grantedTokens prometheus.Counter
	returns       *prometheus.CounterVec
	returnTokens  *prometheus.CounterVec
	acquireDur    prometheus.Histogram
	txnOps        prometheus.Histogram
	txnDur        prometheus.Histogram
	txnFailures   prometheus.Counter
	leader        prometheus.Gauge
	leaderChanges prometheus.Counter
	usageReports  prometheus.Counter
	overBound     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_grants_total",
			Help: "Lease requests answered, by result: granted (new lease), replayed (same request id), empty (pool spent), rejected (per-item error), failed (not committed).",
		}, []string{"result"}),
		grantedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_lease_granted_tokens_total",
			Help: "Tokens granted in new leases.",
		}),
		returns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_returns_total",
			Help: "Lease returns, by result: credited (window open), late (window over), duplicate, rejected.",
		}, []string{"result"}),
		returnTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_returned_tokens_total",
			Help: "Unspent tokens returned, by whether they were credited to the pool.",
		}, []string{"credited"}),
		acquireDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_lease_acquire_duration_seconds",
			Help:    "Time to answer an AcquireLeases call, including the etcd commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		txnOps: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_etcd_txn_ops",
			Help:    "Writes per group-committed etcd transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		txnDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_etcd_txn_duration_seconds",
			Help:    "Duration of group-commit etcd transactions.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		txnFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_etcd_txn_failures_total",
			Help: "Group commits that failed or were fenced (each ends the leadership term).",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_allocator_leader",
			Help: "1 while this allocator replica leads and serves grants, else 0.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_allocator_leader_terms_total",
			Help: "Leadership terms this replica has started.",
		}),
		usageReports: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_usage_reports_total",
			Help: "Usage report items that changed a stored count.",
		}),
		overBound: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_windows_over_bound_total",
			Help: "Windows that closed with more admitted above G than their computed bound: each is a bug.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.grants, m.grantedTokens, m.returns, m.returnTokens, m.acquireDur,
			m.txnOps, m.txnDur, m.txnFailures, m.leader, m.leaderChanges, m.usageReports, m.overBound)
	}
	return m
}

func (m *metrics) observeCommit(ops int, d time.Duration, err error) {
	m.txnOps.Observe(float64(ops))
	m.txnDur.Observe(d.Seconds())
	if err != nil {
		m.txnFailures.Inc()
	}
}
