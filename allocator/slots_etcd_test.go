package allocator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestSlotSharesOnEtcd: on a real etcd, through PutLimit and
// AcquireShares, slot shares are answered with slots and admit_slots,
// replayed by request id, durable across a leader's restart (the next
// leader counts them: nothing beyond N); ListWindows of a concurrency
// limit answers its shares in force and N; the metrics export the bound
// N beside the slots leased and held; a change of kind, an override and
// effective NEXT_WINDOW are refused naming the field.
func TestSlotSharesOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	ctx := context.Background()
	conc := &pb.Limit{Id: "c/e", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3, Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	if _, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: conc}); err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, "c/e", 1)
	ask := func(region, req string, demand float64, held int64) *pb.ShareResult {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "c/e", DemandPerSecond: demand, HeldSlots: held}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("AcquireShares: %v, %v", res, err)
		}
		return res[0]
	}
	r := ask("eu", "e1", 3, 2)
	if r.Share.Slots != 3 || r.Share.AdmitSlots != 3 || r.Share.Seq != 1 || r.Share.RateMilliTokens != 0 || r.Share.ExpiresIn.AsDuration() != 10*time.Second {
		t.Fatalf("eu's first slot share: %v", r.Share)
	}
	if again := ask("eu", "e1", 3, 2); !again.Replayed || again.Share.Slots != 3 || again.Share.Seq != 1 {
		t.Fatalf("a replay: %v", again)
	}
	if u := ask("us", "u1", 3, 0); u.Share.Slots != 0 || u.Share.ShareId != "" {
		t.Fatalf("us while eu's share holds every slot: %v", u.Share)
	}

	lw, err := srv.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "c/e"})
	if err != nil {
		t.Fatal(err)
	}
	if lw.Kind != pb.LimitKind_LIMIT_KIND_CONCURRENCY || lw.LimitSlots != 3 || len(lw.Windows) != 0 || len(lw.Shares) != 1 ||
		lw.Shares[0].Region != "eu" || lw.Shares[0].Slots != 3 || lw.Shares[0].HeldSlots != 2 {
		t.Fatalf("ListWindows: %v", lw)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "leasehold_concurrency_") {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{"leasehold_concurrency_bound_slots": 3, "leasehold_concurrency_leased_slots": 3,
		"leasehold_concurrency_held_slots": 2, "leasehold_concurrency_held_max_slots": 2}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}

	// Changes: no windows, no kind change, an override keeps the regions.
	next := &pb.Limit{Id: "c/e", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 4, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT}
	for _, tc := range []struct {
		req   *pb.PutLimitRequest
		field string
	}{
		{&pb.PutLimitRequest{Reason: "t", Limit: next, Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW}, "effective"},
		{&pb.PutLimitRequest{Reason: "t", Limit: &pb.Limit{Id: "c/e", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 4, Regions: []string{"eu"},
			Mode: pb.Mode_MODE_STRICT}, OverrideFor: durationpb.New(time.Hour)}, "limit.regions"},
		{&pb.PutLimitRequest{Reason: "t", Limit: &pb.Limit{Id: "c/e", LimitTokens: 4, Window: durationpb.New(time.Minute),
			Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT}}, "kind"},
	} {
		if _, err := srv.PutLimit(ctx, tc.req); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("PutLimit %v: %v, want an error naming %s", tc.req, err, tc.field)
		}
	}

	// Failover: b rebuilds the share from etcd and still counts it.
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, "c/e", 1)
	askB := func(region, req string) *pb.ShareResult {
		t.Helper()
		res, err := b.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "c/e", DemandPerSecond: 3}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("AcquireShares: %v, %v", res, err)
		}
		return res[0]
	}
	clock.Add(5 * time.Second)
	if u := askB("us", "u2"); u.Share.Slots != 0 {
		t.Fatalf("us on the new leader, while eu's share is in force: %v", u.Share)
	}
	clock.Add(5 * time.Second) // eu's share expired
	if u := askB("us", "u3"); u.Share.Slots < 1 {
		t.Fatalf("us after eu's share expired: %v", u.Share)
	}
}
