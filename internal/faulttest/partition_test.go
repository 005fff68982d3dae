package faulttest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/faulttest"
	"leasehold/internal/ports"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

// Scenario 2 runs the main limit (limitID, W = 10 s) beside a long limit
// whose one window spans the whole partition: the region holds leases of
// that window when the link goes, they expire while it is down, and the
// window is still open when the link comes back, so their unspent tokens
// must go back to the pool.
const (
	longLimitID = "tenant/faults-long"
	W2          = 120 * time.Second
	longTTL     = 6 * time.Second
	longChunk   = 100 // min_chunk: each long lease outlasts what eu spends of it in longTTL
	longRate    = 4   // eu's Checks/s on the long limit
	longG       = 10000
	partitionG  = 300
	localA      = 40
	euRate      = 25 // Checks/s, 250 per window
	usRate      = 35 // Checks/s, 350 per window: us alone can spend G
)

// partitionCase is one fail mode of eu, the partitioned region (us keeps
// the default, closed, and is never cut off).
type partitionCase struct {
	name  string
	mode  pb.Mode
	kind  pb.FallbackKind
	local int64 // A for local
}

func (c partitionCase) fallback(a int64) map[string]*pb.Fallback {
	if c.kind == pb.FallbackKind_FALLBACK_KIND_CLOSED {
		return nil // the default
	}
	fb := &pb.Fallback{Kind: c.kind}
	if c.kind == pb.FallbackKind_FALLBACK_KIND_LOCAL {
		fb.LocalTokens = a
	}
	return map[string]*pb.Fallback{"eu": fb}
}

// p2Timeline is the scenario's wall-clock plan, shared by the modes so
// their figures line up in one table.
type p2Timeline struct {
	start  time.Time // when the plan was made
	origin time.Time // the window before the partition (time 0 of the report)
	cut    time.Time // eu's link to the allocator is blackholed
	first  time.Time // the first of three fully partitioned windows
	heal   time.Time // the link comes back, 0.5 s into the fourth window
	end    time.Time // end of the window after the heal window
	long   time.Time // end of the long limit's window that spans the partition
}

// newP2Timeline plans from now: a full window of load before the
// partition, the cut 0.5 s before a window boundary (so eu holds the next
// window's lease, fetched early, when the link goes), three full windows
// without the allocator, the heal 0.5 s into the fourth, one more window.
// The boundary is chosen so that the long limit's window contains it and
// ends >= 19.5 s after the heal.
func newP2Timeline(now time.Time) p2Timeline {
	b := nextWindowStart(now, W+time.Second)
	for {
		off := time.Duration(b.UnixNano() % int64(W2))
		if off <= W2-5*W {
			break
		}
		b = b.Add(W)
	}
	return p2Timeline{
		start: now, origin: b.Add(-W), cut: b.Add(-W / 20), first: b,
		heal: b.Add(3*W + W/20), end: b.Add(5 * W),
		long: time.Unix(0, (b.UnixNano()/int64(W2)+1)*int64(W2)),
	}
}

// p2Shared lets the modes start their loads on one timeline once every
// mode's processes serve, and collects their report parts.
type p2Shared struct {
	ready   sync.WaitGroup
	once    sync.Once
	tl      p2Timeline
	waitFor time.Duration // bounds the wait for the other modes' setup

	mu    sync.Mutex // protects parts
	parts map[string]*p2Part
}

func (sh *p2Shared) timeline() p2Timeline {
	all := make(chan struct{})
	go func() { sh.ready.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(sh.waitFor): // a mode's setup hangs: its own timeouts fail it
	}
	sh.once.Do(func() { sh.tl = newP2Timeline(time.Now()) })
	return sh.tl
}

// p2Part is one mode's share of the report.
type p2Part struct {
	facts [][2]string
	rows  []faulttest.WindowRow
	modes map[string]map[faulttest.Mode]time.Duration
}

