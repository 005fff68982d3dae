package statuspage

import (
	"net/http"
	"testing"

	pb "leasehold/proto/leasehold/v1"
)

// TestConcurrencyLimitOnStatus: a concurrency limit (no windows) is
// listed and its page answers, without a window chart; quotactl windows
// shows its slot shares (not the status page, in this version).
func TestConcurrencyLimitOnStatus(t *testing.T) {
	src := &fakeSource{leader: true, limits: []*pb.Limit{limit("tenant/atlas", 1000, "eu", "us"),
		{Id: "tenant/exports", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Version: 1}}}
	for _, path := range []string{"/status", "/status?limit=tenant/exports"} {
		code, _, body := serve(t, src, path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		mustContain(t, body, "tenant/exports")
		mustNotContain(t, body, `<svg class="chart" id="chart-tenant/exports"`)
		if testing.Verbose() {
			t.Log(body)
		}
	}
}
