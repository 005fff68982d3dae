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
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

func overrideBase() *pb.Limit {
	return &pb.Limit{Id: "tenant/ovr", LimitTokens: 100, Window: durationpb.New(time.Minute), Regions: []string{"eu"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(time.Minute)}}
}

// TestOverrideStepTable: the version in force around an override's end,
// at fixed instants: the override until the instant before ends_at, the
// version it replaced from ends_at on (for grants, for agents and for
// readers), with no write in between.
func TestOverrideStepTable(t *testing.T) {
	end := t0.Add(90 * time.Second)
	base := overrideBase()
	base.Version = 1
	p := overrideBase()
	p.LimitTokens, p.Version = 300, 2
	p.Override = &pb.LimitOverride{Reason: "incident", EndsAt: timestamppb.New(end), After: base}
	l := decodeLimit(p)
	for _, s := range []struct {
		at      time.Time
		g       int64
		pending bool
	}{
		{t0, 300, true},
		{end.Add(-time.Nanosecond), 300, true},
		{end, 100, false},
		{end.Add(time.Hour), 100, false},
	} {
		if got := l.At(s.at).Tokens; got != s.g {
			t.Errorf("At(%v) G %d, want %d", s.at.Sub(t0), got, s.g)
		}
		v := inForce(p, s.at)
		if v.LimitTokens != s.g || (v.Override != nil) != s.pending || v.Version != 2 {
			t.Errorf("inForce at %v: G %d override %v version %d", s.at.Sub(t0), v.LimitTokens, v.Override != nil, v.Version)
		}
		if got := asShown(p, s.at); got.LimitTokens != s.g {
			t.Errorf("asShown at %v: G %d", s.at.Sub(t0), got.LimitTokens)
		}
		if overriding(p, s.at) != s.pending {
			t.Errorf("overriding at %v: %v", s.at.Sub(t0), !s.pending)
		}
	}
}

