package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client/clienttest"
)

var subCfg = SubLeaseConfig{HotRate: 50, Horizon: time.Second, IdleAfter: 2 * time.Second}

// A caller below HotRate holds nothing: every call is a Check.
func TestQuietCallerHoldsNothing(t *testing.T) {
	r := newRig(t, nil, WithSubLeases(subCfg))
	got := r.hot(40, 5*time.Second) // 40/s, below 50
	if got[SourceAgent] != 200 || len(got) != 1 {
		t.Fatalf("sources %v, want 200 Checks", got)
	}
	if _, reserves, _ := r.agent.Calls(); reserves != 0 {
		t.Fatalf("%d Reserves from a quiet caller", reserves)
	}
}

// A hot caller reserves a chunk sized to its own rate and spends it in
// process.
func TestHotCallerChunkFollowsRate(t *testing.T) {
	for _, rate := range []int{200, 2000} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 100000, 10*time.Second, 5*time.Second) }, WithSubLeases(subCfg))
			got := r.hot(rate, time.Second)
			res := r.reservations()
			if len(res) == 0 {
				t.Fatalf("no reservation; sources %v", got)
			}
			if g := res[0].Granted; g < int64(rate)*3/4 || g > int64(rate)*3/2 {
				t.Fatalf("first chunk %d at %d/s with a 1s horizon", g, rate)
			}
			if got[SourceSubLease] < rate/2 {
				t.Fatalf("sources %v: most calls should be sub-lease hits", got)
			}
			if checks, _, _ := r.agent.Calls(); checks > rate/3 {
				t.Fatalf("%d Checks: the caller went hot after ~250ms", checks)
			}
		})
	}
}

// hotUntilReserved drives the rig at 1000/s until its first reservation
// and returns it.
func (r *rig) hotUntilReserved() clienttest.Reservation {
	r.t.Helper()
	for range 2000 {
		r.allow(1)
		r.settle()
		if res := r.reservations(); len(res) > 0 {
			return res[0]
		}
		r.clock.Advance(time.Millisecond)
	}
	r.t.Fatal("no reservation after 2s at 1000/s")
	return clienttest.Reservation{}
}

// oneChunk is a rig whose fake agent reserves from 500 ms leases, made hot
// until it holds one chunk, after which every Reserve is refused.
func oneChunk(t *testing.T, opts ...Option) (*rig, clienttest.Reservation) {
	t.Helper()
	var refuse atomic.Bool
	r := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 100000, 10*time.Second, 500*time.Millisecond)
		a.BeforeReserve = func(context.Context, *pb.ReserveRequest) error {
			if refuse.Load() {
				return status.Error(codes.FailedPrecondition, "no more chunks")
			}
			return nil
		}
	}, append([]Option{WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: 300 * time.Millisecond})}, opts...)...)
	res := r.hotUntilReserved()
	refuse.Store(true)
	return r, res
}

// TestRefusedReserveRetriedWithinASecond: a Reserve the region refuses
// (OVER_LIMIT, retry-after the rest of the window) holds the limit's next
// one back for a second, not to the window's reset: the region's next
// lease may land a moment later, and the limit's calls are decided from
// chunks again soon after.
func TestRefusedReserveRetriedWithinASecond(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 100000, time.Minute, time.Minute) },
		WithSubLeases(subCfg), WithoutDenialCache())
	first := r.hotUntilReserved()
	reserves := func() int { return r.agent.Window(testLimit, first.Window).ReserveRequests }
	r.agent.AddTokens(testLimit, -r.agent.Window(testLimit, first.Window).Left) // the region runs dry
	// Hot calls spend the chunk and ask for another.
	for i := 0; reserves() < 2; i++ {
		if i == 5000 {
			t.Fatalf("no second Reserve in 5 s of hot calls (%d)", reserves())
		}
		r.allow(1)
		r.settle()
		r.clock.Advance(time.Millisecond)
	}
	if n := len(r.reservations()); n != 1 {
		t.Fatalf("%d reservations granted, want the first only (the second refused)", n)
	}
	refused := r.clock.Now()
	r.agent.AddTokens(testLimit, 50000) // the region's next lease lands
	for len(r.reservations()) < 2 {
		if r.clock.Now().Sub(refused) > 3*time.Second {
			t.Fatalf("no chunk 3 s after the refusal (%d Reserves): the limit waits for its window's reset", reserves())
		}
		r.allow(1)
		r.settle()
		r.clock.Advance(time.Millisecond)
	}
	if waited := r.clock.Now().Sub(refused); waited < 250*time.Millisecond || waited > 1100*time.Millisecond {
		t.Fatalf("next chunk %v after the refusal, want 250 ms to about 1 s", waited)
	}
	if reserves() != 3 {
		t.Fatalf("%d Reserves, want 3: the first, the refused one, and one after the back-off", reserves())
	}
}

