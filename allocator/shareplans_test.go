package allocator

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// freePlan is a bucket plan: every tenant/{id} 10 tokens a second, bursts
// of 50, shares of 10 s.
func freePlan() *pb.Limit {
	return &pb.Limit{Id: "plans/free", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 10, BurstTokens: 50,
		RatePeriod: durationpb.New(time.Second), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"tenant/{id}"}}
}

// shareTenantState is what a core keeps of a tenant of a bucket or
// concurrency plan: its shares entry (with the holders' seq), its cached
// resolution, its reporting intervals, its demand reports, its most held.
func shareTenantState(c *Core, id string) (kept []string) {
	if c.shares[id] != nil {
		kept = append(kept, fmt.Sprintf("shares (seq %v)", c.shares[id].seq))
	}
	if _, ok := c.resolved[id]; ok {
		kept = append(kept, "resolved")
	}
	if c.bucketUse[id] != nil {
		kept = append(kept, "bucket intervals")
	}
	if _, ok := c.heldMax[id]; ok {
		kept = append(kept, "held max")
	}
	for k := range c.demand {
		if k.limit == id {
			kept = append(kept, "demand "+k.region)
		}
	}
	return kept
}

// TestBucketPlanForgetsIdleTenants: a tenant of a bucket plan that no
// admin call created gets rate shares on first use (sized as a bucket
// limit's, seq from 1, committed to etcd); once it stops and its last
// share is past the retention, the leader's sweep removes its share
// records and the core keeps nothing of it (no shares entry, no seq, no
// resolution, no intervals, no demand); used again, its seq restarts at
// 1. A failover between a grant and the sweep: the new leader restores
// the share from etcd, keeps counting the seq from it, and forgets the
// tenant at the same time the old leader would have. A dry run of a
// lower rate names the tenant whose last interval admitted more than the
// new B + R x the interval.
func TestBucketPlanForgetsIdleTenants(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	const retention = 30 * time.Second
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second), WithRetention(retention, time.Hour))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, freePlan(), Change{Reason: "free for everyone", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", 1)
	cli := c.Client(t)
	shareKeys := func() int {
		t.Helper()
		resp, err := cli.Get(ctx, a.Store().sharesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs)
	}
	share := func(a *Allocator, region, req string, admitted int64) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "tenant/newco", DemandPerSecond: 20,
			AdmittedTokens: admitted}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK || res[0].Share.GetRateMilliTokens() == 0 {
			t.Fatalf("share %s of %s: %v %v", req, region, res, err)
		}
		return res[0].Share
	}
	state := func(a *Allocator) (kept []string) {
		_ = a.View(func(_ time.Time, c *Core) { kept = shareTenantState(c, "tenant/newco") })
		return kept
	}

	// First use: eu alone asks, the whole rate and burst, seq 1.
	if s := share(a.Allocator, "eu", "e1", 0); s.Seq != 1 || s.RateMilliTokens != 10_000 || s.BurstTokens != 50 {
		t.Fatalf("first share: %v", s)
	}
	if n := shareKeys(); n != 1 {
		t.Fatalf("%d share records after the first share, want 1", n)
	}
	clock.Add(5 * time.Second)
	if s := share(a.Allocator, "eu", "e2", 40); s.Seq != 2 {
		t.Fatalf("eu's renewal: %v", s)
	}
	// Unused tenants cost nothing: a refused share request keeps nothing.
	if res, err := a.AcquireShares(ctx, "ap", []*pb.ShareRequest{{RequestId: "a1", LimitId: "tenant/other", DemandPerSecond: 1}}); err != nil ||
		res[0].Code != pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED {
		t.Fatalf("a share in a region the plan leaves out: %v %v", res, err)
	}
	_ = a.View(func(_ time.Time, c *Core) {
		if kept := shareTenantState(c, "tenant/other"); len(kept) > 0 {
			t.Errorf("a refused request keeps %v", kept)
		}
	})

	// A dry run of a lower rate: newco admitted 40 in the running
	// reporting interval; 1 token per 2 s with a burst of 5 allows
	// 5 + 30 = 35 a minute.
	lower := freePlan()
	lower.RateTokens, lower.BurstTokens, lower.RatePeriod = 1, 5, durationpb.New(2*time.Second)
	dryRun := func(a *Allocator, p *pb.Limit) *pb.ChangeEffect {
		t.Helper()
		resp, err := NewServer(a).PutLimit(ctx, &pb.PutLimitRequest{Limit: p, Reason: "dry", DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Effect
	}
	eff := dryRun(a.Allocator, lower)
	if eff.PlanTenants != 1 || eff.PlanTenantsDenyingCount != 1 || len(eff.PlanTenantsDenying) != 1 || eff.PlanTenantsDenying[0] != "tenant/newco" {
		t.Fatalf("dry run of 1 per 2 s, burst 5: tenants %d, denying %d %v", eff.PlanTenants, eff.PlanTenantsDenyingCount, eff.PlanTenantsDenying)
	}
	if same := dryRun(a.Allocator, freePlan()); same.PlanTenants != 1 || same.PlanTenantsDenyingCount != 0 {
		t.Fatalf("dry run of the same plan: %v", same)
	}

	// Failover between the grant and the sweep: b restores the shares
	// from etcd and goes on with the seq.
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second), WithRetention(retention, time.Hour))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitPlan(t, b.Allocator, "tenant/probe", 1)
	if kept := state(b.Allocator); len(kept) != 1 {
		t.Fatalf("the new leader keeps %v of the tenant, want its shares", kept)
	}
	sweepNow(t, b.Allocator) // nothing expired yet
	if n := shareKeys(); n != 2 {
		t.Fatalf("%d share records before they expired, want 2", n)
	}
	clock.Add(time.Second)
	if s := share(b.Allocator, "eu", "e3", 40); s.Seq != 3 {
		t.Fatalf("eu's renewal on the new leader: %v (want seq 3)", s)
	}
	// Idle: the last share expires at +16 s; the sweep forgets it the
	// retention later, not before.
	clock.Add(10*time.Second + retention - time.Millisecond)
	sweepNow(t, b.Allocator)
	if n := shareKeys(); n != 1 || len(state(b.Allocator)) == 0 {
		t.Fatalf("a millisecond before the last share's retention ends: %d records, state %v; want 1 and kept", n, state(b.Allocator))
	}
	clock.Add(time.Millisecond)
	sweepNow(t, b.Allocator)
	if n, kept := shareKeys(), state(b.Allocator); n != 0 || len(kept) != 0 {
		t.Fatalf("after the retention: %d share records, core keeps %v; want nothing", n, kept)
	}
	if eff := dryRun(b.Allocator, lower); eff.PlanTenants != 0 {
		t.Fatalf("dry run after the tenant was forgotten: %v", eff)
	}
	// Used again: seq 1 again, the whole rate (nobody else holds any).
	if s := share(b.Allocator, "eu", "e4", 0); s.Seq != 1 || s.RateMilliTokens != 10_000 {
		t.Fatalf("the tenant used again: %v (want seq 1)", s)
	}
}

