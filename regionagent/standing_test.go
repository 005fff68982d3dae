package regionagent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/history"
	"leasehold/internal/syncbuf"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// TestStandingSharesTwoReplicas: a real allocator on etcd and two agent
// replicas of eu on one redis-server, a strict limit of G = 200 per minute
// in eu and us, each region with a standing share of 10. The first Checks
// of the window are decided from eu's share, without a lease (the
// allocator grants none); then 2 x 16 goroutines of random costs spend
// the window: eu admits at most G less us's share, which us never spent,
// and within 3 tokens of it; Redis counts what the Checks said. The share
// is deposited once for the region (two deposits of it would let eu pass
// G - 10), and each replica closes it at its deadline.
func TestStandingSharesTwoReplicas(t *testing.T) {
	w := newWorld(t, "eu", "us")
	l := limit("tenant/standing", 200, time.Minute, 15*time.Second, "eu", "us")
	l.Lease.Standing = 10
	l = w.putLimit(l)
	w.clock.Add(time.Second) // agents sync in the window, after its start
	agents := []*Agent{w.agent("eu", "r1", WithColdWait(2*time.Second)), w.agent("eu", "r2", WithColdWait(2*time.Second))}
	for _, a := range agents {
		runWork(t, a)
	}
	ctx := context.Background()
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	// Low water: the prior 200/60/2 per second over the 2 s lead, 3.3.
	for i := range 6 {
		d, err := agents[i%2].Check(ctx, l.Id, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
	}
	if st := w.stats(l.Id, win); st.Granted != 0 {
		t.Fatalf("the allocator granted %d in leases while eu's share paid the first Checks, want none", st.Granted)
	}
	b := balance(t, agents[0], l.Id, win, w.clock.Now())
	if b.Admitted != 6 || b.Spendable != 4 || len(b.Open) != 1 || b.Open[0].ID != lease.StandingLeaseID(win, "eu") {
		t.Fatalf("bucket after 6 Checks: admitted %d, spendable %d, open %+v; want eu's share alone, 4 left", b.Admitted, b.Spendable, b.Open)
	}
	// Each replica carried the share once: one put it there, the other
	// found it (leasehold_agent_standing_shares_total).
	shares := map[string]float64{}
	for _, a := range agents {
		for _, r := range []string{"deposited", "found", "not_used"} {
			shares[r] += testutil.ToFloat64(a.m.standing.WithLabelValues(r))
		}
	}
	if shares["deposited"] != 1 || shares["found"] != 1 || shares["not_used"] != 0 {
		t.Fatalf("standing_shares_total over both replicas: %v; want deposited 1, found 1", shares)
	}

	var admitted atomic.Int64
	admitted.Store(6)
	var load sync.WaitGroup
	for i, a := range agents {
		for g := range 16 {
			load.Add(1)
			go func() {
				defer load.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				for range 20 {
					cost := 1 + rng.Int64N(3)
					d, err := a.Check(ctx, l.Id, cost)
					if err != nil {
						t.Errorf("check: %v", err)
						return
					}
					if d.Allowed {
						admitted.Add(cost)
					}
				}
			}()
		}
	}
	load.Wait()
	if t.Failed() {
		return
	}
	if got := admitted.Load(); got > 190 || got < 187 {
		t.Fatalf("eu admitted %d of G = 200 under a demand of about 1,300, us's share of 10 unspent: want <= 190, >= 187", got)
	}
	b = balance(t, agents[0], l.Id, win, w.clock.Now())
	if b.Admitted != admitted.Load() {
		t.Fatalf("Redis counted %d admitted, Checks said %d", b.Admitted, admitted.Load())
	}
	// The share's deadline passes: the replicas close it.
	w.clock.Add(time.Minute)
	for _, a := range agents {
		a.evaluate(ctx, l.Id)
		a.tick(ctx)
	}
	b = balance(t, agents[0], l.Id, win, w.clock.Now())
	for _, o := range b.Open {
		if o.ID == lease.StandingLeaseID(win, "eu") {
			t.Fatalf("eu's share still open after its window: %+v", o)
		}
	}
}

// TestStandingShareHistory: the history of a run that spends standing
// shares certifies. Each replica records the share it deposited or found
// as a grant of the region's (the allocator records none: the share is
// granted by the limit's definition), so the checker counts what the
// region admitted against the share and its leases.
func TestStandingShareHistory(t *testing.T) {
	allocRec, allocBuf := newRecorder(t, history.Process{Name: "alloc", Role: history.RoleAllocator})
	w := startWorldWith(t, true, nil, []allocator.Option{allocator.WithHistory(allocRec)}, "eu", "us")
	l := limit("tenant/standing-hist", 40, time.Minute, 15*time.Second, "eu", "us")
	l.Lease.Standing = 5
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	var runs []*history.Run
	var bufs []*syncbuf.Buffer
	var agents []*Agent
	for _, name := range []string{"r1", "r2"} {
		rec, buf := newRecorder(t, history.Process{Name: name, Role: history.RoleAgent, Region: "eu"})
		a := w.agent("eu", name, WithColdWait(2*time.Second), WithHistory(rec))
		runWork(t, a)
		agents, bufs = append(agents, a), append(bufs, buf)
		t.Cleanup(func() { _ = rec.Close() })
	}
	ctx := context.Background()
	admitted := int64(0)
	for i := range 60 {
		d, err := agents[i%2].Check(ctx, l.Id, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 35 {
		t.Fatalf("admitted %d, want G - us's share = 35", admitted)
	}
	for i, buf := range bufs {
		runs = append(runs, runsOf(t, buf, agents[i].cfg.ReplicaID)...)
	}
	runs = append(runs, runsOf(t, allocBuf, "alloc")...)
	rep := history.Check(&history.History{Runs: runs}, nil)
	if len(rep.Violations) > 0 {
		t.Fatalf("violations: %v", rep.Violations)
	}
}

// TestGroupsStandingShares: standing shares with two allocator groups,
// each with a clock of its own, on real etcd and a real redis-server: an
// agent of eu decides the first Checks of limits that both groups own
// from its shares, with no lease request to either group; each share is
// deposited once, under its window owner's clock; each owner counts both
// regions' shares out of its pool; and at a window's end eu's unspent
// share goes back to the window's owner, which credits it.
func TestGroupsStandingShares(t *testing.T) {
	regions := []string{"eu", "us"}
	gw := startGroups(t, 5*time.Second, regions...)
	const G, W, standing = 1000, time.Hour, 5
	now := time.Now()
	// The windows' phase puts now mid-window: no boundary during the test
	// (a snapshot from the window before leaves shares unused).
	phase := ((time.Duration(now.UnixNano()) + W/2) % W).Truncate(time.Millisecond)
	owners := map[string]string{}
	perGroup := map[string]int{}
	for i := range 16 {
		id := fmt.Sprintf("tenant/s%02d", i)
		owner, _, _ := gw.m.Owner(id, now)
		l := limit(id, G, W, time.Minute, regions...)
		l.Lease.Standing, l.WindowPhase = standing, durationpb.New(phase)
		if _, err := gw.allocs[owner].PutLimit(context.Background(), l, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
			t.Fatal(err)
		}
		owners[id] = owner
		perGroup[owner]++
	}
	if perGroup["a"] == 0 || perGroup["b"] == 0 {
		t.Fatalf("the map spreads 16 limits as %v: want both groups to own some", perGroup)
	}
	a := gw.agent("eu")
	ctx := context.Background()
	for id := range owners {
		for i := range 3 {
			if d, err := a.Check(ctx, id, 1); err != nil || !d.Allowed {
				t.Fatalf("%s, check %d: %+v, %v", id, i, d, err)
			}
		}
	}
	if n := gw.leases["a"].Load() + gw.leases["b"].Load(); n != 0 {
		t.Fatalf("%d lease requests to the groups while the shares paid, want none", n)
	}
	for id, owner := range owners {
		win := lease.WindowsOf(W, phase).Of(time.Now())
		b := balance(t, a, id, win.Index, time.Now())
		if b.Admitted != 3 || len(b.Open) != 1 || b.Open[0].ID != lease.StandingLeaseID(win.Index, "eu") || b.Spendable != standing-3 {
			t.Fatalf("%s: admitted %d, spendable %d, open %+v; want eu's share alone, 2 left", id, b.Admitted, b.Spendable, b.Open)
		}
		var pool int64
		_ = gw.allocs[owner].View(func(_ time.Time, c *allocator.Core) { pool = c.Pool(id, win.Index) })
		if pool != G-standing*int64(len(regions)) {
			t.Fatalf("%s: group %s's pool %d, want G less both regions' shares, %d", id, owner, pool, G-standing*int64(len(regions)))
		}
	}

	// Windows of 10 s, begun a second ago, G = 30 (the share's 4 left
	// stay above the renewal low-water mark, 30/10/2 per second over the
	// 2 s lead: no lease): one limit of each group, one Check each; when
	// the window ends, eu closes its share and returns the 4 tokens left
	// to the window's owner, which credits them.
	const short, shortG = 10 * time.Second, 30
	now = time.Now()
	phase = (time.Duration(now.Add(-time.Second).UnixNano()) % short).Truncate(time.Millisecond)
	var shortIDs []string
	for _, g := range []string{"a", "b"} {
		for i := 0; ; i++ {
			id := fmt.Sprintf("tenant/short%d", i)
			if o, _, _ := gw.m.Owner(id, now); o != g || owners[id] != "" {
				continue
			}
			l := limit(id, shortG, short, short, regions...)
			l.Lease.Standing, l.WindowPhase = standing, durationpb.New(phase)
			if _, err := gw.allocs[g].PutLimit(ctx, l, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
				t.Fatal(err)
			}
			owners[id] = g
			shortIDs = append(shortIDs, id)
			waitAllSynced(t, a, []string{id})
			break
		}
	}
	win := lease.WindowsOf(short, phase).Of(now)
	for _, id := range shortIDs {
		if d, err := a.Check(ctx, id, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", id, d, err)
		}
	}
	if n := gw.leases["a"].Load() + gw.leases["b"].Load(); n != 0 {
		t.Fatalf("%d lease requests for the short windows' first Checks, want none", n)
	}
	deadline := time.Now().Add(short + 20*time.Second)
	for _, id := range shortIDs {
		for {
			reps, err := gw.allocs[owners[id]].Reports(id, 3)
			if err != nil {
				t.Fatal(err)
			}
			var rep allocator.WindowReport
			for _, r := range reps {
				if r.WindowStart.Equal(win.Start()) {
					rep = r
				}
			}
			if rep.Returned == standing-1 && rep.Standing == standing*int64(len(regions)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (group %s), window %d: %+v; want eu's 4 unspent returned, shares of 10", id, owners[id], win.Index, rep)
			}
			time.Sleep(50 * time.Millisecond) // polling the close and the return the window's end brings
		}
	}
}
