package allocator

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// checkOverrideEndRecorded runs the leader's sweep and checks that the
// end of the override o is in the limit's history as a change of its own,
// with the version it returned to (check), and that a second sweep writes
// nothing more.
func checkOverrideEndRecorded(t *testing.T, a *Allocator, o *pb.Limit, reason string, check func(*pb.Limit) bool) {
	t.Helper()
	ctx := context.Background()
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	got, err := NewServer(a).GetLimit(ctx, &pb.GetLimitRequest{Id: o.Id})
	if err != nil || got.Limit.Override != nil || got.Limit.Version != o.Version+1 || !check(got.Limit) {
		t.Fatalf("GetLimit after the end was recorded: %v %v", got, err)
	}
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	hist, err := NewServer(a).LimitHistory(ctx, &pb.LimitHistoryRequest{Id: o.Id})
	if err != nil || len(hist.Events) != 3 {
		t.Fatalf("history: %v %v", hist, err)
	}
	var last *pb.AuditEvent
	for _, e := range hist.Events {
		if last == nil || e.GetNew().GetVersion() > last.GetNew().GetVersion() {
			last = e
		}
	}
	if last.Reason != "override ended ("+reason+")" || !check(last.GetNew()) {
		t.Fatalf("the end's history entry: %v", last)
	}
}

