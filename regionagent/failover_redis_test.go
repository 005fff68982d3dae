package regionagent

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/allocator"
	"leasehold/internal/faulttest"
	"leasehold/internal/redistest"
	"leasehold/lease"
	"leasehold/regionagent/bucket"
)

// TestFailoverLostWrites is a real Redis failover that loses writes: a
// primary and a replica whose replication link goes through a fault
// proxy. Spends are made on the primary while the link is blackholed,
// then the primary is SIGKILLed, the replica promoted (REPLICAOF NO ONE,
// as Sentinel would) and the agent's connections switched to it. The
// promoted replica holds the bucket as it was before the blackhole: the
// spends made since are forgotten.
//
// The agent must notice (replication id), estimate the forgotten spends
// from the lag it saw x the admit rate (>= those really lost), debit them
// from the rolled-back bucket, and report them; the allocator's report of
// the window carries the term in its bound, and the tokens the Checks
// admitted stay within G + bound. The region holds one lease of all of G,
// so every token the failover gives back can be spent again: without the
// debit the region admits G + the lost spends (within the bound); with it,
// no more than G.
func TestFailoverLostWrites(t *testing.T) {
	t.Run("debit", func(t *testing.T) { testFailoverLostWrites(t, true) })
	t.Run("no debit", func(t *testing.T) { testFailoverLostWrites(t, false) })
}

