package allocator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// putBucketLimitRaw writes a bucket limit straight into etcd: the Admin
// API refuses bucket limits until the agent enforces them.
func putBucketLimitRaw(t *testing.T, a *Allocator, id string, rate, burst int64, ttl time.Duration) {
	t.Helper()
	b, err := proto.Marshal(&pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: burst,
		RatePeriod: durationpb.New(time.Second), Regions: []string{"eu", "us", "ap"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Store().Client().Put(context.Background(), a.Store().limitKey(id), string(b)); err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a, id, 1)
}

func acquireShare(t *testing.T, a *Allocator, region, req string, demand float64) *pb.ShareResult {
	t.Helper()
	res, err := a.AcquireShares(context.Background(), region, []*pb.ShareRequest{{RequestId: req, LimitId: "b/e", DemandPerSecond: demand}})
	if err != nil {
		t.Fatalf("AcquireShares(%s %s): %v", region, req, err)
	}
	return res[0]
}

// TestSharesDurableAcrossFailover: on a real etcd, every share is in etcd
// when it is answered, a retry gets the same share (from the next leader
// too), an expired share's rate goes back only at its expiry, and a
// deposed leader's fence cannot commit a share.
func TestSharesDurableAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	putBucketLimitRaw(t, a.Allocator, "b/e", 100, 200, 10*time.Second)

	r1 := acquireShare(t, a.Allocator, "eu", "e1", 300)
	if r1.Code != pb.ItemCode_ITEM_CODE_OK || r1.Share.RateMilliTokens != 100_000 || r1.Share.BurstTokens != 200 || r1.Share.Seq != 1 ||
		r1.Share.ExpiresIn.AsDuration() != 10*time.Second {
		t.Fatalf("first share: %v", r1)
	}
	resp, err := c.Client(t).Get(context.Background(), a.Store().sharesPrefix(), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || !strings.HasSuffix(string(resp.Kvs[0].Key), "/eu/e1") {
		t.Fatalf("share records in etcd: %v, %v", resp, err)
	}
	if r := acquireShare(t, a.Allocator, "us", "u1", 100); r.Share.GetShareId() != "" || r.Share.GetRateMilliTokens() != 0 {
		t.Fatalf("us while eu holds everything: %v", r)
	}

	// Failover: b takes over from etcd and answers the retry identically.
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, "b/e", 1)
	clock.Add(time.Second)
	r1b := acquireShare(t, b.Allocator, "eu", "e1", 300)
	if !r1b.Replayed || r1b.Share.ShareId != r1.Share.ShareId || r1b.Share.Seq != 1 || r1b.Share.RateMilliTokens != 100_000 ||
		r1b.Share.ExpiresIn.AsDuration() != 9*time.Second {
		t.Fatalf("replay on the new leader: %v", r1b)
	}
	// The new leader knows demand only from requests it answered: eu
	// renews (alone, the whole limit, seq 2); us gets nothing until eu's
	// shares expire, then its part; eu's next share follows the seq.
	clock.Set(t0.Add(5 * time.Second))
	if r := acquireShare(t, b.Allocator, "eu", "e2", 300); r.Share.GetRateMilliTokens() != 100_000 || r.Share.Seq != 2 {
		t.Fatalf("eu's renewal on the new leader: %v", r)
	}
	clock.Set(t0.Add(15*time.Second - time.Millisecond))
	if r := acquireShare(t, b.Allocator, "us", "u2", 100); r.Share.GetRateMilliTokens() != 0 {
		t.Fatalf("us before eu's share expired: %v", r)
	}
	clock.Set(t0.Add(15 * time.Second))
	if r := acquireShare(t, b.Allocator, "us", "u3", 100); r.Share.GetRateMilliTokens() != 100_000/4 || r.Share.Seq != 1 {
		t.Fatalf("us after eu's share expired: %v", r)
	}
	if r := acquireShare(t, b.Allocator, "eu", "e3", 300); r.Share.GetRateMilliTokens() != 75_000 || r.Share.Seq != 3 {
		t.Fatalf("eu's next share: %v", r)
	}

	// A deposed leader's fence commits nothing.
	b.mu.Lock()
	tm := b.term
	b.mu.Unlock()
	if _, err := c.Client(t).Revoke(context.Background(), b.SessionLease()); err != nil {
		t.Fatal(err)
	}
	op, err := b.Store().putShareOp(&ShareGrant{ShareID: "s/eu/forged", Limit: "b/e", Region: "eu", RequestID: "forged", Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Store().Commit(context.Background(), tm.fence, []clientv3.Op{op}); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit with a revoked leader's fence: %v, want ErrFenced", err)
	}
}

// TestShareRecordsExpire: the sweep removes a share's record once it
// expired more than the retention ago, and forgets it in the core.
func TestShareRecordsExpire(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(time.Minute, 10*time.Millisecond))
	allocatortest.WaitLeader(t, a)
	putBucketLimitRaw(t, a.Allocator, "b/e", 100, 200, 10*time.Second)
	acquireShare(t, a.Allocator, "eu", "e1", 300)
	clock.Add(70 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.Client(t).Get(context.Background(), a.Store().sharesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		var left int
		_ = a.View(func(_ time.Time, core *Core) { left = len(core.shareReq) })
		if resp.Count == 0 && left == 0 { // the core forgets right after the delete commits
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not ordering
	}
	t.Fatal("the expired share's record was never removed, or the core never forgot it")
}

func TestValidateAcquireShares(t *testing.T) {
	ok := func() *pb.AcquireSharesRequest {
		return &pb.AcquireSharesRequest{Region: "eu", Requests: []*pb.ShareRequest{{RequestId: "r1", LimitId: "b/a", DemandPerSecond: 1}}}
	}
	if err := ValidateAcquireShares(ok()); err != nil {
		t.Fatal(err)
	}
	for field, edit := range map[string]func(*pb.AcquireSharesRequest){
		"region":                        func(r *pb.AcquireSharesRequest) { r.Region = "" },
		"requests":                      func(r *pb.AcquireSharesRequest) { r.Requests = nil },
		"requests[0]":                   func(r *pb.AcquireSharesRequest) { r.Requests[0] = nil },
		"requests[0].request_id":        func(r *pb.AcquireSharesRequest) { r.Requests[0].RequestId = "a/b" },
		"requests[1].request_id":        func(r *pb.AcquireSharesRequest) { r.Requests = append(r.Requests, r.Requests[0]) },
		"requests[0].limit_id":          func(r *pb.AcquireSharesRequest) { r.Requests[0].LimitId = "" },
		"requests[0].demand_per_second": func(r *pb.AcquireSharesRequest) { r.Requests[0].DemandPerSecond = -1 },
		"requests[0].holder":            func(r *pb.AcquireSharesRequest) { r.Requests[0].Holder = "eu 1" },
		"requests[0].would_deny_tokens": func(r *pb.AcquireSharesRequest) { r.Requests[0].WouldDenyTokens = -1 },
		"requests[0].would_deny_checks": func(r *pb.AcquireSharesRequest) { r.Requests[0].WouldDenyChecks = -1 },
	} {
		req := ok()
		edit(req)
		var fe *vocab.FieldError
		if err := ValidateAcquireShares(req); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v", field, err)
		}
	}
}

// TestBucketMetrics: the allocator exports, per bucket limit, what the
// agents' counters grew by in the last closed reporting interval and the
// bound beside it (B + R x (interval + slack)).
func TestBucketMetrics(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	putBucketLimitRaw(t, a.Allocator, "b/e", 100, 200, 10*time.Second)
	ask := func(req string, admitted, wd, wdc int64) {
		t.Helper()
		res, err := a.AcquireShares(context.Background(), "eu", []*pb.ShareRequest{{RequestId: req, LimitId: "b/e", DemandPerSecond: 50,
			AdmittedTokens: admitted, WouldDenyTokens: wd, WouldDenyChecks: wdc}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("AcquireShares: %v, %v", res, err)
		}
	}
	ask("r1", 0, 0, 0)
	clock.Add(10 * time.Second)
	ask("r2", 120, 45, 20)      // shadow mode: would-deny counters grow beside admitted
	clock.Add(50 * time.Second) // the next interval
	ask("r3", 150, 50, 22)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "leasehold_bucket_") {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{"leasehold_bucket_admitted_tokens": 120, "leasehold_bucket_bound_tokens": 200 + 100*71,
		"leasehold_bucket_interval_seconds": 60, "leasehold_bucket_would_deny_tokens": 45, "leasehold_bucket_would_deny_checks": 20}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// TestListWindowsBucket: ListWindows of a bucket limit (which has no
// windows) answers its reporting intervals, oldest first with the running
// one last, each with what the regions admitted beside B + R x (interval +
// slack), and the shares in force; a quiet gap counts nothing in its
// intervals and at most bucketHistory closed intervals are kept.
func TestListWindowsBucket(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	putBucketLimitRaw(t, a.Allocator, "b/e", 100, 200, 10*time.Second)
	srv := NewServer(a.Allocator)
	ask := func(region, req string, admitted int64) {
		t.Helper()
		res, err := a.AcquireShares(context.Background(), region, []*pb.ShareRequest{{RequestId: req, LimitId: "b/e", DemandPerSecond: 50, AdmittedTokens: admitted}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("AcquireShares: %v, %v", res, err)
		}
	}
	list := func(last int32) *pb.ListWindowsResponse {
		t.Helper()
		resp, err := srv.ListWindows(context.Background(), &pb.ListWindowsRequest{LimitId: "b/e", Last: last})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Kind != pb.LimitKind_LIMIT_KIND_BUCKET || len(resp.Windows) != 0 {
			t.Fatalf("kind %v, %d windows", resp.Kind, len(resp.Windows))
		}
		return resp
	}
	// Known to the allocator before any share: the running interval only.
	if r := list(10); len(r.Intervals) != 1 || r.Intervals[0].Closed || r.Intervals[0].AdmittedTotal != 0 || len(r.Shares) != 0 {
		t.Fatalf("before any share: %v", r)
	}
	ask("eu", "e1", 0)
	ask("us", "u1", 0)
	clock.Add(5 * time.Second)
	ask("eu", "e2", 70)
	ask("us", "u2", 30)
	clock.Add(55 * time.Second) // the next interval
	ask("eu", "e3", 80)
	r := list(10)
	if len(r.Intervals) != 2 {
		t.Fatalf("intervals: %v", r.Intervals)
	}
	first, running := r.Intervals[0], r.Intervals[1]
	wantBound := int64(200 + 100*71) // slack: the 10 s share ttl + 1 s
	if !first.Closed || first.AdmittedTotal != 100 || first.Admitted["eu"] != 70 || first.Admitted["us"] != 30 ||
		first.Bound != wantBound || first.RateTokens != 100 || first.BurstTokens != 200 || first.RatePeriod.AsDuration() != time.Second ||
		first.Slack.AsDuration() != 11*time.Second || !first.Start.AsTime().Equal(t0) || !first.End.AsTime().Equal(t0.Add(time.Minute)) {
		t.Errorf("first interval: %v", first)
	}
	if running.Closed || running.AdmittedTotal != 10 || running.Admitted["eu"] != 10 || !running.Start.AsTime().Equal(t0.Add(time.Minute)) {
		t.Errorf("running interval: %v", running)
	}
	// In force now: eu's e3 (just granted); us's u2 expired at t0+16s.
	if len(r.Shares) != 1 || r.Shares[0].Region != "eu" || r.Shares[0].Seq != 3 ||
		!r.Shares[0].ExpiresAt.AsTime().Equal(clock.Now().Add(10*time.Second)) || r.Shares[0].RateMilliTokens+0 <= 0 {
		t.Errorf("shares: %v", r.Shares)
	}
	if r := list(1); len(r.Intervals) != 1 || r.Intervals[0].Closed {
		t.Errorf("last 1: %v", r.Intervals)
	}
	// Two hours quiet: the intervals are empty and at most bucketHistory
	// of them are kept, ending just before the running one.
	clock.Add(2 * time.Hour)
	r = list(1000)
	if len(r.Intervals) != bucketHistory+1 {
		t.Fatalf("%d intervals after a quiet gap", len(r.Intervals))
	}
	for i, iv := range r.Intervals {
		if iv.AdmittedTotal != 0 || (i < bucketHistory) != iv.Closed {
			t.Errorf("interval %d after the gap: %v", i, iv)
		}
		if i > 0 && !iv.Start.AsTime().Equal(r.Intervals[i-1].End.AsTime()) {
			t.Errorf("interval %d does not follow the one before", i)
		}
	}
	// A window limit answers windows, not intervals.
	if _, err := srv.ListWindows(context.Background(), &pb.ListWindowsRequest{LimitId: "no/such"}); status.Code(err) != codes.NotFound {
		t.Errorf("an unknown limit: %v", err)
	}
}

// TestBucketLimitChanges: through PutLimit, a bucket limit is created and
// a change governs at once (no window to wait for); a change for the next
// window, an override of the rate period or the regions and a change of
// kind are refused naming the field.
func TestBucketLimitChanges(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	bucket := func(rate int64) *pb.Limit {
		return &pb.Limit{Id: "b/c", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: 20,
			Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT}
	}
	if _, err := a.PutLimit(ctx, bucket(10), Change{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	clock.Add(7 * time.Second)
	got, err := a.PutLimit(ctx, bucket(20), Change{Reason: "test"})
	if err != nil || got.Version != 2 || !got.EffectiveFrom.AsTime().Equal(clock.Now()) || got.Previous != nil {
		t.Fatalf("a change with effective unset: %v, %v", got, err)
	}
	waitLimit(t, a.Allocator, "b/c", 2)
	var rate int64
	_ = a.View(func(now time.Time, core *Core) {
		if l, ok := core.Limit("b/c"); ok {
			rate = l.At(now).Rate
		}
	})
	if rate != 20 {
		t.Errorf("rate in force %d, want 20 at once", rate)
	}
	for _, tc := range []struct {
		name  string
		l     *pb.Limit
		ch    Change
		field string
	}{
		{"next window", bucket(30), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW}, "effective"},
		{"override of the period", func() *pb.Limit { l := bucket(30); l.RatePeriod = durationpb.New(time.Minute); return l }(),
			Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW, OverrideFor: time.Minute}, "limit.rate_period"},
		{"override of the regions", func() *pb.Limit { l := bucket(30); l.Regions = []string{"eu"}; return l }(),
			Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW, OverrideFor: time.Minute}, "limit.regions"},
		{"kind", &pb.Limit{Id: "b/c", LimitTokens: 10, Window: durationpb.New(time.Minute), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT},
			Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}, "limit.kind"},
		{"override of the kind", &pb.Limit{Id: "b/c", LimitTokens: 10, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT},
			Change{Reason: "test", OverrideFor: time.Minute}, "limit.kind"},
	} {
		_, err := a.PutLimit(ctx, tc.l, tc.ch)
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}
}
