package allocator

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/vocab"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// standingLimit is a strict limit of G = 100 per minute in eu and us, each
// with a standing share of 5.
func standingLimit() *pb.Limit {
	return &pb.Limit{Id: "tenant/std", LimitTokens: 100, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Version: 1, Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 1, Standing: 5}}
}

// TestStandingChangesAtBoundary: what the running window's standing shares
// are never changes under it. A change made effective at once may not
// change lease.standing or drop a region while a share is set (regions
// may already have spent theirs); the same change scheduled for the next
// window is accepted, and so are the changes at once that leave the
// shares as they are (a lower G, a region added), and an override is held
// to the same rule.
func TestStandingChangesAtBoundary(t *testing.T) {
	now := t0.Add(10 * time.Second)
	for _, tc := range []struct {
		name  string
		from  func(*pb.Limit)
		to    func(*pb.Limit)
		eff   pb.Effective
		field string // "": accepted
	}{
		{name: "share raised at once", to: func(l *pb.Limit) { l.Lease.Standing = 6 }, eff: pb.Effective_EFFECTIVE_NOW, field: "limit.lease.standing"},
		{name: "share removed at once", to: func(l *pb.Limit) { l.Lease.Standing = 0 }, eff: pb.Effective_EFFECTIVE_NOW, field: "limit.lease.standing"},
		{name: "share set at once", from: func(l *pb.Limit) { l.Lease.Standing = 0 }, to: func(*pb.Limit) {}, eff: pb.Effective_EFFECTIVE_NOW, field: "limit.lease.standing"},
		{name: "share raised at the boundary", to: func(l *pb.Limit) { l.Lease.Standing = 6 }, eff: pb.Effective_EFFECTIVE_NEXT_WINDOW},
		{name: "region dropped at once", to: func(l *pb.Limit) { l.Regions = []string{"eu"} }, eff: pb.Effective_EFFECTIVE_NOW, field: "limit.regions"},
		{name: "region dropped at the boundary", to: func(l *pb.Limit) { l.Regions = []string{"eu"} }, eff: pb.Effective_EFFECTIVE_NEXT_WINDOW},
		{name: "region dropped at once, no share", from: func(l *pb.Limit) { l.Lease.Standing = 0 },
			to: func(l *pb.Limit) { l.Regions, l.Lease.Standing = []string{"eu"}, 0 }, eff: pb.Effective_EFFECTIVE_NOW},
		{name: "region added at once", to: func(l *pb.Limit) { l.Regions = []string{"ap", "eu", "us"} }, eff: pb.Effective_EFFECTIVE_NOW},
		{name: "G lowered at once", to: func(l *pb.Limit) { l.LimitTokens = 10 }, eff: pb.Effective_EFFECTIVE_NOW},
	} {
		stored := standingLimit()
		if tc.from != nil {
			tc.from(stored)
		}
		next := standingLimit()
		tc.to(next)
		got, err := nextRecord(now, stored, &changeItem{put: next, valid: next, field: "limit"}, tc.eff, false)
		checkField(t, tc.name, err, tc.field)
		if err == nil && tc.eff == pb.Effective_EFFECTIVE_NEXT_WINDOW && !got.EffectiveFrom.AsTime().Equal(t0.Add(time.Minute)) {
			t.Errorf("%s: effective from %v, want the next boundary", tc.name, got.EffectiveFrom.AsTime())
		}
	}

	// An override starts at once: it keeps the shares.
	over := standingLimit()
	over.LimitTokens, over.Lease.Standing = 300, 10
	_, err := overrideRecord(now, standingLimit(), over, &changeItem{put: over, valid: over, field: "limit"}, &changeSet{overrideFor: time.Minute})
	checkField(t, "override", err, "limit.lease.standing")
	over.Lease.Standing = 5
	if _, err := overrideRecord(now, standingLimit(), over, &changeItem{put: over, valid: over, field: "limit"}, &changeSet{overrideFor: time.Minute}); err != nil {
		t.Errorf("override keeping the shares: %v", err)
	}

	// A plan: each tenant its contracts shape is held to it too.
	plan := func(tenantStanding int64) *pb.Limit {
		p := standingLimit()
		p.Id, p.Binds = "plans/std", []string{"tenant/*"}
		p.Contracts = map[string]*pb.Contract{"tenant/big": {LimitTokens: 1000,
			Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 1, Standing: tenantStanding}}}
		return p
	}
	next := plan(20)
	_, err = nextRecord(now, plan(10), &changeItem{put: next, valid: next, field: "limit"}, pb.Effective_EFFECTIVE_NOW, false)
	checkField(t, "contract", err, "limit.contracts[tenant/big].lease.standing")
	next = plan(10)
	next.LimitTokens = 50
	if _, err := nextRecord(now, plan(10), &changeItem{put: next, valid: next, field: "limit"}, pb.Effective_EFFECTIVE_NOW, false); err != nil {
		t.Errorf("plan's G lowered at once: %v", err)
	}
}

