package allocator

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

func proPlan(g int64) *pb.Limit {
	return &pb.Limit{Id: "plans/pro", LimitTokens: g, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second)}, Binds: []string{"tenant/{id}"}}
}

// waitPlan waits until the leader's core resolves id to version v of its
// plan.
func waitPlan(t *testing.T, a *Allocator, id string, v int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = a.View(func(_ time.Time, c *Core) {
			l, found := c.Limit(id)
			ok = found && l.Version >= v
		})
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not ordering
	}
	t.Fatalf("%s never resolved to plan version %d on the leader", id, v)
}

// TestCorePlanFirstUse: an id a plan binds is granted from the plan on
// first use with no record of its own; the plan's record, an id of two
// segments and an unbound id are not limits; an explicit limit wins over
// the plan; the core keeps a resolution only while the id has windows.
func TestCorePlanFirstUse(t *testing.T) {
	c := NewCore()
	plan := testLimit("plans/pro", 100, time.Minute, 15*time.Second, "eu", "us")
	plan.Proto.Binds = []string{"tenant/{id}"}
	plan.Proto.Contracts = map[string]*pb.Contract{"tenant/vip": {LimitTokens: 250}} // a contract wins over the plan's G
	c.SetLimit(plan)
	c.SetLimit(testLimit("tenant/atlas", 300, time.Minute, 15*time.Second, "eu", "us"))
	ent := testLimit("plans/ent", 5000, time.Minute, 15*time.Second, "eu", "us")
	ent.Proto.Binds = []string{"tenant/bigco", "tenant/atlas"} // a mapping: wins over tenant/{id}, not over a record
	c.SetLimit(ent)
	acq := func(id, req string, want int64) Decision {
		return c.Acquire(t0, "eu", AcquireRequest{RequestID: req, Limit: id, Want: want})
	}
	if d := acq("tenant/newco", "r1", 1000); d.Code != pb.ItemCode_ITEM_CODE_OK || d.Grant == nil || d.Grant.Tokens != 100 || d.Grant.G != 100 {
		t.Fatalf("first use of tenant/newco: %+v", d)
	}
	if d := acq("tenant/newco", "r2", 1); d.Grant != nil {
		t.Fatalf("tenant/newco's pool is spent, got %+v", d.Grant)
	}
	if d := acq("tenant/atlas", "r3", 1000); d.Grant == nil || d.Grant.Tokens != 300 {
		t.Fatalf("the explicit limit tenant/atlas: %+v", d)
	}
	if d := acq("tenant/bigco", "r4", 10000); d.Grant == nil || d.Grant.Tokens != 5000 {
		t.Fatalf("tenant/bigco, mapped to plans/ent: %+v", d)
	}
	if d := acq("tenant/vip", "r5", 10000); d.Grant == nil || d.Grant.Tokens != 250 || d.Grant.G != 250 {
		t.Fatalf("tenant/vip, with a contract of 250 on plans/pro: %+v", d)
	}
	for _, id := range []string{"plans/pro", "tenant/eu/x", "other/x"} {
		if d := acq(id, "r-"+id, 1); d.Code != pb.ItemCode_ITEM_CODE_NOT_FOUND {
			t.Errorf("%s: code %v, want NOT_FOUND", id, d.Code)
		}
	}
	// A refused request keeps nothing of a tenant.
	if d := c.Acquire(t0, "ap", AcquireRequest{RequestID: "r-ap", Limit: "tenant/refused", Want: 1}); d.Code != pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED {
		t.Fatalf("tenant/refused from ap: %+v", d)
	}
	if l, ok := c.Limit("tenant/newco"); !ok || l.Proto.Plan != "plans/pro" || l.ID != "tenant/newco" {
		t.Fatalf("Limit(tenant/newco) = %v %v", l, ok)
	}
	if c.Resolved() != 3 {
		t.Fatalf("resolved %d, want 3 (tenant/newco, tenant/bigco, tenant/vip)", c.Resolved())
	}
	var ids []string
	c.eachLimit(func(id string, _ *Limit) { ids = append(ids, id) })
	if strings.Join(sortedCopy(ids), ",") != "tenant/atlas,tenant/bigco,tenant/newco,tenant/vip" {
		t.Fatalf("eachLimit: %v", ids)
	}
	for _, k := range c.Expired(t0.Add(3*time.Minute), time.Minute) {
		c.Forget(k)
	}
	if c.Resolved() != 0 || len(c.windows) != 0 {
		t.Fatalf("after the windows expired: resolved %d, windows %d", c.Resolved(), len(c.windows))
	}
	// A plan change reaches every tenant: the next grant is sized by it.
	plan2 := testLimit("plans/pro", 40, time.Minute, 15*time.Second, "eu", "us")
	plan2.Proto.Binds, plan2.Proto.Version = []string{"tenant/{id}"}, 2
	c.SetLimit(plan2)
	if d := c.Acquire(t0.Add(3*time.Minute), "eu", AcquireRequest{RequestID: "r9", Limit: "tenant/newco", Want: 1000}); d.Grant == nil || d.Grant.Tokens != 40 || d.Grant.LimitVersion != 2 {
		t.Fatalf("after the plan change: %+v %+v", d, d.Grant)
	}
	c.DeleteLimit("plans/pro")
	if _, ok := c.Limit("tenant/other"); ok {
		t.Fatal("a deleted plan still binds")
	}
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestPlanChangeAtBoundary: a plan change effective at the next window
// leaves every tenant's running window under the old G and gives every
// tenant on the plan, used before or not, the new G from the boundary;
// agents' syncs carry the change when it governs.
func TestPlanChangeAtBoundary(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	p, err := a.PutLimit(ctx, proPlan(100), Change{Reason: "the pro plan"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/a", p.Version)
	grant := func(tenant, req string) int64 {
		t.Helper()
		res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: req, LimitId: tenant, WantTokens: 1000}})
		if err != nil || len(res) != 1 || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("grant %s %s: %v %v", tenant, req, res, err)
		}
		return res[0].GetLease().GetTokens()
	}
	tenants := []string{"tenant/a", "tenant/b", "tenant/c"}
	for _, id := range tenants {
		if got := grant(id, "w0"+id); got != 100 {
			t.Fatalf("%s window 0: %d, want 100", id, got)
		}
	}
	sync0, err := a.SyncLimits(ctx, "eu", 0)
	if err != nil {
		t.Fatal(err)
	}
	grown := proPlan(250)
	grown.Contracts = map[string]*pb.Contract{"tenant/vip": {LimitTokens: 40}} // a contract in the same change
	p2, err := a.PutLimit(ctx, grown, Change{Reason: "pro grows", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW})
	if err != nil {
		t.Fatal(err)
	}
	if !p2.EffectiveFrom.AsTime().Equal(t0.Add(time.Minute)) || p2.Previous.GetLimitTokens() != 100 {
		t.Fatalf("the change is stored as %v", p2)
	}
	waitPlan(t, a.Allocator, "tenant/a", p2.Version)
	// Still window 0: the old G for every tenant, new ones too.
	if got := grant("tenant/d", "w0"); got != 100 {
		t.Fatalf("tenant/d window 0: %d, want 100 (the change waits for the boundary)", got)
	}
	s, err := a.SyncLimits(ctx, "eu", sync0.Revision)
	if err != nil || s.Unchanged || planTokens(s) != 100 {
		t.Fatalf("sync before the boundary: %v %v", s, err)
	}
	if got := grant("tenant/vip", "w0vip"); got != 100 {
		t.Fatalf("tenant/vip window 0: %d, want the plan's 100 (its contract comes with the change)", got)
	}
	clock.Set(t0.Add(time.Minute + time.Second))
	if got := grant("tenant/vip", "w1vip"); got != 40 {
		t.Fatalf("tenant/vip window 1: %d, want its contract's 40", got)
	}
	for _, id := range append(tenants, "tenant/d", "tenant/e") {
		if got := grant(id, "w1"+id); got != 250 {
			t.Fatalf("%s window 1: %d, want 250", id, got)
		}
		l, _ := coreLimit(a.Allocator, id)
		if l.GetVersion() != p2.Version || l.GetPlan() != "plans/pro" {
			t.Fatalf("%s resolves to %v", id, l)
		}
	}
	// The window metrics show the used tenants (window 0 closed), not the plan.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leasehold_window_limit_tokens G of the limit's last closed window.
