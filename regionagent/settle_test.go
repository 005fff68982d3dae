package regionagent

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// windowReport is the allocator's report of one window of limit.
func (w *world) windowReport(limit string, win int64, length time.Duration) allocator.WindowReport {
	w.t.Helper()
	reps, err := w.alloc.Reports(limit, 10)
	if err != nil {
		w.t.Fatal(err)
	}
	start := lease.Window{Index: win, Length: length}.Start()
	for _, r := range reps {
		if r.WindowStart.Equal(start) {
			return r
		}
	}
	w.t.Fatalf("no report of window %d in %+v", win, reps)
	return allocator.WindowReport{}
}

// TestSettleLater: a settle-later Check charges its estimate and returns a
// decision id; Settle refunds, charges, and admits an overrun the window
// cannot hold, counted in the window's settlement term and carried into
// the next window, which pays it from its first lease; retries are
// applied once; bad input and late settles are refused, over gRPC with
// the codes the API states.
func TestSettleLater(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/llm", 100, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 100 // one lease holds the whole window
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	srv := NewServer(a)
	ctx := context.Background()
	a.evaluate(ctx, l.Id)
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index

	d1, err := a.CheckSettleLater(ctx, l.Id, 30)
	if err != nil || !d1.Allowed || d1.DecisionID == "" || d1.Remaining != 70 || d1.SettleWithin != 30*time.Second {
		t.Fatalf("settle-later check: %+v %v", d1, err)
	}
	// It cost 10: 20 back.
	s, err := a.Settle(ctx, l.Id, d1.DecisionID, 10)
	if err != nil || s != (Settlement{Estimate: 30, Refunded: 20}) {
		t.Fatalf("refund: %+v %v", s, err)
	}
	if s, err = a.Settle(ctx, l.Id, d1.DecisionID, 10); err != nil || s != (Settlement{Estimate: 30, Refunded: 20, Replayed: true}) {
		t.Fatalf("retried settle: %+v %v", s, err)
	}
	if _, err = a.Settle(ctx, l.Id, d1.DecisionID, 11); !errors.Is(err, ErrSettleRefused) {
		t.Fatalf("a retry with another actual: %v", err)
	}
	// 90 spendable. An estimate of 50 that cost 100: 40 absorbed, 10 over.
	d2, err := a.CheckSettleLater(ctx, l.Id, 50)
	if err != nil || !d2.Allowed {
		t.Fatalf("second check: %+v %v", d2, err)
	}
	if s, err = a.Settle(ctx, l.Id, d2.DecisionID, 100); err != nil || s != (Settlement{Estimate: 50, Charged: 40, Overrun: 10, Debt: 10}) {
		t.Fatalf("overrun: %+v %v", s, err)
	}
	for _, m := range []struct {
		c    prometheus.Counter
		want float64
	}{
		{a.m.settles.WithLabelValues("settled"), 2}, {a.m.settles.WithLabelValues("replayed"), 1},
		{a.m.settles.WithLabelValues("refused"), 1}, {a.m.settleTokens.WithLabelValues("overrun"), 10},
		{a.m.settleTokens.WithLabelValues("refunded"), 20}, {a.m.settleTokens.WithLabelValues("charged"), 40},
	} {
		if got := testutil.ToFloat64(m.c); got != m.want {
			t.Errorf("%s = %v, want %v", m.c.Desc(), got, m.want)
		}
	}
	a.report(ctx)
	if u := w.regionUsage(l.Id, "eu", win); u.NetAdmitted() != 110 || u.SettleOverrun != 10 {
		t.Fatalf("the allocator holds %+v, want 110 admitted (10 + 100) and 10 overrun", u)
	}

	// The next window's first lease pays the 10 of debt.
	w.clock.Add(time.Minute)
	a.evaluate(ctx, l.Id)
	d3, err := a.CheckSettleLater(ctx, l.Id, 5)
	if err != nil || !d3.Allowed || d3.Remaining != 100-10-5 {
		t.Fatalf("the next window: %+v %v, want 85 left after 10 of debt", d3, err)
	}
	a.report(ctx)
	rep := w.windowReport(l.Id, win, time.Minute)
	if rep.Terms.Settlement != 10 || rep.ObservedOvershoot != 10 || rep.Bound.Tokens != 10 || rep.Bound.Infinite {
		t.Fatalf("window report: observed %d, bound %v (%s), want 10 and settlement 10", rep.ObservedOvershoot, rep.Bound, rep.Terms)
	}

	// Bad input and late settles, over gRPC.
	w.clock.Add(30*time.Second + time.Millisecond) // past d3's grace
	for _, tc := range []struct {
		name     string
		req      *pb.SettleRequest
		code     codes.Code
		fragment string
	}{
		{"after the grace", &pb.SettleRequest{LimitId: l.Id, DecisionId: d3.DecisionID, Actual: 5}, codes.FailedPrecondition, "settle grace"},
		{"unknown decision", &pb.SettleRequest{LimitId: l.Id, DecisionId: decisionID(win + 1), Actual: 5}, codes.NotFound, "decision_id"},
		{"not a decision id", &pb.SettleRequest{LimitId: l.Id, DecisionId: "client-1", Actual: 5}, codes.InvalidArgument, "decision_id"},
		{"no decision id", &pb.SettleRequest{LimitId: l.Id, Actual: 5}, codes.InvalidArgument, "decision_id"},
		{"negative actual", &pb.SettleRequest{LimitId: l.Id, DecisionId: d3.DecisionID, Actual: -1}, codes.InvalidArgument, "actual"},
		{"actual above G", &pb.SettleRequest{LimitId: l.Id, DecisionId: d3.DecisionID, Actual: 101}, codes.InvalidArgument, "actual"},
		{"unknown limit", &pb.SettleRequest{LimitId: "tenant/none", DecisionId: d3.DecisionID, Actual: 1}, codes.NotFound, "limit_id"},
		{"a window long over", &pb.SettleRequest{LimitId: l.Id, DecisionId: decisionID(win - 5), Actual: 1}, codes.FailedPrecondition, "too long ago"},
	} {
		_, err := srv.Settle(ctx, tc.req)
		if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.fragment) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.code, tc.fragment)
		}
	}
	if _, err := srv.Check(ctx, &pb.CheckRequest{LimitId: l.Id, Cost: 101, SettleLater: true}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an estimate above G: %v", err)
	}
	if _, err := srv.CheckMulti(ctx, &pb.CheckMultiRequest{Checks: []*pb.CheckRequest{{LimitId: l.Id, SettleLater: true}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("settle_later in CheckMulti: %v", err)
	}
}

// TestSettleLaterBound: two regions (eu with two replicas sharing its
// Redis), settle-later Checks of random estimates settled with random
// actual costs, some late in their window or after its end, some retried,
// from another replica than the one that decided. Per window, the actual
// cost admitted (the test's own ledger) is within G + the settlement term
// the allocator exports; the term is exactly the overruns Settle answered;
// and the allocator's admitted count is the ledger plus the debt the
// window paid for the one before: a retried settle was applied once.
func TestSettleLaterBound(t *testing.T) {
	const g = 300
	w := newWorld(t, "eu", "us")
	l := w.putLimit(limit("tenant/llm-bound", g, time.Minute, 15*time.Second, "eu", "us"))
	agents := map[string][]*Agent{
		"eu": {w.agent("eu", "r1"), w.agent("eu", "r2")},
		"us": {w.agent("us", "r1")},
	}
	regions := []string{"eu", "us"}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 19))
	ctx := context.Background()

	type pending struct {
		region string
		id     string
		actual int64
		win    int64
		at     time.Time
	}
	var (
		queue            []pending
		actual, overrun  = map[int64]int64{}, map[int64]int64{}
		decided, retried int
		first            = lease.WindowOf(w.clock.Now(), time.Minute).Index
		windows          = int64(4)
		settleOne        func(p pending)
	)
	settleOne = func(p pending) {
		reps := agents[p.region]
		a := reps[rng.IntN(len(reps))] // any replica of the region settles
		s, err := a.Settle(ctx, l.Id, p.id, p.actual)
		if err != nil || s.Replayed {
			t.Fatalf("settle %+v: %+v %v", p, s, err)
		}
		actual[p.win] += p.actual
		overrun[p.win] += s.Overrun
		if rng.IntN(4) == 0 { // the caller did not see the answer: it retries
			retried++
			again, err := reps[rng.IntN(len(reps))].Settle(ctx, l.Id, p.id, p.actual)
			s.Replayed = true
			if err != nil || again != s {
				t.Fatalf("retried settle %+v: %+v %v, want %+v", p, again, err, s)
			}
		}
	}
	for w.clock.Now().Before(lease.Window{Index: first + windows, Length: time.Minute}.Start()) {
		w.clock.Add(time.Second)
		now := w.clock.Now()
		for _, r := range regions {
			for _, a := range agents[r] {
				a.evaluate(ctx, l.Id)
			}
		}
		for range rng.IntN(4) {
			r := regions[rng.IntN(len(regions))]
			a := agents[r][rng.IntN(len(agents[r]))]
			est := 1 + rng.Int64N(30)
			d, err := a.CheckSettleLater(ctx, l.Id, est)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				continue
			}
			decided++
			delay := time.Duration(rng.Int64N(int64(25 * time.Second)))
			queue = append(queue, pending{region: r, id: d.DecisionID, actual: rng.Int64N(2*est + 1), // as often below the estimate as above
				win: lease.WindowOf(now, time.Minute).Index, at: now.Add(delay)})
		}
		rest := queue[:0]
		for _, p := range queue {
			if p.at.After(now) {
				rest = append(rest, p)
				continue
			}
			settleOne(p)
		}
		queue = rest
	}
	for _, p := range queue {
		settleOne(p)
	}
	for _, r := range regions {
		for _, a := range agents[r] {
			a.report(ctx)
		}
	}
	var overruns int64
	for win := first; win < first+windows; win++ {
		rep := w.windowReport(l.Id, win, time.Minute)
		var paid int64
		for _, r := range regions {
			paid += counterOf(balance(t, agents[r][0], l.Id, win, w.clock.Now()), "debt_paid")
		}
		t.Logf("window %d: ledger %d, admitted %d (%d of it debt paid), settlement %d, observed %d", win-first,
			actual[win], rep.AdmittedTotal, paid, rep.Terms.Settlement, rep.ObservedOvershoot)
		switch {
		case rep.Bound.Infinite || actual[win] > g+rep.Bound.Tokens:
			t.Errorf("window %d: actual cost admitted %d > G %d + bound %v", win-first, actual[win], g, rep.Bound)
		case rep.Terms.Settlement != overrun[win]:
			t.Errorf("window %d: settlement term %d, the settles answered %d of overrun", win-first, rep.Terms.Settlement, overrun[win])
		case rep.AdmittedTotal != actual[win]+paid:
			t.Errorf("window %d: the allocator counts %d admitted, the ledger %d + %d of debt paid", win-first, rep.AdmittedTotal, actual[win], paid)
		case rep.ObservedOvershoot > rep.Bound.Tokens:
			t.Errorf("window %d: observed %d above the bound %v", win-first, rep.ObservedOvershoot, rep.Bound)
		}
		overruns += overrun[win]
	}
	if decided < 60 || retried == 0 || overruns == 0 {
		t.Fatalf("%d decisions, %d retried settles, %d of overrun: the test did not exercise settlement", decided, retried, overruns)
	}
}

