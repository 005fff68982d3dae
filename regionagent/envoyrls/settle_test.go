package envoyrls

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSettleLaterEnvoy drives a real agent the way an AI gateway does: the
// request path charges an estimate (hits_addend, leasehold_settle=later)
// and gets a decision id in the dynamic metadata; the response path
// (apply_on_stream_done) settles it with the actual usage as hits_addend,
// once however often it is sent.
func TestSettleLaterEnvoy(t *testing.T) {
	ra := startRealAgent(t, wholeLimit("tenant/acme", 100))
	srv := NewServer(ra.agent, mustParse(t, apiMapping), WithRegisterer(prometheus.NewRegistry()), WithLogger(quietLogger()))
	cl := serve(t, srv)
	ctx := context.Background()
	estimate := request("api", 40, desc("tenant_id", "acme", KeySettle, "later"))
	var r *rlsv3.RateLimitResponse
	eventually(t, 10*time.Second, "an admitted estimate", func() bool {
		var err error
		if r, err = cl.ShouldRateLimit(ctx, estimate); err != nil {
			t.Fatal(err)
		}
		return r.OverallCode == OK
	})
	id := r.GetDynamicMetadata().GetFields()[KeyDecision].GetStringValue()
	if id == "" || r.Statuses[0].LimitRemaining != 60 {
		t.Fatalf("request path: %v", r)
	}
	// The response cost 10: 30 back, however often the settle is sent.
	settle := request("api", 10, desc("tenant_id", "acme", KeyDecision, id))
	for range 2 {
		if r, err := cl.ShouldRateLimit(ctx, settle); err != nil || r.OverallCode != OK {
			t.Fatalf("response path: %v %v", r, err)
		}
	}
	// 90 are left: an estimate of 90 passes, one more token does not.
	if r, err := cl.ShouldRateLimit(ctx, request("api", 90, desc("tenant_id", "acme", KeySettle, "later"))); err != nil || r.OverallCode != OK {
		t.Fatalf("estimate of the 90 left: %v %v", r, err)
	}
	if r, err := cl.ShouldRateLimit(ctx, request("api", 1, desc("tenant_id", "acme"))); err != nil || r.OverallCode != OVER {
		t.Fatalf("a token past the refund: %v %v", r, err)
	}
	if got := testutil.ToFloat64(srv.met.settles.WithLabelValues("settled")); got != 2 {
		t.Fatalf("settled %v, want 2 (the retry answers the first settle)", got)
	}
	// An unknown decision (of the same window) is counted; the response
	// path is still OK.
	win, _, _ := strings.Cut(id, "-")
	if r, err := cl.ShouldRateLimit(ctx, request("api", 1, desc("tenant_id", "acme", KeyDecision, win+"-"+strings.Repeat("0", 32)))); err != nil || r.OverallCode != OK {
		t.Fatalf("unknown decision: %v %v", r, err)
	}
	if got := testutil.ToFloat64(srv.met.settles.WithLabelValues("unknown")); got != 1 {
		t.Fatalf("unknown settles %v, want 1", got)
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"mixed":             request("api", 1, desc("tenant_id", "acme", KeySettle, "later"), desc("tenant_id", "acme")),
		"two settle-later":  request("api", 1, desc("tenant_id", "acme", KeySettle, "later"), desc("tenant_id", "acme", KeySettle, "later")),
		"settle not later":  request("api", 1, desc("tenant_id", "acme", KeySettle, "now")),
		"not a decision id": request("api", 1, desc("tenant_id", "acme", KeyDecision, "a/b")),
	} {
		if _, err := cl.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
}
