package allocator

import (
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
	txnRetries    prometheus.Counter
	resumes       prometheus.Counter
	watchRestarts prometheus.Counter
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
			Help: "Group commits that failed for good: fenced, refused by etcd, or not landed within the retry budget (each ends the leadership term).",
		}),
		txnRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_etcd_txn_retries_total",
			Help: "Group commits sent again, still fenced, after etcd could not answer (raft leader changed or lost, member gone, attempt timed out).",
		}),
		resumes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_allocator_session_resumed_total",
			Help: "Times the leader's etcd session stopped hearing keep-alives (e.g. during an etcd election) and was resumed on the same, still live, lease: the term went on.",
		}),
		watchRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_allocator_limits_watch_restarts_total",
			Help: "Times the leader's watch of limit changes failed (e.g. etcd had no raft leader) and was started again from the last revision it saw.",
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
			m.txnOps, m.txnDur, m.txnFailures, m.txnRetries, m.resumes, m.watchRestarts, m.leader, m.leaderChanges, m.usageReports, m.overBound)
	}
	return m
}
