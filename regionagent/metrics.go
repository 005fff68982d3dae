package regionagent

import "github.com/prometheus/client_golang/prometheus"

// metrics are the agent's Prometheus metrics, on the Registerer of Config.
type metrics struct {
	checks       *prometheus.CounterVec
	checkDur     prometheus.Histogram
	batch        prometheus.Histogram
	renewals     *prometheus.CounterVec
	leaseTokens  prometheus.Counter
	returned     prometheus.Counter
	fallbackMode *prometheus.GaugeVec
	reports      *prometheus.CounterVec
	active       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_agent_checks_total",
			Help: "Check decisions, by result: ok, over_limit, unavailable, fallback, fallback_denied, redis_error.",
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
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_agent_renewals_total",
			Help: "Lease requests to the allocator, by result: granted, empty, failed.",
		}, []string{"result"}),
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
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_agent_active_limits",
			Help: "Limits this replica has seen Checks for recently.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.checkDur, m.batch, m.renewals, m.leaseTokens, m.returned, m.fallbackMode, m.reports, m.active)
	}
	return m
}
