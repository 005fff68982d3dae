package regionagent

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"leasehold/allocator"
	"leasehold/lease"
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

func TestRenewalOneReplicaAtATime(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/one", 100000, time.Minute, 15*time.Second, "eu"))
	var inFlight, most, total atomic.Int64
	hook := func(start bool) {
		if !start {
			inFlight.Add(-1)
			return
		}
		total.Add(1)
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond) // widen the window in which a second renewer would overlap
	}
	agents := []*Agent{w.agent("eu", "r1"), w.agent("eu", "r2"), w.agent("eu", "r3")}
	ctx := context.Background()
	for _, a := range agents {
		a.onAcquire = hook
		a.Check(ctx, l.Id, 50) // each replica sees demand and wants to renew
	}
	var wg sync.WaitGroup
	for _, a := range agents {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					a.evaluate(ctx, l.Id)
					w.clock.Add(time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	if total.Load() == 0 {
		t.Fatal("nobody renewed")
	}
	if most.Load() != 1 {
		t.Fatalf("%d replicas asked the allocator at once", most.Load())
	}
}

// TestNextWindowFetchedAhead: near a window's end the agent holds a lease
// of the next window, spendable from the boundary, so traffic does not
// stall there. The only gap is the safety margin: the current lease ends a
// margin before the boundary and the next one starts at it (rounded up to
// the millisecond), so a Check inside [end - margin, end + 1ms] may be
// denied; anywhere else it must not be.
func TestNextWindowFetchedAhead(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/next", 6000, time.Minute, 15*time.Second, "eu"))
	a := w.agent("eu", "r1")
	ctx := context.Background()
	start := lease.WindowOf(w.clock.Now(), time.Minute)
	// Demand of 10/s through the window, renewing each 100 ms step.
	admitted, denied := 0, 0
	for now := w.clock.Now(); now.Before(start.End().Add(5 * time.Second)); now = w.clock.Now() {
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		} else if now.After(start.Start().Add(time.Second)) {
			denied++
			margin := a.opt.safetyMargin(15 * time.Second)
			if gap := now.Sub(start.End()); gap < -margin || gap > time.Millisecond {
				t.Errorf("denied at %v (window end at +60s)", now.Sub(start.Start()))
			}
		}
		a.evaluate(ctx, l.Id)
		w.clock.Add(100 * time.Millisecond)
	}
	next := start.Next().Index
	if st := w.stats(l.Id, next); st.Granted == 0 {
		t.Fatal("no lease granted for the next window")
	}
	t.Logf("admitted %d, denied %d across the boundary", admitted, denied)
}

// TestUsageReported: the regional counts a replica reports reach the
// allocator once, whichever replicas report them and however often.
func TestUsageReported(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/usage", 10, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 10
	l = w.putLimit(l)
	a1, a2 := w.agent("eu", "r1"), w.agent("eu", "r2")
	ctx := context.Background()
	a1.Check(ctx, l.Id, 1)
	a1.evaluate(ctx, l.Id)
	admitted, denied := int64(0), int64(0)
	for i := range 8 {
		d, _ := []*Agent{a1, a2}[i%2].Check(ctx, l.Id, 2)
		if d.Allowed {
			admitted += 2
		} else {
			denied += 2
		}
	}
	for range 3 {
		a1.report(ctx)
		a2.report(ctx)
	}
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	var got map[string]struct{ adm, den int64 }
	_ = w.alloc.View(func(_ time.Time, c *allocator.Core) {
		got = map[string]struct{ adm, den int64 }{}
		for r, u := range c.RegionUsage(l.Id, win) {
			got[r] = struct{ adm, den int64 }{u.Admitted, u.Denied}
		}
	})
	// The very first Check was denied before any lease (cost 1).
	if got["eu"].adm != admitted || got["eu"].den != denied+1 {
		t.Fatalf("allocator has eu %+v, Checks saw admitted %d denied %d (+1 cold)", got["eu"], admitted, denied)
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
	srv := NewServer(w.agent("eu", "fz"))
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
