package regionagent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// cutDialer connects an agent to the allocator until it is cut: then it
// closes the open connections and refuses new ones, until healed.
type cutDialer struct {
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func (c *cutDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return nil, errors.New("partitioned")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cutDialer) set(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	if down {
		for _, conn := range c.conns {
			conn.Close()
		}
		c.conns = nil
	}
}

// TestReturnSentAgainAfterPartition: a lease that expires while the
// allocator is unreachable is closed in Redis at once, but its return
// cannot be sent; it is sent when the allocator answers again, and its
// unspent tokens go back to the still-open window's pool.
func TestReturnSentAgainAfterPartition(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/ret", 100, time.Minute, 10*time.Second, "eu")
	l.Lease.MinChunk = 60
	a, cut := w.leasedCutAgent(l, 8)
	ctx := context.Background()
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	granted := w.stats(l.Id, win).Granted
	if granted < 8 {
		t.Fatalf("granted %d, want a lease of at least 8", granted)
	}

	cut.set(true)
	w.clock.Add(11 * time.Second) // the lease expires during the partition
	a.evaluate(ctx, l.Id)
	if st := w.stats(l.Id, win); st.Credited != 0 {
		t.Fatalf("credited %d while partitioned", st.Credited)
	}
	a.mu.Lock()
	kept := a.core.UnreturnedOf(l.Id)
	a.mu.Unlock()
	if len(kept) != 1 || kept[0].Unspent != granted-8 {
		t.Fatalf("returns kept to send again: %v, want one of %d unspent", kept, granted-8)
	}

	cut.set(false)
	// The circuit breaker may hold calls back for its cooldown (on the
	// agent's clock): step past it, still inside the window. (Later
	// evaluations lease again and return surpluses of their own: the
	// first lease's grant record is what must show the return.)
	var g allocator.Grant
	w.untilHealed(a, l.Id, func() bool {
		g = w.grant(kept[0].LeaseID)
		return g.Returned
	})
	if !g.Returned || g.Unspent != granted-8 || g.Credited != granted-8 {
		t.Fatalf("the lease after the heal: returned %v, unspent %d, credited %d; want %d unspent and credited",
			g.Returned, g.Unspent, g.Credited, granted-8)
	}
	a.mu.Lock()
	pending := len(a.core.UnreturnedOf(l.Id))
	a.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d returns still kept after the allocator acknowledged them", pending)
	}
}

// grant reads a lease's grant record from etcd.
func (w *world) grant(leaseID string) allocator.Grant {
	w.t.Helper()
	resp, err := w.alloc.Store().Client().Get(context.Background(), "/leasehold/grants/", clientv3.WithPrefix())
	if err != nil {
		w.t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		var g allocator.Grant
		if err := json.Unmarshal(kv.Value, &g); err != nil {
			w.t.Fatalf("grant record %s: %v", kv.Key, err)
		}
		if g.LeaseID == leaseID {
			return g
		}
	}
	w.t.Fatalf("no grant record of lease %s", leaseID)
	return allocator.Grant{}
}

