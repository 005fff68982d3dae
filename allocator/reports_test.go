package allocator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// boundedLimit: G = 1000/min, eu may admit 100 locally, us is closed.
func boundedLimit() *pb.Limit {
	return &pb.Limit{Id: "tenant/rep", LimitTokens: 1000, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode:     pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 100}},
		Lease:    &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second)}}
}

// playWindow grants eu 600 and us 300, eu returns 50 unspent, and both
// report usage: eu admitted 540 from leases and 80 under local fallback.
func playWindow(t *testing.T, a *Allocator, clock *fakeClock) int64 {
	t.Helper()
	ctx := context.Background()
	w := lease.WindowOf(clock.Now(), time.Minute).Index
	grant := func(region, id string, n int64) *pb.Lease {
		res, err := a.AcquireLeases(ctx, region, []*pb.LeaseRequest{{RequestId: id, LimitId: "tenant/rep", WantTokens: n}})
		if err != nil || res[0].Lease == nil || res[0].Lease.Tokens != n {
			t.Fatalf("grant %s %d: %v %v", region, n, res, err)
		}
		return res[0].Lease
	}
	eu := grant("eu", "e1", 600)
	grant("us", "u1", 300)
	if _, err := a.ReturnLeases(ctx, "eu", []*pb.LeaseReturn{{LimitId: "tenant/rep", LeaseId: eu.LeaseId, Unspent: 50}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		region string
		u      *pb.Usage
	}{
		{"eu", &pb.Usage{LimitId: "tenant/rep", WindowIndex: w, Admitted: 540, FallbackAdmitted: 80, Fallback: pb.FallbackKind_FALLBACK_KIND_LOCAL}},
		{"us", &pb.Usage{LimitId: "tenant/rep", WindowIndex: w, Admitted: 290, Denied: 40}},
	} {
		if _, err := a.ReportUsage(ctx, r.region, "bucket", []*pb.Usage{r.u}); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func checkReport(t *testing.T, got WindowReport) {
	t.Helper()
	r := got.Report
	if r.LimitTokens != 1000 || r.Granted != 900 || r.Returned != 50 || r.Admitted["eu"] != 620 || r.Admitted["us"] != 290 ||
		r.AdmittedTotal != 910 || r.FallbackAdmitted != 80 || r.Bound.Infinite || r.Bound.Tokens != 100 ||
		r.ObservedOvershoot != 0 || r.Stranded != 20 || got.Fallback["eu"] != pb.FallbackKind_FALLBACK_KIND_LOCAL {
		t.Fatalf("report %+v (fallback %v): want G 1000, granted 900, returned 50, eu 620 us 290, fallback 80, bound 100 (eu's local:100), stranded 20", r, got.Fallback)
	}
}

// TestReportsSurviveSweepAndFailover: a window's report is computed from
// grants, returns and usage; after its records are swept the stored
// summary gives the same report; after a failover the new leader does too.
func TestReportsSurviveSweepAndFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithRetention(30*time.Second, time.Hour))
	allocatortest.WaitLeader(t, a)
	l, err := a.PutLimit(context.Background(), boundedLimit(), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, l.Id, l.Version)
	w := playWindow(t, a.Allocator, clock)

	reps, err := a.Reports("tenant/rep", 10)
	if err != nil || len(reps) != 1 || reps[0].Closed {
		t.Fatalf("running window: %v %v", reps, err)
	}
	checkReport(t, reps[0])

	clock.Set(t0.Add(2 * time.Minute)) // window w ended more than the retention ago
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	_ = a.View(func(_ time.Time, core *Core) {
		if _, live := core.windows[windowKey{"tenant/rep", w}]; live {
			t.Fatal("window records not swept")
		}
	})
	reps, err = a.Reports("tenant/rep", 10)
	if err != nil || len(reps) != 1 || !reps[0].Closed {
		t.Fatalf("after the sweep: %v %v", reps, err)
	}
	checkReport(t, reps[0])

	// A usage report arriving after the sweep (an agent that could not
	// reach the allocator for longer than the retention) updates the
	// summary; it does not bring back a window with no grants.
	if _, err := a.ReportUsage(context.Background(), "us", "bucket", []*pb.Usage{{LimitId: "tenant/rep", WindowIndex: w, Admitted: 295}}); err != nil {
		t.Fatal(err)
	}
	reps, err = a.Reports("tenant/rep", 10)
	if err != nil || len(reps) != 1 || reps[0].Admitted["us"] != 295 || reps[0].Granted != 900 {
		t.Fatalf("late usage: %+v %v", reps, err)
	}
	if _, err := a.ReportUsage(context.Background(), "us", "bucket", []*pb.Usage{{LimitId: "tenant/rep", WindowIndex: w, Admitted: 290}}); err != nil {
		t.Fatal(err)
	}

	a.Stop()
	b := startAllocator(t, c, "b", clock.opt())
	allocatortest.WaitLeader(t, b)
	reps, err = b.Reports("tenant/rep", 10)
	if err != nil || len(reps) != 1 || reps[0].Admitted["us"] != 295 {
		t.Fatalf("after failover: %+v %v", reps, err)
	}
	reps[0].Admitted["us"], reps[0].AdmittedTotal, reps[0].Stranded = 290, 910, 20 // the late report, undone for the common check
	checkReport(t, reps[0])
	if _, err := b.Reports("tenant/none", 10); !errorsIs(err, ErrNotFound) {
		t.Fatalf("unknown limit: %v", err)
	}
}

// TestWindowMetrics: the last closed window's figures are exported with
// exactly the documented names, and a window over its bound is counted.
func TestWindowMetrics(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithRetention(30*time.Second, time.Hour))
	allocatortest.WaitLeader(t, a)
	l, _ := a.PutLimit(context.Background(), boundedLimit(), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	waitLimit(t, a.Allocator, l.Id, l.Version)
	w := playWindow(t, a.Allocator, clock)
	clock.Set(t0.Add(time.Minute + time.Second)) // w is the last closed window
	// In the running window us is OPEN.
	if _, err := a.ReportUsage(context.Background(), "us", "bucket", []*pb.Usage{{LimitId: "tenant/rep", WindowIndex: w + 1, FallbackAdmitted: 3, Fallback: pb.FallbackKind_FALLBACK_KIND_OPEN}}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP leasehold_overshoot_bound_tokens The computed bound on tokens admitted above G in the last closed window (+Inf while a region was OPEN).
# TYPE leasehold_overshoot_bound_tokens gauge
leasehold_overshoot_bound_tokens{limit="tenant/rep"} 100
# HELP leasehold_overshoot_observed_tokens Tokens admitted above G in the last closed window: max(0, admitted - G). Above the bound is a bug.
# TYPE leasehold_overshoot_observed_tokens gauge
leasehold_overshoot_observed_tokens{limit="tenant/rep"} 0
# HELP leasehold_region_fallback_mode Most permissive fail mode in force per region in the running window: 0 none, 1 closed, 2 local, 3 open.
# TYPE leasehold_region_fallback_mode gauge
leasehold_region_fallback_mode{limit="tenant/rep",region="eu"} 0
leasehold_region_fallback_mode{limit="tenant/rep",region="us"} 3
# HELP leasehold_stranded_tokens Tokens granted in the last closed window that were neither returned nor admitted.
# TYPE leasehold_stranded_tokens gauge
leasehold_stranded_tokens{limit="tenant/rep"} 20
# HELP leasehold_window_admitted_tokens Tokens admitted in the last closed window, per region (leases and fallback).
# TYPE leasehold_window_admitted_tokens gauge
leasehold_window_admitted_tokens{limit="tenant/rep",region="eu"} 620
leasehold_window_admitted_tokens{limit="tenant/rep",region="us"} 290
# HELP leasehold_window_fallback_admitted_tokens Tokens admitted under LOCAL or OPEN fallback in the last closed window, per region.
# TYPE leasehold_window_fallback_admitted_tokens gauge
leasehold_window_fallback_admitted_tokens{limit="tenant/rep",region="eu"} 80
leasehold_window_fallback_admitted_tokens{limit="tenant/rep",region="us"} 0
# HELP leasehold_window_limit_tokens G of the limit's last closed window.
# TYPE leasehold_window_limit_tokens gauge
leasehold_window_limit_tokens{limit="tenant/rep"} 1000
`
	names := []string{"leasehold_overshoot_bound_tokens", "leasehold_overshoot_observed_tokens", "leasehold_region_fallback_mode",
		"leasehold_stranded_tokens", "leasehold_window_admitted_tokens", "leasehold_window_fallback_admitted_tokens", "leasehold_window_limit_tokens"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// A window (w+2, no fallback anywhere) that admitted 1,200 of G 1,000
	// closed over its bound of 0, and is counted.
	clock.Set(t0.Add(2*time.Minute + time.Second))
	if _, err := a.ReportUsage(context.Background(), "eu", "bucket", []*pb.Usage{{LimitId: "tenant/rep", WindowIndex: w + 2, Admitted: 1200}}); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(4 * time.Minute))
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(a.m.overBound); got != 1 {
		t.Fatalf("windows over bound = %v, want 1", got)
	}

	// A window (w+3) whose settle-later Checks admitted 30 beyond eu's
	// leases: its bound is the settlement term, 30, and it is not over.
	if _, err := a.ReportUsage(context.Background(), "eu", "bucket", []*pb.Usage{{LimitId: "tenant/rep", WindowIndex: w + 3, Admitted: 1030, SettleOverrun: 30}}); err != nil {
		t.Fatal(err)
	}
	want = `
# HELP leasehold_overshoot_bound_tokens The computed bound on tokens admitted above G in the last closed window (+Inf while a region was OPEN).
# TYPE leasehold_overshoot_bound_tokens gauge
leasehold_overshoot_bound_tokens{limit="tenant/rep"} 30
# HELP leasehold_overshoot_observed_tokens Tokens admitted above G in the last closed window: max(0, admitted - G). Above the bound is a bug.
# TYPE leasehold_overshoot_observed_tokens gauge
leasehold_overshoot_observed_tokens{limit="tenant/rep"} 30
# HELP leasehold_window_settlement_tokens The bound's settlement term in the last closed window: cost settle-later Checks admitted beyond the window's leases.
# TYPE leasehold_window_settlement_tokens gauge
leasehold_window_settlement_tokens{limit="tenant/rep"} 30
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasehold_overshoot_bound_tokens", "leasehold_overshoot_observed_tokens",
		"leasehold_window_settlement_tokens"); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(6 * time.Minute))
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(a.m.overBound); got != 1 {
		t.Fatalf("windows over bound = %v, want still 1", got)
	}
}

