package envoyrls

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// fuzzChecker is an agent for FuzzShouldRateLimit: it fails the test on
// any input the Envoy layer should never pass on (an invalid limit id, a
// cost below 1, too many or repeated limits), admits a cost up to 500 and
// denies a larger one, and settles anything.
type fuzzChecker struct{ t *testing.T }

func (c fuzzChecker) valid(limit string, cost, least int64) {
	c.t.Helper()
	if err := vocab.ValidateLimitID("limit", limit); err != nil || cost < least {
		c.t.Fatalf("passed on limit %q cost %d (%v)", limit, cost, err)
	}
}

func (c fuzzChecker) decision(cost int64) regionagent.Decision {
	if cost > 500 {
		return regionagent.Decision{Reason: pb.Reason_REASON_OVER_LIMIT, Remaining: 500, RetryAfter: time.Second,
			ResetAfter: 30 * time.Second, Limit: 1000, Window: time.Minute, Version: 1}
	}
	return regionagent.Decision{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 500 - cost, ResetAfter: 30 * time.Second,
		Limit: 1000, Window: time.Minute, Version: 1, DecisionID: "d1"}
}

func (c fuzzChecker) CheckMulti(_ context.Context, items []regionagent.CheckItem) ([]regionagent.Decision, error) {
	if len(items) == 0 || len(items) > maxLimits {
		c.t.Fatalf("passed on %d limits", len(items))
	}
	seen := map[string]bool{}
	out := make([]regionagent.Decision, len(items))
	for i, it := range items {
		c.valid(it.Limit, it.Cost, 1)
		if seen[it.Limit] {
			c.t.Fatalf("limit %q twice in one CheckMulti", it.Limit)
		}
		seen[it.Limit] = true
		out[i] = c.decision(it.Cost)
	}
	return out, nil
}

func (c fuzzChecker) CheckSettleLater(_ context.Context, limit string, estimate int64) (regionagent.Decision, error) {
	c.valid(limit, estimate, 1)
	return c.decision(estimate), nil
}

func (c fuzzChecker) Settle(_ context.Context, limit, _ string, actual int64) (regionagent.Settlement, error) {
	c.valid(limit, actual, 0)
	return regionagent.Settlement{}, nil
}

// FuzzShouldRateLimit: any bytes decoded as Envoy's RateLimitRequest
// (descriptor values are what clients send, through Envoy) never panic
// the Envoy layer, never reach the agent as an invalid limit id, a cost
// below 1 or a repeated limit, and are answered with one status per
// descriptor (OVER_LIMIT overall exactly when one is), or refused with
// InvalidArgument.
//
//	go test -run '^$' -fuzz FuzzShouldRateLimit ./regionagent/envoyrls/
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlsv3.RateLimitRequest{
		benchRequests["descriptors=1"], benchRequests["descriptors=3"],
		request("api", 600, desc("tenant_id", "big")),
		request("api", 1, desc("tenant_id", "a", KeySettle, "later")),
		request("api", 7, desc("tenant_id", "a", KeyDecision, "d1"), desc("tenant_id", "b", KeyDecision, "d2")),
		request("api", 1, desc("tenant_id", "../x"), desc("plan", "free", "user", "u"), desc("remote_address", "10.0.0.1")),
		request("", 1, desc("tenant_id", "a")),
	}
	for _, r := range seeds {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	m := mustParse(f, apiMapping)
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		s := NewServer(fuzzChecker{t}, m, WithLogger(quietLogger()))
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("refused with %v, want InvalidArgument", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		over := false
		for _, st := range resp.Statuses {
			over = over || st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if want := map[bool]rlsv3.RateLimitResponse_Code{false: rlsv3.RateLimitResponse_OK, true: rlsv3.RateLimitResponse_OVER_LIMIT}[over]; resp.OverallCode != want {
			t.Fatalf("overall %v with statuses %v", resp.OverallCode, fmt.Sprint(codesOf(resp)))
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("the answer cannot be encoded: %v", err)
		}
	})
}
