package regionagent

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "leasehold/proto/leasehold/v1"
)

// utilCase is one demand of BenchmarkUtilization: two replicas of one
// region check one strict limit of G tokens per window, cost 1 a Check,
// each at a fixed rate; together they ask 1.25 G a window.
type utilCase struct {
	name        string
	g           int64
	window, ttl time.Duration
	rates       [2]float64 // Checks per second at r1 and r2
}

// The leases last half the window, so they end in the middle of each
// window as well as at its end (`quotactl limits set` defaults the ttl to
// a quarter of the window). hot: both replicas far above
// DefaultChunks.HotRate (50/s): hot chunks of 250 ms of their rate (100
// tokens). warm: both at 40/s, between WarmRate (1/s) and HotRate, G >=
// 128: warm chunks of 4 s of the rate, at most G/64 (4 tokens). uneven:
// one replica has 90 % of the demand (hot), the other 10 % (warm, at most
// G/64 = 20 tokens a chunk).
var utilCases = []utilCase{
	{name: "hot", g: 2560, window: 4 * time.Second, ttl: 2 * time.Second, rates: [2]float64{400, 400}},
	{name: "warm", g: 256, window: 4 * time.Second, ttl: 2 * time.Second, rates: [2]float64{40, 40}},
	{name: "uneven", g: 1280, window: 4 * time.Second, ttl: 2 * time.Second, rates: [2]float64{360, 40}},
}

const (
	// utilWindows is how many full windows one run measures.
	utilWindows = 3
	// utilWarmup is the demand before the first full window: the limit's
	// first leases, and the replicas' rates measured (chunks taken).
	utilWarmup = 2 * time.Second
	// utilTail is the demand after the last full window, so that its end
	// passes under demand.
	utilTail = 250 * time.Millisecond
)

// BenchmarkUtilization measures issue 15's utilization target: two agent
// replicas of one region on one redis-server, chunks on (DefaultChunks),
// a strict limit and demand of 1.25 G a window: how much of G the callers
// are admitted in each full window (one the demand covered from its start
// to its end), and where the rest went. Each b.N is one run of
// utilWindows full windows of a new limit; the cases share one world.
//
// The benchmark moves the world's clock to each Check's instant, so each
// replica's rate is exact and each Check knows its window, but never
// faster than the wall clock: the chunks' client retires a chunk at its
// deadline in a sweep every 250 ms of real time, and the agents' work
// loops (runWork) sleep until their next timed work (renewals, closes,
// reports) on real timers. Run faster, those happen late on the world's
// clock and strand tokens production does not (a chunk ends 500 ms before
// its lease so that the sweep gives it back in time; in a trial run
// without pacing, the warm case admitted nothing in two of three
// windows: its renewals came late). A driver that falls behind (a slow
// Check) leaves the clock behind the wall clock rather than catch up in a
// burst. Checks have no deadline: one that finds the region dry is
// answered at once, never waits for the clock.
//
// Metrics, over the full windows of all runs: util-min-% and
// util-mean-%, tokens admitted as a share of G; unleased-%G, what the
// allocator's pool still held at the window's end (never leased, or
// returned in time and not leased again); late-%G, returned to the
// allocator after the window closed; stranded-%G, granted but neither
// admitted nor returned (a chunk given back after its lease closed, or
// never). The three add up to 100 minus util-mean-%. checks/window counts
// both replicas' Checks; chunked-% is the share of them decided from
// chunks. Each window's counts are logged.
func BenchmarkUtilization(b *testing.B) {
	w := newWorld(b, "eu")
	var agents [2]*Agent
	for i := range agents {
		agents[i] = w.agent("eu", fmt.Sprintf("r%d", i+1), WithChunks(DefaultChunks))
		runWork(b, agents[i])
	}
	for _, c := range utilCases {
		b.Run(c.name, func(b *testing.B) {
			var all []utilWindow
			for i := range b.N {
				all = append(all, w.utilRun(b, agents, c, fmt.Sprintf("tenant/util-%s-%d", c.name, i))...)
			}
			reportUtil(b, c, all)
		})
	}
}

// utilWindow is what one window admitted and where the rest went.
type utilWindow struct {
	checks, chunked             int64
	admitted, over, unavailable int64
	granted, credited, late     int64
	pool                        int64 // the allocator's pool left
	reported                    int64 // what the region reported admitted, net of chunk releases
}