// TestScenario2Partition: for each fail mode of eu (strict limit with the
// closed fallback; bounded with local:A; bounded with open), eu's agent is
// cut off from the allocator (blackhole proxy) for three full windows
// while eu and us are driven over G. eu spends the leases it holds, then
// behaves as its mode says: closed denies (UNAVAILABLE), local admits at
// most A per window, open admits everything (counted, reported, bound
// +Inf). Strict/closed windows admit <= G, local ones <= G + A. The agent
// exports the mode in force and leaves it after the heal. A second limit
// with a 2-minute window shows that leases eu held when the link went,
// which expired during the partition, have their unspent tokens credited
// back to the pool once the link is back, while that window is open.
func TestScenario2Partition(t *testing.T) {
	skipShort(t)
	cases := []partitionCase{
		{name: "closed", mode: pb.Mode_MODE_STRICT, kind: pb.FallbackKind_FALLBACK_KIND_CLOSED},
		{name: fmt.Sprintf("local:%d", localA), mode: pb.Mode_MODE_BOUNDED, kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, local: localA},
		{name: "open", mode: pb.Mode_MODE_BOUNDED, kind: pb.FallbackKind_FALLBACK_KIND_OPEN},
	}
	sh := &p2Shared{parts: map[string]*p2Part{}, waitFor: 3 * time.Minute}
	sh.ready.Add(len(cases))
	// The modes run at once, on one timeline. Not t.Parallel: -parallel
	// (GOMAXPROCS, 2 here) would hold one back; t.Run may be called from
	// several goroutines.
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(strings.ReplaceAll(c.name, ":", "_"), func(t *testing.T) { runPartition(t, sh, c) })
		}()
	}
	wg.Wait()
	tl := sh.tl
	if tl.origin.IsZero() {
		return
	}
	rep := faulttest.Report{
		Title: "2. Region partitioned from the allocator for 3 windows, each fail mode",
		Summary: fmt.Sprintf("Three runs side by side on one timeline, one per fail mode of eu: strict limit with the closed "+
			"fallback, bounded with `local:%d`, bounded with `open` (us keeps the default, closed, and is never cut off). "+
			"Each run: one allocator (embedded etcd), eu's agent behind the proxy, us's agent direct; G = %d per 10 s "+
			"(default 2.5 s leases); eu driven at %d Checks/s, us at %d (us alone can spend G). The proxy blackholes eu's "+
			"link 0.5 s before a window boundary (eu then holds the next window's lease, fetched early), for three full "+
			"windows; the heal is 0.5 s into the fourth. Beside it, eu drives a second limit (G = %d per 2 min, 6 s leases, "+
			"min chunk %d, %d Checks/s) whose one window spans the whole partition: the leases eu holds of it when the link "+
			"goes expire during the partition, and their unspent tokens must be credited back once the link is back, "+
			"while that window is still open.", localA, partitionG, euRate, usRate, longG, longChunk, longRate),
		Modes: map[string]map[faulttest.Mode]time.Duration{},
	}
	for _, c := range cases {
		p := sh.parts[c.name]
		if p == nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("The %s run did not finish: no figures.", c.name))
			continue
		}
		for _, f := range p.facts {
			rep.Facts = append(rep.Facts, [2]string{c.name + ": " + f[0], f[1]})
		}
		rep.Windows = append(rep.Windows, p.rows...)
		for target, m := range p.modes {
			rep.Modes[c.name+" "+target] = m
		}
	}
	rep.Notes = append(rep.Notes,
		"Window notes name the run. eu's fallback begins only when its renewal call has failed for good (the agent "+
			"retries an allocator call for 5 s), so between its lease running out and its mode eu answers OVER_LIMIT "+
			"with a short retry_after. After the heal eu waits for its circuit breaker's next probe (the cooldown "+
			"doubles up to 10 s while the allocator stays away). Windows closed while eu was cut off are reported by "+
			"eu after the heal (its usage reports cover the past windows whose buckets still exist).")
	faulttest.WriteReport(t, rep, tl.origin)
}