// TestSettleLaterForgive: under debt_policy forgive an overrun is counted
// in its window's settlement term and the next window keeps its whole
// budget; the limit's own settle grace is the one stated and enforced.
func TestSettleLaterForgive(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/forgive", 100, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 100
	l.DebtPolicy = pb.DebtPolicy_DEBT_POLICY_FORGIVE
	l.SettleGrace = durationpb.New(5 * time.Second)
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	ctx := context.Background()
	a.evaluate(ctx, l.Id)
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	d, err := a.CheckSettleLater(ctx, l.Id, 50)
	if err != nil || !d.Allowed || d.SettleWithin != 5*time.Second {
		t.Fatalf("check: %+v %v", d, err)
	}
	if c, err := a.Check(ctx, l.Id, 40); err != nil || !c.Allowed {
		t.Fatalf("a plain check of 40: %+v %v", c, err)
	}
	// It cost 100: 10 taken from the 10 left, 40 over, forgiven.
	if s, err := a.Settle(ctx, l.Id, d.DecisionID, 100); err != nil || s != (Settlement{Estimate: 50, Charged: 10, Overrun: 40}) {
		t.Fatalf("settle: %+v %v", s, err)
	}
	a.report(ctx)
	if u := w.regionUsage(l.Id, "eu", win); u.SettleOverrun != 40 || u.NetAdmitted() != 140 {
		t.Fatalf("the allocator holds %+v, want 140 admitted and 40 overrun", u)
	}
	// The next window owes nothing: its whole 100 can be decided.
	w.clock.Add(time.Minute)
	a.evaluate(ctx, l.Id)
	d, err = a.CheckSettleLater(ctx, l.Id, 100)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the next window: %+v %v, want all 100", d, err)
	}
	// Its 5 s grace: at 5 s a settle is taken, past it refused.
	w.clock.Add(5*time.Second + time.Millisecond)
	if _, err := a.Settle(ctx, l.Id, d.DecisionID, 50); !errors.Is(err, ErrSettleRefused) {
		t.Fatalf("a settle 5.001 s after the decision: %v, want refused", err)
	}
}