// TestSubLeaseDeadline: a chunk is spent before sent + expires_in -
// margin and never at or after it (margin 2 ms + 1000 ppm of 500 ms).
func TestSubLeaseDeadline(t *testing.T) {
	r, res := oneChunk(t)
	if got := res.Deadline.Sub(res.Made); got != 500*time.Millisecond {
		t.Fatalf("fake lease of %v", got)
	}
	for i, s := range []struct {
		at  time.Duration // after the Reserve was made (= sent, on the fake clock)
		src Source
	}{
		{time.Millisecond, SourceSubLease},
		{400 * time.Millisecond, SourceSubLease},
		{497*time.Millisecond + 499*time.Microsecond, SourceSubLease},
		{497*time.Millisecond + 500*time.Microsecond, SourceAgent}, // the client's deadline
		{499 * time.Millisecond, SourceAgent},
		{600 * time.Millisecond, SourceAgent},
	} {
		r.clock.Set(res.Made.Add(s.at))
		if d := r.allow(1); d.Source != s.src {
			t.Fatalf("step %d at +%v: source %v, want %v", i, s.at, d.Source, s.src)
		}
		r.settle()
	}
}

// A chunk that would mostly expire unspent (from a lease about to end)
// is given back at once, and the caller uses Checks until it would have
// expired.
func TestShortLivedChunkGivenBack(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 100000, 10*time.Second, 100*time.Millisecond) },
		WithSubLeases(subCfg))
	res := r.hotUntilReserved() // ~1000 tokens that live 100ms at ~1000/s
	got := r.reservations()[0]
	if !got.Released || got.Returned != res.Granted-1 {
		t.Fatalf("short-lived chunk: %+v (the reserving call spent 1)", got)
	}
	src := r.hot(1000, 90*time.Millisecond)
	if _, reserves, _ := r.agent.Calls(); reserves != 1 || src[SourceAgent] != 90 {
		t.Fatalf("before the chunk's deadline: %d Reserves, sources %v", reserves, src)
	}
	r.hot(1000, 20*time.Millisecond)
	if _, reserves, _ := r.agent.Calls(); reserves != 2 {
		t.Fatalf("after it: %d Reserves, want a new one", reserves)
	}
}

// TestSubLeaseNeverOverspends is a property test: random clock steps and
// costs over many short windows and chunk lifetimes. Per window, the
// client admits by Check exactly what the agent admitted by Check, and by
// sub-lease at most what the agent reserved minus what came back: no token
// is spent after its chunk's deadline (it would count in a later window)
// or twice.
func TestSubLeaseNeverOverspends(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			const W = time.Second
			g := 300 + rng.Int64N(1500)
			ttl := time.Duration(100+rng.IntN(900)) * time.Millisecond
			r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, g, W, ttl) },
				WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: time.Duration(50+rng.IntN(500)) * time.Millisecond, IdleAfter: 300 * time.Millisecond}))
			byCheck, bySub := map[int64]int64{}, map[int64]int64{}
			for i := range 6000 {
				step := time.Duration(rng.Int64N(int64(2 * time.Millisecond)))
				if i%1000 == 999 {
					step = time.Duration(rng.Int64N(int64(time.Second))) // a lull
				}
				r.clock.Advance(step)
				now := r.clock.Now()
				cost := 1 + rng.Int64N(3)
				d := r.allow(cost)
				w := now.UnixNano() / int64(W)
				switch {
				case d.Allowed && d.Source == SourceSubLease:
					bySub[w] += cost
				case d.Allowed:
					byCheck[w] += cost
				}
				r.settle()
				if i%200 == 0 {
					r.sweep()
				}
			}
			if err := r.c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			var subs int64
			for _, w := range r.agent.Windows(testLimit) {
				st := r.agent.Window(testLimit, w)
				if byCheck[w] != st.CheckAdmitted {
					t.Fatalf("window %d: %d admitted by Check, agent says %d", w, byCheck[w], st.CheckAdmitted)
				}
				if bySub[w] > st.Reserved-st.Returned {
					t.Fatalf("window %d: %d spent from chunks, %d reserved, %d returned", w, bySub[w], st.Reserved, st.Returned)
				}
				subs += bySub[w]
			}
			if subs == 0 {
				t.Fatal("no sub-lease spends: the property was not exercised")
			}
			for _, res := range r.reservations() {
				if res.Released && res.Returned != res.Unspent && res.Made.Add(ttl).After(r.clock.Now()) {
					t.Fatalf("release of a live chunk not returned: %+v", res)
				}
			}
		})
	}
}