func TestListWindowsOverGRPC(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt())
	allocatortest.WaitLeader(t, a)
	l, _ := a.PutLimit(context.Background(), boundedLimit(), Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	waitLimit(t, a.Allocator, l.Id, l.Version)
	playWindow(t, a.Allocator, clock)
	_, admin := serve(t, a.Allocator)
	ctx := context.Background()
	resp, err := admin.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "tenant/rep"})
	if err != nil || len(resp.Windows) != 1 {
		t.Fatalf("ListWindows: %v %v", resp, err)
	}
	w := resp.Windows[0]
	if w.Bound != 100 || w.BoundInfinite || w.AdmittedTotal != 910 || w.Admitted["eu"] != 620 || w.Terms.Fallback != 100 ||
		w.Fallback["eu"] != pb.FallbackKind_FALLBACK_KIND_LOCAL || w.Closed || w.WindowEnd.AsTime().Sub(w.WindowStart.AsTime()) != time.Minute {
		t.Fatalf("window report %v", w)
	}
	_, err = admin.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "tenant/rep", Last: 5000})
	wantInvalid(t, err, "last")
	_, err = admin.ListWindows(ctx, &pb.ListWindowsRequest{})
	wantInvalid(t, err, "limit_id")
	if _, err := admin.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "tenant/none"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown limit: %v", err)
	}
}

