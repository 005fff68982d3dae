package client

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	pb "leasehold/proto/leasehold/v1"
)

// Decision results as the client counts them (Stats, the collector's
// result label).
const (
	ResultOK          = "ok"          // admitted (Reason OK)
	ResultFallback    = "fallback"    // admitted under the region's fallback
	ResultOverLimit   = "over_limit"  // denied: the limit's budget is spent (HTTP 429)
	ResultUnavailable = "unavailable" // the agent answered that it cannot decide (HTTP 503)
	ResultError       = "error"       // no answer: the agent could not be asked, or not in time (HTTP 503)
)

// Stats are a client's decision counts since New: every Allow and
// AllowMulti that decided (an invalid argument or a closed client counts
// nowhere), and every decision AllowSubLease made.
type Stats struct {
	// SubLease: admitted in process from a sub-lease.
	SubLease int64
	// DenialCache: denied in process from the denial cache.
	DenialCache int64
	// Agent* are the answers of Checks (and CheckMultis) by result;
	// AgentError counts the calls that got none (the agent unreachable
	// or late, or the call refused: an unknown limit, a cost above G).
	AgentOK, AgentFallback, AgentOverLimit, AgentUnavailable, AgentError int64
}

// Total is the number of decisions counted.
func (s Stats) Total() int64 {
	return s.SubLease + s.DenialCache + s.AgentOK + s.AgentFallback + s.AgentOverLimit + s.AgentUnavailable + s.AgentError
}

// counters are the client's decision counts. Each is one atomic add on
// the path that decided, on a cache line of its own so that the sub-lease
// fast path shares no line with the other counters or the client's
// fields: no lock, no allocation.
type counters struct {
	_           [64]byte
	subLease    atomic.Int64
	_           [56]byte
	denialCache atomic.Int64
	_           [56]byte
	agent       [5]atomic.Int64 // by agentResult
	_           [64]byte
}

// agentResult indexes counters.agent.
type agentResult uint8

const (
	agentOK agentResult = iota
	agentFallback
	agentOverLimit
	agentUnavailable
	agentError
)

// countAgent counts one answer of the agent.
func (s *counters) countAgent(r pb.Reason) {
	switch r {
	case pb.Reason_REASON_OK:
		s.agent[agentOK].Add(1)
	case pb.Reason_REASON_FALLBACK:
		s.agent[agentFallback].Add(1)
	case pb.Reason_REASON_OVER_LIMIT:
		s.agent[agentOverLimit].Add(1)
	default:
		s.agent[agentUnavailable].Add(1)
	}
}

// Stats returns the client's decision counts so far.
func (c *Client) Stats() Stats {
	a := &c.counts.agent
	return Stats{
		SubLease: c.counts.subLease.Load(), DenialCache: c.counts.denialCache.Load(),
		AgentOK: a[agentOK].Load(), AgentFallback: a[agentFallback].Load(), AgentOverLimit: a[agentOverLimit].Load(),
		AgentUnavailable: a[agentUnavailable].Load(), AgentError: a[agentError].Load(),
	}
}

const clientDecisionsHelp = "Decisions of the Leasehold client, by result (ok, fallback, over_limit, unavailable, error: no answer) and source " +
	"(sublease: in process from a sub-lease; denial_cache: a denial repeated in process; agent: a Check)."

var clientDecisionsDesc = prometheus.NewDesc("leasehold_client_decisions_total", clientDecisionsHelp, []string{"result", "source"}, nil)

const clientSubLeaseTokensHelp = "Tokens of the region's balance the Leasehold client holds in sub-leases: reserved, neither spent nor given back yet."

var clientSubLeaseTokensDesc = prometheus.NewDesc("leasehold_client_sublease_tokens", clientSubLeaseTokensHelp, nil, nil)

// collector exports a client's Stats and the tokens its sub-leases hold.
type collector struct{ c *Client }

// NewCollector returns a Prometheus collector of c's decision counts,
// read at scrape time from the client's own counters, and of the tokens
// its sub-leases hold (HeldTokens):
//
//	leasehold_client_decisions_total{result="ok|fallback|over_limit|unavailable|error",
//	                                 source="sublease|denial_cache|agent"}
//	leasehold_client_sublease_tokens
//
// Every series a client can produce is exported from the start, at zero.
// Register it on the caller's registry (a client in each of several
// registries, or several clients in one, need prometheus.WrapRegistererWith
// and a label that tells them apart).
func NewCollector(c *Client) prometheus.Collector { return collector{c} }

func (k collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- clientDecisionsDesc
	ch <- clientSubLeaseTokensDesc
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	s := k.c.Stats()
	for _, m := range []struct {
		v              int64
		result, source string
	}{
		{s.SubLease, ResultOK, "sublease"},
		{s.DenialCache, ResultOverLimit, "denial_cache"},
		{s.AgentOK, ResultOK, "agent"},
		{s.AgentFallback, ResultFallback, "agent"},
		{s.AgentOverLimit, ResultOverLimit, "agent"},
		{s.AgentUnavailable, ResultUnavailable, "agent"},
		{s.AgentError, ResultError, "agent"},
	} {
		ch <- prometheus.MustNewConstMetric(clientDecisionsDesc, prometheus.CounterValue, float64(m.v), m.result, m.source)
	}
	ch <- prometheus.MustNewConstMetric(clientSubLeaseTokensDesc, prometheus.GaugeValue, float64(k.c.HeldTokens()))
}