// Unspent tokens come back when the limit goes idle.
func TestUnspentReleasedOnIdle(t *testing.T) {
	var obs releaseLog
	r := newRig(t, nil, WithSubLeases(subCfg), WithReleaseObserver(obs.observe))
	res := r.hotUntilReserved()
	var spent int64
	for range 10 {
		if d := r.allow(2); d.Source == SourceSubLease {
			spent += 2
		}
	}
	r.clock.Advance(time.Second)
	r.sweep()
	if got := r.reservations()[0]; got.Released {
		t.Fatalf("released before IdleAfter: %+v", got)
	}
	r.clock.Advance(time.Second) // idle 2s, the chunk lives 5s
	r.sweep()
	got := r.reservations()
	if len(got) != 1 || !got[0].Released || got[0].Unspent != res.Granted-spent-1 || got[0].Returned != got[0].Unspent {
		t.Fatalf("after idle: %+v (granted %d, spent %d + the reserving call's 1)", got, res.Granted, spent)
	}
	if r.c.state(testLimit).cur.Load() != nil {
		t.Fatal("still holds a chunk")
	}
	obs.expect(t, got[0].Unspent, got[0].Returned)
}

// Unspent tokens come back on Close; an expired chunk is not released
// (the agent counts it as spent).
func TestUnspentReleasedOnClose(t *testing.T) {
	r := newRig(t, nil, WithSubLeases(subCfg))
	res := r.hotUntilReserved()
	if err := r.c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := r.reservations()[0]
	if !got.Released || got.Unspent != res.Granted-1 || got.Returned != got.Unspent {
		t.Fatalf("after Close: %+v", got)
	}
}

// TestExpiredChunkReleased: a chunk that reaches its deadline unspent is
// released (nothing is spent from it after the deadline, so the count is
// final): the agent puts the tokens back into the leases they came from
// while those are open. It was once never released, which counted its
// tokens as admitted and stranded them.
func TestExpiredChunkReleased(t *testing.T) {
	var obs releaseLog
	r := newRig(t, nil, WithSubLeases(SubLeaseConfig{HotRate: 50, IdleAfter: time.Minute}), WithReleaseObserver(obs.observe))
	res := r.hotUntilReserved()
	spent := r.spentFromChunks()
	r.clock.Advance(6 * time.Second) // the chunk lived 5s
	if d := r.allow(1); d.Source == SourceSubLease {
		t.Fatalf("spent from a chunk after its deadline: %+v", d)
	}
	r.sweep()
	if err := r.c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := r.reservations()[0]
	if _, _, releases := r.agent.Calls(); releases != 1 || !got.Released || got.Unspent != res.Granted-spent {
		t.Fatalf("%d Releases of an expired chunk, %+v: want one with its %d unspent", releases, got, res.Granted-spent)
	}
	obs.expect(t, got.Unspent, got.Returned)
}

// releaseLog records what WithReleaseObserver saw.
type releaseLog struct {
	mu   sync.Mutex
	seen [][2]int64 // unspent, returned
	errs int
}

func (l *releaseLog) observe(unspent, returned int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs++
	}
	l.seen = append(l.seen, [2]int64{unspent, returned})
}

// expect: exactly one release was observed, with these counts.
func (l *releaseLog) expect(t *testing.T, unspent, returned int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.seen) != 1 || l.errs != 0 || l.seen[0] != [2]int64{unspent, returned} {
		t.Fatalf("release observer saw %v (%d errors), want one release of %d unspent, %d returned", l.seen, l.errs, unspent, returned)
	}
}