// TestBucketPlanChanges: a change of a bucket plan governs at once
// (effective unset), for every tenant: a tenant's next share is sized
// with the new rate and burst and carries the plan's new version (a
// contract's rate and burst are its tenant's own), and a
// share granted before keeps what it was granted until it expires (the
// allocator counts it until then). What a bucket limit refuses, a bucket
// plan refuses, naming the field: a change for the next window, an
// override, a change of kind.
func TestBucketPlanChanges(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, freePlan(), Change{Reason: "free"}); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", 1)
	share := func(region, req string) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "tenant/newco", DemandPerSecond: 100}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s: %v %v", req, res, err)
		}
		return res[0].Share
	}
	if s := share("eu", "e1"); s.RateMilliTokens != 10_000 || s.BurstTokens != 50 || s.LimitVersion != 1 {
		t.Fatalf("first share: %v", s)
	}
	more := freePlan()
	more.RateTokens, more.BurstTokens = 30, 90
	more.Contracts = map[string]*pb.Contract{"tenant/atlas": {RateTokens: 100, BurstTokens: 400}}
	clock.Add(time.Second)
	got, err := a.PutLimit(ctx, more, Change{Reason: "free gets more, atlas its own rate"})
	if err != nil || got.Version != 2 || !got.EffectiveFrom.AsTime().Equal(clock.Now()) || got.Previous != nil {
		t.Fatalf("a change with effective unset: %v, %v", got, err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", 2)
	// eu still holds its first share (10/s); the renewal gets the new
	// numbers (eu alone asks: all of them) with the new version.
	if s := share("eu", "e2"); s.RateMilliTokens != 30_000 || s.BurstTokens != 90 || s.LimitVersion != 2 {
		t.Fatalf("eu's share after the change: %v", s)
	}
	// A contract's rate and burst are the tenant's own.
	res, err := a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: "a1", LimitId: "tenant/atlas", DemandPerSecond: 500}})
	if err != nil || res[0].Share.GetRateMilliTokens() != 100_000 || res[0].Share.GetBurstTokens() != 400 {
		t.Fatalf("atlas's share under its contract: %v %v", res, err)
	}
	for _, tc := range []struct {
		name  string
		l     *pb.Limit
		ch    Change
		field string
	}{
		{"next window", freePlan(), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW}, "effective"},
		{"override of the binds", func() *pb.Limit {
			l := proto.Clone(more).(*pb.Limit)
			l.Binds = append(l.Binds, "tenant/bigco")
			return l
		}(),
			Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW, OverrideFor: time.Minute}, "limit.binds"},
		{"override of the period", func() *pb.Limit {
			l := proto.Clone(more).(*pb.Limit)
			l.RatePeriod = durationpb.New(time.Minute)
			return l
		}(),
			Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW, OverrideFor: time.Minute}, "limit.rate_period"},
		{"kind", proPlan(100), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}, "limit.kind"},
	} {
		if tc.name == "kind" {
			tc.l.Id = "plans/free"
		}
		_, err := a.PutLimit(ctx, tc.l, tc.ch)
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}
}

