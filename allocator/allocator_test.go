package allocator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// TestBudgetUnderConcurrency: 3 regions x 32 goroutines ask for leases on
// 10 limits over 5 windows; 20% of requests are retried with the same
// request id (some at once, concurrently); some leases are returned, some
// returns retried. For every (limit, window), granted - returned <= G, in
// the test's own ledger and in etcd, and no request id maps to two leases.
func TestBudgetUnderConcurrency(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0)
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	const limits, G = 10, 1000
	for i := range limits {
		l := putLimit(t, a.Allocator, fmt.Sprintf("tenant/t%d", i), G, time.Minute, 15*time.Second, 40)
		waitLimit(t, a.Allocator, l.Id, l.Version)
	}
	led := newLedger()
	ctx := context.Background()
	for w := range 5 {
		clock.Set(t0.Add(time.Duration(w)*time.Minute + time.Second))
		var wg sync.WaitGroup
		for _, region := range []string{"eu", "us", "ap"} {
			for g := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), uint64(g)))
					for n := range 12 {
						req := &pb.LeaseRequest{
							RequestId:       fmt.Sprintf("w%d-g%d-n%d", w, g, n),
							LimitId:         fmt.Sprintf("tenant/t%d", rng.IntN(limits)),
							DemandPerSecond: 50,
						}
						calls := 1
						if rng.IntN(5) == 0 {
							calls = 2 // retried with the same request id
						}
						var cwg sync.WaitGroup
						for range calls {
							cwg.Add(1)
							go func() {
								defer cwg.Done()
								res, err := a.AcquireLeases(ctx, region, []*pb.LeaseRequest{req})
								if err != nil {
									t.Errorf("acquire: %v", err)
									return
								}
								led.record(t, region, res[0])
							}()
						}
						cwg.Wait()
						// Return a third of the leases, half of those twice.
						led.mu.Lock()
						ls := led.byReq[region+"/"+req.RequestId]
						led.mu.Unlock()
						if ls == nil || rng.IntN(3) != 0 {
							continue
						}
						unspent := rng.Int64N(ls.Tokens + 1)
						for range 1 + rng.IntN(2) {
							rr, err := a.ReturnLeases(ctx, region, []*pb.LeaseReturn{{LimitId: ls.LimitId, LeaseId: ls.LeaseId, Unspent: unspent}})
							if err != nil {
								t.Errorf("return: %v", err)
								return
							}
							led.mu.Lock()
							if prev, ok := led.credited[ls.LeaseId]; ok && (prev != rr[0].Credited || !rr[0].Duplicate) {
								t.Errorf("retried return of %s: credited %d then %+v", ls.LeaseId, prev, rr[0])
							}
							led.credited[ls.LeaseId] = rr[0].Credited
							led.mu.Unlock()
						}
					}
				}()
			}
		}
		wg.Wait()
	}
	if t.Failed() {
		return
	}
	net := led.net()
	exhausted := 0
	for k, n := range net {
		if n > G {
			t.Errorf("%v: granted - returned = %d > G = %d", k, n, G)
		}
		if n >= G-40 {
			exhausted++
		}
	}
	if exhausted < limits*5/2 {
		t.Errorf("only %d of %d pools were spent: the test did not contend", exhausted, limits*5)
	}
	// etcd holds the same: every grant durable, nothing extra.
	st, err := a.Store().Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fromEtcd := map[poolKey]int64{}
	seen := map[string]bool{}
	for _, g := range st.Grants {
		fromEtcd[poolKey{g.Limit, g.Window}] += g.Tokens - g.Credited
		k := g.Region + "/" + g.RequestID
		if seen[k] {
			t.Errorf("request %s has two grant records", k)
		}
		seen[k] = true
		if ls := led.byReq[k]; ls == nil || ls.LeaseId != g.LeaseID || ls.Tokens != g.Tokens {
			t.Errorf("etcd grant %s/%s (%d tokens) differs from the reply %v", g.Region, g.RequestID, g.Tokens, ls)
		}
	}
	if len(seen) != len(led.byReq) {
		t.Errorf("etcd has %d grants, the test received %d leases", len(seen), len(led.byReq))
	}
	for k, n := range net {
		if fromEtcd[k] != n {
			t.Errorf("%v: etcd says granted - returned = %d, replies say %d", k, fromEtcd[k], n)
		}
	}
	t.Logf("%d leases over %d pools, %d pools spent", len(led.byReq), len(net), exhausted)
}

