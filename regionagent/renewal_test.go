package regionagent

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"leasehold/lease"
)

func TestRenewalOneReplicaAtATime(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/one", 100000, time.Minute, 15*time.Second, "eu"))
	var inFlight, most, total atomic.Int64
	// Counts the AcquireLeases calls in flight, over every replica.
	count := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasSuffix(method, "/AcquireLeases") {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		total.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond) // widen the window in which a second renewer would overlap
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	dial := []grpc.DialOption{count}
	agents := []*Agent{w.agentDial("eu", "r1", dial), w.agentDial("eu", "r2", dial), w.agentDial("eu", "r3", dial)}
	ctx := context.Background()
	for _, a := range agents {
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
		a.tick(ctx) // timed work only: rounds come from the Checks and the timers
		w.clock.Add(100 * time.Millisecond)
	}
	next := start.Next().Index
	if st := w.stats(l.Id, next); st.Granted == 0 {
		t.Fatal("no lease granted for the next window")
	}
	t.Logf("admitted %d, denied %d across the boundary", admitted, denied)
}
