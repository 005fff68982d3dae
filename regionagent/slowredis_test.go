package regionagent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"leasehold/internal/faulttest"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

// TestSlowRedisNoFalseOverLimit: a region's Redis turns slow under load
// (a proxy on loopback holds every chunk 150 ms each way, so each call
// misses the agent's 100 ms Redis timeout, yet every command still
// reaches redis-server and runs there): the agent trips its Redis breaker
// and serves from in-process leases, while the shared bucket still holds
// unspent tokens of the window that the allocator counts as granted. The
// in-process leases take the rest of the pool. The region has then not
// spent what it was granted, so the agent must not say OVER_LIMIT (a
// gateway's denial cache would hold it to the window's end): it says
// UNAVAILABLE. When Redis is fast again the region spends the rest, and
// OVER_LIMIT comes only once what the region's stores admitted is G.
// Admitted never exceeds G (strict).
func TestSlowRedisNoFalseOverLimit(t *testing.T) {
	const G = 600
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/slow", G, time.Minute, 15*time.Second, "eu"))
	w.clock.Add(time.Second)
	proxy := faulttest.NewProxy(t, w.redis["eu"].Addr())
	// As ParseRedis makes it: the call's deadline reaches the socket.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	a := w.agentOn(rdb, "eu", "r1", nil, WithColdWait(2*time.Second),
		WithTimeouts(2*time.Second, 5*time.Second, 100*time.Millisecond))
	runWork(t, a)
	// The test reads the bucket past the proxy.
	direct := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	t.Cleanup(func() { direct.Close() })
	bk := bucket.New(direct)
	ctx := context.Background()
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	key := bucket.Key("", l.Id, win)
	// regionAdmitted is what the region's stores admitted in the window:
	// the shared bucket's count (a spend that timed out may still have run
	// there) and what this replica admitted in process.
	regionAdmitted := func() int64 {
		t.Helper()
		b, err := bk.Balance(ctx, key, w.clock.Now().UnixMilli())
		if err != nil {
			t.Fatal(err)
		}
		return b.Admitted + int64(testutil.ToFloat64(a.lm.admitted))
	}

	var answered, admitted, over, unavailable atomic.Int64
	var firstOver atomic.Pointer[Decision]
	check := func() Decision {
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil {
			t.Errorf("check: %v", err)
			return d
		}
		answered.Add(1)
		switch {
		case d.Allowed:
			admitted.Add(1)
		case d.Reason == pb.Reason_REASON_OVER_LIMIT:
			over.Add(1)
			firstOver.CompareAndSwap(nil, &d)
		case d.Reason == pb.Reason_REASON_UNAVAILABLE:
			unavailable.Add(1)
		}
		return d
	}

	// 1. Redis answers: 100 admitted from the shared bucket, which then
	// holds the rest of its lease.
	for i := 0; admitted.Load() < 100; i++ {
		if i == 1000 {
			t.Fatalf("admitted %d of 100 in 1000 Checks with Redis answering", admitted.Load())
		}
		check()
	}
	if over.Load() != 0 {
		t.Fatalf("OVER_LIMIT with Redis answering and %d admitted of G = %d", admitted.Load(), G)
	}
	b0, err := bk.Balance(ctx, key, w.clock.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	if b0.Spendable == 0 {
		t.Fatalf("the shared bucket holds nothing unspent after 100 admitted (%+v): nothing to strand", b0)
	}

	// 2. Redis slow: every call misses the timeout. Four callers keep
	// checking until the agent serves in process, the allocator's pool is
	// empty and 40 Checks were refused after that, each caller at most 1,500
	// Checks and 20 s.
	proxy.SetDelay(150 * time.Millisecond)
	var stop atomic.Bool
	var refusedDry atomic.Int64
	var wg sync.WaitGroup
	until := time.Now().Add(20 * time.Second)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1500 && !stop.Load() && time.Now().Before(until); i++ {
				d := check()
				if !d.Allowed && a.rh.isDown() && w.pool(l.Id, win) == 0 && refusedDry.Add(1) >= 40 {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if !a.rh.isDown() {
		t.Fatalf("Redis never marked down with every call over the timeout (%d answered)", answered.Load())
	}
	if !stop.Load() {
		t.Fatalf("the pool was never taken in process: pool %d, %d answered, %d admitted",
			w.pool(l.Id, win), answered.Load(), admitted.Load())
	}
	slowOver, slowAdmitted := over.Load(), regionAdmitted()
	t.Logf("Redis slow: %d answered, %d admitted by the test's count, %d by the stores', %d OVER_LIMIT, %d UNAVAILABLE",
		answered.Load(), admitted.Load(), slowAdmitted, slowOver, unavailable.Load())
	if slowAdmitted >= G {
		t.Fatalf("the region admitted %d with its Redis slow, G = %d: the stranded tokens were spent", slowAdmitted, G)
	}
	if slowOver != 0 {
		d := firstOver.Load()
		t.Errorf("%d OVER_LIMIT answered while the region had admitted %d < G = %d (its Redis bucket holds unspent "+
			"tokens); the first retry_after %v", slowOver, slowAdmitted, G, d.RetryAfter)
	}

	// 3. Redis fast again: the agent goes back to the shared bucket and the
	// region spends the rest of the window; its first OVER_LIMIT comes
	// when its stores admitted G.
	proxy.SetDelay(0)
	for i := 0; a.rh.isDown(); i++ {
		if i == 20 {
			t.Fatal("Redis answers again but 20 probes failed")
		}
		_ = a.probeRedis(ctx) // a probe may meet a connection the slow calls left
	}
	over.Store(0)
	firstOver.Store(nil)
	var last Decision
	for i := 0; i < 4*G && over.Load() == 0; i++ {
		last = w.checkAdvancing(t, a, l.Id)
		switch {
		case last.Allowed:
			admitted.Add(1)
		case last.Reason == pb.Reason_REASON_OVER_LIMIT:
			over.Add(1)
		}
	}
	if over.Load() == 0 {
		t.Fatalf("the window never ran dry after Redis came back (%d admitted by the test's count)", admitted.Load())
	}
	got := regionAdmitted()
	if got != G {
		t.Errorf("OVER_LIMIT (retry_after %v) with the region's stores at %d admitted, want G = %d", last.RetryAfter, got, G)
	}
	if n := admitted.Load(); n > G {
		t.Errorf("admitted %d > G = %d", n, G)
	}
	st := w.stats(l.Id, win)
	if st.Granted-st.Credited > G {
		t.Errorf("granted %d - credited %d > G", st.Granted, st.Credited)
	}
	t.Logf("after Redis came back: OVER_LIMIT at %d admitted by the stores (%d by the test's count); granted %d, credited %d",
		got, admitted.Load(), st.Granted, st.Credited)
}
