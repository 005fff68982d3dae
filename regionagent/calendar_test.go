package regionagent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/history"
	"leasehold/internal/zones"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// calendarLimit is a strict limit of g per calendar unit in zone.
func calendarLimit(id string, g int64, unit, zone string, ttl time.Duration, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Calendar: &pb.CalendarWindows{Unit: unit, Zone: zone}, Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}
}

// TestCalendarWindowsEndToEnd: the real allocator on embedded etcd, two
// regions' agents on real redis-servers, one driven clock set to
// 2027-10-31 in Europe/Berlin, the day the clocks go back (03:00 CEST ->
// 02:00 CET at 01:00 UTC, a 25-hour day) and the last day of the month
// (November starts at local midnight, 23:00 UTC). The clock runs ahead of
// the wall clock, as Redis expires the bucket keys on its own clock.
// Three strict limits, each asked for more than G by both regions (lease
// ttl 5 min): G = 1000 per calendar month, G = 300 per calendar day, and
// a plan's tenant (plans/pro, 400 per calendar month) used for the first
// time; and a roomy month (G = 10^6, ttl 30 min) never spent. Twenty
// minutes around the DST change, then twenty around midnight:
//   - nothing resets at the DST change (the three budgets, spent before
//     it, stay spent); they come back at 23:00 UTC (local midnight of
//     November 1), not before;
//   - every answer names its calendar window: reset_after is the local
//     month's (day's) end, window its own length (745 h for October, 25 h
//     for October 31) and the calendar;
//   - no calendar window admits more than G (counted here);
//   - the allocator's reports name the calendar windows ([Oct 1 00:00
//     CEST, Nov 1 00:00 CET)) and count what the agents admitted;
//   - every lease is clamped to its calendar window's end (the roomy
//     month's leases granted from 22:50 UTC end at 23:00), and the histories of the
//     allocator and both agents are certified.
func TestCalendarWindowsEndToEnd(t *testing.T) {
	allocRec, allocBuf := newRecorder(t, history.Process{Name: "alloc", Role: history.RoleAllocator})
	w := startWorldWith(t, true, nil, []allocator.Option{allocator.WithHistory(allocRec)}, "eu", "us")
	// Checks come half a second off the second (the boundaries): an
	// agent whose clock stands still exactly at a boundary, holding the
	// next window's lease that starts a millisecond later (StartAt
	// rounds up), would ask the allocator again and again.
	t0 := time.Date(2027, 10, 31, 0, 50, 0, 5e8, time.UTC)
	if !t0.After(time.Now().Add(time.Hour)) {
		t.Skip("the test's October 2027 is not ahead of the wall clock any more: move it on")
	}
	w.clock.ns.Store(t0.UnixNano())
	const month, day, tenant = "tenant/month", "tenant/day", "acct/newco"
	// Each is spent before the DST change. A fourth, roomy limit is never
	// spent: its leases of 30 min, granted from 22:50, are clamped to the
	// month's end.
	const roomy = "tenant/roomy"
	G := map[string]int64{month: 1000, day: 300, tenant: 400, roomy: 1_000_000}
	const ttl = 5 * time.Minute
	stored := w.putLimit(calendarLimit(month, G[month], "month", "Europe/Berlin", ttl, "eu", "us"))
	if stored.GetCalendar().GetZone() != "Europe/Berlin" || stored.Window != nil {
		t.Fatalf("stored %v", stored)
	}
	w.putLimit(calendarLimit(day, G[day], "day", "Europe/Berlin", ttl, "eu", "us"))
	w.putLimit(calendarLimit(roomy, G[roomy], "month", "Europe/Berlin", 30*time.Minute, "eu", "us"))
	plan := calendarLimit("plans/pro", G[tenant], "month", "Europe/Berlin", ttl, "eu", "us")
	plan.Binds = []string{"acct/{id}"}
	w.putPlan(plan, "acct/probe")

	berlin, err := zones.Load("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	sched := map[string]lease.Windows{
		month:  lease.CalendarWindows(lease.Calendar{Unit: lease.Month, Loc: berlin}),
		day:    lease.CalendarWindows(lease.Calendar{Unit: lease.Day, Loc: berlin}),
		tenant: lease.CalendarWindows(lease.Calendar{Unit: lease.Month, Loc: berlin}),
		roomy:  lease.CalendarWindows(lease.Calendar{Unit: lease.Month, Loc: berlin}),
	}
	ids := []string{month, day, tenant, roomy}
	dst := time.Date(2027, 10, 31, 1, 0, 0, 0, time.UTC)       // 03:00 CEST -> 02:00 CET
	midnight := time.Date(2027, 10, 31, 23, 0, 0, 0, time.UTC) // 2027-11-01 00:00 CET
	if oct := sched[month].Of(t0); oct.Length != 745*time.Hour || !oct.End().Equal(midnight) {
		t.Fatalf("October in Berlin: %v long, ends %v", oct.Length, oct.End())
	}
	if d := sched[day].Of(t0); d.Length != 25*time.Hour || !d.End().Equal(midnight) {
		t.Fatalf("October 31 in Berlin: %v long, ends %v", d.Length, d.End())
	}

	regions := []string{"eu", "us"}
	agents := map[string]*Agent{}
	recs := map[string]*history.Recorder{}
	bufs := map[string]func() []*history.Run{}
	for _, r := range regions {
		rec, buf := newRecorder(t, history.Process{Name: r + "1", Role: history.RoleAgent, Region: r})
		recs[r], bufs[r] = rec, func() []*history.Run { return runsOf(t, buf, r+".jsonl") }
		agents[r] = w.agent(r, r+"1", WithColdWait(2*time.Second), WithHistory(rec))
		runWork(t, agents[r])
	}

	ctx := context.Background()
	type key struct {
		limit string
		index int64
	}
	admitted := map[key]int64{}
	// Per limit, the answers in the minute before and after an instant.
	type around struct{ allowedBefore, deniedBefore, allowedAfter int }
	at := map[string]map[time.Time]*around{}
	for _, id := range ids {
		at[id] = map[time.Time]*around{dst: {}, midnight: {}}
	}
	var unavailable, checks int
	run := func(from time.Time, steps int) {
		w.clock.ns.Store(from.UnixNano())
		for range steps { // steps of a second; each region asks each limit once a second
			now := w.clock.Now()
			for _, r := range regions {
				for _, id := range ids {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					d, err := agents[r].Check(cctx, id, 1)
					cancel()
					if err != nil {
						t.Fatalf("%s %s at %v: %v", r, id, now, err)
					}
					checks++
					if d.Reason == pb.Reason_REASON_UNAVAILABLE {
						unavailable++
						continue
					}
					win := sched[id].Of(now)
					if got, want := d.ResetAfter, win.End().Sub(now); got != want {
						t.Fatalf("%s at %v: reset_after %v, want %v (its calendar window's end)", id, now, got, want)
					}
					if d.Window != win.Length || d.Cal.Loc != berlin {
						t.Fatalf("%s at %v: window %v of %v, want %v of Europe/Berlin", id, now, d.Window, d.Cal, win.Length)
					}
					if d.Allowed {
						admitted[key{id, win.Index}]++
					}
					for b, a := range at[id] {
						switch off := now.Sub(b); {
						case off >= -time.Minute && off < 0 && d.Allowed:
							a.allowedBefore++
						case off >= -time.Minute && off < 0:
							a.deniedBefore++
						case off >= 0 && off < time.Minute && d.Allowed:
							a.allowedAfter++
						}
					}
				}
				agents[r].tick(ctx)
			}
			w.clock.Add(time.Second)
		}
	}
	run(t0, 20*60)                                                 // 00:50-01:10 UTC: the DST change
	run(midnight.Add(-10*time.Minute+500*time.Millisecond), 20*60) // 22:50-23:10 UTC: November begins
	t.Logf("%d checks, admitted per window %v; unavailable %d", checks, admitted, unavailable)

	for _, id := range ids {
		// The budget was spent before the DST change and stayed spent
		// across it; it came back at local midnight.
		if id == roomy {
			if a := at[id][midnight]; a.deniedBefore != 0 {
				t.Errorf("%s denied %d in the minute before midnight", id, a.deniedBefore)
			}
			continue
		}
		if a := at[id][dst]; a.allowedAfter != 0 {
			t.Errorf("%s: %d admitted in the minute after the DST change: a window reset there", id, a.allowedAfter)
		}
		if a := at[id][midnight]; a.deniedBefore == 0 || a.allowedBefore != 0 || a.allowedAfter == 0 {
			t.Errorf("%s at local midnight: %d allowed and %d denied in the minute before, %d allowed after; want none, some, some",
				id, a.allowedBefore, a.deniedBefore, a.allowedAfter)
		}
		cur, next := sched[id].Of(t0), sched[id].Of(midnight)
		if !next.Start().Equal(midnight) || next.Index != cur.Index+1 {
			t.Fatalf("%s: the next window %v starts %v", id, next, next.Start())
		}
		for _, win := range []lease.Window{cur, next} {
			if n := admitted[key{id, win.Index}]; n > G[id] || n < G[id]*9/10 && win == cur {
				t.Errorf("%s window [%v, %v) admitted %d, G %d", id, win.Start(), win.End(), n, G[id])
			}
		}
	}

	// The reports name the calendar windows and count their admits.
	for _, r := range regions {
		agents[r].report(ctx)
	}
	for _, id := range []string{month, tenant} {
		reps, err := w.alloc.Reports(id, 5)
		if err != nil || len(reps) != 2 {
			t.Fatalf("reports of %s: %d, %v", id, len(reps), err)
		}
		oct, nov := reps[0], reps[1]
		if !oct.WindowStart.Equal(time.Date(2027, 9, 30, 22, 0, 0, 0, time.UTC)) || !oct.WindowEnd.Equal(midnight) ||
			!nov.WindowStart.Equal(midnight) || !nov.WindowEnd.Equal(time.Date(2027, 11, 30, 23, 0, 0, 0, time.UTC)) {
			t.Errorf("%s reports [%v, %v) and [%v, %v): not October and November in Berlin", id,
				oct.WindowStart, oct.WindowEnd, nov.WindowStart, nov.WindowEnd)
		}
		for _, rep := range reps {
			idx := sched[id].Of(rep.WindowStart).Index
			if got, want := rep.AdmittedTotal, admitted[key{id, idx}]; got != want || got > G[id] {
				t.Errorf("%s report of [%v, %v) admitted %d, the agents answered %d (G %d)", id, rep.WindowStart, rep.WindowEnd, got, want, G[id])
			}
		}
		if id == tenant && (reps[0].Plan != "plans/pro" || reps[1].Plan != "plans/pro") {
			t.Errorf("the tenant's reports name plans %q, %q", reps[0].Plan, reps[1].Plan)
		}
	}

	// The histories: every lease clamped to its calendar window's end.
	var agentRuns []*history.Run
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
	grants, clamped := map[string]int{}, 0
	for _, rec := range allocRuns[0].Records {
		if rec.Kind != history.KindGrant {
			continue
		}
		grants[rec.Limit]++
		win := sched[rec.Limit].ByIndex(rec.Window)
		if rec.Cal != zones.Format(win.Cal) || rec.End != win.End().UnixNano() || rec.Expiry > rec.End {
			t.Errorf("grant %+v: want calendar %q, window end %v, expiry no later", rec, zones.Format(win.Cal), win.End())
		}
		if rec.Limit == roomy && rec.Expiry == rec.End && rec.Expiry < rec.T+int64(30*time.Minute) {
			clamped++ // shortened to the month's end
		}
	}
	if len(grants) != 4 || clamped == 0 {
		t.Errorf("grants per limit %v, %d clamped to a window's end: want every limit, some clamped", grants, clamped)
	}
	rep := history.Check(&history.History{Runs: append(agentRuns, allocRuns...)}, nil)
	if !rep.OK() {
		t.Errorf("violations: %v", rep.Violations)
	}
	t.Log(rep.Summary())
}