func runPartition(t *testing.T, sh *p2Shared, c partitionCase) {
	arrived := sync.OnceFunc(sh.ready.Done)
	defer arrived() // a run that fails early must not hold up the others
	s := &scenario{t: t, G: partitionG}
	addr := ports.Addr(t)
	px := faulttest.NewProxy(t, addr)
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{GRPCAddr: addr,
		Advertise: px.Addr(), Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, []string{s.allocs[0].EtcdEndpoint})
	rs := redisOf(t)
	eu := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", Allocators: []string{px.Addr()}, Redis: rs["eu"].Addr()})
	us := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "us", Allocators: []string{addr}, Redis: rs["us"].Addr()})
	for _, l := range []*pb.Limit{
		{Id: limitID, LimitTokens: partitionG, Window: durationpb.New(W), Regions: []string{"eu", "us"},
			Mode: c.mode, Fallback: c.fallback(localA)},
		{Id: longLimitID, LimitTokens: longG, Window: durationpb.New(W2), Regions: []string{"eu", "us"},
			Mode: c.mode, Fallback: c.fallback(localA),
			Lease: &pb.LeaseSettings{Ttl: durationpb.New(longTTL), MinChunk: longChunk}},
	} {
		faulttest.HistoryLimit(t, l)
		s.admin(func(ctx context.Context, a pb.AdminClient) error {
			_, err := a.PutLimit(ctx, &pb.PutLimitRequest{Reason: "scenario 2", Limit: l})
			return err
		})
	}
	s.waitKnown(eu, us)
	waitLimitKnown(t, longLimitID, eu)

	arrived()
	tl := sh.timeline()
	s.origin = tl.origin
	sleepUntil(tl.origin.Add(-3 * time.Second)) // the loads warm up 3 s before the first counted window
	start := time.Now()
	dur := tl.end.Sub(start)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: euRate, Duration: dur,
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu.GRPCAddr}, {Name: "us-1", Region: "us", Addr: us.GRPCAddr}}})
	load.SetRate("us-1", usRate)
	longLoad := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: longLimitID, Window: W2, Rate: longRate, Workers: 1,
		Duration: dur, Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu.GRPCAddr}}})
	watch := faulttest.WatchMode(t, eu.HTTPAddr, limitID, 100*time.Millisecond, dur+time.Minute)

	// eu must hold a lease of the first partitioned window when the link
	// goes (fetched early, within lead + interval of the boundary).
	firstW := tl.first.UnixNano() / int64(W)
	held := waitGrant(s.grants, limitID, "eu", firstW, tl.cut)
	if len(held) == 0 {
		t.Errorf("eu holds no lease of the first partitioned window at the cut: the scenario cannot show it spends held leases")
	}
	sleepUntil(tl.cut)
	px.Blackhole(true)
	cut := time.Now()

	// The long limit's leases eu holds when the link goes (of the window
	// that spans the partition, fetched early if it starts at the
	// boundary): granted before the cut, not returned 1 s after it (a
	// return in flight at the cut has reached the allocator by then, or is
	// lost with the link).
	sleepUntil(cut.Add(time.Second))
	s.grants.SyncNow(t)
	longW := tl.long.UnixNano()/int64(W2) - 1 // the long window that contains tl.first
	var longHeld []faulttest.GrantRecord
	for _, r := range s.grants.Records() {
		if r.Limit == longLimitID && r.Region == "eu" && r.Window == longW && !r.Returned && time.Unix(0, r.GrantedAt).Before(cut) {
			longHeld = append(longHeld, r)
		}
	}
	if len(longHeld) == 0 {
		t.Errorf("eu holds no lease of the long limit at the cut: the return after the heal is not exercised")
	}

	sleepUntil(tl.heal)
	px.Blackhole(false)
	healed := time.Now()

	// After the heal: the long limit's leases held at the cut (expired
	// since, closed by eu) must be returned, with their unspent tokens
	// credited while the window is open.
	returnedAt, longCredited, longStatus := waitReturned(t, s, longHeld, healed, tl.long, tl.end.Add(2*time.Second))
	load.Wait()
	longLoad.Stop()
	end := tl.end
	// The gauge must be gone after the heal; give the agent's breaker its
	// longest cooldown (10 s) and a renewal to find the allocator again.
	var modeOff time.Time
	for deadline := healed.Add(25 * time.Second); ; {
		modeOff = watch.FirstAfter(healed, func(k int) bool { return k == 0 })
		if !modeOff.IsZero() || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // polling the mode watch
	}
	watch.Stop()
	closedInRedis := closedMarkers(t, rs["eu"].Addr(), longLimitID, longW, longHeld)
	mctx, mcancel := context.WithTimeout(context.Background(), 2*time.Second)
	redisErrors, _, err := faulttest.ScrapeMetric(mctx, eu.HTTPAddr, "leasehold_agent_checks_total", `result="redis_error"`)
	mcancel()
	if err != nil {
		t.Logf("reading eu's metrics: %v", err)
	}

	events := load.Events()
	tally := faulttest.Count(events)
	ws := fullWindows(start, end)
	notes := map[int64]string{}
	partitioned := map[int64]bool{}
	for _, w := range ws {
		switch at := windowStart(w); {
		case at.Before(tl.first):
			notes[w] = c.name + ": before"
		case at.Before(tl.first.Add(3 * W)):
			notes[w] = c.name + ": eu partitioned"
			partitioned[w] = true
		case at.Before(tl.first.Add(4 * W)):
			notes[w] = c.name + ": healed 0.5 s in"
		default:
			notes[w] = c.name + ": after"
		}
	}
	rows := checkPartitionWindows(s, c, ws, tally, events, notes)

	// eu spent its held lease in the first partitioned window, then
	// behaved as its mode says in the two windows it held nothing of.
	if len(held) > 0 && okIn(events, "eu-1", "", tl.first, tl.first.Add(W)) == 0 {
		t.Errorf("eu admitted nothing from the lease it held when the link went")
	}
	var lastLeaseOK, firstMode time.Time
	for _, e := range faulttest.Between(events, cut, healed) {
		if e.Target != "eu-1" {
			continue
		}
		if e.Mode == faulttest.ModeOK && firstMode.IsZero() {
			lastLeaseOK = e.At
		}
		if firstMode.IsZero() && (e.Mode == faulttest.ModeFallback || e.Mode == faulttest.ModeUnavailable) {
			firstMode = e.At
		}
	}
	var fbPer []int64
	for _, w := range ws {
		if !partitioned[w] {
			continue
		}
		fbPer = append(fbPer, tally.Fallback[w]["eu"])
		if windowStart(w).Equal(tl.first) {
			continue // eu's held lease, then the time its renewal takes to fail
		}
		at := windowStart(w).Sub(tl.origin).Seconds()
		n := map[faulttest.Mode]int{}
		for _, e := range faulttest.Between(events, windowStart(w), windowStart(w+1)) {
			if e.Target == "eu-1" {
				n[e.Mode]++
			}
		}
		if n[faulttest.ModeOK] > 0 {
			t.Errorf("window %+.0fs: eu holds no lease but %d answers were OK (from leases)", at, n[faulttest.ModeOK])
		}
		switch c.kind {
		case pb.FallbackKind_FALLBACK_KIND_CLOSED:
			if n[faulttest.ModeUnavailable] == 0 || n[faulttest.ModeFallback] > 0 {
				t.Errorf("window %+.0fs: closed eu answered %v, want UNAVAILABLE and no FALLBACK", at, n)
			}
		case pb.FallbackKind_FALLBACK_KIND_LOCAL:
			if tally.Fallback[w]["eu"] == 0 {
				t.Errorf("window %+.0fs: eu in local:%d admitted nothing under its fallback (answers %v)", at, c.local, n)
			}
		case pb.FallbackKind_FALLBACK_KIND_OPEN:
			// Open admits everything. An UNAVAILABLE can only come from
			// the fallback count's Redis call timing out (another fault,
			// on a loaded 2-core box): a few are tolerated, and counted
			// in the report (redis_error).
			if n[faulttest.ModeFallback] == 0 || n[faulttest.ModeOverLimit] > 0 || n[faulttest.ModeUnavailable]*50 > n[faulttest.ModeFallback] {
				t.Errorf("window %+.0fs: open eu answered %v, want every answer admitted under FALLBACK", at, n)
			}
		}
		// The agent exports the mode in force, all through the window.
		for _, k := range []int{watch.At(windowStart(w).Add(time.Second)), watch.At(windowStart(w).Add(W / 2)), watch.At(windowStart(w + 1).Add(-time.Second))} {
			if k != int(c.kind) {
				t.Errorf("window %+.0fs: eu's agent exports %s = %d, want %d (%s) while it runs in that mode",
					at, faulttest.FallbackModeMetric, k, int(c.kind), c.kind)
				break
			}
		}
		// us is not cut off: it keeps spending leases.
		if okIn(events, "us-1", "", windowStart(w), windowStart(w+1)) == 0 {
			t.Errorf("window %+.0fs: us admitted nothing", at)
		}
	}
	if modeOff.IsZero() {
		t.Errorf("eu's agent still exports a fallback mode %v after the heal", time.Since(healed).Round(time.Second))
	}
	modeOn := watch.FirstAfter(cut, func(k int) bool { return k == int(c.kind) })
	var firstGrantAfter time.Time
	for _, r := range s.grants.Records() {
		if at := time.Unix(0, r.GrantedAt); r.Limit == limitID && r.Region == "eu" && at.After(healed) &&
			(firstGrantAfter.IsZero() || at.Before(firstGrantAfter)) {
			firstGrantAfter = at
		}
	}
	var firstOKAfter time.Time
	for _, e := range faulttest.Between(events, healed, end) {
		if e.Target == "eu-1" && e.Mode == faulttest.ModeOK {
			firstOKAfter = e.At
			break
		}
	}
	if okIn(events, "eu-1", "", tl.first.Add(4*W), end) == 0 {
		t.Errorf("eu admitted nothing from leases in the window after the heal")
	}

	spans := watch.Spans(start, end)
	var spanText []string
	for _, k := range []int{0, 1, 2, 3, -1} {
		if d := spans[k]; d > 0 {
			spanText = append(spanText, fmt.Sprintf("%s %s", modeName(k), secs(d)))
		}
	}
	var heldTokens int64
	for _, r := range held {
		heldTokens += r.Tokens
	}
	var longHeldTokens int64
	for _, r := range longHeld {
		longHeldTokens += r.Tokens
	}
	when := func(x time.Time) string {
		if x.IsZero() {
			return "never"
		}
		return since(tl.origin, x)
	}
	facts := [][2]string{
		{"eu cut off / healed", since(tl.origin, cut) + " / " + since(tl.origin, healed)},
		{"eu's lease of the first partitioned window, held at the cut", fmt.Sprintf("%d lease(s), %d tokens", len(held), heldTokens)},
		{"eu's last admission from a lease / first answer in its mode", when(lastLeaseOK) + " / " + when(firstMode)},
		{"eu admitted under fallback, per partitioned window", fmt.Sprint(fbPer)},
		{"eu's exported mode (" + faulttest.FallbackModeMetric + ") over the run", strings.Join(spanText, ", ")},
		{"exported mode in force from / gone after the heal at", when(modeOn) + " / " + when(modeOff)},
		{"after the heal: first grant to eu / first eu admission from a lease", when(firstGrantAfter) + " / " + when(firstOKAfter)},
		{"long limit: eu's leases held at the cut (all expired during the partition)", fmt.Sprintf("%d lease(s), %d tokens; closed in eu's Redis since: %s", len(longHeld), longHeldTokens, closedInRedis)},
		{"long limit: returned after the heal, credited to the still-open window", longStatus + fmt.Sprintf(" (%d tokens credited", longCredited) + "; window ends " + since(tl.origin, tl.long) + "; all returned " + when(returnedAt) + ")"},
		{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
		{"answers", answers(tally)},
		{"eu's Checks whose Redis call failed (another fault; they fall back too)", fmt.Sprint(redisErrors)},
	}
	sh.mu.Lock()
	sh.parts[c.name] = &p2Part{facts: facts, rows: rows, modes: faulttest.TimeInModes(events, end)}
	sh.mu.Unlock()
}

