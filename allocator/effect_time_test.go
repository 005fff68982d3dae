package allocator

import (
	"context"
	"leasehold/internal/zones"
	"leasehold/lease"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

func acquire(t *testing.T, a *Allocator, region, req, limit string, next bool, want int64) *pb.Lease {
	t.Helper()
	w := pb.WindowChoice_WINDOW_CHOICE_CURRENT
	if next {
		w = pb.WindowChoice_WINDOW_CHOICE_NEXT
	}
	res, err := a.AcquireLeases(context.Background(), region, []*pb.LeaseRequest{{RequestId: req, LimitId: limit, Window: w, WantTokens: want}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != pb.ItemCode_ITEM_CODE_OK {
		t.Fatalf("acquire %s: %v", req, res[0])
	}
	return res[0].Lease
}

func pool(t *testing.T, a *Allocator, limit string, window int64) int64 {
	t.Helper()
	var p int64
	if err := a.View(func(_ time.Time, c *Core) { p = c.Pool(limit, window) }); err != nil {
		t.Fatal(err)
	}
	return p
}

// A change for the next window leaves the running window to the old
// version (G, mode, fallback) and governs from the boundary, leases for
// the next window fetched early included; agents are handed the version
// in force, and the new one as soon as it governs. A change with
// EFFECTIVE_NOW governs the running window: a lower G empties its pool.
func TestEffectiveTime(t *testing.T) {
	c := etcdtest.Start(t, 1)
	W := time.Minute
	t0 := time.Unix(1_800_000_000, 0).Truncate(W)
	w0 := t0.UnixNano() / int64(W)
	clk := newFakeClock(t0.Add(10 * time.Second))
	a := startAllocator(t, c, "a", clk.opt())
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	id := "tenant/eff"
	l := &pb.Limit{Id: id, LimitTokens: 100, Window: durationpb.New(W), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT}
	if _, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: l, Reason: "create"}); err != nil {
		t.Fatal(err)
	}
	waitLimit(t, a.Allocator, id, 1)
	if got := acquire(t, a.Allocator, "eu", "e1", id, false, 30); got.Tokens != 30 {
		t.Fatalf("first lease: %v", got)
	}
	sync0, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu"})
	if err != nil || len(sync0.Limits) != 1 {
		t.Fatal(sync0, err)
	}

	// At t0+20s: G 100 -> 50, bounded with a local fallback in eu, for the
	// next window (the default).
	clk.Set(t0.Add(20 * time.Second))
	next := &pb.Limit{Id: id, LimitTokens: 50, Window: durationpb.New(W), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 7}}}
	put, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: next, Reason: "downgrade"})
	if err != nil {
		t.Fatal(err)
	}
	if !put.Limit.EffectiveFrom.AsTime().Equal(t0.Add(W)) || put.Limit.Previous.GetLimitTokens() != 100 || put.Limit.Version != 2 {
		t.Fatalf("scheduled change: %v", put.Limit)
	}
	waitLimit(t, a.Allocator, id, 2)
	got, err := srv.GetLimit(as(viewer), &pb.GetLimitRequest{Id: id})
	if err != nil || got.Limit.Previous.GetVersion() != 1 {
		t.Fatalf("get shows the scheduled change and the version in force: %v %v", got, err)
	}
	// The running window keeps G = 100: 70 left, and a grant of 60 fits.
	if p := pool(t, a.Allocator, id, w0); p != 70 {
		t.Fatalf("pool of the running window after a scheduled change: %d, want 70", p)
	}
	if got := acquire(t, a.Allocator, "us", "u1", id, false, 60); got.Tokens != 60 || got.LimitVersion != 1 {
		t.Fatalf("lease in the running window: %v", got)
	}
	// A lease for the next window, fetched early, uses the new version.
	early := acquire(t, a.Allocator, "eu", "e2", id, true, 80)
	if early.WindowIndex != w0+1 || early.Tokens != 50 || early.LimitVersion != 2 {
		t.Fatalf("early lease for the next window: %v", early)
	}
	// Agents get the version in force; the revision does not change
	// until the boundary.
	s1, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu"})
	if err != nil || len(s1.Limits) != 1 || s1.Limits[0].Version != 1 || s1.Limits[0].LimitTokens != 100 ||
		s1.Limits[0].Mode != pb.Mode_MODE_STRICT || s1.Limits[0].Previous != nil {
		t.Fatalf("sync before the boundary: %v %v", s1, err)
	}
	s2, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu", KnownRevision: s1.Revision})
	if err != nil || !s2.Unchanged {
		t.Fatalf("sync again before the boundary: %v %v", s2, err)
	}
	// At the boundary the agent gets the new version at its next sync.
	clk.Set(t0.Add(W))
	s3, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu", KnownRevision: s1.Revision})
	if err != nil || s3.Unchanged || len(s3.Limits) != 1 || s3.Limits[0].Version != 2 || s3.Limits[0].LimitTokens != 50 ||
		s3.Limits[0].Fallback["eu"].GetLocalTokens() != 7 || s3.Limits[0].Previous != nil {
		t.Fatalf("sync after the boundary: %v %v", s3, err)
	}
	s4, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu", KnownRevision: s3.Revision})
	if err != nil || !s4.Unchanged {
		t.Fatalf("sync again after the boundary: %v %v", s4, err)
	}
	got, err = srv.GetLimit(as(viewer), &pb.GetLimitRequest{Id: id})
	if err != nil || got.Limit.Previous != nil || got.Limit.Version != 2 {
		t.Fatalf("get after the boundary: %v %v", got, err)
	}
	// The new window: G = 50, and the early lease took all of it.
	if p := pool(t, a.Allocator, id, w0+1); p != 0 {
		t.Fatalf("pool of the first new window: %d, want 0", p)
	}

	// A change while another is scheduled replaces it; previous stays the
	// version in force.
	clk.Set(t0.Add(W + 10*time.Second))
	l3 := cloneLimit(next)
	l3.LimitTokens = 500
	if _, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: l3, Reason: "raise"}); err != nil {
		t.Fatal(err)
	}
	l4 := cloneLimit(next)
	l4.LimitTokens = 400
	put, err = srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: l4, Reason: "raise less"})
	if err != nil || put.Limit.Previous.GetVersion() != 2 || put.Limit.Version != 4 || !put.Limit.EffectiveFrom.AsTime().Equal(t0.Add(2*W)) {
		t.Fatalf("second scheduled change: %v %v", put, err)
	}
	waitLimit(t, a.Allocator, id, 4)
	if p := pool(t, a.Allocator, id, w0+1); p != 0 {
		t.Fatalf("running window after two scheduled raises: pool %d, want 0", p)
	}
	if p := pool(t, a.Allocator, id, w0+2); p != 400 {
		t.Fatalf("next window after two scheduled changes: pool %d, want 400", p)
	}

	// EFFECTIVE_NOW governs the running window at once: at t0+2W+5s,
	// with 300 granted, G 400 -> 100 empties the pool (never negative).
	clk.Set(t0.Add(2*W + 5*time.Second))
	if got := acquire(t, a.Allocator, "us", "u2", id, false, 300); got.Tokens != 300 {
		t.Fatalf("lease: %v", got)
	}
	l5 := cloneLimit(next)
	l5.LimitTokens = 100
	put, err = srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: l5, Reason: "incident", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil || put.Limit.Previous != nil || !put.Limit.EffectiveFrom.AsTime().Equal(clk.Now()) || put.Effect.PoolAfter != 0 {
		t.Fatalf("change now: %v %v", put, err)
	}
	waitLimit(t, a.Allocator, id, 5)
	if p := pool(t, a.Allocator, id, w0+2); p != 0 {
		t.Fatalf("pool after lowering G now: %d, want 0", p)
	}
	res, err := a.AcquireLeases(context.Background(), "eu", []*pb.LeaseRequest{{RequestId: "e3", LimitId: id, WantTokens: 10}})
	if err != nil || res[0].Lease.GetTokens() != 0 {
		t.Fatalf("grant after lowering G now: %v %v", res, err)
	}
	s5, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu", KnownRevision: s3.Revision})
	if err != nil || s5.Unchanged || s5.Limits[0].LimitTokens != 100 {
		t.Fatalf("sync after a change now: %v %v", s5, err)
	}
}

