package statuspage

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

// TestConcurrencyLimitOnStatus: a concurrency limit (no windows) is
// listed with N and its slots now (held, the bound N + A, the most held),
// without a window chart; its page shows the slot shares in force. On a
// follower the slots are the leader's to show; held above the bound is a
// critical alert.
func TestConcurrencyLimitOnStatus(t *testing.T) {
	exports := &pb.Limit{Id: "tenant/exports", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3, Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_BOUNDED, Version: 1,
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 2}},
		Lease:    &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	expires := time.Date(2026, 3, 2, 10, 0, 7, 0, time.UTC)
	src := &fakeSource{leader: true, limits: []*pb.Limit{limit("tenant/atlas", 1000, "eu", "us"), exports},
		slots: map[string]allocator.SlotStatus{"tenant/exports": {N: 3, Bound: 5, Leased: 3, Held: 2, HeldMax: 3,
			Shares: []allocator.ShareInForce{{Region: "eu", Slots: 2, Admit: 2, Held: 2, ExpiresAt: expires, Seq: 4},
				{Region: "us", Slots: 1, Admit: 1, Held: 0, ExpiresAt: expires, Seq: 9}}}}}
	code, _, body := serve(t, src, "/status")
	if code != http.StatusOK {
		t.Fatalf("/status: %d\n%s", code, body)
	}
	mustContain(t, body, "tenant/exports")
	mustContain(t, body, "<td>concurrency</td>")
	mustContain(t, body, "2 held</td>")
	mustContain(t, body, "≤ 5</td>")
	mustNotContain(t, body, `<svg class="chart" id="chart-tenant/exports"`)

	code, _, body = serve(t, src, "/status?limit=tenant/exports")
	if code != http.StatusOK {
		t.Fatalf("detail: %d\n%s", code, body)
	}
	mustContain(t, body, "3 slots held at once, all regions together")
	mustContain(t, body, `id="slot-shares"`)
	mustContain(t, body, "slot shares, ttl 10s")
	for _, want := range []string{"<th scope=\"row\">eu</th>", "<th scope=\"row\">us</th>", "5 slots held at any instant"} {
		mustContain(t, body, want)
	}
	if testing.Verbose() {
		t.Log(body)
	}

	// Held above the bound: a bug, flagged.
	src.slots["tenant/exports"] = allocator.SlotStatus{N: 3, Bound: 5, HeldMax: 6}
	_, _, body = serve(t, src, "/status")
	mustContain(t, body, "held &gt; bound")
	// Held under a larger N (before N was lowered, or an override that
	// raised it ended): not a bug, not flagged.
	src.slots["tenant/exports"] = allocator.SlotStatus{N: 3, Bound: 5, HeldMax: 6, BoundMax: 8}
	if _, _, body = serve(t, src, "/status"); strings.Contains(body, "held &gt; bound") {
		t.Fatal("held under an earlier, larger N flagged as over the bound")
	}

	// A follower does not know the slots: it says so.
	src.leader, src.reportsErr = false, allocator.ErrNotLeader
	_, _, body = serve(t, src, "/status?limit=tenant/exports")
	mustContain(t, body, "Slots are shown by the leader only.")
}
