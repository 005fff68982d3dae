package regionagent

import (
	"context"
	"errors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// fakeClock is one clock for the allocator, the agents and Redis's
// scripts, moved only by the test. It starts one to two hours ahead of
// the wall clock, so Redis key expiries (on Redis's real clock) stay in
// the future, and on a whole hour, so a test's minute and hour windows
// start with it whatever the time of day: a test that ran into the last
// minute of an hour window (a lease sized to what is left of it) passed
// or failed by the minute CI ran it.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().Truncate(time.Hour).Add(2 * time.Hour).UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// world is an allocator on embedded etcd, serving gRPC on loopback, and a
// real redis-server per region.
type world struct {
	t     testing.TB
	clock *fakeClock
	alloc *allocator.Allocator
	addr  string
	redis map[string]*redistest.Server

	// agents are the world's agents, for its stuck-Check watch
	// (watchStuckChecks); driving counts the test's helpers that move the
	// clock while Checks wait themselves (checkAdvancing,
	// moveClockWhileWaiting), while the watch stands aside.
	agentsMu sync.Mutex
	agents   []*Agent
	driving  atomic.Int32
	rescued  atomic.Int64 // ns the watch moved the clock, for the tests' logs
	// waitsMu protects waits: the Checks that began a wait since the
	// watch last looked, with the real time of the last (nil: no watch).
	waitsMu sync.Mutex
	waits   map[*core.Check]sawWait
}

// sawWait is when a Check last began a wait, and on which limit.
type sawWait struct {
	at    time.Time
	limit string
}

// observeWait is the world's agents' wait observer (withWaitObserver),
// called on the Check's own goroutine.
func (w *world) observeWait(chk *core.Check) {
	limit := ""
	if len(chk.Keys) > 0 {
		limit = chk.Keys[0].Limit
	}
	w.waitsMu.Lock()
	if w.waits != nil {
		w.waits[chk] = sawWait{time.Now(), limit}
	}
	w.waitsMu.Unlock()
}

func newWorld(t testing.TB, regions ...string) *world {
	t.Helper()
	return startWorld(t, true, regions...)
}

// startWorld starts a world on the fake clock, or (fake false) on the
// wall clock for benchmarks.
func startWorld(t testing.TB, fake bool, regions ...string) *world {
	return startWorldOpts(t, fake, nil, regions...)
}

// startWorldOpts is startWorld with options for the allocator's gRPC server.
func startWorldOpts(t testing.TB, fake bool, serverOpts []grpc.ServerOption, regions ...string) *world {
	return startWorldWith(t, fake, serverOpts, nil, regions...)
}

// startWorldWith is startWorldOpts with options for the allocator.
func startWorldWith(t testing.TB, fake bool, serverOpts []grpc.ServerOption, allocOpts []allocator.Option, regions ...string) *world {
	w := &world{t: t, clock: newFakeClock(), redis: map[string]*redistest.Server{}}
	c := etcdtest.Start(t, 1)
	clock := allocator.WithClock(w.clock.Now)
	if !fake {
		w.clock = nil
		clock = allocator.WithClock(time.Now)
	}
	a, err := allocator.New(allocator.Config{Client: c.Client(t), Regions: regions, Advertise: "alloc",
		Logger: slog.New(slog.DiscardHandler)}, append([]allocator.Option{clock}, allocOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	allocatortest.WaitLeader(t, a)
	w.alloc, w.addr = a, allocatortest.Serve(t, nil, allocator.NewServer(a), serverOpts...)
	for _, r := range regions {
		w.redis[r] = redistest.Start(t)
	}
	if fake {
		w.watchStuckChecks()
	}
	return w
}

// stuckAfter is how long, in real time, one Check may wait on a world's
// standing clock before the world moves the clock for it.
const stuckAfter = time.Second

// watchStuckChecks moves the world's clock at real speed while any of its
// agents has a Check that has waited longer than stuckAfter in real time,
// until the test ends. A Check waits on the agent's clock for what the
// core scheduled on it: a renewal retried after a lost Redis or
// allocator call, another replica's renewal lock looked at again 50 ms
// later. In a world whose clock only the test moves, that time never
// comes, and a Check made with no deadline of its own (most of these
// tests') would hang the package until go test's timeout. A Check that
// waits briefly (a first lease from the allocator) never sees the clock
// move: only one stuck for a second does, and then by about the real time
// it is stuck, so it cannot carry a test far into its next window. Each
// move is logged, so a test that depends on one shows it.
func (w *world) watchStuckChecks() {
	w.waits = map[*core.Check]sawWait{}
	done, stopped := make(chan struct{}), make(chan struct{})
	var first atomic.Pointer[string] // the first stuck Check, for the log
	go func() {
		defer close(stopped)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		// The real time each waiting Check was first seen waiting. A
		// Check waiting on the agent's clock wakes and waits again (a
		// new waiter) every few ms of real time: it is kept by its Check.
		// Between two waits it spends, or looks at its bucket, for a few
		// ms: it is forgotten only once not seen waiting for 100 ms. A
		// Check is seen waiting while it is among its agent's waiters,
		// and when it began a wait since the last look (observeWait): one
		// waiting for a moment a hair ahead of the standing clock wakes
		// at once and spends again, thousands of times a second, and is
		// hardly ever found among the waiters.
		since, lastSeen := map[*core.Check]time.Time{}, map[*core.Check]time.Time{}
		see := func(chk *core.Check, at, now time.Time) bool {
			if at.After(lastSeen[chk]) {
				lastSeen[chk] = at
			}
			first, ok := since[chk]
			if !ok {
				since[chk] = at
				return false
			}
			return now.Sub(first) >= stuckAfter
		}
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			now := time.Now()
			step := now.Sub(last)
			last = now
			w.agentsMu.Lock()
			agents := slices.Clone(w.agents)
			w.agentsMu.Unlock()
			stuck := ""
			w.waitsMu.Lock()
			for chk, sw := range w.waits {
				if see(chk, sw.at, now) {
					stuck = "a Check of " + sw.limit
				}
			}
			clear(w.waits)
			w.waitsMu.Unlock()
			for _, a := range agents {
				a.mu.Lock()
				for id, ws := range a.waiters {
					for _, wt := range ws {
						if see(wt.chk, now, now) {
							stuck = a.ReplicaID() + ": " + id
						}
					}
				}
				a.mu.Unlock()
			}
			for chk, at := range lastSeen {
				if now.Sub(at) > 100*time.Millisecond {
					delete(since, chk)
					delete(lastSeen, chk)
				}
			}
			if stuck != "" && w.driving.Load() == 0 {
				w.clock.Add(step)
				if w.rescued.Add(int64(step)) == int64(step) {
					first.Store(&stuck)
				}
			}
		}
	}()
	// Logged at the end only: a fuzz test's world may not log from inside
	// its target.
	w.t.Cleanup(func() {
		close(done)
		<-stopped
		if d := time.Duration(w.rescued.Load()); d > 0 {
			w.t.Logf("a Check waited over %v on the standing clock (first %s): the world's clock was moved %v in all, "+
				"at real speed while one did", stuckAfter, *first.Load(), d)
		}
	})
}

// putLimit stores a limit and waits until the allocator's leader applies it.
func (w *world) putLimit(l *pb.Limit) *pb.Limit {
	w.t.Helper()
	// A write that timed out (etcd slow under CI's load) is made again:
	// putting the same limit twice is the same limit, a version later.
	var got *pb.Limit
	var err error
	for try := 0; try < 3; try++ {
		got, err = w.alloc.PutLimit(context.Background(), l, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
		if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Unavailable && !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	if err != nil {
		w.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = w.alloc.View(func(_ time.Time, c *allocator.Core) {
			v, found := c.Limit(got.Id)
			ok = found && v.Version == got.Version
		})
		if ok {
			return got
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	w.t.Fatalf("limit %s never reached the leader", got.Id)
	return nil
}

func limit(id string, g int64, window, ttl time.Duration, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(window), Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}
}

// agent returns an agent replica of region on the world's clock, synced
// and ready, whose background loops do NOT run: tests step it by hand.
func (w *world) agent(region, replica string, opts ...Option) *Agent {
	w.t.Helper()
	return w.agentDial(region, replica, nil, opts...)
}

// agentDial is agent with extra dial options for its allocator calls.
func (w *world) agentDial(region, replica string, dial []grpc.DialOption, opts ...Option) *Agent {
	w.t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis[region].Addr()})
	w.t.Cleanup(func() { rdb.Close() })
	return w.agentOn(rdb, region, replica, dial, opts...)
}

// agentOn is agentDial on a Redis of the test's (a Cluster, a wrapper).
func (w *world) agentOn(rdb redis.UniversalClient, region, replica string, dial []grpc.DialOption, opts ...Option) *Agent {
	w.t.Helper()
	opts = append([]Option{WithClock(w.clock.Now), WithRedisClock(w.clock.Now), WithColdWait(0), withWaitObserver(w.observeWait),
		WithTimeouts(2*time.Second, 5*time.Second, 2*time.Second)}, opts...)
	a, err := New(Config{Region: region, Allocators: []string{w.addr},
		DialOptions: append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...),
		Redis:       rdb, ReplicaID: replica, Logger: testLogger()}, opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(a.Close)
	w.agentsMu.Lock()
	w.agents = append(w.agents, a)
	w.agentsMu.Unlock()
	w.sync(a)
	// The agent's sync loop is not running (tests drive it by hand), but
	// a Check of a limit not in the snapshot asks for a sync and waits.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.syncNow:
				_ = a.syncLimits(ctx)
			}
		}
	}()
	w.t.Cleanup(func() { cancel(); awaitStopped(w.t, done, "the sync loop") })
	return a
}

