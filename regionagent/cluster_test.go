package regionagent

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/internal/redistest"
	"leasehold/internal/syncbuf"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// clusterWorld is a world whose eu region's Redis is a real three-master
// Redis Cluster the test started, reached as the agent's --redis
// cluster://... flag would reach it.
type clusterWorld struct {
	*world
	cluster *redistest.Cluster
	rdb     *redis.ClusterClient
}

func newClusterWorld(t *testing.T) *clusterWorld {
	c := redistest.StartCluster(t, 3)
	rdb, err := ParseRedis(c.Spec())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("ParseRedis(%q) = %T, want a *redis.ClusterClient", c.Spec(), rdb)
	}
	return &clusterWorld{world: newWorld(t, "eu"), cluster: c, rdb: cc}
}

// callCtx bounds one of the test's own calls to the cluster (10 s), so a
// call that never returns fails the test instead of hanging the package
// (go-redis's Cluster client once waited minutes on a reply: see
// docs/design.md). It is cancelled when the test ends.
func (cw *clusterWorld) callCtx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cw.t.Cleanup(cancel)
	return ctx
}

// master is the address of the master that holds key.
func (cw *clusterWorld) master(key string) string {
	cw.t.Helper()
	m, err := cw.rdb.MasterForKey(cw.callCtx(), key)
	if err != nil {
		cw.t.Fatal(err)
	}
	return m.Options().Addr
}

// onEachMaster finds one limit id per master, prefix followed by a
// number, for limits without a hash tag (their id is their tag).
func (cw *clusterWorld) onEachMaster(prefix string) map[string]string {
	cw.t.Helper()
	out := map[string]string{} // master -> limit
	for i := 0; len(out) < 3 && i < 1000; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if m := cw.master(bucket.Key("", id, 0)); out[m] == "" {
			out[m] = id
		}
	}
	if len(out) != 3 {
		cw.t.Fatalf("%s*: limits on %d masters, want 3", prefix, len(out))
	}
	return out
}

// keysByNode lists the leasehold keys each master holds (KEYS on each).
func (cw *clusterWorld) keysByNode() map[string]string {
	cw.t.Helper()
	var mu sync.Mutex
	out := map[string]string{}
	err := cw.rdb.ForEachMaster(cw.callCtx(), func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "lh:*").Result()
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if prev, dup := out[k]; dup {
				return fmt.Errorf("%s on %s and %s", k, prev, c.Options().Addr)
			}
			out[k] = c.Options().Addr
		}
		return err
	})
	if err != nil {
		cw.t.Fatal(err)
	}
	return out
}

// bal reads a bucket through the cluster at the world's clock.
func (cw *clusterWorld) bal(tag, limit string) bucket.BalanceResult {
	cw.t.Helper()
	win := lease.WindowOf(cw.clock.Now(), time.Minute).Index
	b, err := bucket.New(cw.rdb).Balance(cw.callCtx(), bucket.Key(tag, limit, win), cw.clock.Now().UnixMilli())
	if err != nil {
		cw.t.Fatal(err)
	}
	return b
}

func taggedLimit(id, tag string, g int64) *pb.Limit {
	l := limit(id, g, time.Minute, 15*time.Second, "eu")
	l.HashTag = tag
	return l
}