// checkField fails unless err is nil (field "") or a FieldError naming
// field.
func checkField(t *testing.T, name string, err error, field string) {
	t.Helper()
	var fe *vocab.FieldError
	switch {
	case field == "" && err != nil:
		t.Errorf("%s: %v, want it accepted", name, err)
	case field != "" && (!errors.As(err, &fe) || fe.Field != field):
		t.Errorf("%s: %v, want a FieldError naming %s", name, err, field)
	}
}

// TestStandingSharesCounted: a window's standing shares are counted as
// granted from its start, whether or not a region spends or returns its
// share: the pool is G minus every region's share from the first instant,
// leases are sized from what is left, and admitted can never pass G. A
// region returns its share once under its derived lease id; the return
// is credited when durable, a retry answers as the first did, and the
// record restores the same pool on a new core. What is not a share of
// the returning region's, in a window that has started, is unknown.
func TestStandingSharesCounted(t *testing.T) {
	l := decodeLimit(standingLimit())
	c := NewCore()
	c.SetLimit(l)
	w := l.Windows().Of(t0).Index
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if p := c.Pool(l.ID, w); p != 90 {
		t.Fatalf("pool before any request: %d, want 100 - 2 x 5", p)
	}
	d := c.Acquire(at(time.Second), "eu", AcquireRequest{RequestID: "r1", Limit: l.ID, Want: 1000, Demand: 1000})
	if d.Grant == nil || d.Grant.Tokens != 90 || d.Grant.PoolLeft != 0 {
		t.Fatalf("a lease asking for everything: %+v, want the 90 left after the shares", d.Grant)
	}
	if d := c.Acquire(at(2*time.Second), "us", AcquireRequest{RequestID: "r1", Limit: l.ID, Want: 1}); d.Grant != nil {
		t.Fatalf("pool spent, yet granted %d", d.Grant.Tokens)
	}

	ret := func(now time.Time, region, id string, unspent int64) ReturnDecision {
		t.Helper()
		d, err := c.Return(now, region, ReturnRequest{Limit: l.ID, LeaseID: id, Unspent: unspent})
		if err != nil {
			t.Fatalf("return %s from %s: %v", id, region, err)
		}
		return d
	}
	eu := lease.StandingLeaseID(w, "eu")
	if pw, pr, preq, err := ParseLeaseID(eu); err != nil || pw != w || pr != "eu" || preq != lease.StandingRequestID {
		t.Fatalf("a share's lease id %q is not in the allocator's form: %d %q %q %v", eu, pw, pr, preq, err)
	}
	first := ret(at(10*time.Second), "eu", eu, 3)
	if first.Code != pb.ItemCode_ITEM_CODE_OK || first.Credited != 3 || first.Grant == nil || !first.Grant.Standing || first.Grant.Tokens != 5 {
		t.Fatalf("eu returns 3 of its share: %+v", first)
	}
	if p := c.Pool(l.ID, w); p != 0 {
		t.Fatalf("pool %d before the return is durable, want 0", p)
	}
	c.Credit(first.Grant)
	if p := c.Pool(l.ID, w); p != 3 {
		t.Fatalf("pool %d after the return is durable, want 3", p)
	}
	if again := ret(at(11*time.Second), "eu", eu, 3); !again.Duplicate || again.Credited != 3 || again.Grant != nil {
		t.Fatalf("the return retried: %+v, want a duplicate crediting 3", again)
	}
	if p := c.Pool(l.ID, w); p != 3 {
		t.Fatalf("pool %d after a retried return, want 3", p)
	}

	for _, tc := range []struct {
		name, region, id string
		unspent          int64
	}{
		{"another region's share", "us", eu, 1},
		{"a share of a window not started", "eu", lease.StandingLeaseID(w+1, "eu"), 1},
		{"a region without a share", "ap", lease.StandingLeaseID(w, "ap"), 1},
	} {
		if d := ret(at(12*time.Second), tc.region, tc.id, tc.unspent); d.Code != pb.ItemCode_ITEM_CODE_UNKNOWN_LEASE || d.Credited != 0 {
			t.Errorf("%s: %+v, want UNKNOWN_LEASE", tc.name, d)
		}
	}
	if _, err := c.Return(at(12*time.Second), "us", ReturnRequest{Limit: l.ID, LeaseID: lease.StandingLeaseID(w, "us"), Unspent: 6}); err == nil {
		t.Error("6 unspent of a share of 5: accepted")
	}
	plain := testLimit("t/plain", 100, time.Minute, 15*time.Second, "eu")
	c.SetLimit(plain)
	if d, _ := c.Return(at(12*time.Second), "eu", ReturnRequest{Limit: plain.ID, LeaseID: lease.StandingLeaseID(w, "eu"), Unspent: 1}); d.Code != pb.ItemCode_ITEM_CODE_UNKNOWN_LEASE {
		t.Errorf("a limit without shares: %+v, want UNKNOWN_LEASE", d)
	}

	// us returns its share after the window: recorded, not credited.
	late := ret(at(61*time.Second), "us", lease.StandingLeaseID(w, "us"), 5)
	if late.Code != pb.ItemCode_ITEM_CODE_WINDOW_CLOSED || late.Credited != 0 {
		t.Fatalf("a late return: %+v", late)
	}

	// The window's report counts the shares as granted.
	rep, ok := c.report(at(61*time.Second), l.ID, w)
	if !ok || rep.Granted != 100 || rep.Standing != 10 || rep.Returned != 3 {
		t.Errorf("report: granted %d (standing %d), returned %d; want 100 (10), 3", rep.Granted, rep.Standing, rep.Returned)
	}

	// A new core restores the same pool and answers the retries the same.
	re := NewCore()
	re.SetLimit(l)
	re.Restore(d.Grant)
	re.Restore(first.Grant)
	if p := re.Pool(l.ID, w); p != 3 {
		t.Fatalf("restored pool %d, want 3", p)
	}
	if again, _ := re.Return(at(13*time.Second), "eu", ReturnRequest{Limit: l.ID, LeaseID: eu, Unspent: 3}); !again.Duplicate || again.Credited != 3 {
		t.Fatalf("a retry on the restored core: %+v", again)
	}
}

