package allocator

import (
	"context"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/limitspec"
	"leasehold/internal/syncbuf"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// serve runs the gRPC services of a over bufconn and returns clients.
func serve(t *testing.T, a *Allocator) (pb.AllocatorClient, pb.AdminClient) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	NewServer(a).Register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewAllocatorClient(conn), pb.NewAdminClient(conn)
}

func validLimit() *pb.Limit {
	return &pb.Limit{
		Id: "tenant/atlas", LimitTokens: 1000, Window: durationpb.New(time.Minute),
		Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 100}},
		Lease:    &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 5, MaxChunk: 100},
	}
}

func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	s, _ := status.FromError(err)
	if s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), field+":") {
		t.Fatalf("got %v %q, want InvalidArgument naming %q", s.Code(), s.Message(), field)
	}
}

func TestAdminRejectsEachInvalidField(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a) // changes are served by the leader
	_, admin := serve(t, a.Allocator)
	ctx := context.Background()
	for _, tc := range []struct {
		field string
		edit  func(l *pb.Limit)
	}{
		{"limit.id", func(l *pb.Limit) { l.Id = "" }},
		{"limit.id", func(l *pb.Limit) { l.Id = "tenant//x" }},
		{"limit.id", func(l *pb.Limit) { l.Id = "tenant!x" }},
		{"limit.id", func(l *pb.Limit) { l.Id = "tenant/../x" }},
		{"limit.id", func(l *pb.Limit) { l.Id = "./x" }},
		{"limit.id", func(l *pb.Limit) { l.Id = strings.Repeat("a", 201) }},
		{"limit.limit_tokens", func(l *pb.Limit) { l.LimitTokens = 0 }},
		{"limit.limit_tokens", func(l *pb.Limit) { l.LimitTokens = -5 }},
		{"limit.limit_tokens", func(l *pb.Limit) { l.LimitTokens = vocab.MaxTokens + 1 }},
		{"limit.lease.max_chunk", func(l *pb.Limit) { l.Lease.MaxChunk = vocab.MaxTokens + 1 }},
		{"limit.fallback[eu].local_tokens", func(l *pb.Limit) { l.Fallback["eu"].LocalTokens = vocab.MaxTokens + 1 }},
		{"limit.window", func(l *pb.Limit) { l.Window = nil }},
		{"limit.window", func(l *pb.Limit) { l.Window = durationpb.New(999 * time.Millisecond) }},
		{"limit.window", func(l *pb.Limit) { l.Window = durationpb.New(time.Second + time.Microsecond) }},
		{"limit.window", func(l *pb.Limit) { l.Window = &durationpb.Duration{Seconds: 1, Nanos: -1} }},
		{"limit.regions", func(l *pb.Limit) { l.Regions = nil }},
		{"limit.regions[1]", func(l *pb.Limit) { l.Regions = []string{"eu", "mars"} }},
		{"limit.regions[1]", func(l *pb.Limit) { l.Regions = []string{"eu", "eu"} }},
		{"limit.regions[0]", func(l *pb.Limit) { l.Regions = []string{"EU"} }},
		{"limit.mode", func(l *pb.Limit) { l.Mode = pb.Mode_MODE_UNSPECIFIED }},
		{"limit.mode", func(l *pb.Limit) { l.Mode = 9 }},
		{"limit.fallback[ap]", func(l *pb.Limit) { l.Fallback["ap"] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED} }},
		{"limit.fallback[eu].local_tokens", func(l *pb.Limit) { l.Fallback["eu"].LocalTokens = 0 }},
		{"limit.fallback[eu].local_tokens", func(l *pb.Limit) {
			l.Fallback["eu"] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN, LocalTokens: 3}
		}},
		{"limit.fallback[eu].kind", func(l *pb.Limit) { l.Fallback["eu"] = &pb.Fallback{} }},
		{"limit.fallback[eu]", func(l *pb.Limit) { l.Mode = pb.Mode_MODE_STRICT }},
		{"limit.lease.ttl", func(l *pb.Limit) { l.Lease.Ttl = durationpb.New(2 * time.Minute) }},
		{"limit.lease.ttl", func(l *pb.Limit) { l.Lease.Ttl = durationpb.New(time.Millisecond) }},
		{"limit.lease.min_chunk", func(l *pb.Limit) { l.Lease.MinChunk = -1 }},
		{"limit.lease.min_chunk", func(l *pb.Limit) { l.Lease.MinChunk = 2000; l.Lease.MaxChunk = 0 }},
		{"limit.lease.max_chunk", func(l *pb.Limit) { l.Lease.MaxChunk = 2 }},
		{"limit.owner", func(l *pb.Limit) { l.Owner = strings.Repeat("o", 201) }},
		{"limit.tags", func(l *pb.Limit) { l.Tags = map[string]string{"": "x"} }},
	} {
		l := validLimit()
		tc.edit(l)
		_, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l})
		wantInvalid(t, err, tc.field)
	}
	if _, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test"}); err == nil {
		t.Fatal("nil limit accepted")
	} else {
		wantInvalid(t, err, "limit")
	}
	// The valid one is stored, then optimistic concurrency.
	got, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: validLimit()})
	if err != nil || got.Limit.Version != 1 {
		t.Fatalf("valid put: %v %v", got, err)
	}
	stale := int64(0)
	_, err = admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: validLimit(), ExpectedVersion: &stale})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("stale expected version: %v, want Aborted", err)
	}
	one := int64(1)
	changed := validLimit()
	changed.LimitTokens = 900
	got, err = admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: changed, ExpectedVersion: &one})
	if err != nil || got.Limit.Version != 2 {
		t.Fatalf("put at version 1: %v %v", got, err)
	}
	if _, err := admin.GetLimit(ctx, &pb.GetLimitRequest{Id: "tenant/none"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get missing: %v", err)
	}
	if _, err := admin.DeleteLimit(ctx, &pb.DeleteLimitRequest{Reason: "test", Id: "tenant/atlas", ExpectedVersion: &one}); status.Code(err) != codes.Aborted {
		t.Fatalf("delete at stale version: %v", err)
	}
	if _, err := admin.DeleteLimit(ctx, &pb.DeleteLimitRequest{Reason: "test", Id: "tenant/atlas"}); err != nil {
		t.Fatal(err)
	}
}

