package httplimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/agenttest"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// rateLimit is a bucket limit of 1 a minute, bursts of 2, in eu: a new
// share's bucket starts empty and holds no token for the whole test, so
// every Check is over the limit.
func rateLimit(id string, shadow bool) *pb.Limit {
	return &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 1, RatePeriod: durationpb.New(time.Minute),
		BurstTokens: 2, Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)},
		Shadow: shadow}
}

// windowLimit is a window limit of g an hour in eu whose first lease is
// the whole pool.
func windowLimit(id string, g int64, shadow bool) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(time.Hour), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Minute), MinChunk: g}, Shadow: shadow}
}

// TestShadowThroughRealAgent: the middleware, with the real client, over
// gRPC to a real agent on redis-server: a limit in shadow mode that would
// deny lets the request through (200, the handler called, no
// Retry-After) with Leasehold-Would-Deny naming it, reason over_limit,
// the same way for a window limit and a bucket (rate) limit, where the
// same limit enforced answers 429. A window limit of 2 passes 2 requests
// unmarked first (its bucket twin none: a new share's bucket starts
// empty).
func TestShadowThroughRealAgent(t *testing.T) {
	ag := agenttest.Start(t, windowLimit("tenant/wshadow", 2, true), windowLimit("tenant/wenforce", 2, false),
		rateLimit("tenant/bshadow", true), rateLimit("tenant/benforce", false))
	c, err := client.New(ag.Serve(t), client.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())),
		client.WithoutDenialCache())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	// A 503 is a request the region could not decide yet (before its
	// first lease or share; nothing charged): asked again.
	for _, k := range []struct {
		kind  string
		clean int // requests admitted before the limit would deny
	}{{"w", 2}, {"b", 0}} {
		var seq []int
		poll(t, k.kind+"enforce: 429", func() bool {
			resp, _, called := serve(t, c, tenantReq(k.kind+"enforce"))
			if resp.StatusCode == http.StatusServiceUnavailable {
				return false
			}
			seq = append(seq, resp.StatusCode)
			if resp.StatusCode == http.StatusTooManyRequests && (called || resp.Header.Get("Retry-After") == "") {
				t.Fatalf("%senforce: 429 called the handler (%v) or lacks Retry-After: %v", k.kind, called, resp.Header)
			}
			return resp.StatusCode == http.StatusTooManyRequests
		})
		if len(seq) != k.clean+1 {
			t.Fatalf("%senforce answered %v, want %d x 200 then 429", k.kind, seq, k.clean)
		}
		marked := `"tenant/` + k.kind + `shadow";reason=over_limit`
		clean, n := 0, 0
		poll(t, k.kind+"shadow: three marked admissions", func() bool {
			resp, body, called := serve(t, c, tenantReq(k.kind+"shadow"))
			if resp.StatusCode != http.StatusOK || !called || body != "upstream" || resp.Header.Get("Retry-After") != "" {
				t.Fatalf("%sshadow: a limit in shadow mode answered %d %q (handler called: %v) %v", k.kind, resp.StatusCode, body, called, resp.Header)
			}
			switch wd := resp.Header.Get(HeaderWouldDeny); {
			case wd == "" && n == 0:
				clean++
			case wd == marked:
				n++
			case wd == `"tenant/`+k.kind+`shadow";reason=unavailable` && clean == 0 && n == 0:
				// Before the region's first lease or share, where the
				// enforced twin answers 503: admitted, marked.
			default:
				t.Fatalf("%sshadow: %s %q after %d clean, %d marked", k.kind, HeaderWouldDeny, wd, clean, n)
			}
			return n == 3
		})
		if clean != k.clean {
			t.Fatalf("%sshadow: %d passed unmarked, want %d (as enforced)", k.kind, clean, k.clean)
		}
	}
}

// poll calls cond until it is true, at most 200 times, 5 ms apart
// (polling the agent's first lease or share; bounded in count and time).
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling the region's first lease or share
	}
	t.Fatalf("no %s after 200 tries", what)
}