// A caller that slows below half the hot rate gives its chunk back.
func TestSlowCallerReleases(t *testing.T) {
	r := newRig(t, nil, WithSubLeases(SubLeaseConfig{HotRate: 50, IdleAfter: time.Minute}))
	r.hotUntilReserved()
	// 10/s: used, never idle, but quiet once the rate estimate (1s decay)
	// has come down from 1000/s: within 5s.
	for range 50 {
		r.clock.Advance(100 * time.Millisecond)
		r.allow(1)
		r.sweep()
	}
	if got := r.reservations()[0]; !got.Released || got.Returned == 0 {
		t.Fatalf("a quiet caller still holds %+v", got)
	}
}

// The next chunk is asked for before the current one runs out, so a
// steady hot caller is served from chunks with few Checks.
func TestRefillAhead(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 1_000_000, 10*time.Second, 5*time.Second) },
		WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: 100 * time.Millisecond}))
	r.hot(1000, 300*time.Millisecond) // warm up
	checks0, _, _ := r.agent.Calls()
	got := r.hot(1000, 3*time.Second)
	checks1, reserves, _ := r.agent.Calls()
	if checks1 != checks0 || got[SourceSubLease] != 3000 {
		t.Fatalf("sources %v, %d Checks after warm-up", got, checks1-checks0)
	}
	if reserves < 25 || reserves > 40 {
		t.Fatalf("%d Reserves for 3s of 100ms chunks", reserves)
	}
}

// An agent without Reserve (Unimplemented): plain Checks, and Reserve is
// tried again only a minute later.
func TestFallbackToCheckOnUnimplemented(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.NoReserve = true }, WithSubLeases(subCfg))
	got := r.hot(1000, time.Second)
	if got[SourceAgent] != 1000 {
		t.Fatalf("sources %v", got)
	}
	if _, reserves, _ := r.agent.Calls(); reserves != 1 {
		t.Fatalf("%d Reserves, want 1 probe", reserves)
	}
	r.clock.Advance(time.Minute)
	r.hot(1000, 500*time.Millisecond)
	if _, reserves, _ := r.agent.Calls(); reserves != 2 {
		t.Fatalf("%d Reserves, want a second probe after a minute", reserves)
	}
}

// A Reserve whose reply was lost is asked again with the same id and
// given back whole; the call that reserved is decided by a Check.
func TestLostReserveReplyGivenBack(t *testing.T) {
	var lost atomic.Int32
	r := newRig(t, func(a *clienttest.Agent) {
		a.AfterReserve = func(context.Context, *pb.ReserveRequest) error {
			if lost.Add(1) == 1 {
				return status.Error(codes.Unavailable, "connection reset")
			}
			return nil
		}
	}, WithSubLeases(subCfg), WithRetry(200*time.Millisecond))
	var res clienttest.Reservation
	for range 2000 {
		r.allow(1)
		r.settle()
		if rs := r.reservations(); len(rs) > 0 {
			res = rs[0]
			break
		}
		r.clock.Advance(time.Millisecond)
	}
	if !res.Released || res.Unspent != res.Granted || res.Returned != res.Granted {
		t.Fatalf("the lost reservation: %+v", res)
	}
	if _, reserves, _ := r.agent.Calls(); reserves != 2 || len(r.reservations()) != 1 {
		t.Fatalf("%d Reserves, %d reservations: want one reservation asked twice", reserves, len(r.reservations()))
	}
}

// A refill that fails transiently is retried with the same reservation id.
func TestRefillRetriedWithSameID(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	r := newRig(t, func(a *clienttest.Agent) {
		a.BeforeReserve = func(_ context.Context, req *pb.ReserveRequest) error {
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, req.ReservationId)
			if n := len(ids); n == 2 || n == 3 { // the first refill fails twice
				return status.Error(codes.Unavailable, "try again")
			}
			return nil
		}
	}, WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: 100 * time.Millisecond}))
	r.hotUntilReserved()
	r.hot(1000, 200*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(ids) < 4 || ids[1] != ids[2] || ids[2] != ids[3] || ids[0] == ids[1] {
		t.Fatalf("reservation ids %v: the refill's retries must keep its id", ids)
	}
}