func TestListLimitsPages(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a) // changes are served by the leader
	_, admin := serve(t, a.Allocator)
	ctx := context.Background()
	for _, id := range []string{"tenant/a", "tenant/b", "tenant/c", "tenant/a/x", "plan/p"} {
		l := validLimit()
		l.Id = id
		if _, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	token := ""
	for {
		resp, err := admin.ListLimits(ctx, &pb.ListLimitsRequest{Prefix: "tenant/", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.Limits {
			ids = append(ids, l.Id)
		}
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if got := strings.Join(ids, ","); got != "tenant/a,tenant/a/x,tenant/b,tenant/c" {
		t.Fatalf("listed %s", got)
	}
	_, err := admin.ListLimits(ctx, &pb.ListLimitsRequest{PageSize: 5000})
	wantInvalid(t, err, "page_size")
}

func TestAcquireRejectsEachMalformedRequest(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	alloc, _ := serve(t, a.Allocator)
	ctx := context.Background()
	ok := func() *pb.LeaseRequest {
		return &pb.LeaseRequest{RequestId: "r1", LimitId: "tenant/a", DemandPerSecond: 1}
	}
	for _, tc := range []struct {
		field string
		req   *pb.AcquireLeasesRequest
	}{
		{"region", &pb.AcquireLeasesRequest{Requests: []*pb.LeaseRequest{ok()}}},
		{"region", &pb.AcquireLeasesRequest{Region: "EU!", Requests: []*pb.LeaseRequest{ok()}}},
		{"requests", &pb.AcquireLeasesRequest{Region: "eu"}},
		{"requests[0].request_id", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{LimitId: "tenant/a"}}}},
		{"requests[0].request_id", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "a/b", LimitId: "tenant/a"}}}},
		{"requests[0].request_id", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: strings.Repeat("r", 129), LimitId: "tenant/a"}}}},
		{"requests[1].request_id", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{ok(), ok()}}},
		{"requests[0].limit_id", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r"}}}},
		{"requests[0].window", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", Window: 7}}}},
		{"requests[0].demand_per_second", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", DemandPerSecond: math.NaN()}}}},
		{"requests[0].demand_per_second", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", DemandPerSecond: math.Inf(1)}}}},
		{"requests[0].demand_per_second", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", DemandPerSecond: -1}}}},
		{"requests[0].held_tokens", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", HeldTokens: -1}}}},
		{"requests[0].want_tokens", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", WantTokens: -1}}}},
		{"requests[0].want_tokens", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", WantTokens: vocab.MaxTokens + 1}}}},
		{"requests[0].held_tokens", &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t", HeldTokens: vocab.MaxTokens + 1}}}},
	} {
		_, err := alloc.AcquireLeases(ctx, tc.req)
		wantInvalid(t, err, tc.field)
	}
	for _, tc := range []struct {
		field string
		req   *pb.ReturnLeasesRequest
	}{
		{"returns", &pb.ReturnLeasesRequest{Region: "eu"}},
		{"returns[0].limit_id", &pb.ReturnLeasesRequest{Region: "eu", Returns: []*pb.LeaseReturn{{LeaseId: "1/eu/r"}}}},
		{"returns[0].lease_id", &pb.ReturnLeasesRequest{Region: "eu", Returns: []*pb.LeaseReturn{{LimitId: "t"}}}},
		{"returns[0].unspent", &pb.ReturnLeasesRequest{Region: "eu", Returns: []*pb.LeaseReturn{{LimitId: "t", LeaseId: "1/eu/r", Unspent: -1}}}},
	} {
		_, err := alloc.ReturnLeases(ctx, tc.req)
		wantInvalid(t, err, tc.field)
	}
	_, err := alloc.ReportUsage(ctx, &pb.ReportUsageRequest{Region: "eu", Reporter: "a1", Usage: []*pb.Usage{{LimitId: "t", Admitted: -1}}})
	wantInvalid(t, err, "usage[0].admitted")
	_, err = alloc.ReportUsage(ctx, &pb.ReportUsageRequest{Region: "eu"})
	wantInvalid(t, err, "reporter")

	// A return of more than the lease holds names the field too.
	l := validLimit() // spent in eu and us only
	l.Id = "tenant/r"
	l, err = a.PutLimit(ctx, l, Change{Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, l.Id, l.Version)
	res, err := alloc.AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r1", LimitId: l.Id, WantTokens: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = alloc.ReturnLeases(ctx, &pb.ReturnLeasesRequest{Region: "eu", Returns: []*pb.LeaseReturn{{LimitId: l.Id, LeaseId: res.Results[0].Lease.LeaseId, Unspent: 11}}})
	wantInvalid(t, err, "returns[0].unspent")
	// Unknown limits and regions are per-item answers, not call failures.
	res, err = alloc.AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "ap", Requests: []*pb.LeaseRequest{
		{RequestId: "x1", LimitId: "tenant/none"}, {RequestId: "x2", LimitId: l.Id}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Results[0].Code != pb.ItemCode_ITEM_CODE_NOT_FOUND || res.Results[1].Code != pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED {
		t.Fatalf("per-item codes: %v", res.Results)
	}
}

func TestFollowerNamesLeader(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "leader:7400")
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "follower:7400")
	alloc, _ := serve(t, b.Allocator)
	deadline := time.Now().Add(10 * time.Second)
	for b.Leader() != "leader:7400" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // waiting for the observer to see the leader
	}
	var trailer metadata.MD
	_, err := alloc.AcquireLeases(context.Background(), &pb.AcquireLeasesRequest{Region: "eu",
		Requests: []*pb.LeaseRequest{{RequestId: "r", LimitId: "t"}}}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("follower: %v, want Unavailable", err)
	}
	if got := trailer.Get(vocab.LeaderMetadataKey); len(got) != 1 || got[0] != "leader:7400" {
		t.Fatalf("trailer %v, want the leader's address", trailer)
	}
}

// FuzzAcquireDecode: any bytes decoded as a request and run through
// validation and, when valid, the core never panic, and a valid request's
// grants stay within the pool.
func FuzzAcquireDecode(f *testing.F) {
	seed, _ := proto.Marshal(&pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{
		{RequestId: "r1", LimitId: "tenant/a", DemandPerSecond: 10, HeldTokens: 5, WantTokens: 7},
		{RequestId: "r2", LimitId: "tenant/a", Window: pb.WindowChoice_WINDOW_CHOICE_NEXT}}})
	f.Add(seed)
	ret, _ := proto.Marshal(&pb.ReturnLeasesRequest{Region: "eu", Returns: []*pb.LeaseReturn{{LimitId: "tenant/a", LeaseId: "1/eu/r1", Unspent: 3}}})
	f.Add(ret)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := NewCore()
		c.SetLimit(testLimit("tenant/a", 100, time.Minute, 15*time.Second, "eu", "us"))
		req := &pb.AcquireLeasesRequest{}
		if proto.Unmarshal(b, req) == nil && ValidateAcquire(req) == nil {
			for _, r := range req.Requests {
				c.Acquire(t0, req.Region, AcquireRequest{RequestID: r.RequestId, Limit: r.LimitId,
					Next: r.Window == pb.WindowChoice_WINDOW_CHOICE_NEXT, Demand: r.DemandPerSecond, Held: r.HeldTokens, Want: r.WantTokens})
			}
			for _, w := range []int64{c.window0(), c.window0() + 1} {
				if st, ok := c.Stats("tenant/a", w); ok && st.Granted > 100 {
					t.Fatalf("granted %d > G", st.Granted)
				}
			}
		}
		rr := &pb.ReturnLeasesRequest{}
		if proto.Unmarshal(b, rr) == nil && ValidateReturn(rr) == nil {
			for _, r := range rr.Returns {
				if d, err := c.Return(t0, rr.Region, ReturnRequest{Limit: r.LimitId, LeaseID: r.LeaseId, Unspent: r.Unspent}); err == nil {
					c.Credit(d.Grant) // committed at once
				}
			}
		}
		ur := &pb.ReportUsageRequest{}
		if proto.Unmarshal(b, ur) == nil && ValidateReport(ur) == nil {
			for _, u := range ur.Usage {
				c.Report(t0, ur.Region, ur.Reporter, u)
			}
		}
		pl := &pb.PutLimitRequest{}
		if proto.Unmarshal(b, pl) == nil {
			_, _ = limitspec.ValidateLimit(pl.Limit, []string{"eu", "us"})
		}
	})
}

// TestRefusedLeaseCallLogBounded: an agent's call naming a region not its
// own is refused and logged; one naming a 4 MB region is refused as
// invalid before anything of it is logged or said back (it once wrote an
// 8.4 MB log line: the region, twice). Counted in bytes.
func TestRefusedLeaseCallLogBounded(t *testing.T) {
	c := etcdtest.Start(t, 1)
	var buf syncbuf.Buffer
	a, err := New(Config{Client: c.Client(t), Regions: []string{"eu", "us"}, Advertise: "a",
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(a, WithAuthRequired(true))
	huge := strings.Repeat("r", 4<<20)
	calls := map[string]func(region string) error{
		"SyncLimits": func(r string) error {
			_, err := srv.SyncLimits(as(agentEU), &pb.SyncLimitsRequest{Region: r})
			return err
		},
		"AcquireLeases": func(r string) error {
			_, err := srv.AcquireLeases(as(agentEU), &pb.AcquireLeasesRequest{Region: r})
			return err
		},
		"ReturnLeases": func(r string) error {
			_, err := srv.ReturnLeases(as(agentEU), &pb.ReturnLeasesRequest{Region: r})
			return err
		},
		"ReportUsage": func(r string) error {
			_, err := srv.ReportUsage(as(agentEU), &pb.ReportUsageRequest{Region: r})
			return err
		},
	}
	for name, call := range calls {
		err := call(huge)
		if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 200 {
			t.Errorf("%s with a 4 MB region: %v (%d bytes), want a short INVALID_ARGUMENT", name, status.Code(err), len(err.Error()))
		}
		if err := call("us"); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s of agent eu for us: %v, want PERMISSION_DENIED", name, err)
		}
	}
	logged := buf.String()
	if n := strings.Count(logged, "Allocator service call refused"); n != len(calls) {
		t.Errorf("%d refusals logged, want %d (those naming us)", n, len(calls))
	}
	if len(logged) > len(calls)*300 {
		t.Errorf("%d bytes logged for %d refusals: the huge region reached the log", len(logged), len(calls))
	}
}
