package regionagent

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

// callCounter counts the allocator's gRPC calls by method (a server
// interceptor of the test's allocator).
type callCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *callCounter) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]]++
	c.mu.Unlock()
	return h(ctx, req)
}

func (c *callCounter) get(method string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

func (c *callCounter) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t int64
	for _, n := range c.n {
		t += n
	}
	return t
}

// putLimits creates n limits named fmt.Sprintf(format, i) in applies of 60.
func (w *world) putLimits(n int, format string, g int64, window, ttl time.Duration, regions ...string) []string {
	w.t.Helper()
	return w.putLimitsOf(n, format, func(id string) *pb.Limit { return limit(id, g, window, ttl, regions...) })
}

// putLimitsOf is putLimits with each limit made by mk from its id.
func (w *world) putLimitsOf(n int, format string, mk func(id string) *pb.Limit) []string {
	w.t.Helper()
	srv := allocator.NewServer(w.alloc)
	ids := make([]string, n)
	for i := 0; i < n; i += 60 {
		req := &pb.ApplyLimitsRequest{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}
		for j := i; j < min(n, i+60); j++ {
			ids[j] = fmt.Sprintf(format, j)
			l := mk(ids[j])
			req.Changes = append(req.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: l}})
		}
		if _, err := srv.ApplyLimits(context.Background(), req); err != nil {
			w.t.Fatal(err)
		}
	}
	return ids
}

// liveAgentOpts is liveAgent with options.
func (w *world) liveAgentOpts(region, replica string, opts ...Option) *Agent {
	w.t.Helper()
	a, _ := w.runAgent(region, replica, w.addr, nil, opts...)
	// The limits were created just now: wait for a sync that has them all.
	select {
	case <-a.Ready():
	case <-time.After(15 * time.Second):
		w.t.Fatal("agent never synced its limits")
	}
	return a
}

// runAgent starts an agent replica of region on the wall clock, its
// loops running, that calls the allocator at allocAddr; stop ends it (as
// the test's cleanup does, once). reg, if not nil, gets its metrics.
func (w *world) runAgent(region, replica, allocAddr string, reg prometheus.Registerer, opts ...Option) (a *Agent, stop func()) {
	w.t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis[region].Addr(), PoolSize: 64})
	a, err := New(Config{Region: region, Allocators: []string{allocAddr}, Redis: rdb, ReplicaID: replica,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, Logger: testLogger(), Registerer: reg}, opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; a.Close(); rdb.Close() }) }
	w.t.Cleanup(stop)
	return a, stop
}

// firstChecks makes one Check of each limit, callers at a time, and
// counts the answers by reason.
func firstChecks(t *testing.T, a *Agent, ids []string, callers int) map[pb.Reason]int64 {
	t.Helper()
	var next atomic.Int64
	var mu sync.Mutex
	got := map[pb.Reason]int64{}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(ids)) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				d, err := a.Check(ctx, ids[i], 1)
				cancel()
				if err != nil {
					t.Errorf("check %s: %v", ids[i], err)
					return
				}
				mu.Lock()
				got[d.Reason]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return got
}

// waitAllSynced waits until the agent knows every limit of ids.
func waitAllSynced(t testing.TB, a *Agent, ids []string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		_, ok := a.core.Limit(ids[len(ids)-1])
		a.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond) // polling the sync loop's effect
	}
	t.Fatal("the agent never synced the new limits")
}

// TestColdLimitsBatched: 5,000 limits nobody has used, first-checked
// concurrently by 64 callers against a real allocator: every Check is
// admitted (every pool is full, so none may be OVER_LIMIT), and the first
// leases of many limits share AcquireLeases calls: at most one call per 8
// limits. A first Check whose lease took longer than its 3 s cold wait
// says UNAVAILABLE, as it should: at a load average of 9, 47 of 5,000
// did. At most 2 % may, and each limit's second Check is admitted.
func TestColdLimitsBatched(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 limits on the wall clock")
	}
	var calls callCounter
	w := startWorldOpts(t, false, []grpc.ServerOption{grpc.ChainUnaryInterceptor(calls.intercept)}, "eu", "us")
	const n = 5000
	ids := w.putLimits(n, "tenant/cold-%05d", 1000, time.Minute, 30*time.Second, "eu", "us")
	// A first Check waits up to 3 s for its lease (default 500 ms): under
	// CI's load (-race, other packages' tests) some first leases took
	// longer, and their Checks were UNAVAILABLE, as they should be.
	a := w.liveAgentOpts("eu", "r1", WithColdWait(3*time.Second))
	waitAllSynced(t, a, ids)
	before := calls.get("AcquireLeases")
	start := time.Now()
	got := firstChecks(t, a, ids, 64)
	took := time.Since(start)
	acquires := calls.get("AcquireLeases") - before
	t.Logf("%d first Checks in %v (%.0f/s): %v; %d AcquireLeases calls (%.1f limits per call)",
		n, took, float64(n)/took.Seconds(), got, acquires, float64(n)/float64(max(1, acquires)))
	if got[pb.Reason_REASON_OK]+got[pb.Reason_REASON_UNAVAILABLE] != n || got[pb.Reason_REASON_UNAVAILABLE] > n/50 {
		t.Fatalf("answers %v: want all %d admitted (every pool is full), or at most 2 %% UNAVAILABLE", got, n)
	}
	if again := firstChecks(t, a, ids, 64); again[pb.Reason_REASON_OK] != n {
		t.Fatalf("second Checks %v: want all %d admitted", again, n)
	}
	if acquires > n/8 {
		t.Fatalf("%d AcquireLeases calls for %d cold limits: want at most one per 8 limits", acquires, n)
	}
}