// evaluate does the agent's timed work due at its clock's now, asks its
// core for a renewal round of limit, and carries everything out: what a
// test calls to set a limit up by hand (the round plans from the bucket,
// acquires, deposits, closes and returns).
func (a *Agent) evaluate(ctx context.Context, id string) {
	now := a.opt.now()
	a.withCore(func(c *core.Core) {
		c.Tick(now)
		c.Renew(now, id)
	})
	a.settle(ctx)
}

// report asks for the counts of every window the agent keeps, now, and
// sends them (the last report on the way out does the same).
func (a *Agent) report(ctx context.Context) {
	now := a.opt.now()
	a.withCore(func(c *core.Core) { c.FinalReport(now) })
	a.settle(ctx)
}

// safetyMargin is the margin the agent's core takes off a lease that
// expires in d (core.WithSafetyMargin), for the tests' expected deadlines.
func (o *options) safetyMargin(d time.Duration) time.Duration {
	return o.margin + time.Duration(float64(d)*o.driftPPM/1e6)
}

// runWork runs the agent's work loop until the test ends: the rounds its
// Checks kick are carried out as in production, with the test's clock.
func runWork(t testing.TB, a *Agent) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.workLoop(ctx) }()
	t.Cleanup(func() { cancel(); awaitStopped(t, done, "the work loop") })
}