// utilRun drives one run of c on a new limit and returns its full
// windows, settled: every lease of them closed and returned, every usage
// report sent.
func (w *world) utilRun(b *testing.B, agents [2]*Agent, c utilCase, id string) []utilWindow {
	b.Helper()
	ctx := context.Background()
	l := w.putLimit(limit(id, c.g, c.window, c.ttl, "eu"))
	for _, a := range agents {
		w.sync(a)
	}
	// From utilWarmup before a window boundary to utilTail after the last
	// full window.
	win := int64(c.window)
	first := (w.clock.Now().Add(utilWarmup).UnixNano() + win - 1) / win
	start := time.Unix(0, first*win).Add(-utilWarmup)
	end := time.Unix(0, (first+utilWindows)*win).Add(utilTail)
	w.clockTo(start)

	// Each replica's Checks at its exact rate, the second replica's half
	// an interval after the first's.
	type event struct {
		at      time.Time
		replica int
	}
	var events []event
	for r, rate := range c.rates {
		step := float64(time.Second) / rate
		for n := 0.0; ; n++ {
			at := start.Add(time.Duration((n + float64(r)/2) * step))
			if !at.Before(end) {
				break
			}
			events = append(events, event{at, r})
		}
	}
	slices.SortStableFunc(events, func(x, y event) int { return x.at.Compare(y.at) })

	byWindow := map[int64]*utilWindow{}
	get := func(k int64) *utilWindow {
		if byWindow[k] == nil {
			byWindow[k] = &utilWindow{}
		}
		return byWindow[k]
	}
	chunkChecks := func() int64 {
		var n float64
		for _, a := range agents {
			n += testutil.ToFloat64(a.m.chunkChecks)
		}
		return int64(n)
	}

	limitReal := 3*end.Sub(start) + 30*time.Second
	bound := time.Now().Add(limitReal)
	p := newPacer(start)
	cur, chunked0 := int64(-1), chunkChecks()
	for _, e := range events {
		if time.Now().After(bound) {
			b.Fatalf("%s: the run took over %v of real time", id, limitReal)
		}
		p.wait(e.at)
		w.clockTo(e.at)
		k := e.at.UnixNano() / win
		if k != cur { // decisions from chunks, counted per window
			n := chunkChecks()
			if cur >= 0 {
				get(cur).chunked += n - chunked0
			}
			cur, chunked0 = k, n
		}
		get(k).checks++
		d, err := agents[e.replica].Check(ctx, l.Id, 1)
		if err != nil {
			b.Fatalf("%s at r%d: %v", id, e.replica+1, err)
		}
		switch {
		case d.Allowed:
			// In the window the decision names (the agent names windows
			// on its estimate of the allocator's clock).
			get(windowOf(w.clock.Now(), d.ResetAfter, c.window)).admitted++
		case d.Reason == pb.Reason_REASON_OVER_LIMIT:
			get(k).over++
		default:
			get(k).unavailable++
		}
	}
	get(cur).chunked += chunkChecks() - chunked0

	// Past every lease of the run: the agents close and return them and
	// send the windows' last reports. (What chunks of the tail's window
	// still hold is given back after its leases closed: that window is
	// not measured.)
	w.clock.Add(c.ttl + 2*time.Second)
	for _, a := range agents {
		a.tick(ctx)
		a.report(ctx)
	}
	var out []utilWindow
	for k := first; k < first+utilWindows; k++ {
		uw := get(k)
		st, u := w.stats(l.Id, k), w.regionUsage(l.Id, "eu", k)
		uw.granted, uw.credited, uw.late = st.Granted, st.Credited, st.ReturnedLate
		uw.pool, uw.reported = w.pool(l.Id, k), u.Admitted-u.Released
		out = append(out, *uw)
	}
	b.Logf("%s: %v of the world's clock in %v of real time (the driver fell behind by %v)",
		id, end.Sub(start), time.Since(p.real0).Round(time.Millisecond), p.lag.Round(time.Millisecond))
	return out
}

// clockTo moves the world's clock forward to t, never back (the world's
// stuck-Check watch may have moved it past t).
func (w *world) clockTo(t time.Time) {
	for range 100 {
		now := w.clock.ns.Load()
		if t.UnixNano() <= now || w.clock.ns.CompareAndSwap(now, t.UnixNano()) {
			return
		}
	}
}

// pacer keeps a driven clock from running ahead of the wall clock: the
// driver waits until as much real time has passed since it started as
// driven time, plus lag, the real time it fell behind and did not make
// up.
type pacer struct {
	real0, fake0 time.Time
	lag          time.Duration
}

// paceSlack is how far behind the driver may fall before the time counts
// as lag: it catches up that much faster than the wall clock, no more.
const paceSlack = 20 * time.Millisecond

func newPacer(fake0 time.Time) *pacer { return &pacer{real0: time.Now(), fake0: fake0} }

// wait returns when the driver may move its clock to at.
func (p *pacer) wait(at time.Time) {
	due := p.real0.Add(at.Sub(p.fake0) + p.lag)
	switch d := time.Until(due); {
	case d > time.Millisecond:
		time.Sleep(d) // the wall clock catching up with the driven one
	case d < -paceSlack:
		p.lag += -d - paceSlack
	}
}

// reportUtil reports BenchmarkUtilization's metrics over ws and logs each
// window.
func reportUtil(b *testing.B, c utilCase, ws []utilWindow) {
	if len(ws) == 0 {
		b.Fatal("no full window")
	}
	pct := func(n int64) float64 { return 100 * float64(n) / float64(c.g) }
	minU := 100.0
	var sumU, unleased, late, stranded, checks, chunked float64
	for i, uw := range ws {
		s := uw.granted - uw.credited - uw.late - uw.admitted
		u := pct(uw.admitted)
		minU = min(minU, u)
		sumU += u
		unleased += pct(uw.pool)
		late += pct(uw.late)
		stranded += pct(s)
		checks += float64(uw.checks)
		chunked += float64(uw.chunked)
		b.Logf("window %d: admitted %d of G %d (%.2f%%); %d Checks, %d from chunks, denied %d over limit, %d unavailable; "+
			"granted %d, returned %d in time, %d late; pool left %d; stranded %d (%d in chunks: the region reported %d admitted net of releases)",
			i, uw.admitted, c.g, u, uw.checks, uw.chunked, uw.over, uw.unavailable,
			uw.granted, uw.credited, uw.late, uw.pool, s, uw.reported-uw.admitted, uw.reported)
		if uw.admitted > c.g {
			b.Errorf("window %d: admitted %d, above G = %d (strict)", i, uw.admitted, c.g)
		}
	}
	n := float64(len(ws))
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(minU, "util-min-%")
	b.ReportMetric(sumU/n, "util-mean-%")
	b.ReportMetric(unleased/n, "unleased-%G")
	b.ReportMetric(late/n, "late-%G")
	b.ReportMetric(stranded/n, "stranded-%G")
	b.ReportMetric(checks/n, "checks/window")
	b.ReportMetric(100*chunked/checks, "chunked-%")
}
