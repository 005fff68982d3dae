package regionagent

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// windowOf is the window a decision at now with resetAfter was made in
// (windows are aligned on the epoch; the end is a multiple of w, so a
// millisecond of error either way names the same window).
func windowOf(now time.Time, resetAfter, w time.Duration) int64 {
	end := now.Add(resetAfter).UnixNano()
	return (end+int64(w)/2)/int64(w) - 1
}

// TestChunksNeverDoubleSpend: two replicas of one region on one real
// redis-server, 64 goroutines each, random costs 1-5, G = 5,000 per 2 s
// window and demand of about 1.5 G (each goroutine 10 Checks a second), so
// that the limit is hot on both replicas and most decisions come from
// chunks.
// Per window: what the callers were admitted is at most G and at most what
// the allocator granted minus what was returned (the rest is stranded,
// never negative), and equal to what the region reported admitted net of
// chunk releases.
func TestChunksNeverDoubleSpend(t *testing.T) {
	if testing.Short() {
		t.Skip("three 2 s windows on the wall clock")
	}
	w := startWorld(t, false, "eu")
	const g, win = 5000, 2 * time.Second
	l := w.putLimit(limit("tenant/chunks", g, win, win, "eu"))
	var agents []*Agent
	for _, r := range []string{"r1", "r2"} {
		agents = append(agents, w.liveAgentOpts("eu", r, WithChunks(DefaultChunks)))
	}
	// From the next boundary, three whole windows.
	first := time.Now().UnixNano()/int64(win) + 1
	end := time.Unix(0, (first+3)*int64(win))
	var mu sync.Mutex
	admitted := map[int64]int64{}
	var wg sync.WaitGroup
	for i, a := range agents {
		for c := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(c)))
				mine := map[int64]int64{}
				tick := time.NewTicker(100 * time.Millisecond) // the demand's pace
				defer tick.Stop()
				for n := 0; n < 1000 && time.Now().Before(end); n++ {
					<-tick.C
					cost := rng.Int64N(5) + 1
					d, err := a.Check(context.Background(), l.Id, cost)
					now := time.Now()
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mine[windowOf(now, d.ResetAfter, win)] += cost
					}
				}
				mu.Lock()
				for k, v := range mine {
					admitted[k] += v
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	var chunked, checks float64
	for _, a := range agents {
		checks += testutil.ToFloat64(a.m.checks.WithLabelValues("ok")) + testutil.ToFloat64(a.m.checks.WithLabelValues("over_limit"))
		chunked += testutil.ToFloat64(a.m.chunkChecks)
	}
	if chunked == 0 {
		t.Fatal("no Check was decided from a chunk: the test measured Redis spends only")
	}
	// Every lease of the three windows has ended and been returned, and
	// every window's final usage report sent, within a few seconds.
	for k := first; k < first+3; k++ {
		var st struct{ granted, returned, net int64 }
		deadline := time.Now().Add(15 * time.Second)
		for {
			s := w.stats(l.Id, k)
			u := w.regionUsage(l.Id, "eu", k)
			st.granted, st.returned, st.net = s.Granted, s.Credited+s.ReturnedLate, u.Admitted-u.Released
			if st.net == admitted[k] || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // polling the agents' reports
		}
		stranded := st.granted - st.returned - admitted[k]
		t.Logf("window %d: admitted %d of G %d (reported %d), granted %d, returned %d, stranded %d (%.2f%% of G)",
			k-first, admitted[k], g, st.net, st.granted, st.returned, stranded, 100*float64(stranded)/g)
		if admitted[k] > g {
			t.Errorf("window %d: %d admitted, above G = %d", k-first, admitted[k], g)
		}
		if stranded < 0 {
			t.Errorf("window %d: admitted %d > granted %d - returned %d: tokens spent twice", k-first, admitted[k], st.granted, st.returned)
		}
		if st.net != admitted[k] {
			t.Errorf("window %d: the region reported %d admitted net of releases, the callers were admitted %d", k-first, st.net, admitted[k])
		}
	}
	var lost, failed float64
	for _, a := range agents {
		lost += testutil.ToFloat64(a.m.chunkReleased.WithLabelValues("lost"))
		failed += testutil.ToFloat64(a.m.chunkReleased.WithLabelValues("failed"))
	}
	t.Logf("%.0f of %.0f Checks decided from chunks; chunk releases lost %.0f tokens, failed %.0f", chunked, checks, lost, failed)
}

