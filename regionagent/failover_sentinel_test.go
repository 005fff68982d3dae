package regionagent

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/internal/faulttest"
	"leasehold/internal/redistest"
	"leasehold/lease"
	"leasehold/regionagent/bucket"
)

// TestFailoverSentinel is TestFailoverLostWrites with Redis Sentinel doing
// the failover: three sentinels (quorum 2) monitor a primary whose one
// replica replicates through a fault proxy, and the agent's Redis client
// is ParseRedis("sentinel://mymaster@..."). Spends are made while the
// replication link is blackholed, then the primary is SIGKILLed; the
// sentinels agree it is down, elect a leader and promote the replica, and
// the client follows the new master by itself (+switch-master, or asking
// a sentinel when it redials). Nothing in the test points the agent at the
// replica.
//
// The agent must notice the promotion through that client, estimate the
// forgotten spends (>= those really lost), debit them on the new master,
// and report them: the allocator's bound carries the term, and the tokens
// the Checks admitted stay within G + bound (within G, with the debit).
func TestFailoverSentinel(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/fo-sentinel", 1000, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 1000
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	ctx := context.Background()

	primary, replica := redistest.Start(t), redistest.Start(t)
	primary.MustDo("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	link := faulttest.NewProxy(t, primary.Addr())
	replica.ReplicaOf(link.Addr())
	waitReplicated(t, primary)
	// The replica replicates through the proxy, an address the sentinels
	// do not know as the master's: after failover-timeout a sentinel
	// repoints it at the primary directly (+fix-slave-config), which would
	// bypass the blackhole. 15 s is far more than this test's run up to
	// the kill (~2 s); a failed election is retried after twice that.
	const failoverTimeout = 15 * time.Second
	sent := redistest.StartSentinels(t, primary.Addr(), redistest.SentinelOptions{
		Master: "mymaster", Count: 3, Quorum: 2, DownAfter: 500 * time.Millisecond, FailoverTimeout: failoverTimeout})
	sent.WaitMonitoring(1)

	rdb, err := ParseRedis(sent.Spec())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	reg := prometheus.NewRegistry()
	a, err := New(Config{Region: "eu", Allocators: []string{w.addr},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Redis:       rdb, ReplicaID: "r1", Logger: testLogger(), Registerer: reg},
		WithClock(w.clock.Now), WithRedisClock(w.clock.Now), WithColdWait(0), WithTimeouts(2*time.Second, 5*time.Second, 2*time.Second),
		WithChunks(ChunkConfig{})) // spends only, as in TestFailoverLostWrites
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
	// What the replica holds, and will hold when promoted.
	replicated := admittedOn(t, primary, key, w.clock.Now())

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
	lost := before - replicated
	if lost < 150 {
		t.Fatalf("only %d spends unreplicated (primary %d, replicated %d): the test wants a real loss", lost, before, replicated)
	}
	// Still behind the blackhole: no sentinel repointed the replica.
	if info := replica.MustDo("INFO", "replication"); !containsLine(info, "master_port:"+portOf(t, link.Addr())) {
		t.Fatalf("the replica no longer replicates through the proxy (a sentinel reconfigured it?):\n%s\n%s", info, sent.Logs())
	}

	// Failover: the primary dies; Sentinel promotes the lagging replica.
	// The agent polls as its watcher would until it sees the new master
	// through its own client (a poll fails, or its client redials, while
	// the sentinels still name the dead primary). The agent's clock stands still meanwhile:
	// no spend is made, and the primary stopped answering at this instant.
	primary.Kill()
	killed := time.Now()
	w.clock.Add(100 * time.Millisecond)
	// Sentinel promotes within ~2 s; the deadline leaves room for one
	// election that failed (a split vote) and its retry.
	wait := 2*failoverTimeout + 5*time.Second
	deadline := killed.Add(wait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var polls int
	for testutil.ToFloat64(a.failover.m.failovers.WithLabelValues(cutPromoted)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the failover was not detected within %v of polls (%d); sentinels:\n%s", wait, polls, sent.Logs())
		}
		a.failover.poll(ctx)
		polls++
		select {
		case <-tick.C: // next poll: waiting for Sentinel's promotion, a process outside the test
		case <-time.After(time.Until(deadline)):
		}
	}
	detected := time.Since(killed)
	if err := sent.WaitMaster(replica.Addr(), 5*time.Second); err != nil {
		t.Fatalf("the agent saw a promotion the sentinels do not agree on: %v", err)
	}
	if n := testutil.ToFloat64(a.failover.m.failovers.WithLabelValues(cutUnlinked)); n != 0 {
		t.Fatalf("%v unlinked cuts: the promoted replica's history should link to the old primary's", n)
	}
	est := a.failover.rollbackTokens(l.Id, win)
	debited := testutil.ToFloat64(a.failover.m.debited)
	t.Logf("lag seen %.1fs; detected %v after the kill (polls: %d); spends lost %d (primary %d, replicated %d); estimate %d; debited %v",
		lagSeen, detected.Round(time.Millisecond), polls, lost, before, replicated, est, debited)
	if est <= 0 || est < lost {
		t.Fatalf("rollback estimate %d, want > 0 and >= the %d spends lost", est, lost)
	}
	if debited < float64(lost) {
		t.Fatalf("debited %v from the rolled-back bucket, %d lost", debited, lost)
	}
	// The debit went to the promoted replica, through the Sentinel client.
	if got := admittedOn(t, replica, key, w.clock.Now()); got != replicated+int64(debited) {
		t.Fatalf("promoted replica's bucket admitted %d after the debit, want %d + %v", got, replicated, debited)
	}

	// Demand far above G for the rest of the window: everything the
	// region can still get is spent, on the new master.
	spend(200, 20*time.Second)
	a.report(ctx)

	if r := w.rollbackReport(l.Id, win, admitted, est); admitted > r.LimitTokens {
		t.Errorf("admitted %d > G %d although %v tokens were debited for %d lost", admitted, r.LimitTokens, debited, lost)
	}
}

// containsLine reports whether INFO text s has the line want.
func containsLine(s, want string) bool {
	for _, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == want {
			return true
		}
	}
	return false
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}
