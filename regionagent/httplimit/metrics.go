package httplimit

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// Metrics counts the middleware's decisions, one per request, by what the
// caller got and who decided:
//
//	leasehold_gateway_decisions_total{result, source}
//
// result: ok (passed: admitted), fallback (passed: admitted under the
// region's fallback), 429, 503 (the limiter answered that it cannot
// decide), error (503: the limiter gave no answer), unknown_limit
// (passed: PassUnknownLimits), no_key (passed: no limit named). source:
// sublease and denial_cache (decided in process by the client), agent (a
// Check), none (no_key). Every series a gateway can produce is exported
// from the start, at zero. Safe for concurrent use; Observe allocates
// nothing.
type Metrics struct {
	by       [Failed + 1][sourceNone + 1]prometheus.Counter // nil: a pair that cannot occur
	fallback prometheus.Counter                             // Allowed with Reason FALLBACK
}

// Results of leasehold_gateway_decisions_total.
const (
	ResultOK           = "ok"
	ResultFallback     = "fallback"
	Result429          = "429"
	Result503          = "503"
	ResultError        = "error"
	ResultUnknownLimit = "unknown_limit"
	ResultNoKey        = "no_key"
)

// source indexes Metrics.by: client.Source, and none.
const sourceNone = client.SourceSubLease + 1

var sourceNames = [sourceNone + 1]string{
	client.SourceAgent: "agent", client.SourceDenialCache: "denial_cache", client.SourceSubLease: "sublease", sourceNone: "none",
}

// pair is an (outcome, source) pair that occurs, with its result label.
type pair struct {
	o      Outcome
	s      client.Source
	result string
}

// pairs are the pairs that occur. Allowed with Reason FALLBACK is counted
// apart (Metrics.fallback).
var pairs = []pair{
	{Allowed, client.SourceSubLease, ResultOK},
	{Allowed, client.SourceAgent, ResultOK},
	{Limited, client.SourceDenialCache, Result429},
	{Limited, client.SourceAgent, Result429},
	{Unavailable, client.SourceAgent, Result503},
	{Failed, client.SourceAgent, ResultError},
	{UnknownLimit, client.SourceAgent, ResultUnknownLimit},
	{NoKey, sourceNone, ResultNoKey},
}

// NewMetrics registers the middleware's metrics on reg and returns them;
// pass m.Observe to the Observe option (or call it from yours).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_gateway_decisions_total",
		Help: "Requests decided by the gateway, by result (ok, fallback, 429, 503: the limiter cannot decide, error: no answer, 503 too; " +
			"unknown_limit and no_key: passed unlimited) and source (sublease, denial_cache: decided in process; agent: a Check; none).",
	}, []string{"result", "source"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	out := &Metrics{}
	for _, p := range pairs {
		out.by[p.o][p.s] = vec.WithLabelValues(p.result, sourceNames[p.s])
	}
	out.fallback = vec.WithLabelValues(ResultFallback, sourceNames[client.SourceAgent])
	return out, nil
}

// Observe counts one request's decision; its signature is Observe's.
func (m *Metrics) Observe(_ *http.Request, o Outcome, d client.Decision) {
	if o == Allowed && d.Reason == pb.Reason_REASON_FALLBACK {
		m.fallback.Inc()
		return
	}
	s := d.Source
	if o == NoKey {
		s = sourceNone
	}
	if o < 0 || o > Failed || s > sourceNone {
		return
	}
	if c := m.by[o][s]; c != nil {
		c.Inc()
		return
	}
	// A pair no client produces today (a denial from a sub-lease, an
	// error from the denial cache): counted under the agent's column.
	if c := m.by[o][client.SourceAgent]; c != nil {
		c.Inc()
	}
}