// refusingRPC is the agent's own service for its chunk client, recording
// each Reserve and refusing new ones once refuse is set.
type refusingRPC struct {
	selfRPC
	now    func() time.Time
	refuse *atomic.Bool
	mu     *sync.Mutex
	last   *reserved
}

type reserved struct {
	sent    time.Time
	expires time.Duration
	granted int64
}

func (r refusingRPC) Reserve(ctx context.Context, req *pb.ReserveRequest, opts ...grpc.CallOption) (*pb.ReserveResponse, error) {
	if r.refuse.Load() {
		return nil, status.Error(codes.FailedPrecondition, "no more chunks")
	}
	sent := r.now()
	resp, err := r.selfRPC.Reserve(ctx, req, opts...)
	if err == nil && resp.Granted > 0 {
		r.mu.Lock()
		*r.last = reserved{sent, resp.ExpiresIn.AsDuration(), resp.Granted}
		r.mu.Unlock()
	}
	return resp, err
}

// TestChunkDeadline: on the test's clock, with a real allocator and
// redis-server, a chunk decides Checks until its deadline (the
// reservation's expiry measured from its send, minus the safety margin)
// and never at or after it.
func TestChunkDeadline(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/chunk-deadline", 100000, 10*time.Second, 2*time.Second, "eu"))
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	runWork(t, a)
	var refuse atomic.Bool
	var mu sync.Mutex
	var last reserved
	a.chunks = client.NewInProcess(refusingRPC{selfRPC{NewServer(a)}, a.opt.now, &refuse, &mu, &last}, "test-",
		client.WithSubLeases(ChunkConfig{HotRate: 1, Horizon: 200 * time.Millisecond, IdleAfter: time.Hour}),
		client.WithClock(a.opt.now), client.WithoutDenialCache())
	fromChunk := func() bool {
		t.Helper()
		before := testutil.ToFloat64(a.m.chunkChecks)
		if _, err := a.Check(context.Background(), l.Id, 1); err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(a.m.chunkChecks) > before
	}
	for i := 0; !fromChunk(); i++ {
		if i == 2000 {
			t.Fatal("no chunk after 2,000 Checks")
		}
		w.clock.Add(time.Millisecond)
	}
	refuse.Store(true)
	mu.Lock()
	res := last
	mu.Unlock()
	deadline := res.sent.Add(res.expires - a.opt.safetyMargin(res.expires))
	if res.expires <= 0 || res.expires > 2*time.Second {
		t.Fatalf("chunk expires in %v: want within the lease's 2 s", res.expires)
	}
	now := w.clock.Now()
	if res.granted < 3 {
		t.Fatalf("a chunk of %d: too small for the steps", res.granted)
	}
	if !now.Before(deadline.Add(-time.Millisecond)) {
		t.Fatalf("the chunk's deadline %v is not ahead of the clock", deadline.Sub(now))
	}
	for i, s := range []struct {
		at    time.Time
		chunk bool
	}{
		{now.Add(deadline.Sub(now) / 2), true},
		{deadline.Add(-time.Microsecond), true},
		{deadline, false},
		{deadline.Add(time.Millisecond), false},
		{res.sent.Add(res.expires), false},
	} {
		w.clock.ns.Store(s.at.UnixNano())
		if got := fromChunk(); got != s.chunk {
			t.Fatalf("step %d at deadline%+v: from a chunk %v, want %v", i, s.at.Sub(deadline), got, s.chunk)
		}
	}
}