func modeName(k int) string {
	switch k {
	case 0:
		return "none"
	case -1:
		return "unreadable"
	}
	return strings.ToLower(strings.TrimPrefix(pb.FallbackKind(k).String(), "FALLBACK_KIND_"))
}

// waitLimitKnown waits until the agents answer Checks of limit (a probe of
// cost 1, in a window no check counts).
func waitLimitKnown(t *testing.T, limit string, agents ...*faulttest.Process) {
	t.Helper()
	for _, a := range agents {
		conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cl := pb.NewRegionAgentClient(conn)
		deadline := time.Now().Add(20 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := cl.Check(ctx, &pb.CheckRequest{LimitId: limit, Cost: 1})
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never learned %s: %v", a.Name(), limit, err)
			}
			time.Sleep(100 * time.Millisecond) // polling the agents' limit sync
		}
		conn.Close()
	}
}

// waitGrant polls the grant log until region holds a grant of limit for
// window w, or until deadline; it returns the grants seen.
func waitGrant(g *faulttest.GrantLog, limit, region string, w int64, deadline time.Time) []faulttest.GrantRecord {
	for {
		var out []faulttest.GrantRecord
		for _, r := range g.Records() {
			if r.Limit == limit && r.Region == region && r.Window == w && !r.Returned {
				out = append(out, r)
			}
		}
		if len(out) > 0 || !time.Now().Before(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond) // polling the grant watch
	}
}

