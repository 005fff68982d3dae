package regionagent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/history"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// TestPhasedWindowsEndToEnd: the real allocator on embedded etcd, two
// regions' agents on real redis-servers, one driven clock. Two strict
// limits of G = 300 per minute, one aligned and one with a phase offset
// of 17 s, each asked for 8 tokens a second (4 per region) for a little
// over three minutes:
//   - each limit is spent before its own boundary and admits again from
//     it: the aligned one at :00, the phased one at :17; the phased one is
//     still spent at :00;
//   - every Check's reset_after names its limit's own window end;
//   - no window of either limit admits more than G (strict, two
//     regions), and each full window admits nearly G;
//   - the allocator's reports name the phased windows ([k x W + 17s, ...))
//     and count what the agents admitted in them;
//   - the histories of the allocator and both agents are certified: every
//     lease clamped to its (phased) window's end, no window over G.
func TestPhasedWindowsEndToEnd(t *testing.T) {
	allocRec, allocBuf := newRecorder(t, history.Process{Name: "alloc", Role: history.RoleAllocator})
	w := startWorldWith(t, true, nil, []allocator.Option{allocator.WithHistory(allocRec)}, "eu", "us")
	const G, W, phase = 300, time.Minute, 17 * time.Second
	aligned := w.putLimit(limit("tenant/aligned", G, W, 15*time.Second, "eu", "us"))
	pl := limit("tenant/phased", G, W, 15*time.Second, "eu", "us")
	pl.WindowPhase = durationpb.New(phase)
	phased := w.putLimit(pl)
	if phased.GetWindowPhase().AsDuration() != phase {
		t.Fatalf("stored phase %v", phased.GetWindowPhase())
	}
	sched := map[string]lease.Windows{aligned.Id: lease.WindowsOf(W, 0), phased.Id: lease.WindowsOf(W, phase)}
	ids := []string{aligned.Id, phased.Id}

	regions := []string{"eu", "us"}
	agents := map[string]*Agent{}
	recs := map[string]*history.Recorder{}
	var agentRuns []*history.Run
	bufs := map[string]func() []*history.Run{}
	for _, r := range regions {
		rec, buf := newRecorder(t, history.Process{Name: r + "1", Role: history.RoleAgent, Region: r})
		recs[r] = rec
		bufs[r] = func() []*history.Run { return runsOf(t, buf, r+".jsonl") }
		agents[r] = w.agent(r, r+"1", WithColdWait(2*time.Second), WithHistory(rec))
		runWork(t, agents[r])
	}

	ctx := context.Background()
	start := w.clock.Now() // a minute boundary (the fake clock starts on one)
	if !sched[aligned.Id].StartsWindow(start) {
		t.Fatalf("the clock starts at %v, not on a minute", start)
	}
	type key struct {
		limit string
		index int64
	}
	admitted := map[key]int64{}
	// Per limit, the answers in the second before and after each instant.
	type around struct{ deniedBefore, allowedAfter, deniedAfter int }
	at := map[string]map[time.Duration]*around{}
	// (The phased window running at the start, [-43s, 17s), is not
	// spent by 17 s: its first boundary checked is 77 s.)
	boundaries := []time.Duration{time.Minute, 77 * time.Second, 2 * time.Minute, 137 * time.Second, 3 * time.Minute}
	for _, id := range ids {
		at[id] = map[time.Duration]*around{}
		for _, b := range boundaries {
			at[id][b] = &around{}
		}
	}
	acc := map[string]float64{}
	var unavailable int
	for step := 0; step < 1900; step++ { // 190 s in steps of 100 ms
		now := w.clock.Now()
		for _, r := range regions {
			for _, id := range ids {
				acc[r+id] += 0.4 // 4 a second per region and limit
				for ; acc[r+id] >= 1; acc[r+id]-- {
					d, err := agents[r].Check(ctx, id, 1)
					if err != nil {
						t.Fatal(err)
					}
					win := sched[id].Of(now)
					if d.Reason == pb.Reason_REASON_UNAVAILABLE {
						unavailable++
						continue
					}
					if got, want := d.ResetAfter, win.End().Sub(now); got != want {
						t.Fatalf("%s at +%v: reset_after %v, want %v (its own window's end)", id, now.Sub(start), got, want)
					}
					if d.Allowed {
						admitted[key{id, win.Index}]++
					}
					for b, a := range at[id] {
						switch off := now.Sub(start); {
						case off >= b-time.Second && off < b && !d.Allowed:
							a.deniedBefore++
						case off >= b && off < b+time.Second && d.Allowed:
							a.allowedAfter++
						case off >= b && off < b+time.Second:
							a.deniedAfter++
						}
					}
				}
				agents[r].tick(ctx)
			}
		}
		w.clock.Add(100 * time.Millisecond)
	}
	t.Logf("admitted per window %v; unavailable %d", admitted, unavailable)

	// Each limit resets at its own boundaries, and only there.
	for _, b := range boundaries {
		own := aligned.Id
		if b%W != 0 {
			own = phased.Id
		}
		if a := at[own][b]; a.deniedBefore == 0 || a.allowedAfter == 0 {
			t.Errorf("%s at +%v (its boundary): denied %d in the second before, allowed %d in the second after; want both",
				own, b, a.deniedBefore, a.allowedAfter)
		}
		if own == aligned.Id {
			if a := at[phased.Id][b]; a.allowedAfter != 0 || a.deniedAfter == 0 {
				t.Errorf("%s at +%v (an aligned boundary): allowed %d, denied %d in the second after; want it still spent",
					phased.Id, b, a.allowedAfter, a.deniedAfter)
			}
		}
	}
	// Strict, two regions: no window admits over G; full windows nearly G.
	for _, id := range ids {
		for i := sched[id].Of(start).Index; i <= sched[id].Of(w.clock.Now()).Index; i++ {
			win := sched[id].ByIndex(i)
			n := admitted[key{id, i}]
			if n > G {
				t.Errorf("%s window [%v, %v) admitted %d > G %d", id, win.Start().Sub(start), win.End().Sub(start), n, G)
			}
			if !win.Start().Before(start) && !win.End().After(w.clock.Now()) && n < G*9/10 {
				t.Errorf("%s full window [%v, %v) admitted only %d of G %d", id, win.Start().Sub(start), win.End().Sub(start), n, G)
			}
		}
	}

	// The reports name the phased windows and count their admits.
	for _, r := range regions {
		agents[r].report(ctx)
	}
	reps, err := w.alloc.Reports(phased.Id, 10)
	if err != nil || len(reps) < 3 {
		t.Fatalf("reports of the phased limit: %d, %v", len(reps), err)
	}
	for _, rep := range reps {
		if off := rep.WindowStart.Sub(start) % W; off != phase && off != phase-W || rep.WindowEnd.Sub(rep.WindowStart) != W {
			t.Errorf("report of [%v, %v): not a window of phase %v", rep.WindowStart.Sub(start), rep.WindowEnd.Sub(start), phase)
		}
		idx := sched[phased.Id].Of(rep.WindowStart).Index
		if got, want := rep.AdmittedTotal, admitted[key{phased.Id, idx}]; got != want || got > G {
			t.Errorf("report of [%v, %v) admitted %d, the agents answered %d (G %d)",
				rep.WindowStart.Sub(start), rep.WindowEnd.Sub(start), got, want, G)
		}
	}

	// The histories: leases clamped to the phased ends, no window over G.
	for _, r := range regions {
		if err := recs[r].Close(); err != nil {
			t.Fatal(err)
		}
		agentRuns = append(agentRuns, bufs[r]()...)
	}
	if err := allocRec.Close(); err != nil {
		t.Fatal(err)
	}
	allocRuns := runsOf(t, allocBuf, "alloc.jsonl")
	var phasedGrants int
	for _, rec := range allocRuns[0].Records {
		if rec.Kind == history.KindGrant && rec.Limit == phased.Id {
			phasedGrants++
			end := sched[phased.Id].ByIndex(rec.Window).End().UnixNano()
			if rec.WindowPhase != int64(phase) || rec.End != end || rec.Expiry > end {
				t.Errorf("phased grant %+v: want phase %v, window end %d, expiry no later", rec, phase, end)
			}
		}
	}
	if phasedGrants == 0 {
		t.Fatal("no grant of the phased limit recorded")
	}
	rep := history.Check(&history.History{Runs: append(agentRuns, allocRuns...)}, nil)
	if !rep.OK() {
		t.Errorf("violations: %v", rep.Violations)
	}
	t.Log(rep.Summary())
}
