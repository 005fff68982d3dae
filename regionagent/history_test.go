package regionagent

import (
	"context"
	"strings"
	"testing"
	"time"

	"leasehold/allocator"
	"leasehold/internal/history"
	"leasehold/internal/syncbuf"
	"leasehold/lease"
)

// runsOf reads what a recorder wrote to buf.
func runsOf(t *testing.T, buf *syncbuf.Buffer, name string) []*history.Run {
	t.Helper()
	runs, err := history.Read(strings.NewReader(buf.String()), name)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func newRecorder(t *testing.T, p history.Process) (*history.Recorder, *syncbuf.Buffer) {
	t.Helper()
	buf := &syncbuf.Buffer{}
	rec, err := history.NewRecorder(buf, p)
	if err != nil {
		t.Fatal(err)
	}
	return rec, buf
}

// TestHistoryRecordsWhatWasDecided: an allocator and an agent recording
// their histories; every Check, CheckMulti item, reservation, release,
// grant and return is in them as it was answered, and the check certifies
// the run.
func TestHistoryRecordsWhatWasDecided(t *testing.T) {
	allocRec, allocBuf := newRecorder(t, history.Process{Name: "alloc", Role: history.RoleAllocator})
	w := startWorldWith(t, true, nil, []allocator.Option{allocator.WithHistory(allocRec)}, "eu")
	const G, W = 100, time.Minute
	l := limit("tenant/hist", G, W, 15*time.Second, "eu")
	l.Lease.MinChunk = G
	l = w.putLimit(l)
	l2 := w.putLimit(limit("tenant/hist2", G, W, 15*time.Second, "eu"))
	w.clock.Add(time.Second)
	agentRec, agentBuf := newRecorder(t, history.Process{Name: "r1", Role: history.RoleAgent, Region: "eu"})
	a := w.agent("eu", "r1", WithHistory(agentRec))
	ctx := context.Background()
	win := lease.WindowOf(w.clock.Now(), W).Index

	a.Check(ctx, l.Id, 1) // no lease yet: UNAVAILABLE at once (no cold wait here)
	a.evaluate(ctx, l.Id)
	a.Check(ctx, l2.Id, 1)
	a.evaluate(ctx, l2.Id)
	w.clock.Add(time.Second)
	for range 3 {
		if d, err := a.Check(ctx, l.Id, 10); err != nil || !d.Allowed {
			t.Fatalf("check: %+v %v", d, err)
		}
	}
	if ds, err := a.CheckMulti(ctx, []CheckItem{{Limit: l.Id, Cost: 5}, {Limit: l2.Id, Cost: 5}}); err != nil || !ds[0].Allowed {
		t.Fatalf("check multi: %+v %v", ds, err)
	}
	if d, err := a.Check(ctx, l.Id, G); err != nil || d.Allowed {
		t.Fatalf("a check of G after 35 spent: %+v %v", d, err)
	}
	if r, err := a.Reserve(ctx, l.Id, 20, 1, "client-1"); err != nil || r.Granted != 20 {
		t.Fatalf("reserve: %+v %v", r, err)
	}
	if n, err := a.Release(ctx, l.Id, "client-1", 20); err != nil || n != 20 {
		t.Fatalf("release: %d %v", n, err)
	}
	w.clock.Add(W) // the window ends: its lease is closed and returned
	a.evaluate(ctx, l.Id)
	if err := agentRec.Close(); err != nil {
		t.Fatal(err)
	}
	if err := allocRec.Close(); err != nil {
		t.Fatal(err)
	}

	agentRuns, allocRuns := runsOf(t, agentBuf, "agent.jsonl"), runsOf(t, allocBuf, "alloc.jsonl")
	var decisions, admitted, multi, reserves, releases, grants, returns int
	for _, r := range agentRuns[0].Records {
		switch r.Kind {
		case history.KindDecision:
			decisions++
			if r.Answer == history.AnswerOK {
				admitted += int(r.Cost)
				if r.Window != win || r.WindowLen != int64(W) || r.G != G || r.Path != history.PathRedis || r.Spend == 0 ||
					r.Proc != "r1" || r.Region != "eu" {
					t.Errorf("admit %+v", r)
				}
			}
			if r.Items == 2 {
				multi++
			}
		case history.KindReserve:
			reserves++
			if r.Reservation != "client-1" || r.Tokens != 20 || r.Window != win {
				t.Errorf("reserve %+v", r)
			}
		case history.KindRelease:
			releases++
			if r.Unspent != 20 || r.Returned != 20 {
				t.Errorf("release %+v", r)
			}
		}
	}
	for _, r := range allocRuns[0].Records {
		switch r.Kind {
		case history.KindGrant:
			if r.Window == win {
				grants++ // (and one of the next window, after the clock moved)
			}
			if r.Expiry > r.End || r.Proc != "alloc" {
				t.Errorf("grant %+v", r)
			}
		case history.KindReturn:
			returns++
		}
	}
	// 2 unavailable, 3 + 2 (multi) admits, 1 denial.
	if decisions != 8 || admitted != 40 || multi != 2 || reserves != 1 || releases != 1 || grants != 2 || returns < 1 {
		t.Errorf("decisions %d (admitted %d, multi %d), reserves %d, releases %d, grants %d, returns %d",
			decisions, admitted, multi, reserves, releases, grants, returns)
	}
	rep := history.Check(&history.History{Runs: append(agentRuns, allocRuns...)}, nil)
	if !rep.Certified() {
		t.Errorf("not certified: %v %v", rep.Violations, rep.Incomplete)
	}
	t.Log(rep.Summary())
}
