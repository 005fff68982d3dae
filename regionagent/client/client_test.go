package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client/clienttest"
)

func TestAllowAsksTheAgent(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 2, 10*time.Second, time.Second) })
	for i, want := range []struct {
		allowed bool
		reason  pb.Reason
		src     Source
	}{
		{true, pb.Reason_REASON_OK, SourceAgent},
		{true, pb.Reason_REASON_OK, SourceAgent},
		{false, pb.Reason_REASON_OVER_LIMIT, SourceAgent},
		{false, pb.Reason_REASON_OVER_LIMIT, SourceDenialCache},
	} {
		d := r.allow(1)
		if d.Allowed != want.allowed || d.Reason != want.reason || d.Source != want.src {
			t.Fatalf("call %d: %+v, want %+v", i, d, want)
		}
		if d.Limit != 2 || d.Window != 10*time.Second || d.Version < 1 || d.ID.IsZero() || len(d.ID.String()) != 32 {
			t.Fatalf("call %d: limit fields or id: %+v", i, d)
		}
	}
	if checks, _, _ := r.agent.Calls(); checks != 3 {
		t.Fatalf("%d Checks reached the agent, want 3", checks)
	}
}

func TestAllowInvalid(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	if _, err := r.c.Allow(ctx, "", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty limit: %v", err)
	}
	if _, err := r.c.Allow(ctx, testLimit, -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative cost: %v", err)
	}
	if _, err := r.c.Allow(ctx, testLimit, 1001); !errors.Is(err, ErrInvalid) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("cost above G: %v", err)
	}
	if _, err := r.c.Allow(ctx, "tenant/none", 1); !errors.Is(err, ErrUnknownLimit) {
		t.Errorf("unknown limit: %v", err)
	}
	if err := r.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Allow(ctx, testLimit, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// A Check is a debit: after a timeout or an Unavailable it is not sent
// again.
func TestCheckNeverRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		hook func(ctx context.Context, _ *pb.CheckRequest) error
	}{
		{"timeout", func(ctx context.Context, _ *pb.CheckRequest) error { <-ctx.Done(); return ctx.Err() }},
		{"unavailable", func(context.Context, *pb.CheckRequest) error { return status.Error(codes.Unavailable, "overloaded") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(a *clienttest.Agent) { a.BeforeCheck = tc.hook }, WithTimeout(50*time.Millisecond))
			d, err := r.c.Allow(context.Background(), testLimit, 1)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err %v, want ErrUnavailable", err)
			}
			if d.Allowed || d.Reason != pb.Reason_REASON_UNAVAILABLE || d.ID.IsZero() {
				t.Fatalf("decision with the error: %+v", d)
			}
			if checks, _, _ := r.agent.Calls(); checks != 1 {
				t.Fatalf("%d Checks reached the agent, want exactly 1", checks)
			}
		})
	}
}

func TestAllowMulti(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit("tenant/b", 1, 10*time.Second, time.Second) })
	ctx := context.Background()
	items := []Item{{testLimit, 1}, {"tenant/b", 1}}
	ds, err := r.c.AllowMulti(ctx, items)
	if err != nil || len(ds) != 2 || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("first: %+v %v", ds, err)
	}
	ds, err = r.c.AllowMulti(ctx, items)
	if err != nil || ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("second: %+v %v", ds, err)
	}
	if w := r.agent.Window(testLimit, t0.UnixNano()/int64(10*time.Second)); w.CheckAdmitted != 1 {
		t.Fatalf("the denied multi charged %s: admitted %d", testLimit, w.CheckAdmitted)
	}
	// A cached denial of one limit answers the multi locally.
	if d := r.allowLimit("tenant/b"); d.Allowed {
		t.Fatal("tenant/b admitted")
	}
	before, _, _ := r.agent.Calls()
	ds, err = r.c.AllowMulti(ctx, items)
	if after, _, _ := r.agent.Calls(); err != nil || ds[0].Allowed || ds[0].Source != SourceDenialCache || after != before {
		t.Fatalf("cached: %+v %v (checks %d -> %d)", ds, err, before, after)
	}
}

func (r *rig) allowLimit(limit string) Decision {
	r.t.Helper()
	d, err := r.c.Allow(context.Background(), limit, 1)
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

// TestConcurrentAllow hammers one hot limit from many goroutines on the
// real clock (for the race detector): what the client admits never
// exceeds what the agent handed out.
func TestConcurrentAllow(t *testing.T) {
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit(testLimit, 5000, time.Second, 300*time.Millisecond)
	target, dialer := ag.Serve(t)
	c, err := New(target, WithDialOptions(dialer), WithSubLeases(SubLeaseConfig{HotRate: 10, Horizon: 50 * time.Millisecond, IdleAfter: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1_000_000 && time.Now().Before(stop); i++ {
				cost := 1 + rand.Int64N(2)
				d, err := c.Allow(context.Background(), testLimit, cost)
				if err == nil && d.Allowed {
					admitted.Add(cost)
				}
				if i%64 == 0 {
					time.Sleep(100 * time.Microsecond) // pacing the load, not ordering
				}
			}
		}()
	}
	wg.Wait()
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var handed int64
	for _, w := range ag.Windows(testLimit) {
		handed += ag.Window(testLimit, w).Admitted()
	}
	if admitted.Load() == 0 || admitted.Load() > handed {
		t.Fatalf("client admitted %d tokens, agent handed out %d", admitted.Load(), handed)
	}
}