# TYPE leasehold_window_limit_tokens gauge
leasehold_window_limit_tokens{limit="tenant/a"} 100
leasehold_window_limit_tokens{limit="tenant/b"} 100
leasehold_window_limit_tokens{limit="tenant/c"} 100
leasehold_window_limit_tokens{limit="tenant/d"} 100
leasehold_window_limit_tokens{limit="tenant/vip"} 100
`), "leasehold_window_limit_tokens"); err != nil {
		t.Fatal(err)
	}
	s2, err := a.SyncLimits(ctx, "eu", s.Revision)
	if err != nil || s2.Unchanged || planTokens(s2) != 250 {
		t.Fatalf("sync after the boundary: %v %v", s2, err)
	}
	ls, err := a.Limits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, l := range ls {
		listed = append(listed, l.Id+"="+l.Plan)
	}
	if got := strings.Join(listed, ","); got != "tenant/a=plans/pro,tenant/b=plans/pro,tenant/c=plans/pro,tenant/d=plans/pro,tenant/e=plans/pro,tenant/vip=plans/pro" {
		t.Fatalf("the status page's limits: %s (the used tenants, not the plan's record)", got)
	}
	reps, err := a.Reports("tenant/a", 2)
	if err != nil || len(reps) != 2 || reps[0].Plan != "plans/pro" || reps[0].LimitTokens != 100 || reps[1].LimitTokens != 250 {
		t.Fatalf("reports of tenant/a: %+v %v", reps, err)
	}
}

func planTokens(s *pb.SyncLimitsResponse) int64 {
	for _, l := range s.Limits {
		if l.Id == "plans/pro" {
			return l.LimitTokens
		}
	}
	return -1
}

// TestPlanChangesRefused: what plans do not carry in this version is
// refused naming the field, and so is a pattern another plan binds.
func TestPlanChangesRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, proPlan(100), Change{Reason: "pro"}); err != nil {
		t.Fatal(err)
	}
	other := proPlan(5)
	other.Id = "plans/free"
	field := func(err error) string {
		var fe *vocab.FieldError
		if errors.As(err, &fe) {
			return fe.Field
		}
		return fmt.Sprint(err)
	}
	if _, err := a.PutLimit(ctx, other, Change{Reason: "free"}); field(err) != "limit.binds[0]" {
		t.Fatalf("a second plan binding tenant/{id}: %v", err)
	}
	ent := proPlan(5000)
	ent.Id, ent.Binds = "plans/ent", []string{"tenant/bigco"}
	if _, err := a.PutLimit(ctx, ent, Change{Reason: "enterprise"}); err != nil {
		t.Fatalf("a plan mapping one tenant the pattern of another names: %v", err)
	}
	ent2 := proPlan(6000)
	ent2.Id, ent2.Binds = "plans/ent2", []string{"tenant/x", "tenant/bigco"}
	if _, err := a.PutLimit(ctx, ent2, Change{Reason: "enterprise 2"}); field(err) != "limit.binds[1]" {
		t.Fatalf("a tenant mapped to two plans: %v", err)
	}
	s := NewServer(a.Allocator)
	// A change of the binds alone is a change (not "unchanged"), and it
	// binds at once although the settings wait for the boundary.
	wide := proPlan(100)
	wide.Binds = append(wide.Binds, "team/{id}")
	w, err := a.PutLimit(ctx, wide, Change{Reason: "teams too"})
	if err != nil || w.Version != 2 || len(w.Previous.GetBinds()) != 2 {
		t.Fatalf("binding team/{id} too: %v %v", w, err)
	}
	waitPlan(t, a.Allocator, "team/x", 2)
	// Moving the pattern in one apply is fine: the old plan lets it go.
	pro := proPlan(100)
	pro.Binds = nil
	other.Binds = []string{"tenant/{id}"}
	if _, err := s.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "move", Changes: []*pb.LimitChange{
		{Change: &pb.LimitChange_Put{Put: pro}, ExpectedVersion: 2},
		{Change: &pb.LimitChange_Put{Put: other}},
	}}); err != nil {
		t.Fatalf("moving a pattern between plans: %v", err)
	}
}

// TestPlanTenantsCostOnlyWhenUsed: 100,000 tenants bound to one plan,
// 1,000 of them used: etcd holds no record for an unused tenant, and the
// allocator's core keeps state for the used ones only.
func TestPlanTenantsCostOnlyWhenUsed(t *testing.T) {
	const tenants, used = 100_000, 1_000
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	const keep = 3 // windows kept for reports
	// The test sweeps (an hour between the allocator's own sweeps).
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(30*time.Second, time.Hour), WithReports(keep, 1000))
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, proPlan(1000), Change{Reason: "pro for everyone"}); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/t0", 1)
	cli := c.Client(t)
	// The records that name a tenant, not the leader's own keys: a
	// campaign key more while a session is renewed late on a loaded
	// machine is not a tenant's record (a CI run counted +1002 for +1000
	// that way, another +1003); others lists those for a failure.
	countKeys := func() int64 {
		resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), "tenant/t") {
				n++
			}
		}
		return n
	}
	// others lists the keys that name no tenant (for a failure's message).
	others := func() []string {
		resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, kv := range resp.Kvs {
			if !strings.Contains(string(kv.Key), "tenant/t") {
				out = append(out, string(kv.Key))
			}
		}
		return out
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	keys0, heap0 := countKeys(), heap()
	// Every one of the 100,000 ids resolves (bound), none is stored.
	for i := range tenants {
		if _, ok := coreLimit(a.Allocator, fmt.Sprintf("tenant/t%d", i)); !ok {
			t.Fatalf("tenant/t%d does not resolve", i)
		}
	}
	if k := countKeys(); k != keys0 {
		t.Fatalf("resolving %d tenants wrote %d etcd keys", tenants, k-keys0)
	}
	const batch = 100
	for i := 0; i < used; i += batch {
		var reqs []*pb.LeaseRequest
		for j := i; j < i+batch; j++ {
			reqs = append(reqs, &pb.LeaseRequest{RequestId: fmt.Sprintf("r%d", j), LimitId: fmt.Sprintf("tenant/t%d", j*(tenants/used)), WantTokens: 10})
		}
		res, err := a.AcquireLeases(ctx, "eu", reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Code != pb.ItemCode_ITEM_CODE_OK || r.Lease.GetTokens() != 10 {
				t.Fatalf("grant: %v", r)
			}
		}
	}
	keys1, heap1 := countKeys(), heap()
	var resolved, windows int
	_ = a.View(func(_ time.Time, core *Core) { resolved, windows = core.Resolved(), len(core.windows) })
	t.Logf("%d tenants bound, %d used: etcd keys %d -> %d (+%d), core resolved %d, windows %d, heap %+.1f MiB (%.0f B per used tenant)",
		tenants, used, keys0, keys1, keys1-keys0, resolved, windows, float64(int64(heap1)-int64(heap0))/(1<<20),
		float64(int64(heap1)-int64(heap0))/used)
	if resolved != used || windows != used {
		t.Fatalf("core: %d resolved, %d windows; want %d each (the used tenants)", resolved, windows, used)
	}
	if keys1-keys0 != used {
		t.Fatalf("etcd grew by %d keys naming tenants for %d grants of %d used tenants: want one grant record each (keys naming none: %q)",
			keys1-keys0, used, used, others())
	}
	// No key names an unused tenant.
	noUnused := func() {
		t.Helper()
		resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			if i := strings.Index(k, "tenant/t"); i >= 0 {
				var n int
				if _, err := fmt.Sscanf(k[i+len("tenant/t"):], "%d", &n); err == nil && n%(tenants/used) != 0 {
					t.Fatalf("key %q names an unused tenant", k)
				}
			}
		}
	}
	noUnused()
	// After the window: the grants are swept into one summary per used
	// tenant (reports), and those go once the tenant has been idle for
	// the windows reports keep. A tenant used again comes back.
	state := func() (resolved, windows, summaries int) {
		_ = a.View(func(_ time.Time, core *Core) {
			resolved, windows, summaries = core.Resolved(), len(core.windows), len(core.summaries)
		})
		return
	}
	demand := func() (n int) {
		_ = a.View(func(_ time.Time, core *Core) { n = len(core.demand) })
		return n
	}
	clock.Set(t0.Add(2 * time.Minute))
	sweepNow(t, a.Allocator)
	noUnused()
	if r, w, sm := state(); r != 0 || w != 0 || sm != used || countKeys() != keys0+used {
		t.Fatalf("after the window: resolved %d, windows %d, summaries %d, etcd keys +%d; want 0, 0, %d, +%d (keys naming no tenant: %q)",
			r, w, sm, countKeys()-keys0, used, used, others())
	}
	if reps, err := a.Reports("tenant/t0", 5); err != nil || len(reps) != 1 || reps[0].Plan != "plans/pro" || reps[0].Granted != 10 {
		t.Fatalf("tenant/t0's report after its window: %+v %v", reps, err)
	}
	clock.Set(t0.Add((2 + keep) * time.Minute))
	sweepNow(t, a.Allocator)
	if r, w, sm := state(); r != 0 || w != 0 || sm != 0 || countKeys() != keys0 || demand() != 0 {
		t.Fatalf("after %d idle windows: resolved %d, windows %d, summaries %d, demand reports %d, etcd keys +%d; want nothing (keys naming no tenant: %q)",
			keep, r, w, sm, demand(), countKeys()-keys0, others())
	}
	t.Logf("after %d idle windows: etcd keys %d (as before any use), no tenant state", keep, countKeys())
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if i := strings.Index(k, "tenant/t"); i >= 0 {
			var n int
			if _, err := fmt.Sscanf(k[i+len("tenant/t"):], "%d", &n); err == nil && n%(tenants/used) != 0 {
				t.Fatalf("key %q names an unused tenant", k)
			}
		}
	}
}

// coreLimit is the leader's core's limit of id, resolved from its plan.
func coreLimit(a *Allocator, id string) (*pb.Limit, bool) {
	var l *Limit
	var ok bool
	_ = a.View(func(_ time.Time, c *Core) { l, ok = c.Limit(id) })
	if !ok {
		return nil, false
	}
	return l.Proto, true
}

// TestPlanDryRun: a dry run of a plan change counts the tenants that used
// the plan and names those whose last window admitted more than the new
// G (all of them for a delete); a tenant with a limit of its own is not
// on the plan; nothing is written.
func TestPlanDryRun(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	p, err := a.PutLimit(ctx, proPlan(100), Change{Reason: "pro"})
	if err != nil {
		t.Fatal(err)
	}
	atlas := proPlan(500)
	atlas.Id, atlas.Binds = "tenant/atlas", nil
	al, err := a.PutLimit(ctx, atlas, Change{Reason: "Atlas contract"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/a", p.Version)
	waitLimit(t, a.Allocator, al.Id, al.Version)
	admitted := map[string]int64{"tenant/a": 90, "tenant/b": 40, "tenant/c": 0, "tenant/d": 70, "tenant/atlas": 400}
	var usage []*pb.Usage
	for id, n := range admitted {
		res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r-" + strings.ReplaceAll(id, "/", "-"), LimitId: id, WantTokens: 100}})
		if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("grant %s: %v %v", id, res, err)
		}
		usage = append(usage, &pb.Usage{LimitId: id, WindowIndex: res[0].Lease.WindowIndex, Admitted: n})
	}
	if _, err := a.ReportUsage(ctx, "eu", "eu-1", usage); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(time.Minute + time.Second)) // window 0 closed
	s := NewServer(a.Allocator)
	resp, err := s.PutLimit(ctx, &pb.PutLimitRequest{Limit: proPlan(50), Reason: "cheaper pro", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	e := resp.Effect
	if e.PlanTenants != 4 || e.PlanTenantsDenyingCount != 2 || strings.Join(e.PlanTenantsDenying, ",") != "tenant/a,tenant/d" ||
		e.NewLimitTokens != 50 || e.WindowStart != nil {
		t.Fatalf("dry run of G 100 -> 50: %v", e)
	}
	ent := proPlan(5000)
	ent.Id, ent.Binds = "plans/ent", []string{"tenant/bigco", "tenant/acme"}
	er, err := s.PutLimit(ctx, &pb.PutLimitRequest{Limit: ent, Reason: "enterprise", DryRun: true})
	if err != nil || er.Effect.PlanTenants != 2 || er.Effect.PlanTenantsDenyingCount != 0 {
		t.Fatalf("dry run of a plan mapping two unused tenants: %v %v", er, err)
	}
	ent.Binds = []string{"tenant/a"}
	if _, err := a.PutLimit(ctx, ent, Change{Reason: "enterprise"}); err != nil {
		t.Fatal(err)
	}
	// Until the leader's watch delivers ent's binds, tenant/a is still
	// pro's (both are version 1): wait for its plan, not a version.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if l, ok := coreLimit(a.Allocator, "tenant/a"); ok && l.Plan == "plans/ent" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tenant/a never moved to plans/ent")
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	ent.LimitTokens = 60
	er, err = s.PutLimit(ctx, &pb.PutLimitRequest{Limit: ent, Reason: "smaller enterprise", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	e = er.Effect // tenant/a is on plans/ent now (a mapping wins over a pattern): its last window admitted 90
	if e.PlanTenants != 1 || strings.Join(e.PlanTenantsDenying, ",") != "tenant/a" {
		t.Fatalf("dry run of plans/ent: %v", e)
	}
	// A contract keeps tenant/d (70 admitted) above a lower G of the
	// plan, and counts an unused tenant as on the plan.
	withContract := proPlan(50)
	withContract.Contracts = map[string]*pb.Contract{"tenant/d": {LimitTokens: 80}, "tenant/z": {LimitTokens: 10}}
	cr, err := s.PutLimit(ctx, &pb.PutLimitRequest{Limit: withContract, Reason: "pro 50, contracts", DryRun: true})
	if err != nil || cr.Effect.PlanTenants != 4 || strings.Join(cr.Effect.PlanTenantsDenying, ",") != "" {
		t.Fatalf("dry run with contracts: %v %v", cr, err)
	}
	del, err := s.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: "plans/pro", Reason: "end pro", DryRun: true})
	if err != nil || del.Effect.PlanTenants != 3 || del.Effect.PlanTenantsDenyingCount != 3 {
		t.Fatalf("dry run of a delete: %v %v", del, err)
	}
	got, err := s.GetLimit(ctx, &pb.GetLimitRequest{Id: "plans/pro"})
	if err != nil || got.Limit.Version != p.Version || got.Limit.LimitTokens != 100 {
		t.Fatalf("a dry run wrote: %v %v", got, err)
	}
}

// TestPlanContractFields: a contract replaces any field of the plan a
// deal changes for its tenant (here its window, regions and mode), the
// allocator grants by the tenant's resolved limit, and a change of the
// plan scheduled for the next window waits for an instant that starts a
// window of the plan and of every contract's own window, so that no
// tenant's window is half old, half new.
func TestPlanContractFields(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	p := proPlan(100)
	p.Contracts = map[string]*pb.Contract{
		"tenant/slow": {Window: durationpb.New(5 * time.Minute), LimitTokens: 400},
		"tenant/eu":   {Regions: []string{"eu"}, Mode: pb.Mode_MODE_BOUNDED},
	}
	p1, err := a.PutLimit(ctx, p, Change{Reason: "pro with two contracts"})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/a", p1.Version)
	if sl := p1.Contracts["tenant/slow"]; sl.GetLease().GetTtl().AsDuration() != 15*time.Second {
		t.Fatalf("tenant/slow's contract stored as %v (the plan's explicit ttl)", sl)
	}
	grant := func(region, tenant, req string) (int64, pb.ItemCode) {
		t.Helper()
		res, err := a.AcquireLeases(ctx, region, []*pb.LeaseRequest{{RequestId: req, LimitId: tenant, WantTokens: 1000}})
		if err != nil || len(res) != 1 {
			t.Fatalf("grant %s %s: %v %v", tenant, req, res, err)
		}
		return res[0].GetLease().GetTokens(), res[0].Code
	}
	if got, _ := grant("eu", "tenant/slow", "s0"); got != 400 {
		t.Fatalf("tenant/slow: %d, want its contract's 400", got)
	}
	if l, _ := coreLimit(a.Allocator, "tenant/slow"); l.GetWindow().AsDuration() != 5*time.Minute || l.GetLimitTokens() != 400 {
		t.Fatalf("tenant/slow resolves to %v", l)
	}
	if got, code := grant("us", "tenant/eu", "e0"); code == pb.ItemCode_ITEM_CODE_OK {
		t.Fatalf("tenant/eu granted %d in us, a region its contract leaves out", got)
	}
	if l, _ := coreLimit(a.Allocator, "tenant/eu"); l.GetMode() != pb.Mode_MODE_BOUNDED || len(l.GetRegions()) != 1 {
		t.Fatalf("tenant/eu resolves to %v", l)
	}
	if got, _ := grant("eu", "tenant/a", "a0"); got != 100 {
		t.Fatalf("tenant/a: %d, want the plan's 100", got)
	}
	// us agents get the plan (its regions), and an eu-only plan would
	// still reach a region a contract adds.
	s, err := a.SyncLimits(ctx, "us", 0)
	if err != nil || planTokens(s) != 100 {
		t.Fatalf("us sync: %v %v", s, err)
	}
	grown := proPlan(250)
	grown.Contracts = p.Contracts
	p2, err := a.PutLimit(ctx, grown, Change{Reason: "pro grows", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW})
	if err != nil {
		t.Fatal(err)
	}
	if !p2.EffectiveFrom.AsTime().Equal(t0.Add(5 * time.Minute)) {
		t.Fatalf("the change governs from %v, want %v: the first start of both the plan's and tenant/slow's windows",
			p2.EffectiveFrom.AsTime(), t0.Add(5*time.Minute))
	}
	waitPlan(t, a.Allocator, "tenant/a", p2.Version)
	clock.Set(t0.Add(time.Minute + time.Second))
	if got, _ := grant("eu", "tenant/a", "a1"); got != 100 {
		t.Fatalf("tenant/a at 1m: %d, want 100 (the change waits for 5m)", got)
	}
	clock.Set(t0.Add(5*time.Minute + time.Second))
	if got, _ := grant("eu", "tenant/a", "a5"); got != 250 {
		t.Fatalf("tenant/a at 5m: %d, want 250", got)
	}
	if got, _ := grant("eu", "tenant/slow", "s5"); got != 400 {
		t.Fatalf("tenant/slow at 5m: %d, want its contract's 400", got)
	}
	// A contract with a window that starts with the plan's only rarely
	// makes a scheduled change refused, naming the contracts.
	odd := proPlan(250)
	odd.Contracts = map[string]*pb.Contract{"tenant/odd": {Window: durationpb.New(61 * time.Second)}}
	po, err := a.PutLimit(ctx, odd, Change{Reason: "odd", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW})
	if err == nil || !strings.Contains(err.Error(), "limit.contracts") {
		t.Fatalf("a change waiting for windows of 1m, 5m and 61s to start together: %v %v", po, err)
	}
	// In a region a contract adds, the tenant is served.
	eu := proPlan(250)
	eu.Regions = []string{"eu"}
	eu.Contracts = map[string]*pb.Contract{"tenant/both": {Regions: []string{"eu", "us"}}}
	if _, err := a.PutLimit(ctx, eu, Change{Reason: "pro in eu; one tenant in both", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatal(err)
	}
	us, err := a.SyncLimits(ctx, "us", 0)
	if err != nil || planTokens(us) != 250 {
		t.Fatalf("us sync of an eu plan with a contract in us: %v %v", us, err)
	}
}
