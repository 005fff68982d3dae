package regionagent

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"leasehold/regionagent/core"
)

// TestChecksCountedByResult: every Check is counted once under its result
// (leasehold_agent_checks_total, its counters bound once), through a Check
// of one limit (its spend's key held by the batch request, no slice made)
// and a CheckMulti of two, interleaved: G = 3 answers OK three times and
// then OVER_LIMIT, and the CheckMulti's limits are charged both or neither.
func TestChecksCountedByResult(t *testing.T) {
	w := startWorld(t, false, "eu")
	w.putLimit(limit("tenant/counted", 3, time.Minute, 15*time.Second, "eu"))
	w.putLimit(limit("tenant/multi-a", 2, time.Minute, 15*time.Second, "eu"))
	w.putLimit(limit("tenant/multi-b", 100, time.Minute, 15*time.Second, "eu"))
	a := w.liveAgentOpts("eu", "r1")
	ctx := context.Background()
	count := func(r core.Result) float64 { return testutil.ToFloat64(a.m.checks.WithLabelValues(string(r))) }
	ok0, over0 := count(core.ResultOK), count(core.ResultOverLimit)

	var oks, overs int
	multi := []CheckItem{{Limit: "tenant/multi-a", Cost: 1}, {Limit: "tenant/multi-b", Cost: 1}}
	for i := range 4 {
		d, err := a.Check(ctx, "tenant/counted", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 3) {
			t.Fatalf("Check %d of G = 3: allowed %v", i+1, d.Allowed)
		}
		ds, err := a.CheckMulti(ctx, multi)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Allowed != (i < 2) || ds[1].Allowed != ds[0].Allowed {
			t.Fatalf("CheckMulti %d of G = 2 and G = 100: %v, %v", i+1, ds[0].Allowed, ds[1].Allowed)
		}
		for _, allowed := range []bool{d.Allowed, ds[0].Allowed} {
			if allowed {
				oks++
			} else {
				overs++
			}
		}
	}
	if got := count(core.ResultOK) - ok0; got != float64(oks) {
		t.Errorf("checks_total{result=ok} rose by %v, want %d", got, oks)
	}
	if got := count(core.ResultOverLimit) - over0; got != float64(overs) {
		t.Errorf("checks_total{result=over_limit} rose by %v, want %d", got, overs)
	}
	// multi-b was charged only with multi-a: twice, of its 100.
	if d, err := a.Check(ctx, "tenant/multi-b", 98); err != nil || !d.Allowed {
		t.Fatalf("multi-b after two admitted CheckMultis: %+v, %v; want its last 98 admitted", d, err)
	}
	if d, err := a.Check(ctx, "tenant/multi-b", 1); err != nil || d.Allowed {
		t.Fatalf("multi-b past G: %+v, %v; want denied", d, err)
	}
}
