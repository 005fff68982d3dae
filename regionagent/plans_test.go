package regionagent

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// putPlan stores a plan and waits until the allocator's leader resolves
// probe (an id the plan binds) to its version.
func (w *world) putPlan(p *pb.Limit, probe string) *pb.Limit {
	w.t.Helper()
	got, err := w.alloc.PutLimit(context.Background(), p, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		w.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = w.alloc.View(func(_ time.Time, c *allocator.Core) {
			v, found := c.Limit(probe)
			ok = found && v.Version == got.Version
		})
		if ok {
			return got
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	w.t.Fatalf("plan %s never reached the leader", got.Id)
	return nil
}

func proPlan(g int64, regions ...string) *pb.Limit {
	p := limit("plans/pro", g, time.Minute, 15*time.Second, regions...)
	p.Binds = []string{"tenant/{id}"}
	return p
}

// TestPlanFirstUseTwoRegionsStrict: a tenant no admin call ever created
// is limited by its plan from its first Check, in two regions, strict:
// three windows of demand twice G, and no window admits more than G (nor
// much less). The agents and the allocator resolved it alone; the plan's
// record, an id of two segments and an unbound id are not limits; the
// allocator's reports name the plan.
func TestPlanFirstUseTwoRegionsStrict(t *testing.T) {
	const G = 1000
	w := newWorld(t, "eu", "us")
	w.putPlan(proPlan(G, "eu", "us"), "tenant/probe")
	agents := map[string]*Agent{
		"eu": w.agent("eu", "eu1", WithColdWait(2*time.Second)),
		"us": w.agent("us", "us1", WithColdWait(2*time.Second)),
	}
	for _, a := range agents {
		runWork(t, a)
	}
	ctx := context.Background()
	for _, id := range []string{"plans/pro", "tenant/eu/newco", "other/newco"} {
		if _, err := agents["eu"].Check(ctx, id, 1); !errorsIs(err, ErrUnknownLimit) {
			t.Fatalf("Check %s: %v, want an unknown limit", id, err)
		}
	}
	const id = "tenant/newco"
	rates := map[string]float64{"eu": 1500.0 / 60, "us": 500.0 / 60} // twice G per minute
	acc := map[string]float64{}
	admitted := map[int64]map[string]int64{}
	var first int64 = -1
	for step := 0; step < 3*600; step++ {
		win := lease.WindowOf(w.clock.Now(), time.Minute).Index
		if first < 0 {
			first = win
		}
		if admitted[win] == nil {
			admitted[win] = map[string]int64{}
		}
		for _, r := range []string{"eu", "us"} {
			acc[r] += rates[r] / 10
			for acc[r] >= 1 {
				acc[r]--
				d, err := agents[r].Check(ctx, id, 1)
				if err != nil {
					t.Fatalf("step %d, %s: %v", step, r, err)
				}
				if d.Allowed {
					admitted[win][r]++
				}
			}
			agents[r].tick(ctx)
		}
		w.clock.Add(100 * time.Millisecond)
	}
	for win := first; win < first+3; win++ {
		total := admitted[win]["eu"] + admitted[win]["us"]
		t.Logf("window %d: admitted eu %d, us %d, total %d of G %d", win-first, admitted[win]["eu"], admitted[win]["us"], total, G)
		if total > G {
			t.Errorf("window %d admitted %d > G = %d", win-first, total, G)
		}
		if total < G*98/100 {
			t.Errorf("window %d admitted %d, want G = %d within 2%% (demand is twice G)", win-first, total, G)
		}
	}
	for r, a := range agents {
		a.report(ctx)
		if n := a.core.Bound(); n != 1 {
			t.Errorf("%s agent keeps %d limits resolved from plans, want 1 (tenant/newco)", r, n)
		}
	}
	reps, err := w.alloc.Reports(id, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range reps {
		if rep.Plan != "plans/pro" || rep.LimitTokens != G || rep.AdmittedTotal > G {
			t.Errorf("allocator report of window %v: plan %q, G %d, admitted %d", rep.WindowStart, rep.Plan, rep.LimitTokens, rep.AdmittedTotal)
		}
	}
	if _, err := w.alloc.Reports("tenant/never-used", 1); err != nil {
		t.Logf("an unused tenant: %v", err)
	}
}

// TestPlanShadow: a plan in shadow mode is tried on its tenants' real
// traffic, not enforced: a tenant over G is admitted and told it would
// have been denied.
func TestPlanShadow(t *testing.T) {
	w := newWorld(t, "eu")
	p := proPlan(5, "eu")
	p.Shadow = true
	w.putPlan(p, "tenant/probe")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	var would int
	for range 10 {
		d, err := a.Check(ctx, "tenant/shadowed", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			t.Fatalf("a shadow plan denied: %+v", d)
		}
		if d.WouldDeny == pb.Reason_REASON_OVER_LIMIT {
			would++
		}
	}
	if would != 5 {
		t.Fatalf("%d Checks would have been denied, want 5 (10 of cost 1 against G = 5)", would)
	}
}

// TestPlanChangeReachesAgents: a tenant in use follows its plan's changes
// at the next sync; an explicit limit of the same id wins over the plan,
// and the plan governs again once it is deleted.
func TestPlanChangeReachesAgents(t *testing.T) {
	w := newWorld(t, "eu")
	w.putPlan(proPlan(1000, "eu"), "tenant/probe")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	if d, err := a.Check(ctx, "tenant/a", 1); err != nil || !d.Allowed {
		t.Fatalf("first Check: %+v %v", d, err)
	}
	g := func() (int64, string) {
		var l, ok = a.core.Limit("tenant/a")
		if !ok {
			return -1, ""
		}
		return l.Tokens, l.Plan
	}
	if n, p := g(); n != 1000 || p != "plans/pro" {
		t.Fatalf("tenant/a: G %d from %q", n, p)
	}
	w.putPlan(proPlan(10, "eu"), "tenant/probe")
	w.sync(a)
	if n, _ := g(); n != 10 {
		t.Fatalf("after the plan change: G %d, want 10", n)
	}
	w.putLimit(limit("tenant/a", 77, time.Minute, 15*time.Second, "eu"))
	w.sync(a)
	if n, p := g(); n != 77 || p != "" {
		t.Fatalf("with an explicit limit: G %d from %q, want 77 of its own", n, p)
	}
	if err := w.alloc.DeleteLimit(ctx, "tenant/a", allocator.Change{Reason: "back to the plan"}); err != nil {
		t.Fatal(err)
	}
	w.putPlan(proPlan(12, "eu"), "tenant/probe") // also waits for the delete: the watch is ordered
	w.sync(a)
	if d, err := a.Check(ctx, "tenant/a", 1); err != nil || !d.Allowed {
		t.Fatalf("Check after the delete: %+v %v", d, err)
	}
	if n, p := g(); n != 12 || p != "plans/pro" {
		t.Fatalf("after the delete: G %d from %q, want the plan's 12", n, p)
	}
}

// TestPlanTenantForgotten: the agent keeps a tenant's resolved limit only
// while it keeps the tenant's state: idle past the forget time, both go,
// and the next Check resolves it again.
func TestPlanTenantForgotten(t *testing.T) {
	w := newWorld(t, "eu")
	w.putPlan(proPlan(100, "eu"), "tenant/probe")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	for _, id := range []string{"tenant/a", "tenant/b"} {
		if d, err := a.Check(ctx, id, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", id, d, err)
		}
	}
	if n := a.core.Bound(); n != 2 {
		t.Fatalf("%d resolved, want 2", n)
	}
	for range 20 { // past the windows, their reports and the forget time, in steps
		w.clock.Add(time.Minute)
		a.report(ctx)
		a.tick(ctx)
		if a.core.Bound() == 0 {
			break
		}
	}
	if n, act := a.core.Bound(), a.core.Active(); n != 0 || act != 0 {
		t.Fatalf("after 20 idle minutes: %d resolved, %d limit states; want none", n, act)
	}
	if d, err := a.Check(ctx, "tenant/a", 1); err != nil || !d.Allowed {
		t.Fatalf("tenant/a again: %+v %v", d, err)
	}
	if n := a.core.Bound(); n != 1 {
		t.Fatalf("%d resolved after tenant/a came back, want 1", n)
	}
}

// TestPlanMappingAtAgent: a tenant a plan names (a tenant-to-plan
// mapping) is that plan's at the agent, over the pattern of another; a
// tenant's contract replaces the plan's G for it.
func TestPlanMappingAtAgent(t *testing.T) {
	w := newWorld(t, "eu")
	w.putPlan(proPlan(10, "eu"), "tenant/probe")
	ent := proPlan(5000, "eu")
	ent.Id, ent.Binds = "plans/ent", []string{"tenant/bigco", "tenant/atlas"}
	ent.Contracts = map[string]*pb.Contract{"tenant/atlas": {LimitTokens: 3000}}
	w.putPlan(ent, "tenant/bigco")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	for _, id := range []string{"tenant/bigco", "tenant/small", "tenant/atlas"} {
		if d, err := a.Check(ctx, id, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", id, d, err)
		}
	}
	if l, _ := a.core.Limit("tenant/bigco"); l.Tokens != 5000 || l.Plan != "plans/ent" {
		t.Fatalf("tenant/bigco: G %d from %q, want plans/ent's 5000", l.Tokens, l.Plan)
	}
	if l, _ := a.core.Limit("tenant/small"); l.Tokens != 10 || l.Plan != "plans/pro" {
		t.Fatalf("tenant/small: G %d from %q, want plans/pro's 10", l.Tokens, l.Plan)
	}
	if l, _ := a.core.Limit("tenant/atlas"); l.Tokens != 3000 || l.Plan != "plans/ent" {
		t.Fatalf("tenant/atlas: G %d from %q, want its contract's 3000 on plans/ent", l.Tokens, l.Plan)
	}
	if d, err := a.Check(ctx, "tenant/bigco", 4000); err != nil || !d.Allowed {
		t.Fatalf("a cost of 4000 for tenant/bigco: %+v %v", d, err)
	}
}

// TestPlanRefusedCheckKeepsNothing: a Check refused before its limit had
// state (a cost over G) keeps no resolved limit at the agent.
func TestPlanRefusedCheckKeepsNothing(t *testing.T) {
	w := newWorld(t, "eu")
	w.putPlan(proPlan(10, "eu"), "tenant/probe")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	ctx := context.Background()
	for i := range 50 {
		if _, err := a.Check(ctx, fmt.Sprintf("tenant/t%d", i), 11); err == nil {
			t.Fatal("a cost over G was not refused")
		}
	}
	if n := a.core.Bound(); n != 0 {
		t.Fatalf("%d resolved limits kept after refused Checks, want 0", n)
	}
}

// TestPlanContractAtAgents: a contract that replaces the plan's window,
// G, regions and shadow mode reaches first-use tenants at both agents:
// tenant/atlas, with 300 per 10s windows of its own, is held to 300 in
// every one of its windows with demand twice that over two regions;
// tenant/euonly is unknown in us (its contract leaves us out) and
// limited in eu; tenant/trial, in shadow mode with G 5, is admitted past
// G with would-deny set.
func TestPlanContractAtAgents(t *testing.T) {
	const G = 300
	w := newWorld(t, "eu", "us")
	p := proPlan(1000, "eu", "us")
	yes := true
	p.Contracts = map[string]*pb.Contract{
		"tenant/atlas":  {LimitTokens: G, Window: durationpb.New(10 * time.Second), Lease: &pb.LeaseSettings{Ttl: durationpb.New(2 * time.Second)}},
		"tenant/euonly": {Regions: []string{"eu"}, LimitTokens: 20},
		"tenant/trial":  {LimitTokens: 5, Shadow: &yes},
	}
	w.putPlan(p, "tenant/probe")
	agents := map[string]*Agent{
		"eu": w.agent("eu", "eu1", WithColdWait(2*time.Second)),
		"us": w.agent("us", "us1", WithColdWait(2*time.Second)),
	}
	for _, a := range agents {
		runWork(t, a)
	}
	ctx := context.Background()
	if _, err := agents["us"].Check(ctx, "tenant/euonly", 1); !errorsIs(err, ErrUnknownLimit) {
		t.Fatalf("tenant/euonly in us: %v, want an unknown limit", err)
	}
	var eu int
	// checkAdvancing: a Check waiting on the agent's clock (here the
	// world's, which stands still) would wait forever (a CI run hung so).
	for range 30 {
		if d := w.checkAdvancing(t, agents["eu"], "tenant/euonly"); d.Allowed {
			eu++
		}
	}
	if eu != 20 {
		t.Fatalf("tenant/euonly admitted %d of 30 in eu, want its contract's 20", eu)
	}
	var shadowed, wouldDeny int
	for range 10 {
		d := w.checkAdvancing(t, agents["eu"], "tenant/trial")
		if d.Allowed {
			shadowed++
		}
		if d.WouldDeny != 0 {
			wouldDeny++
		}
	}
	if shadowed != 10 || wouldDeny != 5 {
		t.Fatalf("tenant/trial in shadow mode: %d of 10 admitted, %d would-deny; want 10 and 5", shadowed, wouldDeny)
	}
	const id = "tenant/atlas"
	rates := map[string]float64{"eu": 45, "us": 15} // twice G per 10s
	acc := map[string]float64{}
	admitted := map[int64]int64{}
	var first int64 = -1
	for step := 0; step < 4*100; step++ {
		win := lease.WindowOf(w.clock.Now(), 10*time.Second).Index
		if first < 0 {
			first = win
		}
		for _, r := range []string{"eu", "us"} {
			acc[r] += rates[r] / 10
			for acc[r] >= 1 {
				acc[r]--
				d, err := agents[r].Check(ctx, id, 1)
				if err != nil {
					t.Fatalf("step %d, %s: %v", step, r, err)
				}
				if d.Allowed {
					// The answer's own window (its end is now plus
					// reset_after, rounded): the world may have moved its
					// clock while a stuck Check waited.
					end := w.clock.Now().Add(d.ResetAfter)
					admitted[int64(math.Round(float64(end.UnixNano())/float64(10*time.Second)))-1]++
				}
			}
			agents[r].tick(ctx)
		}
		w.clock.Add(100 * time.Millisecond)
	}
	for win := first + 1; win < first+4; win++ { // the first window is partial
		t.Logf("window %d: admitted %d of G %d", win-first, admitted[win], G)
		if admitted[win] > G || admitted[win] < G*95/100 {
			t.Errorf("window %d of 10s admitted %d, want G = %d (within 5%% below; demand is twice G)", win-first, admitted[win], G)
		}
	}
	if l, _ := agents["us"].core.Limit(id); l.Window != 10*time.Second || l.Tokens != G {
		t.Fatalf("tenant/atlas at us: %+v", l)
	}
}

// TestPlanOverrideAtAgent: an override of a plan reaches a tenant at the
// agent with the sync that carries it, and its end with the first sync
// from its end (the allocator's revision changes then, with nothing
// written), as a limit's override does.
func TestPlanOverrideAtAgent(t *testing.T) {
	w := newWorld(t, "eu")
	p := w.putPlan(proPlan(10, "eu"), "tenant/probe")
	a := w.agent("eu", "eu1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	if d := w.checkAdvancing(t, a, "tenant/a"); !d.Allowed {
		t.Fatalf("tenant/a: %+v", d)
	}
	o, err := w.alloc.PutLimit(ctx, proPlan(30, "eu"), allocator.Change{Reason: "incident 44", OverrideFor: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if o.Version != p.Version+1 || o.Override == nil {
		t.Fatalf("the override stored as %v", o)
	}
	w.sync(a)
	if l, _ := a.core.Limit("tenant/a"); l.Tokens != 30 || l.Version != o.Version {
		t.Fatalf("tenant/a under the override: %+v", l)
	}
	// checkAdvancing: a Check that waits (a renewal retried on the
	// agent's clock, on a loaded machine) would otherwise wait forever
	// on this world's clock, which stands still (a CI run hung so).
	var admitted int
	for range 40 {
		if d := w.checkAdvancing(t, a, "tenant/a"); d.Allowed {
			admitted++
		}
	}
	if admitted != 29 {
		t.Fatalf("tenant/a admitted %d more under the override, want 29 (G 30)", admitted)
	}
	w.clock.Add(89 * time.Second)
	w.sync(a)
	if l, _ := a.core.Limit("tenant/a"); l.Tokens != 30 {
		t.Fatalf("tenant/a a second before the end: %+v", l)
	}
	w.clock.Add(time.Second)
	w.sync(a)
	if l, _ := a.core.Limit("tenant/a"); l.Tokens != 10 {
		t.Fatalf("tenant/a at the end: G %d, want the plan's 10 again", l.Tokens)
	}
}
