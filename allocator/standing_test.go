package allocator

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
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