// TestConcurrencyPlanForgetsIdleTenants: a tenant of a concurrency plan
// gets slot shares on first use; a contract's limit_tokens is its own N;
// a dry run of a lower N names the tenant holding more slots than it; once
// its last share is past the retention the sweep removes its records and
// the core keeps nothing of it (slots held at most included); used again,
// seq 1.
func TestConcurrencyPlanForgetsIdleTenants(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	const retention = 30 * time.Second
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithRetention(retention, time.Hour))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	jobs := func(n int64) *pb.Limit {
		return &pb.Limit{Id: "plans/jobs", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n, Regions: []string{"eu", "us"},
			Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"jobs/{id}"},
			Contracts: map[string]*pb.Contract{"jobs/big": {LimitTokens: 20}}}
	}
	if _, err := a.PutLimit(ctx, jobs(3), Change{Reason: "jobs", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "jobs/probe", 1)
	share := func(id, req string, held int64) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: req, LimitId: id, DemandPerSecond: float64(held + 1), HeldSlots: held}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK || res[0].Share.GetSlots() == 0 {
			t.Fatalf("slot share %s of %s: %v %v", req, id, res, err)
		}
		return res[0].Share
	}
	if s := share("jobs/newco", "n1", 0); s.Seq != 1 || s.Slots != 3 {
		t.Fatalf("first slot share: %v", s)
	}
	if s := share("jobs/big", "b1", 0); s.Slots != 20 {
		t.Fatalf("a contract's N: %v", s)
	}
	clock.Add(5 * time.Second)
	if s := share("jobs/newco", "n2", 3); s.Seq != 2 {
		t.Fatalf("renewal holding 3: %v", s)
	}
	resp, err := NewServer(a.Allocator).PutLimit(ctx, &pb.PutLimitRequest{Limit: jobs(2), Reason: "fewer", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Effect; e.Kind != pb.LimitKind_LIMIT_KIND_CONCURRENCY || e.NewLimitTokens != 2 || e.PlanTenants != 2 ||
		e.PlanTenantsDenyingCount != 1 || e.PlanTenantsDenying[0] != "jobs/newco" {
		t.Fatalf("dry run of N 3 -> 2: %v", e)
	}
	// The slot metrics and ListWindows show the used tenants (not the
	// plan's record), each with its own N.
	bounds := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_concurrency_bound_slots" {
			for _, m := range mf.GetMetric() {
				bounds[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if len(bounds) != 2 || bounds["jobs/newco"] != 3 || bounds["jobs/big"] != 20 {
		t.Fatalf("leasehold_concurrency_bound_slots: %v, want jobs/newco 3 and jobs/big 20", bounds)
	}
	lw, err := NewServer(a.Allocator).ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "jobs/newco"})
	if err != nil || lw.Kind != pb.LimitKind_LIMIT_KIND_CONCURRENCY || lw.LimitSlots != 3 || lw.Plan != "plans/jobs" || len(lw.Shares) != 2 {
		t.Fatalf("ListWindows of a concurrency plan's tenant: %v %v", lw, err)
	}
	clock.Add(10*time.Second + retention)
	sweepNow(t, a.Allocator)
	_ = a.View(func(_ time.Time, c *Core) {
		for _, id := range []string{"jobs/newco", "jobs/big"} {
			if kept := shareTenantState(c, id); len(kept) > 0 || c.SharesKept(id) {
				t.Errorf("after the retention the core keeps %v of %s", kept, id)
			}
		}
	})
	resp2, err := a.Store().Client().Get(ctx, a.Store().sharesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(resp2.Kvs) != 0 {
		t.Fatalf("share records after the retention: %d, %v", len(resp2.Kvs), err)
	}
	if s := share("jobs/newco", "n3", 0); s.Seq != 1 || s.Slots != 3 {
		t.Fatalf("the tenant used again: %v (want seq 1)", s)
	}
}

// TestShareTenantsCostOnlyWhenUsed: 100,000 ids bound to a bucket plan
// and to a concurrency plan, 500 of each used: etcd grows by one share
// record per used tenant and no key names an unused one; the core keeps
// share state (and a cached resolution) for the used tenants only; once
// their shares are past the retention, nothing at all.
func TestShareTenantsCostOnlyWhenUsed(t *testing.T) {
	const tenants, used = 100_000, 500
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	const retention = 30 * time.Second
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(retention, time.Hour))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	jobs := &pb.Limit{Id: "plans/jobs", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3, Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"jobs/{id}"}}
	for _, p := range []*pb.Limit{freePlan(), jobs} {
		if _, err := a.PutLimit(ctx, p, Change{Reason: "for everyone", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
			t.Fatal(err)
		}
	}
	waitPlan(t, a.Allocator, "tenant/t0", 1)
	waitPlan(t, a.Allocator, "jobs/t0", 1)
	cli := c.Client(t)
	keys := func() (n int, unused []string) {
		t.Helper()
		resp, err := cli.Get(ctx, a.Store().sharesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			// shares/<limit>!/<region>/<request id>, <limit> = tenant/tN or jobs/tN
			id, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), a.Store().sharesPrefix()), "!")
			_, n, _ := strings.Cut(id, "/t")
			i, err := strconv.Atoi(n)
			if err != nil || i%(tenants/used) != 0 {
				unused = append(unused, string(kv.Key))
			}
		}
		return len(resp.Kvs), unused[:min(len(unused), 5)]
	}
	for i := range tenants {
		if _, ok := coreLimit(a.Allocator, fmt.Sprintf("tenant/t%d", i)); !ok {
			t.Fatalf("tenant/t%d does not resolve", i)
		}
	}
	kept := func() (n int) {
		_ = a.View(func(_ time.Time, c *Core) {
			for i := range tenants {
				for _, p := range []string{"tenant/t", "jobs/t"} {
					if c.SharesKept(fmt.Sprintf("%s%d", p, i)) {
						n++
					}
				}
			}
		})
		return n
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	heap0 := heap()
	const batch = 100
	for i := 0; i < used; i += batch {
		for _, p := range []string{"tenant/t", "jobs/t"} {
			var reqs []*pb.ShareRequest
			for j := i; j < i+batch; j++ {
				reqs = append(reqs, &pb.ShareRequest{RequestId: fmt.Sprintf("r%s%d", p[:1], j), LimitId: fmt.Sprintf("%s%d", p, j*(tenants/used)),
					DemandPerSecond: 5, HeldSlots: 1})
			}
			res, err := a.AcquireShares(ctx, "eu", reqs)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if r.Code != pb.ItemCode_ITEM_CODE_OK || r.Share.GetSeq() != 1 {
					t.Fatalf("share: %v", r)
				}
			}
		}
	}
	heap1 := heap()
	n, unused := keys()
	t.Logf("%d ids bound to each of two plans, %d of each used: %d share records, core keeps %d tenants, heap %+.1f MiB (%.0f B per used tenant)",
		tenants, used, n, kept(), float64(int64(heap1)-int64(heap0))/(1<<20), float64(int64(heap1)-int64(heap0))/(2*used))
	if n != 2*used || len(unused) > 0 {
		t.Fatalf("%d share records (want one per used tenant, %d), keys naming no used tenant: %q", n, 2*used, unused)
	}
	if k := kept(); k != 2*used {
		t.Fatalf("the core keeps share state of %d tenants, want the %d used", k, 2*used)
	}
	clock.Add(10*time.Second + retention)
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	if n, _ := keys(); n != 0 || kept() != 0 {
		t.Fatalf("after the retention: %d share records, core keeps %d tenants; want nothing", n, kept())
	}
}

// sweepNow runs the leader a's sweep of expired state once, now.
func sweepNow(t *testing.T, a *Allocator) {
	t.Helper()
	tm := a.currentTermOrNil()
	if tm == nil {
		t.Fatal("not leading")
	}
	if err := a.sweepOnce(tm); err != nil {
		t.Fatal(err)
	}
}