// TestRedisCluster: an agent on a real three-master Redis Cluster. Limits
// without a hash tag, spread over all three masters, are each served
// (5 of G = 5 admitted, the 6th OVER_LIMIT) with their buckets and epochs
// on their own master; ten concurrent Checks of each of three more
// limits, one per master, admit exactly G = 8 each (spend pipelines
// spanning the nodes); two limits sharing a hash tag live on one master
// and are checked together all or nothing (one over its limit denies
// both, and neither is charged: the balances say so); a CheckMulti of
// limits with different hash tags is InvalidArgument naming both limits,
// over gRPC, and charges nothing.
func TestRedisCluster(t *testing.T) {
	cw := newClusterWorld(t)
	// The world's clock stands still unless the test moves it: a Check
	// whose round was lost to a Redis timeout under CI's load is retried
	// on the agent's clock, so the clock runs while a Check waits
	// (moveClockWhileWaiting), and the deadline makes anything else a
	// failure that names itself, not a hung package.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// One untagged limit per master (its id is its hash tag), twice.
	spread, burst := cw.onEachMaster("tenant/spread"), cw.onEachMaster("tenant/burst")
	for _, id := range spread {
		cw.putLimit(limit(id, 5, time.Minute, 15*time.Second, "eu"))
	}
	for _, id := range burst {
		cw.putLimit(limit(id, 8, time.Minute, 15*time.Second, "eu"))
	}
	api := cw.putLimit(taggedLimit("tenant/atlas/api", "atlas", 10))
	jobs := cw.putLimit(taggedLimit("tenant/atlas/jobs", "atlas", 3))
	bor := cw.putLimit(taggedLimit("tenant/borealis/api", "borealis", 10))
	cw.clock.Add(time.Second)
	a := cw.agentOn(cw.rdb, "eu", "r1", nil, WithColdWait(2*time.Second))
	runWork(t, a)
	if !a.core.IsSynced() {
		t.Fatal("agent not synced")
	}
	moveClockWhileWaiting(t, cw.world, a)

	for m, id := range spread {
		var ok int
		for range 5 {
			d, err := a.Check(ctx, id, 1)
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if d.Allowed {
				ok++
			}
		}
		if d, err := a.Check(ctx, id, 1); err != nil || d.Allowed || d.Reason != pb.Reason_REASON_OVER_LIMIT {
			t.Fatalf("%s: 6th check %+v %v, want OVER_LIMIT", id, d, err)
		}
		if b := cw.bal("", id); ok != 5 || b.Admitted != 5 {
			t.Fatalf("%s on %s: %d of 5 admitted, bucket counts %d", id, m, ok, b.Admitted)
		}
	}
	// Concurrent Checks of limits on all three masters: the agent's spend
	// pipelines then hold keys of several nodes (the Cluster client splits
	// them); each limit admits exactly its G = 8 of 10, the rest
	// OVER_LIMIT.
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, over := map[string]int{}, map[string]int{}
	for _, id := range burst {
		for range 10 {
			wg.Go(func() {
				<-start
				d, err := a.Check(ctx, id, 1)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("%s: %v", id, err)
				case d.Allowed:
					admitted[id]++
				case d.Reason == pb.Reason_REASON_OVER_LIMIT:
					over[id]++
				default:
					t.Errorf("%s: %+v, want admitted or OVER_LIMIT", id, d)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	for m, id := range burst {
		if b := cw.bal("", id); admitted[id] != 8 || over[id] != 2 || b.Admitted != 8 {
			t.Errorf("%s on %s: %d admitted, %d over limit of 10 concurrent; bucket counts %d admitted; want 8, 2, 8",
				id, m, admitted[id], over[id], b.Admitted)
		}
	}
	a.report(ctx) // the usage script reads a limit's epoch and buckets in one call: one slot

	// Three CheckMultis of (api, jobs) pass; the fourth finds jobs (G = 3)
	// spent and charges neither.
	multi := []CheckItem{{Limit: api.Id, Cost: 1}, {Limit: jobs.Id, Cost: 1}}
	for i := range 3 {
		ds, err := a.CheckMulti(ctx, multi)
		if err != nil || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("multi %d: %+v %v", i, ds, err)
		}
	}
	before := [2]bucket.BalanceResult{cw.bal("atlas", api.Id), cw.bal("atlas", jobs.Id)}
	ds, err := a.CheckMulti(ctx, multi)
	if err != nil || ds[0].Allowed || ds[1].Allowed || ds[1].Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("multi over jobs' limit: %+v %v, want both denied, jobs OVER_LIMIT", ds, err)
	}
	// (The script charges the leases and counts admitted in one step, all
	// keys or none: admitted unchanged is nothing charged. The balance
	// itself may grow meanwhile: the denial kicks api's renewal.)
	after := [2]bucket.BalanceResult{cw.bal("atlas", api.Id), cw.bal("atlas", jobs.Id)}
	if after[0].Admitted != 3 || after[1].Admitted != 3 {
		t.Fatalf("after the denied multi: api admitted %d, jobs admitted %d; want 3, 3", after[0].Admitted, after[1].Admitted)
	}
	if after[1].Denied <= before[1].Denied {
		t.Fatalf("jobs denied %d -> %d: the refusal was not counted", before[1].Denied, after[1].Denied)
	}

	// Across hash tags: refused as invalid input before any Redis call
	// (not Redis's CROSSSLOT), over gRPC too; nothing charged, no bucket
	// made for the other tag.
	cl := serveAgent(t, a)
	for _, pair := range [][2]string{{api.Id, bor.Id}, {spread[cw.cluster.Addrs()[0]], spread[cw.cluster.Addrs()[1]]}} {
		_, err := cl.CheckMulti(ctx, &pb.CheckMultiRequest{Checks: []*pb.CheckRequest{{LimitId: pair[0]}, {LimitId: pair[1]}}})
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "checks[1].limit_id: ") ||
			!strings.Contains(st.Message(), `"`+pair[0]+`"`) || !strings.Contains(st.Message(), `"`+pair[1]+`"`) ||
			!strings.Contains(st.Message(), "do not share a hash tag") || !strings.Contains(st.Message(), "hash_tag") {
			t.Errorf("CheckMulti(%s, %s) = %v %q, want InvalidArgument on checks[1].limit_id naming both", pair[0], pair[1], st.Code(), st.Message())
		}
	}
	if n := testutil.ToFloat64(a.m.checks.WithLabelValues(resultCrossSlot)); n != 2 {
		t.Errorf("checks_total{result=%q} = %v, want the 2 refusals", resultCrossSlot, n)
	}
	if b := cw.bal("atlas", api.Id); b.Admitted != 3 {
		t.Fatalf("api admitted %d after refused multis, want 3", b.Admitted)
	}
	if b := cw.bal("borealis", bor.Id); b.Admitted+b.Denied != 0 {
		t.Fatalf("borealis counted %d admitted, %d denied by refused multis", b.Admitted, b.Denied)
	}
	if d, err := a.Check(ctx, bor.Id, 1); err != nil || !d.Allowed {
		t.Fatalf("a single Check of borealis: %+v %v", d, err)
	}

	// Where the keys are: each spread limit's bucket and epoch on its own
	// master (three masters), the two atlas limits together on atlas's.
	nodes := cw.keysByNode()
	win := lease.WindowOf(cw.clock.Now(), time.Minute).Index
	for m, id := range spread {
		for _, k := range []string{bucket.Key("", id, win), bucket.EpochKey("", id)} {
			if nodes[k] != m {
				t.Errorf("%s on %q, want %s", k, nodes[k], m)
			}
		}
	}
	atlas := cw.master("{atlas}")
	for _, id := range []string{api.Id, jobs.Id} {
		if k := bucket.Key("atlas", id, win); nodes[k] != atlas {
			t.Errorf("%s on %q, want atlas's master %s (keys: %v)", k, nodes[k], atlas, nodes)
		}
	}
	if k := bucket.Key("borealis", bor.Id, win); nodes[k] != cw.master("{borealis}") {
		t.Errorf("%s on %q", k, nodes[k])
	}
	used := map[string]bool{}
	for _, n := range nodes {
		used[n] = true
	}
	if len(used) != 3 {
		t.Errorf("keys on %d masters, want 3: %v", len(used), nodes)
	}
	t.Logf("keys by master: %v", nodes)

	// The allocator has each spread limit's usage, read from the cluster.
	for _, id := range spread {
		reps, err := cw.alloc.Reports(id, 1)
		if err != nil || len(reps) != 1 || reps[0].AdmittedTotal != 5 {
			t.Errorf("%s: reports %+v %v, want 5 admitted", id, reps, err)
		}
	}
}

// unmarkedCluster hides that a client is a Redis Cluster client: the
// agent then does not refuse a CheckMulti across hash tags itself, and
// Redis answers CROSSSLOT.
type unmarkedCluster struct{ *redis.ClusterClient }

// TestCrossSlotFromRedis: a CROSSSLOT that reaches the agent (it was not
// told its Redis is a Cluster) answers the CheckMulti InvalidArgument
// naming the limits, at once: not UNAVAILABLE with a retry, not the fail
// mode, not a Redis outage; it is logged at warn at most once a second.
func TestCrossSlotFromRedis(t *testing.T) {
	cw := newClusterWorld(t)
	ctx := context.Background()
	api := cw.putLimit(taggedLimit("tenant/atlas/api", "atlas", 100))
	bor := cw.putLimit(taggedLimit("tenant/borealis/api", "borealis", 100))
	var logs syncbuf.Buffer
	a := cw.agentOn(unmarkedCluster{cw.rdb}, "eu", "r1", nil, WithColdWait(2*time.Second))
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	runWork(t, a)
	moveClockWhileWaiting(t, cw.world, a)
	if d, err := a.Check(ctx, api.Id, 1); err != nil || !d.Allowed {
		t.Fatalf("single check: %+v %v", d, err)
	}
	const n = 20
	start := time.Now()
	for i := range n {
		_, err := a.CheckMulti(ctx, []CheckItem{{Limit: api.Id}, {Limit: bor.Id}})
		var fe *FieldError
		if !errorsAs(err, &fe) || fe.Field != "checks[1].limit_id" || !strings.Contains(fe.Reason, "CROSSSLOT") ||
			!strings.Contains(fe.Reason, `"tenant/atlas/api"`) || !strings.Contains(fe.Reason, `"tenant/borealis/api"`) {
			t.Fatalf("multi %d: %v, want a field error on checks[1].limit_id naming CROSSSLOT and both limits", i, err)
		}
	}
	elapsed := time.Since(start)
	a.settle(ctx) // the notes are logged by the work loop
	if a.rh.isDown() {
		t.Fatal("CROSSSLOT marked Redis down")
	}
	if got := testutil.ToFloat64(a.m.checks.WithLabelValues(resultCrossSlot)); got != n {
		t.Errorf("checks_total{result=%q} = %v, want %d", resultCrossSlot, got, n)
	}
	if got := testutil.ToFloat64(a.m.checks.WithLabelValues(string(core.ResultStoreError))); got != 0 {
		t.Errorf("checks_total{result=%q} = %v: CROSSSLOT counted as a Redis error", core.ResultStoreError, got)
	}
	if b := cw.bal("atlas", api.Id); b.Admitted != 1 {
		t.Fatalf("api admitted %d, want the single check's 1", b.Admitted)
	}
	lines := strings.Count(logs.String(), "CheckMulti refused")
	if maxLines := 1 + int(elapsed/time.Second); lines < 1 || lines > maxLines || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("%d warn lines for %d refusals in %v, want 1..%d:\n%s", lines, n, elapsed, maxLines, logs.String())
	}
}

// moveClockWhileWaiting runs w's clock at about real speed while a Check
// of a waits (5 ms every 5 ms), until the test ends: a round lost to a
// Redis timeout is retried on the agent's clock, which otherwise stands
// still in these tests; the Checks' own wait bounds keep their meaning.
func moveClockWhileWaiting(t *testing.T, w *world, a *Agent) {
	done, stopped := make(chan struct{}), make(chan struct{})
	w.driving.Add(1) // this moves the clock; the world's watch stands aside
	go func() {
		defer close(stopped)
		defer w.driving.Add(-1)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			a.mu.Lock()
			waiting := len(a.waiters) > 0
			a.mu.Unlock()
			if waiting {
				w.clock.Add(5 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
}