// Close while a refill is in flight: both the current chunk and the one
// arriving are given back.
func TestCloseDuringRefill(t *testing.T) {
	entered, unblock := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	r := newRig(t, func(a *clienttest.Agent) {
		a.BeforeReserve = func(context.Context, *pb.ReserveRequest) error {
			if n.Add(1) == 2 {
				close(entered)
				<-unblock
			}
			return nil
		}
	}, WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: 100 * time.Millisecond}))
	r.hotUntilReserved()
	st := r.c.state(testLimit)
	for i := 0; !st.pending.Load(); i++ { // spend until the refill is asked for
		if i > 1000 {
			t.Fatal("no refill")
		}
		r.clock.Advance(time.Millisecond)
		r.allow(1)
	}
	<-entered
	done := make(chan error)
	go func() { done <- r.c.Close(context.Background()) }()
	close(unblock)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res := r.reservations()
	if len(res) != 2 {
		t.Fatalf("%d reservations", len(res))
	}
	for _, x := range res {
		if !x.Released || x.Returned != x.Unspent || x.Unspent == 0 {
			t.Fatalf("not given back: %+v", x)
		}
	}
}

// spentFromChunks is what the current chunk of the test limit has spent.
func (r *rig) spentFromChunks() int64 {
	v, ok := r.c.states.Load(testLimit)
	if !ok {
		return 0
	}
	if cur := v.(*limitState).cur.Load(); cur != nil {
		return cur.spent()
	}
	return 0
}

// TestReleaseLead: WithReleaseLead ends a chunk that long before its
// lease (here 100 ms before the fake agent's 500 ms reservation, less the
// safety margin), so that what is left goes back while the lease is open.
func TestReleaseLead(t *testing.T) {
	r, res := oneChunk(t, WithReleaseLead(100*time.Millisecond))
	end := 400*time.Millisecond - 2*time.Millisecond - 500*time.Microsecond // lead, fixed margin, 1,000 ppm of 500 ms
	for i, s := range []struct {
		at  time.Duration
		src Source
	}{
		{time.Millisecond, SourceSubLease},
		{end - time.Microsecond, SourceSubLease},
		{end, SourceAgent},
		{450 * time.Millisecond, SourceAgent},
	} {
		r.clock.Set(res.Made.Add(s.at))
		if d := r.allow(1); d.Source != s.src {
			t.Fatalf("step %d at +%v: source %v, want %v", i, s.at, d.Source, s.src)
		}
		r.settle()
	}
}

// TestLocalDecisionObserver: every decision the client makes without the
// agent is observed (from a sub-lease, with its reservation; from the
// denial cache), at the client's clock; none the agent made is.
func TestLocalDecisionObserver(t *testing.T) {
	var mu sync.Mutex
	var seen []LocalDecision
	observe := WithLocalDecisionObserver(func(d LocalDecision) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	})
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 100000, 10*time.Second, 5*time.Second) },
		WithSubLeases(subCfg), observe)
	got := r.hot(200, time.Second)
	mu.Lock()
	obs := seen
	seen = nil
	mu.Unlock()
	if len(obs) != got[SourceSubLease] || len(obs) == 0 {
		t.Fatalf("%d observed, %v decided", len(obs), got)
	}
	ids := map[string]bool{}
	for _, res := range r.reservations() {
		ids[res.ID] = true
	}
	for _, d := range obs {
		if d.Decision.Source != SourceSubLease || !d.Decision.Allowed || d.Cost != 1 || d.Limit != testLimit ||
			!ids[d.Reservation] || d.At.Before(t0) || d.At.After(t0.Add(time.Second)) {
			t.Fatalf("observed %+v (reservations %v)", d, ids)
		}
	}

	// The denial cache's answers are observed too.
	r = newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 5, 10*time.Second, time.Second)
		a.DenyRetryAfter = 400 * time.Millisecond
	}, observe)
	r.allow(5)
	r.allow(1) // the agent denies: cached
	r.clock.Advance(100 * time.Millisecond)
	if d := r.allow(1); d.Source != SourceDenialCache {
		t.Fatalf("not from the cache: %+v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0].Decision.Source != SourceDenialCache || seen[0].Reservation != "" ||
		!seen[0].At.Equal(t0.Add(100*time.Millisecond)) {
		t.Fatalf("observed %+v", seen)
	}
}

var warmCfg = SubLeaseConfig{HotRate: 50, Horizon: time.Second, IdleAfter: time.Second, WarmRate: 1, WarmHorizon: 4 * time.Second}

// TestWarmLimitChunks: with WarmRate, a limit asked 4 times a second
// (below HotRate) whose G is large is decided from chunks covering 4 s
// of that rate; one whose G is below 128 is not (a chunk would hold too
// much of it), nor is any without WarmRate. A warm chunk is kept between
// uses further apart than IdleAfter, and given back when its caller
// stops.
func TestWarmLimitChunks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		g       int64
		cfg     SubLeaseConfig
		chunked bool
	}{
		{"large G", 100_000, warmCfg, true},
		{"G 127", 127, warmCfg, false},
		{"no WarmRate", 100_000, subCfg, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, tc.g, time.Minute, 30*time.Second) }, WithSubLeases(tc.cfg))
			got := r.hot(4, 20*time.Second) // 80 calls, 250 ms apart
			checks, reserves, _ := r.agent.Calls()
			if !tc.chunked {
				if reserves != 0 || got[SourceAgent] != 80 {
					t.Fatalf("%d reserves, sources %v: want 80 Checks", reserves, got)
				}
				return
			}
			res := r.reservations()
			if len(res) == 0 {
				t.Fatalf("no reservation; sources %v", got)
			}
			// 4 s at 4/s: 16 tokens (the rate estimate is near 4).
			for _, x := range res {
				if x.Granted < 8 || x.Granted > 24 {
					t.Errorf("warm chunk of %d tokens, want about 16", x.Granted)
				}
			}
			if got[SourceSubLease] < 60 || checks > 20 {
				t.Fatalf("sources %v, %d Checks: most calls should come from chunks", got, checks)
			}
			// Uses 250 ms apart never let the chunk go idle: no release
			// while the caller keeps its rate.
			if _, _, releases := r.agent.Calls(); releases != 0 {
				t.Errorf("%d releases while the caller kept its rate", releases)
			}
			// The caller stops: the chunk goes back after 2 s unused.
			r.clock.Advance(2100 * time.Millisecond)
			r.sweep()
			if _, _, releases := r.agent.Calls(); releases != 1 {
				t.Errorf("%d releases after the caller stopped, want 1", releases)
			}
		})
	}
}