// waitReturned waits until every lease in held is returned with its
// unspent tokens credited (the window was open), or until deadline (before
// windowEnd). It
// fails the test for each lease that is not, and returns when all were,
// the tokens credited and a summary.
func waitReturned(t *testing.T, s *scenario, held []faulttest.GrantRecord, healed, windowEnd, deadline time.Time) (time.Time, int64, string) {
	t.Helper()
	if len(held) == 0 {
		return time.Time{}, 0, "nothing held"
	}
	for {
		latest := map[string]faulttest.GrantRecord{}
		for _, r := range s.grants.Records() {
			latest[r.Key] = r
		}
		var credited int64
		var returned, creditedN int
		for _, h := range held {
			r := latest[h.Key]
			if r.Returned {
				returned++
			}
			if r.Returned && r.Credited == r.Unspent {
				creditedN++
				credited += r.Credited
			}
		}
		if creditedN == len(held) {
			return time.Now(), credited, fmt.Sprintf("%d of %d", creditedN, len(held))
		}
		if time.Now().After(deadline) {
			for _, h := range held {
				r := latest[h.Key]
				t.Errorf("long limit: lease %s (%d tokens) eu held when the link went: returned %v, unspent %d, credited %d, "+
					"%v after the heal (its window is open until %v after the heal): its unspent tokens did not go back to the pool",
					r.LeaseID, r.Tokens, r.Returned, r.Unspent, r.Credited, time.Since(healed).Round(time.Second),
					windowEnd.Sub(healed).Round(time.Second))
			}
			return time.Time{}, credited, fmt.Sprintf("%d of %d returned, %d credited", returned, len(held), creditedN)
		}
		time.Sleep(200 * time.Millisecond) // polling the grant watch
	}
}

