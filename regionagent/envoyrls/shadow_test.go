package envoyrls

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// shadowBucket is a bucket limit of 1 a minute, bursts of 2, in eu: its
// bucket starts empty and holds no token for the whole test, so every
// Check is over the limit.
func shadowBucket(id string, shadow bool) *pb.Limit {
	return &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 1, RatePeriod: durationpb.New(time.Minute),
		BurstTokens: 2, Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)},
		Shadow: shadow}
}

// TestRealAgentShadow: through a real agent on redis-server, a limit in
// shadow mode that would deny is admitted (OK, its descriptor OK, no
// Retry-After) and named in Leasehold-Would-Deny with reason over_limit,
// the same way for a window limit and a bucket (rate) limit, where the
// same limit enforced answers OVER_LIMIT with Retry-After. A window
// limit of 2 admits 2 requests clean first (its bucket twin none: a new
// share's bucket starts empty).
func TestRealAgentShadow(t *testing.T) {
	w := wholeLimit("tenant/wshadow", 2)
	w.Shadow = true
	ra := startRealAgent(t, w, wholeLimit("tenant/wenforce", 2), shadowBucket("tenant/bshadow", true), shadowBucket("tenant/benforce", false))
	srv := NewServer(ra.agent, mustParse(t, apiMapping), WithRegisterer(prometheus.NewRegistry()), WithLogger(quietLogger()))
	cl := serve(t, srv)
	ctx := context.Background()
	header := func(r *rlsv3.RateLimitResponse, key string) string {
		for _, h := range r.ResponseHeadersToAdd {
			if h.Key == key {
				return h.Value
			}
		}
		return ""
	}
	for _, c := range []struct {
		kind  string
		clean int // requests admitted before the limit would deny
	}{{"w", 2}, {"b", 0}} {
		shadow, enforce := request("api", 1, desc("tenant_id", c.kind+"shadow")), request("api", 1, desc("tenant_id", c.kind+"enforce"))
		marked := `"tenant/` + c.kind + `shadow";reason=over_limit`
		// The enforced twin: c.clean admitted, then over the limit (a
		// request the region could not decide yet, before its first
		// lease or share, is retried: it charged nothing).
		var seq []rlsv3.RateLimitResponse_Code
		eventually(t, 10*time.Second, c.kind+"enforce: over the limit", func() bool {
			r, err := cl.ShouldRateLimit(ctx, enforce)
			if err != nil {
				return false // UNAVAILABLE while the region waits for its first lease or share
			}
			seq = append(seq, r.OverallCode)
			if r.OverallCode == OVER && header(r, HeaderRetryAfter) == "" {
				t.Fatalf("%senforce: OVER_LIMIT without Retry-After: %q", c.kind, headerList(r))
			}
			return r.OverallCode == OVER
		})
		if len(seq) != c.clean+1 {
			t.Fatalf("%senforce answered %v, want %d OK then OVER_LIMIT", c.kind, seq, c.clean)
		}
		// The shadow one: the same decisions, each admitted; the
		// would-be denials marked.
		clean, n := 0, 0
		eventually(t, 10*time.Second, c.kind+"shadow: three marked admissions", func() bool {
			r, err := cl.ShouldRateLimit(ctx, shadow)
			if err != nil {
				return false // as above
			}
			if r.OverallCode != OK || len(r.Statuses) != 1 || r.Statuses[0].Code != OK || header(r, HeaderRetryAfter) != "" {
				t.Fatalf("%sshadow: a limit in shadow mode answered %v %v %q", c.kind, r.OverallCode, codesOf(r), headerList(r))
			}
			switch wd := header(r, HeaderWouldDeny); {
			case wd == "" && n == 0:
				clean++
			case wd == marked:
				n++
			case wd == `"tenant/`+c.kind+`shadow";reason=unavailable` && clean == 0 && n == 0:
				// Before the region's first lease or share, where the
				// enforced twin answers UNAVAILABLE: admitted, marked.
			default:
				t.Fatalf("%sshadow: %s %q after %d clean, %d marked", c.kind, HeaderWouldDeny, wd, clean, n)
			}
			return n == 3
		})
		if clean != c.clean {
			t.Fatalf("%sshadow: %d admitted clean, want %d (as enforced)", c.kind, clean, c.clean)
		}
	}
}