// TestOverrideShownEndedBeforeSweep: the limits the status page shows
// (Allocator.Limits) carry an override in force with its end, and from
// its end the version it returned to, before the sweep records the end
// (as GetLimit shows it).
func TestOverrideShownEndedBeforeSweep(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, overrideBase(), Change{Reason: "contract", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatal(err)
	}
	up := overrideBase()
	up.LimitTokens = 300
	o, err := a.PutLimit(ctx, up, Change{Reason: "launch", OverrideFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	shown := func() *pb.Limit {
		t.Helper()
		ls, err := a.Limits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.Id == o.Id {
				return l
			}
		}
		t.Fatalf("%s not in %v", o.Id, ls)
		return nil
	}
	if l := shown(); l.GetLimitTokens() != 300 || !l.GetOverride().GetEndsAt().AsTime().Equal(t0.Add(61*time.Second)) {
		t.Fatalf("during the override: %v", l)
	}
	clock.Set(t0.Add(61 * time.Second)) // the end; no sweep has run on this clock
	if l := shown(); l.GetLimitTokens() != 100 || l.GetOverride() != nil {
		t.Fatalf("at the end, before the sweep: %v", l)
	}
}

// TestOverrideEndsAcrossFailover: an override raising G from 100 to 300
// for 90 s governs grants at once; the leader changes; the new leader
// grants under the override until its end and under G = 100 from its end
// on, in the same window and the next, and agents' syncs change at the
// end: all from stored state and the clock, nothing written at the end.
func TestOverrideEndsAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	l, err := a.PutLimit(ctx, overrideBase(), Change{Reason: "contract", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, l.Id, l.Version)
	up := overrideBase()
	up.LimitTokens = 300
	o, err := a.PutLimit(ctx, up, Change{Reason: "incident 42: launch traffic", OverrideFor: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(91 * time.Second)
	if o.Override == nil || !o.Override.EndsAt.AsTime().Equal(end) || o.Override.After.GetLimitTokens() != 100 ||
		o.Override.Reason != "incident 42: launch traffic" || !o.EffectiveFrom.AsTime().Equal(t0.Add(time.Second)) {
		t.Fatalf("override stored as %v", o)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	grant := func(a *Allocator, id string, want int64) int64 {
		t.Helper()
		res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: id, LimitId: o.Id, WantTokens: want}})
		if err != nil || len(res) != 1 {
			t.Fatalf("grant %s: %v %v", id, res, err)
		}
		return res[0].GetLease().GetTokens()
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leasehold_limit_override_end_timestamp_seconds When the override in force on a limit ends (Unix seconds; absent without one): the version before it governs again then.
# TYPE leasehold_limit_override_end_timestamp_seconds gauge
leasehold_limit_override_end_timestamp_seconds{limit="tenant/ovr"} `+strconv.FormatInt(end.Unix(), 10)+"\n"),
		"leasehold_limit_override_end_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	if got := grant(a.Allocator, "w0", 300); got != 300 {
		t.Fatalf("window 0 under the override: granted %d, want 300", got)
	}
	syncBefore, err := a.SyncLimits(ctx, "eu", 0)
	if err != nil || len(syncBefore.Limits) != 1 || syncBefore.Limits[0].LimitTokens != 300 {
		t.Fatalf("sync under the override: %v %v", syncBefore, err)
	}

	a.Stop()
	b := startAllocator(t, c, "b", clock.opt())
	allocatortest.WaitLeader(t, b)
	waitLimit(t, b.Allocator, o.Id, o.Version)
	clock.Set(t0.Add(time.Minute + 30*time.Second)) // window 1, the override still in force
	if got := grant(b.Allocator, "w1a", 250); got != 250 {
		t.Fatalf("window 1 before the end: granted %d, want 250", got)
	}
	clock.Set(end) // the override's end, still window 1: G = 100, 250 granted
	if got := grant(b.Allocator, "w1b", 10); got != 0 {
		t.Fatalf("window 1 at the end: granted %d, want 0 (G 100, 250 granted under the override)", got)
	}
	sync, err := b.SyncLimits(ctx, "eu", syncBefore.Revision)
	if err != nil || sync.Unchanged || len(sync.Limits) != 1 || sync.Limits[0].LimitTokens != 100 || sync.Limits[0].Override != nil {
		t.Fatalf("sync at the end: %v %v", sync, err)
	}
	clock.Set(t0.Add(2*time.Minute + time.Second)) // window 2
	if got := grant(b.Allocator, "w2", 300); got != 100 {
		t.Fatalf("window 2: granted %d, want 100", got)
	}
	got, err := NewServer(b.Allocator).GetLimit(ctx, &pb.GetLimitRequest{Id: o.Id})
	if err != nil || got.Limit.LimitTokens != 100 || got.Limit.Override != nil || got.Limit.Version != o.Version {
		t.Fatalf("GetLimit after the end: %v %v", got, err)
	}
	// The leader records the end as a change of its own (bookkeeping: the
	// grants above followed the end before it).
	if err := b.sweepOnce(b.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	got, err = NewServer(b.Allocator).GetLimit(ctx, &pb.GetLimitRequest{Id: o.Id})
	if err != nil || got.Limit.LimitTokens != 100 || got.Limit.Override != nil || got.Limit.Version != o.Version+1 {
		t.Fatalf("GetLimit after the end was recorded: %v %v", got, err)
	}
	hist, err := NewServer(b.Allocator).LimitHistory(ctx, &pb.LimitHistoryRequest{Id: o.Id})
	if err != nil || len(hist.Events) != 3 {
		t.Fatalf("history: %v %v", hist, err)
	}
	var last *pb.AuditEvent
	for _, e := range hist.Events {
		if last == nil || e.GetNew().GetVersion() > last.GetNew().GetVersion() {
			last = e
		}
	}
	if last.Reason != "override ended (incident 42: launch traffic)" || last.GetNew().GetLimitTokens() != 100 {
		t.Fatalf("the end's history entry: %v", last)
	}
	if err := b.sweepOnce(b.currentTermOrNil()); err != nil { // nothing more to record
		t.Fatal(err)
	}
	// The window that saw the end reports G at its end and the grants
	// made under the override as the bound's limit_lowered term.
	reps, err := b.Reports(o.Id, 10)
	if err != nil || len(reps) < 2 {
		t.Fatalf("reports %v %v", reps, err)
	}
	if r := reps[1]; r.LimitTokens != 100 || r.Granted != 250 || r.Terms.LimitLowered != 150 {
		t.Fatalf("window 1 report: G %d granted %d limit_lowered %d", r.LimitTokens, r.Granted, r.Terms.LimitLowered)
	}
}

// TestOverrideRefusals: what an override may not be, each refused naming
// the field.
func TestOverrideRefusals(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	if _, err := a.PutLimit(ctx, overrideBase(), Change{Reason: "r", OverrideFor: time.Hour}); err == nil || !strings.Contains(err.Error(), "override_for") {
		t.Fatalf("override of a missing limit: %v", err)
	}
	l, err := a.PutLimit(ctx, overrideBase(), Change{Reason: "contract"})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, l.Id, l.Version)
	win := overrideBase()
	win.Window = durationpb.New(time.Hour)
	withOverride := overrideBase()
	withOverride.Override = &pb.LimitOverride{Reason: "x"}
	up := overrideBase()
	up.LimitTokens = 200
	for _, s := range []struct {
		l     *pb.Limit
		c     Change
		field string
	}{
		{up, Change{Reason: "r", OverrideFor: time.Millisecond}, "override_for"},
		{up, Change{Reason: "r", OverrideFor: 32 * 24 * time.Hour}, "override_for"},
		{up, Change{Reason: "r", OverrideFor: time.Hour, Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW}, "effective"},
		{win, Change{Reason: "r", OverrideFor: time.Hour}, "limit.window"},
		{overrideBase(), Change{Reason: "r", OverrideFor: time.Hour}, "limit"},
		{withOverride, Change{Reason: "r"}, "limit.override"},
	} {
		_, err := a.PutLimit(ctx, s.l, s.c)
		var fe interface{ Error() string }
		if fe = err; err == nil || !strings.HasPrefix(err.Error(), s.field+":") && !strings.Contains(err.Error(), " "+s.field+":") {
			t.Errorf("%+v: %v, want an error naming %s", s.c, fe, s.field)
		}
	}
	// A change scheduled for the next window: no override on top of it
	// (its end would lose the scheduled version).
	sched := overrideBase()
	sched.LimitTokens = 120
	s, err := a.PutLimit(ctx, sched, Change{Reason: "next month"})
	if err != nil || s.Previous == nil {
		t.Fatalf("scheduled change: %v %v", s, err)
	}
	waitLimit(t, a.Allocator, s.Id, s.Version)
	if _, err := a.PutLimit(ctx, up, Change{Reason: "incident", OverrideFor: time.Hour}); err == nil || !strings.HasPrefix(err.Error(), "override_for:") {
		t.Fatalf("override over a scheduled change: %v", err)
	}
	sched.LimitTokens = 110
	if n, err := a.PutLimit(ctx, sched, Change{Reason: "now", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil || n.Previous != nil {
		t.Fatalf("change now: %v %v", n, err)
	}
	// While an override is in force, a change for the next window is
	// refused (it would outlive the override's end); one effective now
	// replaces the override.
	o, err := a.PutLimit(ctx, up, Change{Reason: "incident", OverrideFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, o.Id, o.Version)
	down := overrideBase()
	down.LimitTokens = 50
	if _, err := a.PutLimit(ctx, down, Change{Reason: "r"}); err == nil || !strings.Contains(err.Error(), "effective") {
		t.Fatalf("next-window change during an override: %v", err)
	}
	n, err := a.PutLimit(ctx, down, Change{Reason: "r", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil || n.Override != nil || n.LimitTokens != 50 {
		t.Fatalf("change now during an override: %v %v", n, err)
	}
}

// TestPlanOverrideEndsAcrossFailover: an override of a plan (a version
// of the plan's record, as a limit's) raises G for every tenant on it,
// used before or first using it under the override, at once; a tenant
// whose contract sets its G keeps it. The leader is stopped during the
// override: the new one grants under it until its end and under the
// plan's old G from its end, in the same window, and agents' syncs
// change at the end, with nothing written; the end is then recorded in
// the plan's history.
func TestPlanOverrideEndsAcrossFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt())
	allocatortest.WaitLeader(t, a)
	ctx := context.Background()
	base := proPlan(100)
	base.Contracts = map[string]*pb.Contract{"tenant/vip": {LimitTokens: 40}}
	p, err := a.PutLimit(ctx, base, Change{Reason: "pro", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	waitPlan(t, a.Allocator, "tenant/a", p.Version)
	grant := func(a *Allocator, tenant, req string, want int64) int64 {
		t.Helper()
		res, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: req, LimitId: tenant, WantTokens: want}})
		if err != nil || len(res) != 1 {
			t.Fatalf("grant %s %s: %v %v", tenant, req, res, err)
		}
		return res[0].GetLease().GetTokens()
	}
	if got := grant(a.Allocator, "tenant/a", "a0", 10); got != 10 {
		t.Fatalf("tenant/a before the override: %d", got)
	}
	// What an override of a plan may not change, named.
	rebind := proPlan(300)
	rebind.Contracts, rebind.Binds = base.Contracts, []string{"tenant/{id}", "team/{id}"}
	if _, err := a.PutLimit(ctx, rebind, Change{Reason: "r", OverrideFor: time.Hour}); err == nil || !strings.Contains(err.Error(), "limit.binds") {
		t.Fatalf("an override changing a plan's binds: %v", err)
	}
	rewin := proPlan(300)
	rewin.Contracts = map[string]*pb.Contract{"tenant/vip": {LimitTokens: 40, Window: durationpb.New(time.Hour)}}
	if _, err := a.PutLimit(ctx, rewin, Change{Reason: "r", OverrideFor: time.Hour}); err == nil || !strings.Contains(err.Error(), "limit.contracts[tenant/vip].window") {
		t.Fatalf("an override changing a tenant's window: %v", err)
	}
	up := proPlan(300)
	up.Contracts = base.Contracts
	o, err := a.PutLimit(ctx, up, Change{Reason: "incident 43: Pro launch", OverrideFor: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	end := t0.Add(91 * time.Second)
	if o.Override == nil || !o.Override.EndsAt.AsTime().Equal(end) || o.Override.After.GetLimitTokens() != 100 {
		t.Fatalf("override stored as %v", o)
	}
	waitPlan(t, a.Allocator, "tenant/a", o.Version)
	if got := grant(a.Allocator, "tenant/a", "a0b", 1000); got != 290 {
		t.Fatalf("tenant/a under the override: %d more, want 290 (G 300, 10 granted)", got)
	}
	if got := grant(a.Allocator, "tenant/b", "b0", 1000); got != 300 {
		t.Fatalf("tenant/b, first used under the override: %d, want 300", got)
	}
	if got := grant(a.Allocator, "tenant/vip", "v0", 1000); got != 40 {
		t.Fatalf("tenant/vip (a contract of G 40) under the override: %d, want 40", got)
	}
	// Shown in force: the plan's series and each used tenant's.
	endS := strconv.FormatInt(end.Unix(), 10)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leasehold_limit_override_end_timestamp_seconds When the override in force on a limit ends (Unix seconds; absent without one): the version before it governs again then.
# TYPE leasehold_limit_override_end_timestamp_seconds gauge
leasehold_limit_override_end_timestamp_seconds{limit="plans/pro"} `+endS+`
leasehold_limit_override_end_timestamp_seconds{limit="tenant/a"} `+endS+`
leasehold_limit_override_end_timestamp_seconds{limit="tenant/b"} `+endS+`
leasehold_limit_override_end_timestamp_seconds{limit="tenant/vip"} `+endS+"\n"),
		"leasehold_limit_override_end_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	syncBefore, err := a.SyncLimits(ctx, "eu", 0)
	if err != nil || planTokens(syncBefore) != 300 {
		t.Fatalf("sync under the override: %v %v", syncBefore, err)
	}

	a.Stop()
	b := startAllocator(t, c, "b", clock.opt())
	allocatortest.WaitLeader(t, b)
	waitPlan(t, b.Allocator, "tenant/a", o.Version)
	clock.Set(t0.Add(time.Minute + 30*time.Second)) // window 1, the override still in force
	if got := grant(b.Allocator, "tenant/a", "a1", 250); got != 250 {
		t.Fatalf("tenant/a in window 1 before the end: %d, want 250", got)
	}
	if again, err := b.SyncLimits(ctx, "eu", syncBefore.Revision); err != nil || !again.Unchanged {
		t.Fatalf("sync before the end: %v %v", again, err)
	}
	clock.Set(end) // the end, still window 1
	if got := grant(b.Allocator, "tenant/a", "a1b", 10); got != 0 {
		t.Fatalf("tenant/a at the end: %d, want 0 (G 100, 250 granted under the override)", got)
	}
	if got := grant(b.Allocator, "tenant/c", "c1", 1000); got != 100 {
		t.Fatalf("tenant/c, first used at the end: %d, want the plan's 100", got)
	}
	sync, err := b.SyncLimits(ctx, "eu", syncBefore.Revision)
	if err != nil || sync.Unchanged || planTokens(sync) != 100 {
		t.Fatalf("sync at the end: %v %v", sync, err)
	}
	for _, l := range sync.Limits {
		if l.Override != nil || len(l.Binds) != 1 || l.Contracts["tenant/vip"].GetLimitTokens() != 40 {
			t.Fatalf("the plan synced at the end: %v", l)
		}
	}
	if err := b.sweepOnce(b.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	got, err := NewServer(b.Allocator).GetLimit(ctx, &pb.GetLimitRequest{Id: "plans/pro"})
	if err != nil || got.Limit.LimitTokens != 100 || got.Limit.Override != nil || got.Limit.Version != o.Version+1 || len(got.Limit.Binds) != 1 {
		t.Fatalf("the plan after its end was recorded: %v %v", got, err)
	}
	hist, err := NewServer(b.Allocator).LimitHistory(ctx, &pb.LimitHistoryRequest{Id: "plans/pro"})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range hist.Events {
		reasons = append(reasons, e.Reason)
	}
	if !slices.Contains(reasons, "override ended (incident 43: Pro launch)") {
		t.Fatalf("the plan's history: %q", reasons)
	}
	waitPlan(t, b.Allocator, "tenant/a", o.Version+1)
	clock.Set(t0.Add(2*time.Minute + time.Second))
	if got := grant(b.Allocator, "tenant/b", "b2", 1000); got != 100 {
		t.Fatalf("tenant/b in window 2: %d, want 100", got)
	}
}