// TestReleaseStormBoundedWorkers: when one sweep retires more chunks than
// maxReleaseWorkers (callers that moved on from many limits at once),
// their releases are sent by that many goroutines, the rest queued for
// them; every release is sent, every unspent token given back, and the
// workers end with the queue.
func TestReleaseStormBoundedWorkers(t *testing.T) {
	const n = maxReleaseWorkers + 40
	entered, gate := make(chan struct{}, n), make(chan struct{})
	limits := make([]string, n)
	r := newRig(t, func(a *clienttest.Agent) {
		for i := range limits {
			limits[i] = fmt.Sprintf("tenant/storm%03d", i)
			a.SetLimit(limits[i], 100_000, time.Minute, 30*time.Second)
		}
		a.BeforeRelease = func(context.Context, *pb.ReleaseRequest) error {
			entered <- struct{}{}
			<-gate
			return nil
		}
	}, WithSubLeases(warmCfg))
	ctx := context.Background()
	for range 8 { // each limit asked 4 times a second: warm
		for _, l := range limits {
			if _, err := r.c.Allow(ctx, l, 1); err != nil {
				t.Fatal(err)
			}
		}
		r.settle()
		r.clock.Advance(250 * time.Millisecond)
	}
	if res := r.reservations(); len(res) != n {
		t.Fatalf("%d chunks, want one for each of %d limits", len(res), n)
	}
	r.clock.Advance(2100 * time.Millisecond) // every caller stopped
	r.c.sweep(r.c.mono())
	for range maxReleaseWorkers {
		<-entered
	}
	r.c.relMu.Lock()
	workers, queued := r.c.relWorkers, len(r.c.relQueue)
	r.c.relMu.Unlock()
	if workers != maxReleaseWorkers || queued != n-maxReleaseWorkers {
		t.Errorf("%d releases in flight on %d workers, %d queued; want %d, %d", len(entered)+maxReleaseWorkers, workers, queued,
			maxReleaseWorkers, n-maxReleaseWorkers)
	}
	close(gate)
	r.settle()
	if _, _, releases := r.agent.Calls(); releases != n {
		t.Errorf("%d releases, want %d", releases, n)
	}
	for _, x := range r.reservations() {
		if !x.Released || x.Unspent <= 0 || x.Returned != x.Unspent {
			t.Errorf("reservation %+v: want released, its unspent tokens returned", x)
		}
	}
	r.c.relMu.Lock()
	defer r.c.relMu.Unlock()
	if r.c.relWorkers != 0 || len(r.c.relQueue) != 0 {
		t.Errorf("after the storm: %d workers, %d queued", r.c.relWorkers, len(r.c.relQueue))
	}
}