// TestStandingReturnSurvivesFailover: on a real etcd, a region's return of
// its standing share is durable before the answer: the allocator that
// takes over counts the shares and the credit as the first did (the
// pool), answers a retry as a duplicate, and sizes a lease from what is
// left.
func TestStandingReturnSurvivesFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	clock := newFakeClock(t0.Add(time.Second))
	a := startAllocator(t, c, "a", clock.opt(), WithSessionTTL(time.Second))
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "b", clock.opt(), WithSessionTTL(time.Second))
	ctx := context.Background()
	l := standingLimit()
	l.Regions = []string{"ap", "eu", "us"}
	l.Version = 0
	stored, err := a.PutLimit(ctx, l, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, l.Id, stored.Version)
	w := lease.WindowOf(clock.Now(), time.Minute).Index

	got, err := a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r1", LimitId: l.Id, WantTokens: 50, DemandPerSecond: 1}})
	if err != nil || got[0].Lease.GetTokens() != 50 || got[0].Lease.GetPoolLeft() != 35 {
		t.Fatalf("a lease of 50: %v, %v; want pool left 100 - 3 x 5 - 50", got, err)
	}
	id := lease.StandingLeaseID(w, "us")
	res, err := a.ReturnLeases(ctx, "us", []*pb.LeaseReturn{{LimitId: l.Id, LeaseId: id, Unspent: 4}})
	if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK || res[0].Credited != 4 {
		t.Fatalf("us returns 4 of its share: %v, %v", res, err)
	}

	a.Stop()
	allocatortest.WaitLeader(t, b)
	if err := b.View(func(_ time.Time, core *Core) {
		if p := core.Pool(l.Id, w); p != 39 {
			t.Errorf("b's pool %d, want 100 - 15 - 50 + 4", p)
		}
	}); err != nil {
		t.Fatal(err)
	}
	res, err = b.ReturnLeases(ctx, "us", []*pb.LeaseReturn{{LimitId: l.Id, LeaseId: id, Unspent: 4}})
	if err != nil || !res[0].Duplicate || res[0].Credited != 4 {
		t.Fatalf("the return retried on b: %v, %v", res, err)
	}
	got, err = b.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r2", LimitId: l.Id, WantTokens: 1000, DemandPerSecond: 1}})
	if err != nil || got[0].Lease.GetTokens() != 39 {
		t.Fatalf("a lease asking for everything on b: %v, %v; want the 39 left", got, err)
	}
}