// A change of the window length or phase waits for a boundary of both
// schedules; two phases of one length never meet.
func TestNextBoundary(t *testing.T) {
	base := time.Unix(1_800_000_000, 0).Truncate(time.Hour) // a boundary of 1m, 3m and 1h
	const s, m = time.Second, time.Minute
	w := lease.WindowsOf
	for _, tc := range []struct {
		now       time.Time
		cur, next lease.Windows
		want      time.Time
		err       bool
	}{
		{base.Add(10 * s), w(m, 0), w(m, 0), base.Add(m), false},
		{base.Add(10 * s), w(m, 0), w(time.Hour, 0), base.Add(time.Hour), false},
		{base.Add(10 * s), w(time.Hour, 0), w(m, 0), base.Add(time.Hour), false},
		{base.Add(10 * s), w(m, 0), w(90*s, 0), base.Add(180 * s), false},
		{base, w(59999*time.Millisecond, 0), w(m, 0), time.Time{}, true},
		// Phased: the running window ends at base+17s; the same phase
		// with another G ends there.
		{base.Add(10 * s), w(m, 17*s), w(m, 17*s), base.Add(17 * s), false},
		// Another phase of the same length never starts a window with it.
		{base.Add(10 * s), w(m, 0), w(m, 17*s), time.Time{}, true},
		{base.Add(10 * s), w(m, 17*s), w(m, 0), time.Time{}, true},
		// 1m phase 17s -> 3m phase 17s: base+17s starts both; from
		// base+20s on, the next is base+3m17s.
		{base.Add(10 * s), w(m, 17*s), w(3*m, 17*s), base.Add(17 * s), false},
		{base.Add(20 * s), w(m, 17*s), w(3*m, 17*s), base.Add(3*m + 17*s), false},
		// 1m phase 17s -> 2m phase 77s (= 17s mod 1m): base+77s starts both.
		{base.Add(10 * s), w(m, 17*s), w(2*m, 77*s), base.Add(77 * s), false},
		// 1m phase 0 -> 2m phase 30s: 30s is no multiple of gcd 1m.
		{base.Add(10 * s), w(m, 0), w(2*m, 30*s), time.Time{}, true},
	} {
		got, err := nextBoundary(tc.now, tc.cur, tc.next)
		if (err != nil) != tc.err || !tc.err && !got.Equal(tc.want) {
			t.Errorf("nextBoundary(%v, %v, %v) = %v, %v; want %v", tc.now, tc.cur, tc.next, got, err, tc.want)
		}
		if err == nil && (!tc.cur.StartsWindow(got) || !tc.next.StartsWindow(got) || !got.After(tc.now)) {
			t.Errorf("nextBoundary(%v, %v, %v) = %v: not a later boundary of both", tc.now, tc.cur, tc.next, got)
		}
	}
}