// TestFencingRevokedSession: once the leader's etcd session is revoked, a
// write fenced by its old election key fails, and a grant attempted after
// the revocation is never committed.
func TestFencingRevokedSession(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	putLimit(t, a.Allocator, "tenant/f", 1000, time.Minute, 15*time.Second, 0)
	waitLimit(t, a.Allocator, "tenant/f", 1)
	ctx := context.Background()
	if _, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "before", LimitId: "tenant/f", WantTokens: 10}}); err != nil {
		t.Fatal(err)
	}

	// Freeze the term so its fence can be used after the revocation.
	a.mu.Lock()
	tm := a.term
	a.mu.Unlock()
	cli := c.Client(t)
	if _, err := cli.Revoke(ctx, a.SessionLease()); err != nil {
		t.Fatal(err)
	}
	op, err := a.Store().putGrantOp(&Grant{LeaseID: "x", Limit: "tenant/f", Region: "eu", RequestID: "forged", Tokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Store().Commit(ctx, tm.fence, []clientv3.Op{op}); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit with a revoked leader's fence: %v, want ErrFenced", err)
	}
	// Through the allocator: the request either finds no leader or fails
	// its commit; either way nothing is written.
	_, err = a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "after", LimitId: "tenant/f", WantTokens: 10}})
	if err == nil {
		// The allocator may already have campaigned again and won: then
		// the grant was made by a new term with a new fence, legitimately.
		if tm2 := a.currentTermOrNil(); tm2 == nil || tm2 == tm {
			t.Fatal("grant committed by a revoked term")
		}
	}
	resp, err := cli.Get(ctx, a.Store().grantsPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key[len(kv.Key)-len("forged"):]) == "forged" {
			t.Fatalf("fenced write landed: %s", kv.Key)
		}
	}
	// The allocator recovers: a new term leads and serves.
	allocatortest.WaitLeader(t, a)
}

func (a *Allocator) currentTermOrNil() *term {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.term
}