// closedMarkers says which of the leases are closed in the region's
// bucket and the unspent amount their close recorded.
func closedMarkers(t *testing.T, redisAddr, limit string, w int64, leases []faulttest.GrantRecord) string {
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	var closed int
	var unspent int64
	for _, l := range leases {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := c.HGet(ctx, bucket.Key("", limit, w), "c:"+l.LeaseID).Int64()
		cancel()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Logf("reading eu's bucket: %v", err)
			continue
		}
		closed++
		unspent += v
	}
	return fmt.Sprintf("%d of %d (%d tokens unspent at close)", closed, len(leases), unspent)
}

// checkPartitionWindows holds every full window of the main limit against
// the mode's rule (closed: <= G; local: <= G + A; open: unbounded), the
// reported bound and the grant records, and returns the report rows.
func checkPartitionWindows(s *scenario, c partitionCase, ws []int64, tally faulttest.Tally, events []faulttest.Event,
	notes map[int64]string) []faulttest.WindowRow {
	t := s.t
	t.Helper()
	reps := s.reports(ws, tally)
	s.grants.SyncNow(t)
	byW := s.grants.ByWindow(limitID)
	var rows []faulttest.WindowRow
	for _, w := range ws {
		at := windowStart(w).Sub(s.origin).Seconds()
		r := reps[w]
		rows = append(rows, faulttest.Row(windowStart(w), s.G, tally.Admitted[w], r))
		rows[len(rows)-1].Note = notes[w]
		total := tally.Total(w)
		euFB := tally.Fallback[w]["eu"]
		switch c.kind {
		case pb.FallbackKind_FALLBACK_KIND_CLOSED:
			if total > s.G {
				t.Errorf("window %+.0fs: the test counted %d admitted, above G = %d", at, total, s.G)
			}
			if euFB > 0 {
				t.Errorf("window %+.0fs: closed eu admitted %d under fallback", at, euFB)
			}
		case pb.FallbackKind_FALLBACK_KIND_LOCAL:
			if total > s.G+c.local {
				t.Errorf("window %+.0fs: the test counted %d admitted, above G + A = %d", at, total, s.G+c.local)
			}
			if euFB > c.local {
				t.Errorf("window %+.0fs: eu admitted %d under local:%d", at, euFB, c.local)
			}
		}
		if n := tally.Fallback[w]["us"]; n > 0 {
			t.Errorf("window %+.0fs: us (never cut off, closed fallback) admitted %d under fallback", at, n)
		}
		// Leases: what a region admitted from leases is at most what its
		// leases held (nothing spent twice, nothing spent without a lease).
		g := byW[w]
		for region, n := range tally.Admitted[w] {
			var leased int64
			if g != nil {
				leased = g.PerRegion[region]
			}
			if fromLeases := n - tally.Fallback[w][region]; fromLeases > leased {
				t.Errorf("window %+.0fs: %s admitted %d from leases, its leases held %d", at, region, fromLeases, leased)
			}
		}
		if r == nil {
			continue
		}
		if r.Granted-r.Returned > s.G {
			t.Errorf("window %+.0fs: granted %d - returned %d > G = %d", at, r.Granted, r.Returned, s.G)
		}
		if g != nil && g.Granted != r.Granted {
			t.Errorf("window %+.0fs: the allocator reports %d granted, etcd holds grants of %d", at, r.Granted, g.Granted)
		}
		switch c.kind {
		case pb.FallbackKind_FALLBACK_KIND_CLOSED:
			if r.BoundInfinite || r.Bound != 0 {
				t.Errorf("window %+.0fs: strict limit reports bound %d (infinite %v), want 0 (terms %v)", at, r.Bound, r.BoundInfinite, r.Terms)
			}
		case pb.FallbackKind_FALLBACK_KIND_LOCAL:
			want := int64(0)
			if r.Fallback["eu"] == pb.FallbackKind_FALLBACK_KIND_LOCAL {
				want = c.local
			}
			if euFB > 0 && want == 0 {
				t.Errorf("window %+.0fs: eu admitted %d under local fallback, the allocator's report names no fallback for it (%v)", at, euFB, r.Fallback)
			}
			if r.BoundInfinite || r.Bound != want {
				t.Errorf("window %+.0fs: bound %d (infinite %v), want %d (terms %v)", at, r.Bound, r.BoundInfinite, want, r.Terms)
			}
		case pb.FallbackKind_FALLBACK_KIND_OPEN:
			if euFB > 0 && !r.BoundInfinite {
				t.Errorf("window %+.0fs: eu admitted %d under open fallback, the reported bound is %d, want +Inf (fallback %v)", at, euFB, r.Bound, r.Fallback)
			}
		}
		if !r.BoundInfinite && (r.ObservedOvershoot > r.Bound || total > s.G+r.Bound || r.AdmittedTotal > s.G+r.Bound) {
			t.Errorf("window %+.0fs: admitted %d (test) / %d (allocator), observed overshoot %d, above the bound %d",
				at, total, r.AdmittedTotal, r.ObservedOvershoot, r.Bound)
		}
		// Fallback admits are counted and reported: the allocator's count
		// is the test's (at least, if an answer was lost to a timeout).
		errs := 0
		for _, e := range faulttest.Between(events, windowStart(w), windowStart(w+1)) {
			if e.Region == "eu" && e.Mode == faulttest.ModeError {
				errs++
			}
		}
		if r.FallbackAdmitted < euFB || (errs == 0 && r.FallbackAdmitted != euFB) {
			t.Errorf("window %+.0fs: the allocator reports %d admitted under fallback, the test counted %d (%d eu calls failed)",
				at, r.FallbackAdmitted, euFB, errs)
		}
	}
	if d := s.grants.Duplicates(); len(d) > 0 {
		t.Errorf("duplicate leases:\n%s", strings.Join(d, "\n"))
	}
	return rows
}