func TestKeepSummaries(t *testing.T) {
	c := NewCore()
	for w := int64(1); w <= 5; w++ {
		dropped := c.keepSummary(&WindowSummary{Limit: "x", Window: w}, 3)
		if want := max(0, w-3); int64(len(dropped)) != min(1, want) || (want > 0 && dropped[0] != want) {
			t.Fatalf("window %d: dropped %v", w, dropped)
		}
	}
	if got := len(c.summaries["x"]); got != 3 || c.summaries["x"][0].Window != 3 {
		t.Fatalf("kept %d summaries from %d", got, c.summaries["x"][0].Window)
	}
}

// TestShadowWindowReport: would-deny counts of a limit in shadow mode add
// up per region over reporters (a retried report counts once), reach the
// window report and the metrics, and survive the sweep and a failover.
func TestShadowWindowReport(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	reg := prometheus.NewRegistry()
	a := startAllocatorReg(t, c, "a", reg, clock.opt(), WithRetention(30*time.Second, time.Hour))
	allocatortest.WaitLeader(t, a)
	lim := boundedLimit()
	lim.Shadow = true
	l, err := a.PutLimit(context.Background(), lim, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil || !l.Shadow {
		t.Fatalf("put: %v %v", l, err)
	}
	waitLimit(t, a.Allocator, l.Id, l.Version)
	w := lease.WindowOf(clock.Now(), time.Minute).Index
	ctx := context.Background()
	for _, r := range []struct {
		region, reporter string
		u                *pb.Usage
	}{
		{"eu", "r1", &pb.Usage{LimitId: l.Id, WindowIndex: w, Admitted: 500, WouldDeny: 30, WouldDenyChecks: 10}},
		{"eu", "r1", &pb.Usage{LimitId: l.Id, WindowIndex: w, Admitted: 500, WouldDeny: 30, WouldDenyChecks: 10}}, // a retry
		{"eu", "r2", &pb.Usage{LimitId: l.Id, WindowIndex: w, Admitted: 100, WouldDeny: 12, WouldDenyChecks: 4}},
		{"us", "r1", &pb.Usage{LimitId: l.Id, WindowIndex: w, Admitted: 300, WouldDeny: 5, WouldDenyChecks: 5}},
	} {
		if _, err := a.ReportUsage(ctx, r.region, r.reporter, []*pb.Usage{r.u}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, a *Allocator) {
		t.Helper()
		reps, err := a.Reports(l.Id, 10)
		if err != nil || len(reps) != 1 {
			t.Fatalf("%s: %v %v", what, reps, err)
		}
		r := reps[0]
		if !r.Shadow || r.WouldDeny["eu"] != 42 || r.WouldDeny["us"] != 5 || r.WouldDenyTotal != 47 || r.WouldDenyChecks != 19 ||
			r.AdmittedTotal != 900 {
			t.Fatalf("%s: %+v: want shadow, would deny eu 42 us 5 (47, 19 checks), admitted 900", what, r)
		}
		p := r.ToProto()
		if !p.Shadow || p.WouldDeny["eu"] != 42 || p.WouldDenyTotal != 47 || p.WouldDenyChecks != 19 {
			t.Fatalf("%s: proto %v", what, p)
		}
	}
	check("live", a.Allocator)
	clock.Set(t0.Add(time.Minute + time.Second)) // w is the last closed window
	want := `
# HELP leasehold_window_would_deny_checks Shadow mode: checks admitted in the last closed window that enforcement would have denied, all regions.
# TYPE leasehold_window_would_deny_checks gauge
leasehold_window_would_deny_checks{limit="tenant/rep"} 19
# HELP leasehold_window_would_deny_tokens Shadow mode: tokens admitted in the last closed window that enforcement would have denied, per region (not in admitted).
# TYPE leasehold_window_would_deny_tokens gauge
leasehold_window_would_deny_tokens{limit="tenant/rep",region="eu"} 42
leasehold_window_would_deny_tokens{limit="tenant/rep",region="us"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasehold_window_would_deny_checks", "leasehold_window_would_deny_tokens"); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(2 * time.Minute))
	if err := a.sweepOnce(a.currentTermOrNil()); err != nil {
		t.Fatal(err)
	}
	check("summary", a.Allocator)
	a.Stop()
	b := startAllocator(t, c, "b", clock.opt())
	allocatortest.WaitLeader(t, b)
	check("after failover", b.Allocator)
}

// TestUsageWouldDenyValidated: negative would-deny counts are refused,
// naming the field; with several negative counts, always the first.
func TestUsageWouldDenyValidated(t *testing.T) {
	for _, u := range []*pb.Usage{{LimitId: "tenant/a", WouldDeny: -1}, {LimitId: "tenant/a", WouldDenyChecks: -1}} {
		err := ValidateReport(&pb.ReportUsageRequest{Region: "eu", Reporter: "r1", Usage: []*pb.Usage{u}})
		if err == nil || (!strings.Contains(err.Error(), "usage[0].would_deny")) {
			t.Fatalf("%v: %v", u, err)
		}
	}
	u := &pb.Usage{LimitId: "tenant/a", Denied: -1, Released: -2, WouldDeny: -3}
	for range 20 {
		err := ValidateReport(&pb.ReportUsageRequest{Region: "eu", Reporter: "r1", Usage: []*pb.Usage{u}})
		if err == nil || err.Error() != "usage[0].denied: must be >= 0, got -1" {
			t.Fatalf("three negative counts: %v, want the first (denied) named", err)
		}
	}
}