func testFailoverLostWrites(t *testing.T, debit bool) {
	w := newWorld(t, "eu")
	l := limit("tenant/fo", 1000, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 1000
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	ctx := context.Background()

	primary, replica := redistest.Start(t), redistest.Start(t)
	primary.MustDo("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	link := faulttest.NewProxy(t, primary.Addr())
	replica.ReplicaOf(link.Addr())
	waitReplicated(t, primary)

	// The agent reaches "the primary" through a dialer the test switches,
	// as a Sentinel client would after the failover.
	var target atomic.Value
	target.Store(primary.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: "primary", Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target.Load().(string))
	}})
	t.Cleanup(func() { rdb.Close() })
	reg := prometheus.NewRegistry()
	a, err := New(Config{Region: "eu", Allocators: []string{w.addr},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Redis:       rdb, ReplicaID: "r1", Logger: testLogger(), Registerer: reg},
		WithClock(w.clock.Now), WithRedisClock(w.clock.Now), WithColdWait(0), WithTimeouts(2*time.Second, 5*time.Second, 2*time.Second),
		WithRollbackDebit(debit),
		// Spends only: a chunk reserved in the background after the
		// failover would add to the promoted bucket's admitted count the
		// test holds exact (chunks and failovers: the estimate's Ahead).
		WithChunks(ChunkConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	w.sync(a)
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	key := bucket.Key("", l.Id, win)

	var admitted int64 // counted from the Check answers
	// spend makes Checks at rate per second for d (spendAt).
	spend := func(rate int, d time.Duration) {
		t.Helper()
		admitted += w.spendAt(a, l.Id, rate, d)
	}
	a.Check(ctx, l.Id, 1) // no lease yet: denied, and the limit is active
	a.evaluate(ctx, l.Id) // the first lease

	// Replicated spends.
	spend(100, time.Second)
	waitReplicated(t, primary)
	a.failover.poll(ctx)
	if lag := testutil.ToFloat64(a.failover.m.lag); lag != 0 {
		t.Fatalf("lag %v with everything replicated, want 0", lag)
	}

	// Spends the replica never receives.
	link.Blackhole(true)
	for range 2 {
		spend(100, time.Second)
		a.failover.poll(ctx)
	}
	lagSeen := testutil.ToFloat64(a.failover.m.lag)
	if lagSeen < 2 {
		t.Fatalf("lag seen %vs with 2s of writes unreplicated, want >= 2", lagSeen)
	}
	before := admittedOn(t, primary, key, w.clock.Now())

	// Failover: the primary dies, the lagging replica takes over.
	primary.Kill()
	replica.Promote()
	target.Store(replica.Addr())
	after := admittedOn(t, replica, key, w.clock.Now())
	lost := before - after
	if lost < 150 {
		t.Fatalf("the failover lost %d spends (primary %d, promoted replica %d): the test wants a real loss", lost, before, after)
	}
	w.clock.Add(100 * time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(a.failover.m.failovers.WithLabelValues(cutPromoted)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the failover was not detected within 10s of polls")
		}
		a.failover.poll(ctx) // the first may fail on a connection to the dead primary
	}
	est := a.failover.rollbackTokens(l.Id, win)
	debited := testutil.ToFloat64(a.failover.m.debited)
	t.Logf("lag seen %.1fs; spends lost %d (primary %d, promoted %d); estimate %d; debited %v",
		lagSeen, lost, before, after, est, debited)
	if est <= 0 || est < lost {
		t.Fatalf("rollback estimate %d, want > 0 and >= the %d spends lost", est, lost)
	}
	if debit && debited < float64(lost) || !debit && debited != 0 {
		t.Fatalf("debited %v from the rolled-back bucket (debit %v), %d lost", debited, debit, lost)
	}
	if got := admittedOn(t, replica, key, w.clock.Now()); got != after+int64(debited) {
		t.Fatalf("bucket admitted %d after the debit, want %d + %v", got, after, debited)
	}

	// Demand far above G for the rest of the window: everything the
	// region can still get is spent.
	spend(200, 20*time.Second)
	a.report(ctx)

	r := w.rollbackReport(l.Id, win, admitted, est)
	switch {
	case debit && admitted > r.LimitTokens:
		// The debit takes back the forgotten spends: strict still holds
		// when the estimate covers the loss.
		t.Errorf("admitted %d > G %d although %v tokens were debited for %d lost", admitted, r.LimitTokens, debited, lost)
	case !debit && admitted != r.LimitTokens+lost:
		t.Errorf("without the debit admitted %d, want G %d + the %d lost spends again", admitted, r.LimitTokens, lost)
	}
}

// rollbackReport returns the allocator's report of a window that saw a
// Redis failover, once it has checked what every such window must show:
// the bound's redis_rollback term covers the agent's estimate, and the
// admitted tokens (counted from the Check answers) are within G + bound.
func (w *world) rollbackReport(limit string, win, admitted, est int64) allocator.WindowReport {
	w.t.Helper()
	reps, err := w.alloc.Reports(limit, 3)
	if err != nil {
		w.t.Fatal(err)
	}
	start := lease.Window{Index: win, Length: time.Minute}.Start()
	for _, r := range reps {
		if !r.WindowStart.Equal(start) {
			continue
		}
		w.t.Logf("window %d: G %d, admitted (Checks) %d, reported %d, bound %s", win, r.LimitTokens, admitted,
			r.AdmittedTotal, r.Terms)
		if r.Terms.RedisRollback < est {
			w.t.Errorf("bound's redis_rollback %d, want >= the agent's estimate %d", r.Terms.RedisRollback, est)
		}
		if r.Bound.Infinite || admitted > r.LimitTokens+r.Bound.Tokens {
			w.t.Errorf("admitted %d > G %d + bound %v", admitted, r.LimitTokens, r.Bound)
		}
		return r
	}
	w.t.Fatalf("no report of window %d in %+v", win, reps)
	return allocator.WindowReport{}
}

// waitReplicated waits until the primary lists an online replica that
// acknowledged everything (replicas acknowledge once a second).
func waitReplicated(t *testing.T, primary *redistest.Server) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := parseReplInfo(primary.MustDo("INFO", "replication"))
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Replicas) == 1 && info.Replicas[0].online() && info.Replicas[0].Offset == info.Offset {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not catch up within 15s: %+v", info)
		}
		time.Sleep(20 * time.Millisecond) // polling the replica's next acknowledgement
	}
}

// admittedOn reads a bucket's admitted count on one server.
func admittedOn(t *testing.T, s *redistest.Server, key string, now time.Time) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	b, err := bucket.New(c).Balance(context.Background(), key, now.UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	return b.Admitted
}

// spendAt makes Checks of cost 1 at rate per second for d on the world's
// clock, in 100 ms steps, carrying out the agent's work after each step
// (the rounds its Checks kicked, its timed work), and returns how many
// were admitted.
func (w *world) spendAt(a *Agent, limit string, rate int, d time.Duration) int64 {
	w.t.Helper()
	ctx := context.Background()
	var admitted int64
	for range int(d / (100 * time.Millisecond)) {
		for range rate / 10 {
			dec, err := a.Check(ctx, limit, 1)
			if err != nil {
				w.t.Fatal(err)
			}
			if dec.Allowed {
				admitted++
			}
		}
		a.tick(ctx)
		w.clock.Add(100 * time.Millisecond)
	}
	return admitted
}