// TestFallbackModesWhilePartitioned: cut off from the allocator with its
// lease spent, the agent applies the limit's fail mode and exports it:
// closed denies with UNAVAILABLE, local:A admits A tokens in the window
// and no more, open admits; once the allocator answers again, it leases
// and the exported mode goes away.
func TestFallbackModesWhilePartitioned(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fb      *pb.Fallback
		mode    pb.Mode
		admits  int // of 20 Checks while partitioned
		reason  pb.Reason
		exports float64
	}{
		{"closed", &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}, pb.Mode_MODE_STRICT, 0, pb.Reason_REASON_UNAVAILABLE, 1},
		{"local:5", &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 5}, pb.Mode_MODE_BOUNDED, 5, pb.Reason_REASON_FALLBACK, 2},
		{"open", &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}, pb.Mode_MODE_BOUNDED, 20, pb.Reason_REASON_FALLBACK, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "eu")
			l := limit("tenant/fb", 10, time.Minute, 10*time.Second, "eu")
			l.Mode, l.Fallback = tc.mode, map[string]*pb.Fallback{"eu": tc.fb}
			l.Lease.MaxChunk = 3
			a, cut := w.leasedCutAgent(l, 1)
			ctx := context.Background()
			cut.set(true)
			// Spend what the held lease has left (chunks of 3): then the
			// region is dry, and undecided (UNAVAILABLE, briefly) until a
			// renewal finds the allocator unreachable.
			for i := 0; ; i++ {
				d, _ := a.Check(ctx, l.Id, 1)
				if d.Reason == pb.Reason_REASON_UNAVAILABLE && d.RetryAfter <= 100*time.Millisecond {
					break
				}
				if !d.Allowed || i == 3 {
					t.Fatalf("spending the held lease: %+v after %d", d, i)
				}
			}
			a.evaluate(ctx, l.Id)
			var admitted int
			for range 20 {
				d, _ := a.Check(ctx, l.Id, 1)
				if d.Allowed {
					admitted++
				}
				if d.Reason != tc.reason && !(d.Reason == pb.Reason_REASON_OVER_LIMIT && tc.admits < 20) {
					t.Fatalf("partitioned: reason %v, want %v", d.Reason, tc.reason)
				}
			}
			if admitted != tc.admits {
				t.Fatalf("admitted %d of 20 under the fail mode, want %d", admitted, tc.admits)
			}
			a.settle(ctx) // what the Checks made ready (the work loop does it at once)
			if got := testutil.ToFloat64(a.m.fallbackMode.WithLabelValues(l.Id)); got != tc.exports {
				t.Fatalf("exported mode %v, want %v", got, tc.exports)
			}

			cut.set(false)
			w.untilHealed(a, l.Id, func() bool {
				d, _ := a.Check(ctx, l.Id, 1)
				return d.Allowed && d.Reason == pb.Reason_REASON_OK
			})
			if d, _ := a.Check(ctx, l.Id, 1); d.Reason != pb.Reason_REASON_OK && d.Reason != pb.Reason_REASON_OVER_LIMIT {
				t.Fatalf("healed: reason %v, want leases again", d.Reason)
			}
			if n := testutil.CollectAndCount(a.m.fallbackMode); n != 0 {
				t.Fatalf("%d fail modes still exported after the heal", n)
			}
		})
	}
}

// leasedCutAgent stores l, starts a cutAgent one second into the window,
// has it lease and admits n Checks of cost 1 from the lease.
func (w *world) leasedCutAgent(l *pb.Limit, n int) (*Agent, *cutDialer) {
	w.t.Helper()
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	cut := &cutDialer{}
	a := w.cutAgent(cut)
	ctx := context.Background()
	a.Check(ctx, l.Id, 1) // cold: asks for the first lease
	a.evaluate(ctx, l.Id)
	for range n {
		if d, _ := a.Check(ctx, l.Id, 1); !d.Allowed {
			w.t.Fatal("denied with a lease")
		}
	}
	return a, cut
}

// untilHealed runs renewal rounds of a after its link came back, until
// done reports true: the agent's clock moves 1 s a round (the circuit
// breaker's cooldown runs on it; at most 40 s, so the window stays open),
// and the rounds are bounded in real time too (gRPC's reconnection).
func (w *world) untilHealed(a *Agent, limit string, done func() bool) {
	w.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 40 && time.Now().Before(deadline); i++ {
		w.clock.Add(time.Second)
		a.evaluate(ctx, limit)
		if done() {
			return
		}
	}
}

// cutAgent is an agent replica of eu that reaches the allocator through
// cut, stepped by hand like world.agent's, with short allocator timeouts.
func (w *world) cutAgent(cut *cutDialer) *Agent {
	w.t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	w.t.Cleanup(func() { rdb.Close() })
	a, err := New(Config{Region: "eu", Allocators: []string{w.addr}, Redis: rdb, ReplicaID: "r1", Logger: testLogger(),
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(cut.dial),
			// Reconnect quickly once healed (gRPC's backoff is real time).
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: time.Second,
				Backoff: grpcbackoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}})}},
		WithClock(w.clock.Now), WithRedisClock(w.clock.Now), WithColdWait(0),
		WithTimeouts(200*time.Millisecond, 500*time.Millisecond, 2*time.Second))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(a.Close)
	w.sync(a)
	return a
}