// TestIdleCostFollowsTraffic: an agent on a real redis-server with 10,000
// limits, each used once and then left idle, sends no Redis command and no
// allocator call per second beyond a constant once its leases have run
// out: the limit sync (one SyncLimits a second, which also probes the
// allocator's health) and the failover watcher (one INFO replication a
// second), plus a Redis clock sync (5 TIME) every 30 s. Counted with
// Redis's INFO commandstats and the allocator's calls.
func TestIdleCostFollowsTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 limits on the wall clock: about 50 s")
	}
	var calls callCounter
	w := startWorldOpts(t, false, []grpc.ServerOption{grpc.ChainUnaryInterceptor(calls.intercept)}, "eu")
	const n = 10000
	window, ttl := 10*time.Second, 5*time.Second
	ids := w.putLimits(n, "tenant/idle-%05d", 100, window, ttl, "eu")
	// A first Check waits up to 4 s for its lease (the default is 500ms):
	// 10,000 at once on a loaded machine left 18 % UNAVAILABLE in a CI
	// run, and what is measured here is the cost once they are idle.
	a := w.liveAgentOpts("eu", "r1", WithColdWait(4*time.Second))
	waitAllSynced(t, a, ids)
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	defer rdb.Close()
	heap0, redis0 := heapInUse(), redisMemory(t, rdb)
	got := firstChecks(t, a, ids, 64)
	// What 10,000 active limits cost in memory (measured, not asserted):
	// Redis's used_memory, and the Go heap of this process, which holds
	// the test's allocator as well as the agent.
	heap1, redis1 := heapInUse(), redisMemory(t, rdb)
	t.Logf("%d active limits: Redis %d bytes per limit (used_memory %d -> %d), process heap %d bytes per limit (agent and allocator, %d -> %d)",
		n, (redis1-redis0)/n, redis0, redis1, (heap1-heap0)/n, heap0, heap1)
	// Every pool is full: none may be OVER_LIMIT. (A first Check that gets
	// no lease within its wait, which -race and a busy machine can cause
	// for some of 10,000 at once, says UNAVAILABLE; TestColdLimitsBatched
	// holds the first Checks to at most 2 % UNAVAILABLE and the second
	// ones to all admitted.)
	if got[pb.Reason_REASON_OVER_LIMIT] != 0 || got[pb.Reason_REASON_OK] < n*95/100 {
		t.Fatalf("answers %v: want no OVER_LIMIT and at least 95 %% of %d admitted", got, n)
	}
	used := time.Now()
	// The leases run out by their window's end; each window is reported
	// once more after it (2 s); the returns and reports of 10,000 limits
	// take a few seconds more.
	quiet := used.Add(2*window + 8*time.Second)
	time.Sleep(time.Until(quiet)) // waiting for the agent's own timers (wall clock)
	const span = 10 * time.Second
	r0, c0 := redisCalls(t, rdb), calls.total()
	time.Sleep(span) // the measured idle span
	r1, c1 := redisCalls(t, rdb), calls.total()
	redisRate := float64(r1-r0-1) / span.Seconds() // minus this test's own INFO
	allocRate := float64(c1-c0) / span.Seconds()
	a.mu.Lock()
	active, unreturned := a.core.Active(), a.core.Unreturned()
	a.mu.Unlock()
	t.Logf("idle with %d limits used once: %.2f Redis commands/s, %.2f allocator calls/s (SyncLimits %d); "+
		"state kept for %d limits, %d returns unacknowledged", n, redisRate, allocRate, calls.get("SyncLimits"), active, unreturned)
	if redisRate > 2 || allocRate > 1.5 {
		t.Fatalf("idle cost %.2f Redis commands/s and %.2f allocator calls/s: want at most 2 and 1.5 (the sync, the failover watcher, the clock sync), whatever the number of limits",
			redisRate, allocRate)
	}
	if unreturned != 0 {
		t.Fatalf("%d returns still unacknowledged", unreturned)
	}
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// redisMemory is Redis's used_memory (INFO memory).
func redisMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

// redisCalls sums the calls of every command Redis has run (INFO
// commandstats).
func redisCalls(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		total += n
	}
	return total
}
