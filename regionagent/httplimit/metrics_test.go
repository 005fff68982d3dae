package httplimit

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// Each request is counted once, under its result and source; every
// series is there from the start.
func TestMetricsCountEachRequest(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "leasehold_gateway_decisions_total"); n != 9 {
		t.Fatalf("%d series before any request, want 9", n)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("registered twice on one registry without an error")
	}
	ok := client.Decision{Allowed: true, Reason: pb.Reason_REASON_OK}
	sub := ok
	sub.Source = client.SourceSubLease
	fb := ok
	fb.Reason = pb.Reason_REASON_FALLBACK
	over := client.Decision{Reason: pb.Reason_REASON_OVER_LIMIT}
	cached := over
	cached.Source = client.SourceDenialCache
	for _, tc := range []struct {
		l      *fakeLimiter
		tenant string
		opts   []Option
		n      int
		result string
		source string
	}{
		{&fakeLimiter{d: ok}, "a", nil, 3, ResultOK, "agent"},
		{&fakeLimiter{d: sub}, "a", nil, 5, ResultOK, "sublease"},
		{&fakeLimiter{d: fb}, "a", nil, 1, ResultFallback, "agent"},
		{&fakeLimiter{d: over}, "a", nil, 2, Result429, "agent"},
		{&fakeLimiter{d: cached}, "a", nil, 4, Result429, "denial_cache"},
		{&fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_UNAVAILABLE}}, "a", nil, 1, Result503, "agent"},
		{&fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_UNAVAILABLE}, err: client.ErrUnavailable}, "a", nil, 2, ResultError, "agent"},
		{&fakeLimiter{err: client.ErrUnknownLimit}, "a", []Option{PassUnknownLimits()}, 1, ResultUnknownLimit, "agent"},
		{&fakeLimiter{}, "", nil, 3, ResultNoKey, "none"},
	} {
		for range tc.n {
			serve(t, tc.l, tenantReq(tc.tenant), append(tc.opts, Observe(m.Observe))...)
		}
		c, err := m.vecFor(tc.result, tc.source)
		if err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(c); got != float64(tc.n) {
			t.Errorf("%s/%s: %v, want %d", tc.result, tc.source, got, tc.n)
		}
	}
	if n := testutil.CollectAndCount(reg, "leasehold_gateway_decisions_total"); n != 9 {
		t.Fatalf("%d series, want the 9 of the start", n)
	}
}

// vecFor finds the counter of a result and source.
func (m *Metrics) vecFor(result, source string) (prometheus.Counter, error) {
	if result == ResultFallback {
		return m.fallback, nil
	}
	for _, p := range pairs {
		if p.result == result && sourceNames[p.s] == source {
			return m.by[p.o][p.s], nil
		}
	}
	return nil, fmt.Errorf("no series %s/%s", result, source)
}
