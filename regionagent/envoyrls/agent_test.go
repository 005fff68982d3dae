package envoyrls

import (
	"context"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/agenttest"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// realAgent is a running region agent ("eu") on a real redis-server, fed
// by an allocator on embedded etcd serving gRPC on loopback.
type realAgent struct {
	agent *regionagent.Agent
	redis *redistest.Server
}

func startRealAgent(t testing.TB, limits ...*pb.Limit) *realAgent {
	t.Helper()
	a := agenttest.Start(t, limits...)
	return &realAgent{agent: a.Agent, redis: a.Redis}
}

// wholeLimit is a limit of G per hour whose first lease is the whole pool
// (min_chunk = G), so the region holds every token from the start.
func wholeLimit(id string, g int64) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(time.Hour), Regions: []string{"eu"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Minute), MinChunk: g}}
}

// TestRealAgent drives a real agent through the Envoy API: all or
// nothing across descriptors, unknown limits allowed, UNAVAILABLE when
// Redis is gone and the limit fails closed.
func TestRealAgent(t *testing.T) {
	ra := startRealAgent(t, wholeLimit("tenant/acme", 5), wholeLimit("tenant/acme/search", 3))
	srv := NewServer(ra.agent, mustParse(t, apiMapping), WithRegisterer(prometheus.NewRegistry()), WithLogger(quietLogger()))
	cl := serve(t, srv)
	ctx := context.Background()
	// untilOK retries a call denied while the region is still fetching its
	// first lease (a denied call charges nothing).
	untilOK := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		var r *rlsv3.RateLimitResponse
		eventually(t, 10*time.Second, "an admitted call", func() bool {
			var err error
			if r, err = cl.ShouldRateLimit(ctx, req); err != nil {
				t.Fatal(err)
			}
			return r.OverallCode == OK
		})
		return r
	}
	pair := request("api", 1, desc("tenant_id", "acme"), desc("tenant_id", "acme", "path", "/search"))
	for range 3 {
		r := untilOK(pair)
		if r.Statuses[1].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("current_limit %v", r.Statuses[1].CurrentLimit)
		}
	}
	// The search limit's 3 are spent: the pair is over limit, and the
	// tenant limit is not charged for it.
	r, err := cl.ShouldRateLimit(ctx, pair)
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode != OVER || !slices.Equal(codesOf(r), []rlsv3.RateLimitResponse_Code{OK, OVER}) {
		t.Fatalf("4th pair: %v %v", r.OverallCode, codesOf(r))
	}
	if hs := headerList(r); len(hs) != 6 || hs[5][:len("Retry-After: ")] != "Retry-After: " {
		t.Fatalf("headers %q", hs)
	}
	alone := request("api", 1, desc("tenant_id", "acme"))
	untilOK(alone)
	untilOK(alone) // 5 of 5: the denied pair took nothing
	if r, err := cl.ShouldRateLimit(ctx, alone); err != nil || r.OverallCode != OVER {
		t.Fatalf("6th tenant token: %v %v", r, err)
	}
	// An id the region has no limit for is allowed and counted, the rest
	// still decided (the real agent's error names the limit).
	if r := untilOK(request("api", 1, desc("tenant_id", "ghost"), desc("remote_address", "10.0.0.1"))); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("unmapped only: headers %q", headerList(r))
	}
	if got := testutil.ToFloat64(srv.met.unmapped.WithLabelValues(unmappedUnknownLimit)); got != 2 {
		t.Fatalf("unknown_limit counted %v, want 2", got)
	}
	// Redis gone and the limit fails closed: the agent cannot decide.
	ra.redis.Kill()
	_, err = cl.ShouldRateLimit(ctx, alone)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("redis down: %v, want UNAVAILABLE", err)
	}
}