// acquireRetry asks until the leader answers, as an agent does: same
// request id on every try, across leaders.
func acquireRetry(t *testing.T, ctx context.Context, as []*runningAllocator, region string, req *pb.LeaseRequest) *pb.LeaseResult {
	t.Helper()
	for i := 0; ; i++ {
		for _, a := range as {
			res, err := a.AcquireLeases(ctx, region, []*pb.LeaseRequest{req})
			if err == nil {
				return res[0]
			}
			if ctx.Err() != nil {
				t.Errorf("request %s never answered: %v", req.RequestId, err)
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond) // back off between rounds of tries
	}
}

// TestFailover: allocator A leads, B follows. A is stopped while requests
// stream; they move to B with the same request ids. Every request id ends
// with exactly one lease, replies from A are replayed identically by B, and
// B's pools equal G minus what the test was granted: nothing lost, nothing
// granted twice.
func TestFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	const G = 5000
	for i := range 4 {
		l := putLimit(t, a.Allocator, fmt.Sprintf("tenant/f%d", i), G, time.Minute, 15*time.Second, 25)
		waitLimit(t, a.Allocator, l.Id, l.Version)
	}
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	// A follower refuses grants and names the leader.
	_, err := b.AcquireLeases(context.Background(), "eu", []*pb.LeaseRequest{{RequestId: "x", LimitId: "tenant/f0"}})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != "a" {
		t.Fatalf("follower answered %v, want NotLeaderError naming a", err)
	}

	led := newLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fromA sync.Map // request id -> lease id answered by A
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range 40 {
				if n == 5 {
					once.Do(func() { close(started) })
				}
				req := &pb.LeaseRequest{RequestId: fmt.Sprintf("g%d-n%d", g, n), LimitId: fmt.Sprintf("tenant/f%d", n%4), DemandPerSecond: 10}
				if res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{req}); err == nil {
					led.record(t, "eu", res[0])
					if res[0].Lease != nil {
						fromA.Store(req.RequestId, res[0].Lease.LeaseId)
					}
					continue
				}
				res := acquireRetry(t, ctx, []*runningAllocator{b, a}, "eu", req)
				if res != nil {
					led.record(t, "eu", res)
				}
			}
		}()
	}
	<-started
	a.Stop() // mid-stream
	wg.Wait()
	allocatortest.WaitLeader(t, b)

	// Replays from B of what A answered are identical.
	n := 0
	fromA.Range(func(k, v any) bool {
		n++
		res := acquireRetry(t, ctx, []*runningAllocator{b}, "eu", &pb.LeaseRequest{RequestId: k.(string), LimitId: led.byReq["eu/"+k.(string)].LimitId})
		if res == nil || res.Lease == nil || res.Lease.LeaseId != v.(string) || !res.Replayed {
			t.Errorf("B replayed %s as %v, A had answered %s", k, res, v)
		}
		return true
	})
	if n == 0 {
		t.Fatal("A answered nothing before it stopped")
	}
	w := lease.WindowOf(clock.Now(), time.Minute).Index
	net := led.net()
	if err := b.View(func(_ time.Time, core *Core) {
		for i := range 4 {
			id := fmt.Sprintf("tenant/f%d", i)
			if got, want := core.Pool(id, w), G-net[poolKey{id, w}]; got != want {
				t.Errorf("%s: B's pool = %d, want G - granted = %d", id, got, want)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("A answered %d requests before it stopped; %d leases in all", n, len(led.byReq))
}

// TestThreeMembersEtcdLeaderHardStopped: with a three-member etcd whose
// raft leader is hard-stopped, the allocator keeps granting.
func TestThreeMembersEtcdLeaderHardStopped(t *testing.T) {
	c := etcdtest.Start(t, 3)
	a := startAllocator(t, c, "a", WithSessionTTL(2*time.Second))
	allocatortest.WaitLeader(t, a)
	l := putLimit(t, a.Allocator, "tenant/3m", 100000, time.Minute, 15*time.Second, 10)
	waitLimit(t, a.Allocator, l.Id, l.Version)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	led := newLedger()
	for i := range 20 {
		led.record(t, "eu", acquireRetry(t, ctx, []*runningAllocator{a}, "eu", &pb.LeaseRequest{RequestId: fmt.Sprint("pre", i), LimitId: l.Id, WantTokens: 5}))
	}
	lead, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.HardStop(lead)
	for i := range 20 {
		res := acquireRetry(t, ctx, []*runningAllocator{a}, "eu", &pb.LeaseRequest{RequestId: fmt.Sprint("post", i), LimitId: l.Id, WantTokens: 5})
		if res == nil || res.Lease == nil || res.Lease.Tokens != 5 {
			t.Fatalf("after etcd leader stop: %v", res)
		}
		led.record(t, "eu", res)
	}
	if len(led.byReq) != 40 {
		t.Fatalf("%d leases, want 40", len(led.byReq))
	}
}

// TestGrantRecordsExpire: records of a window are removed once it ended
// more than the retention ago, and its request ids are forgotten.
func TestGrantRecordsExpire(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(30*time.Second, time.Hour)) // the test sweeps
	allocatortest.WaitLeader(t, a)
	l := putLimit(t, a.Allocator, "tenant/gc", 100, time.Minute, 15*time.Second, 0)
	waitLimit(t, a.Allocator, l.Id, l.Version)
	ctx := context.Background()
	if _, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r", LimitId: l.Id, WantTokens: 7}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReportUsage(ctx, "eu", "agent-1", []*pb.Usage{{LimitId: l.Id, WindowIndex: lease.WindowOf(clock.Now(), time.Minute).Index, Admitted: 5}}); err != nil {
		t.Fatal(err)
	}
	count := func() int64 {
		resp, err := c.Client(t).Get(ctx, a.Store().prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	before := count()
	clock.Set(t0.Add(time.Minute + 29*time.Second)) // within retention: kept
	sweepNow(t, a.Allocator)
	if got := count(); got != before {
		t.Fatalf("records removed within retention: %d -> %d", before, got)
	}
	clock.Set(t0.Add(time.Minute + 31*time.Second))
	sweepNow(t, a.Allocator)
	if got := count(); got != before-1 {
		t.Fatalf("after retention: %d keys, want %d (grant and usage replaced by one window summary)", got, before-1)
	}
	sums, err := c.Client(t).Get(ctx, a.Store().summariesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || sums.Count != 1 {
		t.Fatalf("window summaries: %v %v", sums, err)
	}
	// The request id is forgotten: a retry now is a new request.
	res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r", LimitId: l.Id, WantTokens: 7}})
	if err != nil || res[0].Replayed || res[0].Lease.WindowIndex == lease.WindowOf(t0, time.Minute).Index {
		t.Fatalf("retry after retention: %v %v", res, err)
	}
}

// TestDeletedLimitSummariesExpire: a deleted limit's window summaries go
// once its newest window ended as many windows ago as reports keep, in
// memory and in etcd, as an idle plan tenant's do; a limit with a record
// keeps its own however long it is idle.
func TestDeletedLimitSummariesExpire(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	const keep = 3
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(30*time.Second, time.Hour), WithReports(keep, 1000)) // the test sweeps
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	var ls []*pb.Limit
	for _, id := range []string{"tenant/deleted", "tenant/kept"} {
		l := putLimit(t, a.Allocator, id, 100, time.Minute, 15*time.Second, 0)
		waitLimit(t, a.Allocator, l.Id, l.Version)
		if _, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r-" + id, LimitId: id, WantTokens: 7}}); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	summaries := func(id string) (mem int, stored int64) {
		_ = a.View(func(_ time.Time, core *Core) { mem = len(core.summaries[id]) })
		resp, err := c.Client(t).Get(ctx, a.Store().summariesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), id) {
				stored++
			}
		}
		return mem, stored
	}
	clock.Set(t0.Add(time.Minute + 31*time.Second)) // the first window past the retention: summarized
	sweepNow(t, a.Allocator)
	for _, l := range ls {
		if mem, stored := summaries(l.Id); mem != 1 || stored != 1 {
			t.Fatalf("%s: %d summaries in memory, %d in etcd after its window closed, want 1 and 1", l.Id, mem, stored)
		}
	}
	if err := a.DeleteLimit(ctx, "tenant/deleted", Change{Reason: "customer left"}); err != nil {
		t.Fatal(err)
	}
	// The leader's core learns of the deletion through its watch: a sweep
	// before that keeps a limit it still knows (a CI run failed so).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := coreLimit(a.Allocator, "tenant/deleted"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader never learned that tenant/deleted was deleted")
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	clock.Set(t0.Add(keep*time.Minute + 59*time.Second)) // its window ended keep windows ago, less a second
	sweepNow(t, a.Allocator)
	if mem, stored := summaries("tenant/deleted"); mem != 1 || stored != 1 {
		t.Fatalf("tenant/deleted within the kept windows: %d summaries in memory, %d in etcd, want 1 and 1", mem, stored)
	}
	clock.Set(t0.Add((keep+1)*time.Minute + time.Second))
	sweepNow(t, a.Allocator)
	if mem, stored := summaries("tenant/deleted"); mem != 0 || stored != 0 {
		t.Fatalf("tenant/deleted after the kept windows: %d summaries in memory, %d in etcd, want none", mem, stored)
	}
	if mem, stored := summaries("tenant/kept"); mem != 1 || stored != 1 {
		t.Fatalf("tenant/kept, a limit with a record: %d summaries in memory, %d in etcd, want its 1 kept", mem, stored)
	}
}