// sync refreshes an agent's limits and Redis clock.
func (w *world) sync(a *Agent) {
	w.t.Helper()
	ctx := context.Background()
	if err := a.syncLimits(ctx); err != nil {
		w.t.Fatal(err)
	}
	if err := a.syncClock(ctx); err != nil {
		w.t.Fatal(err)
	}
}

// stats returns the allocator's granted and credited for a window.
func (w *world) stats(limit string, window int64) allocator.WindowStats {
	var st allocator.WindowStats
	_ = w.alloc.View(func(_ time.Time, c *allocator.Core) { st, _ = c.Stats(limit, window) })
	return st
}

func (w *world) pool(limit string, window int64) int64 {
	var p int64
	_ = w.alloc.View(func(_ time.Time, c *allocator.Core) { p = c.Pool(limit, window) })
	return p
}

// awaitStopped waits for a loop the test started to stop after its
// context was cancelled. A loop that does not stop within 30 s is a bug
// that would otherwise hang the package until go test's timeout: the test
// fails, naming the loop, with the stacks of the agent's goroutines.
func awaitStopped(t testing.TB, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop within 30 s of its context's end; the agent's goroutines:\n%s", what, agentStacks())
	}
}

// agentStacks is the stacks of the goroutines running this package's
// code (not etcd's or Redis's clients' hundreds).
func agentStacks() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "leasehold/regionagent.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestWorldMovesItsClockForAStuckCheck: the world's watch keeps a Check
// from hanging on its standing clock. Another replica (one that died)
// holds the limit's renewal lock, so the agent's round finds it taken and
// looks again 50 ms later on the agent's clock, which in this world only
// the test moves. The Check has no deadline of its own, as most of these
// tests' Checks: without the watch it waits until the test's 60 s bound.
func TestWorldMovesItsClockForAStuckCheck(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/locked-elsewhere", 100, time.Minute, time.Minute, "eu"))
	// A cold Check waits for its first lease (the harness's default is
	// not to wait), as in production.
	a := w.agent("eu", "r1", WithColdWait(10*time.Second))
	runWork(t, a)
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if ok, err := bucket.New(rdb).TryLock(ctx, bucket.LockKey("", l.Id), "dead-replica", lockLease); !ok || err != nil {
		t.Fatal(ok, err)
	}
	before := w.clock.Now()
	d, err := a.Check(ctx, l.Id, 1)
	if err != nil {
		t.Fatalf("the Check behind another replica's lock: %v (the clock moved %v); the agent's goroutines:\n%s",
			err, w.clock.Now().Sub(before), agentStacks())
	}
	if !d.Allowed {
		t.Fatalf("the Check after the dead replica's lock expired: %+v", d)
	}
	if moved := time.Duration(w.rescued.Load()); moved <= 0 || moved > 2*lockLease {
		t.Fatalf("the watch moved the clock %v for the stuck Check, want more than 0 and at most about the lock's %v", moved, lockLease)
	}
}