// TestNextBoundaryCalendar: a change to or from calendar windows governs
// from the first instant, from the running window's end, that starts a
// window of both schedules (among ten windows of the longer), or is
// refused. 2027-10-31 23:00 UTC is local midnight of November 1 in
// Berlin (and Paris), a whole hour, and a Monday.
func TestNextBoundaryCalendar(t *testing.T) {
	cal := func(u lease.Unit, zone string) lease.Windows {
		loc, err := zones.Load(zone)
		if err != nil {
			t.Fatal(err)
		}
		return lease.CalendarWindows(lease.Calendar{Unit: u, Loc: loc})
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	mid, oct15 := at("2027-10-31T23:00:00Z"), at("2027-10-15T12:00:00Z")
	berlin, ny := cal(lease.Month, "Europe/Berlin"), cal(lease.Month, "America/New_York")
	for _, tc := range []struct {
		now       time.Time
		cur, next lease.Windows
		want      time.Time
		err       bool
	}{
		{oct15, berlin, berlin, mid, false},
		{oct15, berlin, cal(lease.Day, "Europe/Berlin"), mid, false},
		{oct15, cal(lease.Day, "Europe/Berlin"), berlin, mid, false},
		{oct15, lease.WindowsOf(time.Minute, 0), berlin, mid, false},
		{oct15, berlin, lease.WindowsOf(time.Hour, 0), mid, false},
		{oct15, berlin, cal(lease.Month, "Europe/Paris"), mid, false},
		{oct15, berlin, cal(lease.Week, "Europe/Berlin"), mid, false}, // November 1, 2027 is a Monday
		// From mid-November the next 1st that is a Monday is May 1, 2028
		// (the sixth month; CEST again).
		{at("2027-11-15T12:00:00Z"), berlin, cal(lease.Week, "Europe/Berlin"), at("2028-04-30T22:00:00Z"), false},
		// Never together: another zone's midnight, a half-hour phase, a
		// length that does not divide local midnights.
		{oct15, berlin, ny, time.Time{}, true},
		{at("2026-12-03T14:00:00Z"), berlin, ny, time.Time{}, true},
		{oct15, cal(lease.Year, "Europe/Berlin"), ny, time.Time{}, true},
		{oct15, berlin, lease.WindowsOf(time.Hour, 30*time.Minute), time.Time{}, true},
		{oct15, lease.WindowsOf(59999*time.Millisecond, 0), berlin, time.Time{}, true},
	} {
		got, err := nextBoundary(tc.now, tc.cur, tc.next)
		if (err != nil) != tc.err || !tc.err && !got.Equal(tc.want) {
			t.Errorf("nextBoundary(%v, %v, %v) = %v, %v; want %v", tc.now, tc.cur, tc.next, got, err, tc.want)
		}
		if err == nil && (!tc.cur.StartsWindow(got) || !tc.next.StartsWindow(got) || !got.After(tc.now)) {
			t.Errorf("nextBoundary(%v, %v, %v) = %v: not a later boundary of both", tc.now, tc.cur, tc.next, got)
		}
	}
}