// TestCheckMultiOfOneLimitUsesChunks: a CheckMulti of one limit (the
// gRPC CheckMulti, and the Envoy API's requests of one descriptor) is
// decided from the limit's chunk like a Check; a CheckMulti of two limits
// never is (it is all or nothing in the store).
func TestCheckMultiOfOneLimitUsesChunks(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/multi-one", 100000, 10*time.Second, 5*time.Second, "eu"))
	other := w.putLimit(limit("tenant/multi-other", 100000, 10*time.Second, 5*time.Second, "eu"))
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1", WithChunks(ChunkConfig{HotRate: 1, Horizon: 200 * time.Millisecond, IdleAfter: time.Hour}))
	runWork(t, a)
	checkMulti := func(items ...CheckItem) bool {
		t.Helper()
		before := testutil.ToFloat64(a.m.chunkChecks)
		ds, err := a.CheckMulti(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		chunked := testutil.ToFloat64(a.m.chunkChecks) > before
		if chunked && (len(ds) != 1 || !ds[0].Allowed || ds[0].Limit != l.LimitTokens) {
			t.Fatalf("CheckMulti %v decided from a chunk: %+v", items, ds)
		}
		return chunked
	}
	one := CheckItem{Limit: l.Id, Cost: 1}
	for i := 0; !checkMulti(one); i++ {
		if i == 2000 {
			t.Fatal("no CheckMulti of one limit decided from a chunk after 2,000 calls")
		}
		w.clock.Add(time.Millisecond)
	}
	for range 20 {
		if checkMulti(one, CheckItem{Limit: other.Id, Cost: 1}) {
			t.Fatal("a CheckMulti of two limits was decided from a chunk")
		}
	}
}

// TestChunksTrackOnlyLimitsWithDemand: limits checked once leave no
// state in the chunks' client (its sweep and its map cost nothing for
// them); a limit checked fast enough to be hot does.
func TestChunksTrackOnlyLimitsWithDemand(t *testing.T) {
	w := startWorld(t, false, "eu")
	ids := w.putLimits(200, "tenant/once-%03d", 100000, time.Minute, time.Minute, "eu")
	hot := w.putLimit(limit("tenant/busy", 1<<40, time.Minute, time.Minute, "eu"))
	a := w.liveAgentOpts("eu", "r1", WithChunks(ChunkConfig{HotRate: 20, Horizon: 200 * time.Millisecond, IdleAfter: time.Hour}),
		WithColdWait(3*time.Second))
	waitAllSynced(t, a, append(ids, hot.Id))
	if got := firstChecks(t, a, ids, 16); got[pb.Reason_REASON_OK] != int64(len(ids)) {
		t.Fatalf("first Checks: %v, want all %d admitted", got, len(ids))
	}
	if n := a.chunks.Limits(); n != 0 {
		t.Fatalf("after one Check each of %d limits the chunks' client holds %d limits, want 0", len(ids), n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; a.chunks.Limits() == 0; i++ {
		if i == 20000 || ctx.Err() != nil {
			t.Fatalf("a limit checked %d times back to back was never tracked as a candidate for chunks", i)
		}
		if _, err := a.Check(ctx, hot.Id, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.chunks.Limits(); n != 1 {
		t.Fatalf("the chunks' client holds %d limits, want the busy one only", n)
	}
}

// TestWarmLimitsFromChunks: with the agent's default chunks, a limit
// checked 4 times a second (far below the hot rate) whose G is large is
// decided mostly in memory, from chunks reserved in the spend batches;
// one whose G is below 128 always goes to Redis.
func TestWarmLimitsFromChunks(t *testing.T) {
	w := newWorld(t, "eu")
	big := w.putLimit(limit("tenant/warm-big", 1_000_000, time.Hour, 10*time.Minute, "eu"))
	small := w.putLimit(limit("tenant/warm-small", 120, time.Hour, 10*time.Minute, "eu"))
	a := leasedChunksAgent(t, w, big, small)
	ctx := context.Background()
	for _, tc := range []struct {
		l       *pb.Limit
		chunked bool
	}{{big, true}, {small, false}} {
		before := testutil.ToFloat64(a.m.chunkChecks)
		for range 40 { // 10 s at 4/s
			d, err := a.Check(ctx, tc.l.Id, 1)
			if err != nil || !d.Allowed {
				t.Fatalf("%s: %+v %v", tc.l.Id, d, err)
			}
			w.clock.Add(250 * time.Millisecond)
		}
		got := testutil.ToFloat64(a.m.chunkChecks) - before
		if tc.chunked && got < 25 {
			t.Errorf("%s: %v of 40 Checks from chunks, want most", tc.l.Id, got)
		}
		if held := chunkLimits(t, a, "holding"); tc.chunked && held != 1 {
			t.Errorf("%s: leasehold_agent_chunk_limits{state=\"holding\"} = %d while it holds a chunk, want 1", tc.l.Id, held)
		}
		// A warm chunk is at most 1/64 of G.
		if n := coreMetric(t, a, "leasehold_agent_chunk_tokens"); tc.chunked && (n <= 0 || n > float64(tc.l.LimitTokens/64)) {
			t.Errorf("%s: leasehold_agent_chunk_tokens = %v while it holds a chunk, want 1 to %d", tc.l.Id, n, tc.l.LimitTokens/64)
		}
		if !tc.chunked && got != 0 {
			t.Errorf("%s (G %d): %v Checks from chunks, want none", tc.l.Id, tc.l.LimitTokens, got)
		}
	}
	a.closeChunks()
	if n := coreMetric(t, a, "leasehold_agent_chunk_tokens"); n != 0 {
		t.Errorf("leasehold_agent_chunk_tokens = %v after the chunks were given back, want 0", n)
	}
}

// TestWarmChunksAfterARest: a warm limit whose traffic resumes after a
// rest is decided from a chunk from its second Check: its first tells the
// chunks' client of it (checked again within chunkRecall, where the
// region's measured demand still counts the rest), and its second, with
// the client's rate measured, reserves one.
func TestWarmChunksAfterARest(t *testing.T) {
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/resumed", 1_000_000, time.Hour, 10*time.Minute, "eu"))
	a := leasedChunksAgent(t, w, l)
	ctx := context.Background()
	if d, err := a.Check(ctx, l.Id, 1); err != nil || !d.Allowed {
		t.Fatalf("the Check before the rest: %+v %v", d, err)
	}
	w.clock.Add(10 * time.Second) // the rest
	var fromChunk []int
	for i := 1; i <= 6; i++ { // 3 s at 2/s
		before := testutil.ToFloat64(a.m.chunkChecks)
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("Check %d after the rest: %+v %v", i, d, err)
		}
		if testutil.ToFloat64(a.m.chunkChecks) > before {
			fromChunk = append(fromChunk, i)
		}
		w.clock.Add(500 * time.Millisecond)
	}
	if !slices.Equal(fromChunk, []int{2, 3, 4, 5, 6}) {
		t.Errorf("Checks after the rest decided from a chunk: %v, want [2 3 4 5 6]", fromChunk)
	}
}

// TestChunksHearOfLimitsCheckedAgain: the chunks' client hears of a limit
// checked again within chunkRecall, however slowly, and not of one
// checked once or again only after longer.
func TestChunksHearOfLimitsCheckedAgain(t *testing.T) {
	w := newWorld(t, "eu")
	var ls []*pb.Limit
	for _, id := range []string{"tenant/once", "tenant/soon", "tenant/late"} {
		ls = append(ls, w.putLimit(limit(id, 1_000_000, time.Hour, 10*time.Minute, "eu")))
	}
	a := leasedChunksAgent(t, w, ls...) // one Check each
	ctx := context.Background()
	check := func(l *pb.Limit) {
		t.Helper()
		if d, err := a.Check(ctx, l.Id, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", l.Id, d, err)
		}
	}
	if n := chunkLimits(t, a, "known"); n != 0 {
		t.Fatalf("after one Check each the chunks' client holds %d limits, want 0", n)
	}
	w.clock.Add(chunkRecall - time.Second)
	check(ls[1])
	if n := chunkLimits(t, a, "known"); n != 1 {
		t.Fatalf("after %s checked again within %v the chunks' client holds %d limits, want 1", ls[1].Id, chunkRecall, n)
	}
	w.clock.Add(2 * time.Second)
	check(ls[2])
	if n := chunkLimits(t, a, "known"); n != 1 {
		t.Fatalf("after %s checked again %v later the chunks' client holds %d limits, want 1 (%s)",
			ls[2].Id, chunkRecall+time.Second, n, ls[1].Id)
	}
	if n := chunkLimits(t, a, "holding"); n != 0 {
		t.Fatalf("%d limits hold a chunk or a denial after Checks seconds apart, want 0", n)
	}
}

// chunkLimits is the agent's leasehold_agent_chunk_limits{state}.
func chunkLimits(t *testing.T, a *Agent, state string) int {
	t.Helper()
	return int(coreMetric(t, a, "leasehold_agent_chunk_limits", state))
}

// coreMetric is the value of the agent's metric name from its core
// collector, with the given label values.
func coreMetric(t *testing.T, a *Agent, name string, labels ...string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(coreCollector{a})
	return metricValue(t, reg, name, labels...)
}

// leasedChunksAgent starts an agent of w's region eu with the agent's
// default chunks (none given back for being idle: the sweeper runs on the
// real clock), a second after the limits were put, and gets each of ls
// its first lease.
func leasedChunksAgent(t *testing.T, w *world, ls ...*pb.Limit) *Agent {
	t.Helper()
	w.clock.Add(time.Second)
	cfg := DefaultChunks
	cfg.IdleAfter = time.Hour
	a := w.agent("eu", "r1", WithChunks(cfg))
	ctx := context.Background()
	for _, l := range ls {
		a.Check(ctx, l.Id, 1) // the first: no lease yet (UNAVAILABLE, the test's cold wait is 0)
		a.evaluate(ctx, l.Id)
	}
	runWork(t, a)
	return a
}
