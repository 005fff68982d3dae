package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client/clienttest"
)

// The client counts each decision once, by where it came from and what
// it was, and the collector exports those counts, every series from the
// start.
func TestStatsCountEveryDecision(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 2, 10*time.Second, time.Second) })
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(r.c))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expo(Stats{})), "leasehold_client_decisions_total"); err != nil {
		t.Fatalf("before any decision: %v", err)
	}

	r.allow(1) // agent ok
	r.allow(1) // agent ok
	r.allow(1) // agent over_limit: cached
	r.allow(1) // denial cache
	r.allow(1) // denial cache
	ctx := context.Background()
	if _, err := r.c.Allow(ctx, "", 1); !errors.Is(err, ErrInvalid) { // not a decision
		t.Fatal(err)
	}
	if _, err := r.c.Allow(ctx, "tenant/none", 1); !errors.Is(err, ErrUnknownLimit) { // refused: error
		t.Fatal(err)
	}
	r.agent.BeforeCheck = func(context.Context, *pb.CheckRequest) error { return status.Error(codes.Unavailable, "down") }
	if _, err := r.c.Allow(ctx, "tenant/other", 1); !errors.Is(err, ErrUnavailable) { // error
		t.Fatal(err)
	}
	want := Stats{AgentOK: 2, AgentOverLimit: 1, DenialCache: 2, AgentError: 2}
	if got := r.c.Stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expo(want)), "leasehold_client_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// Sub-lease hits are counted, and with the agent's answers they add up
// to every call.
func TestStatsCountSubLeaseHits(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 100000, 10*time.Second, 5*time.Second) }, WithSubLeases(subCfg))
	got := r.hot(1000, time.Second)
	s := r.c.Stats()
	if s.SubLease != int64(got[SourceSubLease]) || s.AgentOK != int64(got[SourceAgent]) || s.Total() != 1000 {
		t.Fatalf("stats %+v; the calls' sources %v (1000 calls)", s, got)
	}
	if s.SubLease < 500 {
		t.Fatalf("stats %+v: most calls should be sub-lease hits", s)
	}
	// The collector exports what the sub-leases hold.
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(r.c))
	held := r.c.HeldTokens()
	if held <= 0 {
		t.Fatalf("a hot limit's client holds %d tokens in sub-leases, want some", held)
	}
	want := fmt.Sprintf("# HELP leasehold_client_sublease_tokens %s\n# TYPE leasehold_client_sublease_tokens gauge\nleasehold_client_sublease_tokens %d\n",
		clientSubLeaseTokensHelp, held)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasehold_client_sublease_tokens"); err != nil {
		t.Fatal(err)
	}
	// AllowSubLease counts what it decides, not what it leaves.
	before := r.c.Stats().SubLease
	if _, ok := r.c.AllowSubLease(context.Background(), testLimit, 1); !ok {
		t.Fatal("no sub-lease decision from a hot limit")
	}
	if _, ok := r.c.AllowSubLease(context.Background(), "tenant/unknown", 1); ok {
		t.Fatal("a sub-lease decision of an unknown limit")
	}
	if n := r.c.Stats().SubLease - before; n != 1 {
		t.Fatalf("AllowSubLease counted %d decisions, want 1", n)
	}
}

// A CheckMulti is one decision.
func TestStatsCountCheckMulti(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 2, 10*time.Second, time.Second)
		a.SetLimit("tenant/b", 1, 10*time.Second, time.Second)
	}, WithoutDenialCache())
	items := []Item{{Limit: testLimit, Cost: 1}, {Limit: "tenant/b", Cost: 1}}
	for range 2 {
		if _, err := r.c.AllowMulti(context.Background(), items); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := r.c.Stats(), (Stats{AgentOK: 1, AgentOverLimit: 1}); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

// expo is the exposition of s.
func expo(s Stats) string {
	var b strings.Builder
	b.WriteString("# HELP leasehold_client_decisions_total " + clientDecisionsHelp + "\n")
	b.WriteString("# TYPE leasehold_client_decisions_total counter\n")
	for _, l := range []struct {
		result, source string
		v              int64
	}{
		{"error", "agent", s.AgentError}, {"fallback", "agent", s.AgentFallback},
		{"ok", "agent", s.AgentOK}, {"ok", "sublease", s.SubLease},
		{"over_limit", "agent", s.AgentOverLimit}, {"over_limit", "denial_cache", s.DenialCache},
		{"unavailable", "agent", s.AgentUnavailable},
	} {
		fmt.Fprintf(&b, "leasehold_client_decisions_total{result=%q,source=%q} %d\n", l.result, l.source, l.v)
	}
	return b.String()
}
