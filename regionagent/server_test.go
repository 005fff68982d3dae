package regionagent

import (
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

func serveAgent(t testing.TB, a *Agent) pb.RegionAgentClient {
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	NewServer(a).Register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRegionAgentClient(conn)
}

func TestCheckStatusCodes(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/codes", 100, time.Minute, 15*time.Second, "eu"))
	cl := serveAgent(t, w.agent("eu", "r1"))
	ctx := context.Background()
	for _, tc := range []struct {
		req   *pb.CheckRequest
		code  codes.Code
		field string
	}{
		{&pb.CheckRequest{}, codes.InvalidArgument, "limit_id"},
		{&pb.CheckRequest{LimitId: l.Id, Cost: -3}, codes.InvalidArgument, "cost"},
		{&pb.CheckRequest{LimitId: l.Id, Cost: 101}, codes.InvalidArgument, "cost"},
		{&pb.CheckRequest{LimitId: l.Id, RequestId: strings.Repeat("x", 129)}, codes.InvalidArgument, "request_id"},
		{&pb.CheckRequest{LimitId: "tenant/nope"}, codes.NotFound, "limit_id"},
	} {
		_, err := cl.Check(ctx, tc.req)
		st, _ := status.FromError(err)
		if st.Code() != tc.code || !strings.HasPrefix(st.Message(), tc.field+":") {
			t.Errorf("Check(%v) = %v %q, want %v naming %s", tc.req, st.Code(), st.Message(), tc.code, tc.field)
		}
	}
	_, err := cl.CheckMulti(ctx, &pb.CheckMultiRequest{Checks: []*pb.CheckRequest{{LimitId: l.Id}, {LimitId: l.Id, Cost: 500}}})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "checks[1].cost:") {
		t.Errorf("CheckMulti: %v", err)
	}
	// A valid check of a cold limit answers (OVER_LIMIT until the first
	// lease: the harness does not wait for one).
	resp, err := cl.Check(ctx, &pb.CheckRequest{LimitId: l.Id})
	if err != nil || resp.LimitTokens != 100 || resp.Window.AsDuration() != time.Minute || resp.LimitVersion != l.Version {
		t.Errorf("valid check: %v %v", resp, err)
	}
}

// FuzzCheckDecode: any bytes decoded as a Check or CheckMulti request never
// panic the agent; failures are InvalidArgument or NotFound.
func FuzzCheckDecode(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.CheckRequest{LimitId: "tenant/f", Cost: 1},
		&pb.CheckRequest{LimitId: "tenant/f", Cost: -1, RequestId: "x"},
		&pb.CheckMultiRequest{Checks: []*pb.CheckRequest{{LimitId: "tenant/f"}, {LimitId: "nope", Cost: 3}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	w := newWorld(f, "eu")
	w.putLimit(limit("tenant/f", 100, time.Minute, 15*time.Second, "eu"))
	// An unknown limit is NOT_FOUND once the lookup wait is over (this
	// agent runs no sync to end it sooner): 1 ms, not the default second,
	// or the fuzzer makes a call a second.
	srv := NewServer(w.agent("eu", "fz", WithLookupWait(time.Millisecond)))
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		check := func(err error) {
			if c := status.Code(err); err != nil && c != codes.InvalidArgument && c != codes.NotFound {
				t.Fatalf("unexpected %v", err)
			}
		}
		cr := &pb.CheckRequest{}
		if proto.Unmarshal(b, cr) == nil {
			_, err := srv.Check(ctx, cr)
			check(err)
		}
		mr := &pb.CheckMultiRequest{}
		if proto.Unmarshal(b, mr) == nil {
			_, err := srv.CheckMulti(ctx, mr)
			check(err)
		}
	})
}

// TestToProtoDurations: the answer made in one allocation carries the
// same durations durationpb.New makes, at the edges of their range too,
// each in a message of its own.
func TestToProtoDurations(t *testing.T) {
	for _, d := range []time.Duration{0, 1, -1, 999_999_999, -999_999_999, 1500 * time.Millisecond, -1500 * time.Millisecond,
		time.Hour, math.MaxInt64, math.MinInt64} {
		got := toProto(Decision{Allowed: true, Remaining: 7, RetryAfter: d, ResetAfter: -d, Window: d / 2, Limit: 9, Version: 3})
		want := &pb.CheckResponse{Allowed: true, Remaining: 7, RetryAfter: durationpb.New(d), ResetAfter: durationpb.New(-d),
			Window: durationpb.New(d / 2), LimitTokens: 9, LimitVersion: 3}
		if !proto.Equal(got, want) {
			t.Errorf("%v: toProto = %v, want %v", d, got, want)
		}
		if got.RetryAfter == got.ResetAfter || got.ResetAfter == got.Window {
			t.Errorf("%v: two durations share a message", d)
		}
	}
}