// checkOverrideEndSeries checks that reg has one series of
// leasehold_limit_override_end_timestamp_seconds per id (sorted), each
// at end; none when ids is empty.
func checkOverrideEndSeries(t *testing.T, reg *prometheus.Registry, end time.Time, ids ...string) {
	t.Helper()
	want := ""
	if len(ids) > 0 {
		want = `# HELP leasehold_limit_override_end_timestamp_seconds When the override in force on a limit ends (Unix seconds; absent without one): the version before it governs again then.
# TYPE leasehold_limit_override_end_timestamp_seconds gauge
`
		for _, id := range ids {
			want += `leasehold_limit_override_end_timestamp_seconds{limit="` + id + `"} ` + strconv.FormatInt(end.Unix(), 10) + "\n"
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasehold_limit_override_end_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
}

// TestBucketOverrideEndsAcrossFailover: an override raising a bucket
// limit's R and B sizes every share granted during it, on the leader
// elected during it too; from its end new shares are sized by the old R
// while the shares granted under the override stay counted until they
// expire (another region gets nothing until then), and the sum of the
// shares in force converges to the old R.
func TestBucketOverrideEndsAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	bucket := func(rate, burst int64) *pb.Limit { return bucketProto("b/o", rate, burst, 10*time.Second, "eu", "us") }
	if _, err := a.PutLimit(ctx, bucket(100, 200), Change{Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	o, err := a.PutLimit(ctx, bucket(300, 600), Change{Reason: "incident 44: launch", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(61 * time.Second)
	if o.Override == nil || !o.Override.EndsAt.AsTime().Equal(end) || o.Override.After.GetRateTokens() != 100 ||
		o.Override.After.GetBurstTokens() != 200 || o.RateTokens != 300 {
		t.Fatalf("override stored as %v", o)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leasehold_limit_override_end_timestamp_seconds When the override in force on a limit ends (Unix seconds; absent without one): the version before it governs again then.
# TYPE leasehold_limit_override_end_timestamp_seconds gauge
leasehold_limit_override_end_timestamp_seconds{limit="b/o"} `+strconv.FormatInt(end.Unix(), 10)+"\n"),
		"leasehold_limit_override_end_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	share := func(a *Allocator, region, req string) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "b/o", DemandPerSecond: 300}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s %s: %v %v", region, req, res, err)
		}
		return res[0].Share
	}
	reserved := func(a *Allocator) (rate, burst int64) {
		_ = a.View(func(now time.Time, core *Core) { rate, burst = core.Reserved("b/o", now) })
		return rate, burst
	}
	if s := share(a.Allocator, "eu", "e1"); s.RateMilliTokens != 300_000 || s.BurstTokens != 600 || s.LimitVersion != o.Version {
		t.Fatalf("eu's share under the override: %v", s)
	}
	syncBefore, err := a.SyncLimits(ctx, "eu", 0)
	if err != nil || len(syncBefore.Limits) != 1 || syncBefore.Limits[0].RateTokens != 300 || syncBefore.Limits[0].Override == nil {
		t.Fatalf("sync under the override: %v %v", syncBefore, err)
	}

	// The leader changes during the override.
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, o.Id, o.Version)
	clock.Set(t0.Add(55 * time.Second)) // eu's first share expired at 11 s
	if s := share(b.Allocator, "eu", "e2"); s.RateMilliTokens != 300_000 || s.BurstTokens != 600 || s.ExpiresIn.AsDuration() != 10*time.Second {
		t.Fatalf("eu's share on the new leader before the end: %v", s)
	}
	got, err := NewServer(b.Allocator).GetLimit(ctx, &pb.GetLimitRequest{Id: o.Id})
	if err != nil || got.Limit.RateTokens != 300 || !got.Limit.GetOverride().GetEndsAt().AsTime().Equal(end) {
		t.Fatalf("GetLimit on the new leader during the override: %v %v", got, err)
	}

	// The end: R = 100 again. eu's share of 300/s (granted under the
	// override) is in force until 65 s and still counted: us gets nothing
	// until it expires; eu's renewal is sized by R = 100.
	clock.Set(end)
	if s := share(b.Allocator, "us", "u1"); s.GetRateMilliTokens() != 0 || s.GetShareId() != "" {
		t.Fatalf("us at the end, eu's override share in force: %v", s)
	}
	e3 := share(b.Allocator, "eu", "e3")
	if e3.RateMilliTokens <= 0 || e3.RateMilliTokens > 100_000 || e3.BurstTokens > 200 || e3.LimitVersion != o.Version {
		t.Fatalf("eu's share at the end: %v, want at most R = 100/s, B = 200", e3)
	}
	if r, bu := reserved(b.Allocator); r != 300_000 || bu != 600 {
		t.Fatalf("reserved at the end: %d, %d; want the override share's 300000, 600 until it expires", r, bu)
	}
	sync, err := b.SyncLimits(ctx, "eu", syncBefore.Revision)
	if err != nil || sync.Unchanged || len(sync.Limits) != 1 || sync.Limits[0].RateTokens != 100 || sync.Limits[0].Override != nil {
		t.Fatalf("sync at the end: %v %v", sync, err)
	}
	clock.Set(t0.Add(65*time.Second - time.Millisecond))
	if s := share(b.Allocator, "us", "u2"); s.GetRateMilliTokens() != 0 {
		t.Fatalf("us just before eu's override share expires: %v", s)
	}
	clock.Set(t0.Add(65 * time.Second))
	u3 := share(b.Allocator, "us", "u3")
	if u3.RateMilliTokens != 100_000-e3.RateMilliTokens {
		t.Fatalf("us once eu's override share expired: %v, want the rest of R = 100/s (eu holds %d)", u3, e3.RateMilliTokens)
	}
	if r, bu := reserved(b.Allocator); r > 100_000 || bu > 200 {
		t.Fatalf("reserved once the override's shares expired: %d, %d; want at most 100000, 200", r, bu)
	}
	checkOverrideEndRecorded(t, b.Allocator, o, "incident 44: launch", func(l *pb.Limit) bool {
		return l.GetRateTokens() == 100 && l.GetBurstTokens() == 200
	})
}

// TestBucketOverrideCut: an override cutting R counts the shares granted
// before it at their own R until they expire (a region gets nothing while
// the others' older shares hold more than the new R), and the shares
// granted from then on add up to the cut R.
func TestBucketOverrideCut(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	bucket := func(rate int64) *pb.Limit {
		return &pb.Limit{Id: "b/o", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: 100,
			Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	}
	if _, err := a.PutLimit(ctx, bucket(100), Change{Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, "b/o", 1)
	share := func(region, req string) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "b/o", DemandPerSecond: 300}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s %s: %v %v", region, req, res, err)
		}
		return res[0].Share
	}
	if s := share("eu", "e1"); s.RateMilliTokens != 100_000 { // expires at 11 s
		t.Fatalf("eu before the cut: %v", s)
	}
	clock.Set(t0.Add(2 * time.Second))
	o, err := a.PutLimit(ctx, bucket(40), Change{Reason: "incident 45: backend overloaded", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	if s := share("us", "u1"); s.GetRateMilliTokens() != 0 {
		t.Fatalf("us under the cut while eu's share of 100/s is in force: %v", s)
	}
	e2 := share("eu", "e2")
	if e2.RateMilliTokens <= 0 || e2.RateMilliTokens > 40_000 {
		t.Fatalf("eu's renewal under the cut: %v, want at most 40/s", e2)
	}
	clock.Set(t0.Add(11 * time.Second))
	u2 := share("us", "u2")
	if u2.RateMilliTokens != 40_000-e2.RateMilliTokens {
		t.Fatalf("us once eu's share from before the cut expired: %v, want the rest of 40/s (eu holds %d)", u2, e2.RateMilliTokens)
	}
	var rate int64
	_ = a.View(func(now time.Time, core *Core) { rate, _ = core.Reserved("b/o", now) })
	if rate != 40_000 {
		t.Fatalf("reserved under the cut: %d, want 40000", rate)
	}
}

// TestConcurrencyOverrideEndsAcrossFailover: an override raising a
// concurrency limit's N sizes the slot shares granted during it, on the
// leader elected during it too; from its end slot shares are sized by the
// old N, the shares granted under the override counted until they expire
// (slots held are never revoked: a region holding more than the new N
// keeps them, and admits nothing new until it holds fewer).
func TestConcurrencyOverrideEndsAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	conc := func(n int64) *pb.Limit {
		return &pb.Limit{Id: "c/o", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n, Regions: []string{"eu", "us"},
			Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
	}
	if _, err := a.PutLimit(ctx, conc(2), Change{Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	o, err := a.PutLimit(ctx, conc(5), Change{Reason: "incident 46: backlog", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(61 * time.Second)
	if o.Override == nil || !o.Override.EndsAt.AsTime().Equal(end) || o.Override.After.GetLimitTokens() != 2 || o.LimitTokens != 5 {
		t.Fatalf("override stored as %v", o)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	ask := func(a *Allocator, region, req string, held int64) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "c/o", DemandPerSecond: 5, HeldSlots: held}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("slots %s %s: %v %v", region, req, res, err)
		}
		return res[0].Share
	}
	if s := ask(a.Allocator, "eu", "e1", 0); s.Slots != 5 || s.AdmitSlots != 5 {
		t.Fatalf("eu's slot share under the override: %v", s)
	}

	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, o.Id, o.Version)
	clock.Set(t0.Add(55 * time.Second))
	if s := ask(b.Allocator, "eu", "e2", 4); s.Slots != 5 || s.AdmitSlots != 5 {
		t.Fatalf("eu's slot share on the new leader before the end: %v", s)
	}

	// The end: N = 2 again. eu holds 4 slots: they are not revoked, its
	// share keeps what it holds up to the new N and admits nothing above
	// it; us gets nothing while eu's share of 5 (until 65 s) is counted.
	clock.Set(end)
	if s := ask(b.Allocator, "us", "u1", 0); s.GetSlots() != 0 {
		t.Fatalf("us at the end, eu's override share in force: %v", s)
	}
	if s := ask(b.Allocator, "eu", "e3", 4); s.Slots != 2 || s.AdmitSlots > 2 {
		t.Fatalf("eu's slot share at the end, holding 4: %v, want 2 slots", s)
	}
	var held int64
	_ = b.View(func(now time.Time, core *Core) { held = core.ReservedSlots("c/o", now) })
	if held != 5 {
		t.Fatalf("slots reserved at the end: %d, want the override share's 5 until it expires", held)
	}
	// The status: N and the bound are 2 again; 4 held under the override's
	// 5 are not over the bound in force when they were held.
	if st, err := b.SlotStatus("c/o"); err != nil || st.N != 2 || st.Bound != 2 || st.HeldMax != 4 || st.BoundMax != 5 {
		t.Fatalf("slot status at the end: %+v, %v; want N 2, bound 2, held at most 4, bound at most 5", st, err)
	}
	clock.Set(t0.Add(65 * time.Second))
	_ = b.View(func(now time.Time, core *Core) { held = core.ReservedSlots("c/o", now) })
	if held != 2 {
		t.Fatalf("slots reserved once the override's share expired: %d, want 2", held)
	}
	if s := ask(b.Allocator, "us", "u2", 0); s.GetSlots() != 0 {
		t.Fatalf("us while eu's share holds N = 2: %v", s)
	}
	checkOverrideEndRecorded(t, b.Allocator, o, "incident 46: backlog", func(l *pb.Limit) bool { return l.GetLimitTokens() == 2 })
}

// TestBucketPlanOverride: an override of a bucket plan reaches a tenant
// first used during it; a tenant with a contract keeps its own rate and
// burst; a tenant first used at the end gets the plan's old numbers.
// While it is in force, the plan and each tenant with shares kept have a
// series of leasehold_limit_override_end_timestamp_seconds (as a window
// plan's used tenants do); from its end none.
func TestBucketPlanOverride(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	base := freePlan()
	base.Contracts = map[string]*pb.Contract{"tenant/atlas": {RateTokens: 100, BurstTokens: 400}}
	p, err := a.PutLimit(ctx, base, Change{Reason: "free"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", p.Version)
	up := freePlan()
	up.Contracts = base.Contracts
	up.RateTokens, up.BurstTokens = 40, 200
	o, err := a.PutLimit(ctx, up, Change{Reason: "incident 47: free tier launch", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if o.Override.GetAfter().GetRateTokens() != 10 {
		t.Fatalf("override stored as %v", o)
	}
	waitPlan(t, a.Allocator, "tenant/probe", o.Version)
	share := func(tenant, req string) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: req, LimitId: tenant, DemandPerSecond: 500}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s %s: %v %v", tenant, req, res, err)
		}
		return res[0].Share
	}
	if s := share("tenant/newco", "n1"); s.RateMilliTokens != 40_000 || s.BurstTokens != 200 {
		t.Fatalf("a first-use tenant under the override: %v", s)
	}
	if s := share("tenant/atlas", "a1"); s.RateMilliTokens != 100_000 || s.BurstTokens != 400 {
		t.Fatalf("a contracted tenant under the override: %v, want its own 100/s, 400", s)
	}
	checkOverrideEndSeries(t, reg, o.Override.EndsAt.AsTime(), "plans/free", "tenant/atlas", "tenant/newco")
	clock.Set(t0.Add(61 * time.Second))
	checkOverrideEndSeries(t, reg, time.Time{})
	if s := share("tenant/later", "l1"); s.RateMilliTokens != 10_000 || s.BurstTokens != 50 {
		t.Fatalf("a tenant first used at the end: %v, want the plan's 10/s, 50", s)
	}
	if s := share("tenant/newco", "n2"); s.RateMilliTokens != 10_000 || s.BurstTokens != 50 {
		t.Fatalf("newco's renewal at the end: %v, want the plan's 10/s, 50", s)
	}
	if s := share("tenant/atlas", "a2"); s.RateMilliTokens != 100_000 || s.BurstTokens != 400 {
		t.Fatalf("atlas at the end: %v", s)
	}
	checkOverrideEndRecorded(t, a.Allocator, o, "incident 47: free tier launch", func(l *pb.Limit) bool {
		return l.GetRateTokens() == 10 && l.GetBurstTokens() == 50 && l.GetContracts()["tenant/atlas"].GetRateTokens() == 100
	})
}

// TestConcurrencyPlanOverride: an override of a concurrency plan's N
// reaches a tenant first used during it; a tenant with a contract keeps
// its own N; from the end a tenant's next slot share has the plan's N
// again. The override-end series: the plan's and each used tenant's
// while it is in force, none from its end.
func TestConcurrencyPlanOverride(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	jobs := func(n int64) *pb.Limit {
		return &pb.Limit{Id: "plans/jobs", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n, Regions: []string{"eu", "us"},
			Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"jobs/{id}"},
			Contracts: map[string]*pb.Contract{"jobs/big": {LimitTokens: 20}}}
	}
	p, err := a.PutLimit(ctx, jobs(3), Change{Reason: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "jobs/probe", p.Version)
	o, err := a.PutLimit(ctx, jobs(8), Change{Reason: "incident 49: backlog", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "jobs/probe", o.Version)
	slots := func(id, req string) int64 {
		t.Helper()
		res, err := a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: req, LimitId: id, DemandPerSecond: 50}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("slot share %s of %s: %v %v", req, id, res, err)
		}
		return res[0].Share.GetSlots()
	}
	if n := slots("jobs/newco", "n1"); n != 8 {
		t.Fatalf("a first-use tenant under the override: %d slots, want 8", n)
	}
	if n := slots("jobs/big", "b1"); n != 20 {
		t.Fatalf("a contracted tenant under the override: %d slots, want its own 20", n)
	}
	checkOverrideEndSeries(t, reg, o.Override.EndsAt.AsTime(), "jobs/big", "jobs/newco", "plans/jobs")
	clock.Set(t0.Add(61 * time.Second)) // the end; the shares above expired at 11 s
	checkOverrideEndSeries(t, reg, time.Time{})
	if n := slots("jobs/later", "l1"); n != 3 {
		t.Fatalf("a tenant first used at the end: %d slots, want the plan's 3", n)
	}
	if n := slots("jobs/newco", "n2"); n != 3 {
		t.Fatalf("newco at the end: %d slots, want the plan's 3", n)
	}
	checkOverrideEndRecorded(t, a.Allocator, o, "incident 49: backlog", func(l *pb.Limit) bool {
		return l.GetLimitTokens() == 3 && l.GetContracts()["jobs/big"].GetLimitTokens() == 20
	})
}

// TestBucketOverrideEndBoundAfterFailover: a leader elected at the end of
// an override that raised R restores the shares granted under it from
// their records; the reporting interval's bound counts them at the R and
// B they were granted under until they expire, not at the old R the new
// leader grants by.
func TestBucketOverrideEndBoundAfterFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	bucket := func(rate, burst int64) *pb.Limit { return bucketProto("b/o", rate, burst, 10*time.Second, "eu", "us") }
	if _, err := a.PutLimit(ctx, bucket(100, 200), Change{Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	o, err := a.PutLimit(ctx, bucket(300, 600), Change{Reason: "launch", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	share := func(a *Allocator, region, req string) *pb.RateShare {
		t.Helper()
		res, err := a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: req, LimitId: "b/o", DemandPerSecond: 300}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s %s: %v %v", region, req, res, err)
		}
		return res[0].Share
	}
	clock.Set(t0.Add(60 * time.Second))
	if s := share(a.Allocator, "eu", "e1"); s.RateMilliTokens != 300_000 { // in force until 70 s
		t.Fatalf("eu's share a second before the end: %v", s)
	}
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	a.Stop()
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, o.Id, o.Version)
	clock.Set(o.Override.EndsAt.AsTime())
	if s := share(b.Allocator, "us", "u1"); s.GetRateMilliTokens() != 0 {
		t.Fatalf("us at the end on the new leader, eu's override share in force: %v", s)
	}
	var reps []BucketReport
	_ = b.View(func(now time.Time, core *Core) { reps = core.BucketReports("b/o", now, 1) })
	if len(reps) != 1 || reps[0].Rate != 300 || reps[0].Burst != 600 {
		t.Fatalf("the new leader's running interval: %+v, want R 300, B 600 (eu's share granted under the override)", reps)
	}
}

// TestPlanOverrideTenantSeriesCapped: an override of a plan with many
// used tenants does not make a series per tenant without bound: the plan
// has its series, and of its tenants at most the window metrics' limit
// count (WithReports), the first by id when none is exported with window
// metrics (a bucket plan's tenants have none).
func TestPlanOverrideTenantSeriesCapped(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithReports(60, 2))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	p, err := a.PutLimit(ctx, freePlan(), Change{Reason: "free"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", p.Version)
	up := freePlan()
	up.RateTokens = 40
	o, err := a.PutLimit(ctx, up, Change{Reason: "launch", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/probe", o.Version)
	for _, tenant := range []string{"tenant/d", "tenant/b", "tenant/c", "tenant/a"} {
		res, err := a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: tenant, LimitId: tenant, DemandPerSecond: 5}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share %s: %v %v", tenant, res, err)
		}
	}
	checkOverrideEndSeries(t, reg, o.Override.EndsAt.AsTime(), "plans/free", "tenant/a", "tenant/b")
}

// TestTenantOverrideSeriesOrder: the tenants exported with window metrics
// come first, in the rows' order, then the others by id, n in all.
func TestTenantOverrideSeriesOrder(t *testing.T) {
	end := t0.Add(time.Minute)
	ends := map[string]time.Time{"t/a": end, "t/b": end, "t/x": end, "t/y": end}
	var rows []limitRow
	for _, id := range []string{"t/y", "other", "t/x"} {
		var r limitRow
		r.rep.Limit = id
		rows = append(rows, r)
	}
	for n, want := range map[int][]string{0: {}, 1: {"t/y"}, 3: {"t/y", "t/x", "t/a"}, 9: {"t/y", "t/x", "t/a", "t/b"}} {
		if got := tenantOverrideSeries(ends, rows, n); !slices.Equal(got, want) {
			t.Errorf("n = %d: %v, want %v", n, got, want)
		}
	}
}
