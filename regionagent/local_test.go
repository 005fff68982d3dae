package regionagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// cmdCounter counts the commands a Redis client sends (pipelined ones
// one by one).
type cmdCounter struct{ n atomic.Int64 }

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// regionUsage is what the allocator holds of a region's usage of a window,
// summed over reporters.
func (w *world) regionUsage(limit, region string, window int64) allocator.UsageRecord {
	var u allocator.UsageRecord
	_ = w.alloc.View(func(_ time.Time, c *allocator.Core) { u = c.RegionUsage(limit, window)[region] })
	return u
}

// admitN makes Checks of cost 1 until n are admitted; it fails the test
// after 10n Checks (a Check may find the region dry while a renewal is in
// flight, but not for long: it is then UNAVAILABLE with a short
// retry-after) or on an answer that says the pool is spent.
func admitN(t *testing.T, a *Agent, limit string, n int64) {
	t.Helper()
	var ok int64
	for i := int64(0); ok < n; i++ {
		d, err := a.Check(context.Background(), limit, 1)
		if err != nil {
			t.Fatalf("%s: check: %v", a.ReplicaID(), err)
		}
		if d.Allowed {
			ok++
			continue
		}
		if i >= 10*n || d.Reason != pb.Reason_REASON_UNAVAILABLE || d.RetryAfter > time.Second {
			t.Fatalf("%s admitted %d of %d in %d Checks; last answer %+v", a.ReplicaID(), ok, n, i+1, d)
		}
	}
}

// checkAdvancing makes one Check of cost 1 of limit at a, running the
// world's clock at real speed while the Check waits: a replica that finds
// the other renewing (it holds the limit's renewal lock) looks again 50 ms
// later on its own clock, which in a world whose clock stands still never
// comes. A Check that waits on a real call (a renewal's allocator call on a
// loaded machine) moves the clock only by the real time it takes, so a
// slow call does not carry the test into the next window. It fails the
// test when the Check has not returned within 30 s of real time (a Check
// blocked for that long is a bug, not a reason to hang the package).
func (w *world) checkAdvancing(t *testing.T, a *Agent, limit string) Decision {
	t.Helper()
	type result struct {
		d   Decision
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.driving.Add(1) // this moves the clock; the world's watch stands aside
	defer w.driving.Add(-1)
	go func() {
		d, err := a.Check(ctx, limit, 1)
		done <- result{d, err}
	}()
	var moved time.Duration
	for last := time.Now(); ; {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("%s: check: %v", a.ReplicaID(), r.err)
			}
			return r.d
		case <-ctx.Done():
			t.Fatalf("%s: a Check of %s did not return within 30 s (the clock moved %v)", a.ReplicaID(), limit, moved)
		case <-time.After(time.Millisecond): // looking whether the Check waits
		}
		now := time.Now()
		step := now.Sub(last)
		last = now
		a.mu.Lock()
		waiting := len(a.waiters[limit]) > 0
		a.mu.Unlock()
		if waiting {
			w.clock.Add(step)
			moved += step
		}
	}
}

// TestRedisDownInProcessLeases: two replicas of eu share one redis-server.
// It is SIGKILLed: after a few failed calls each replica serves the limit
// from leases it acquires for itself and holds in process, with no Redis
// call per Check. Redis is restarted empty: the replicas return their
// in-process leases (credited once), go back to the shared bucket, and
// report usage so that the allocator's admitted count is exactly what was
// admitted, although the bucket's counters restarted from zero. Draining
// the window then admits at most G minus what the dead Redis stranded.
func TestRedisDownInProcessLeases(t *testing.T) {
	const G = 1000
	w := newWorld(t, "eu")
	l := w.putLimit(limit("tenant/local", G, time.Minute, 15*time.Second, "eu"))
	w.clock.Add(time.Second)
	// A short Redis timeout: each failed call before the breaker trips
	// costs it.
	opts := []Option{WithColdWait(2 * time.Second), WithTimeouts(2*time.Second, 5*time.Second, 300*time.Millisecond)}
	r1 := w.agent("eu", "r1", opts...)
	r2 := w.agent("eu", "r2", opts...)
	agents := []*Agent{r1, r2}
	counters := make([]*cmdCounter, len(agents))
	for i, a := range agents {
		runWork(t, a)
		counters[i] = &cmdCounter{}
		a.cfg.Redis.(*redis.Client).AddHook(counters[i])
	}
	ctx := context.Background()
	win := lease.WindowOf(w.clock.Now(), time.Minute).Index
	var admitted int64

	// 1. Redis up: 20 admitted per replica from the shared bucket (its
	// first lease; the fake clock stands still, so leases are sized by the
	// prior demand G/W).
	for _, a := range agents {
		admitN(t, a, l.Id, 20)
		admitted += 20
	}
	r1.report(ctx)
	if got := w.regionUsage(l.Id, "eu", win).Admitted; got != admitted {
		t.Fatalf("allocator has %d admitted after the first report, want %d", got, admitted)
	}
	bal := balance(t, r1, l.Id, win, w.clock.Now())
	stranded := bal.Spendable + bal.Pending

	// 2. Redis SIGKILLed. A few Checks fail over to the fail mode (closed:
	// UNAVAILABLE) until the breaker trips; then every Check is decided in
	// process.
	w.redis["eu"].Kill()
	for _, a := range agents {
		for i := 0; !a.rh.isDown(); i++ {
			if i == 20 {
				t.Fatalf("%s: Redis not marked down after %d Checks against a dead Redis", a.ReplicaID(), i)
			}
			d, err := a.Check(ctx, l.Id, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Fatalf("%s admitted a Check with Redis dead and nothing in process: %+v", a.ReplicaID(), d)
			}
		}
		if v := testutil.ToFloat64(a.lm.redisUp); v != 0 {
			t.Fatalf("%s: leasehold_agent_redis_up = %v while down", a.ReplicaID(), v)
		}
	}
	before := make([]int64, len(agents))
	for i := range agents {
		before[i] = counters[i].n.Load()
	}
	var localAdmitted int64
	for i, a := range agents {
		admitN(t, a, l.Id, 100)
		localAdmitted += 100
		if n := counters[i].n.Load() - before[i]; n != 0 {
			t.Fatalf("%s sent %d Redis commands while Redis was marked down", a.ReplicaID(), n)
		}
		if v := testutil.ToFloat64(a.lm.admitted); v != 100 {
			t.Fatalf("%s: local admitted metric %v, want 100", a.ReplicaID(), v)
		}
	}
	admitted += localAdmitted
	var heldLocal int64
	for _, a := range agents {
		lb, _, _ := a.local.read(ctx, store.Key{Limit: l.Id, Window: win})
		if lb.Admitted != 100 {
			t.Fatalf("%s: in-process bucket counts %d admitted, want 100 (its own only)", a.ReplicaID(), lb.Admitted)
		}
		heldLocal += lb.Spendable + lb.Pending
	}
	if heldLocal == 0 {
		t.Fatal("nothing left in process to return")
	}

	// 3. Redis restarted empty: each replica probes, returns what it holds
	// in process, and spends from the shared bucket again.
	w.redis["eu"].Restart()
	creditedBefore := w.stats(l.Id, win).Credited
	for _, a := range agents {
		if err := a.probeRedis(ctx); err != nil {
			t.Fatalf("%s: probe after restart: %v", a.ReplicaID(), err)
		}
		if a.rh.isDown() || testutil.ToFloat64(a.lm.redisUp) != 1 {
			t.Fatalf("%s still down after a successful probe", a.ReplicaID())
		}
		a.evaluate(ctx, l.Id)
		if n := openLocal(ctx, a, l.Id, win); n > 0 {
			t.Fatalf("%s still holds %d in-process leases after the renewal round", a.ReplicaID(), n)
		}
		a.evaluate(ctx, l.Id) // a repeated round returns nothing more
	}
	// The work loop (runWork) may be the one returning them, its call still
	// in flight: wait for the credit, bounded.
	got := w.stats(l.Id, win).Credited - creditedBefore
	for deadline := time.Now().Add(10 * time.Second); got < heldLocal && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // polling the in-flight return's effect
		got = w.stats(l.Id, win).Credited - creditedBefore
	}
	if got != heldLocal {
		t.Fatalf("returning the in-process leases credited %d, they held %d", got, heldLocal)
	}
	for i, a := range agents {
		n0 := counters[i].n.Load()
		admitN(t, a, l.Id, 50)
		if counters[i].n.Load() == n0 {
			t.Fatalf("%s decided Checks without Redis after it came back", a.ReplicaID())
		}
		admitted += 50
	}
	// The bucket's counters restarted from zero: under one reporter name
	// the allocator's max-merge would keep max(40, 100), not 40 + 100.
	for _, a := range agents {
		a.report(ctx)
	}
	if got := w.regionUsage(l.Id, "eu", win).Admitted; got != admitted {
		t.Fatalf("allocator has %d admitted, the test admitted %d (40 before the outage, %d in process, 100 after)",
			got, admitted, localAdmitted)
	}

	// 4. Drain the window, both replicas in turn: strict, and the dead
	// Redis's tokens are lost. (The clock moves while a Check waits on it:
	// see checkAdvancing.)
	var spent [2]bool // the replica's last answer said the pool is spent
	for i := 0; i < 20*G && !(spent[0] && spent[1]); i++ {
		d := w.checkAdvancing(t, agents[i%2], l.Id)
		if d.Allowed {
			admitted++
		}
		spent[i%2] = !d.Allowed && d.RetryAfter > time.Second
	}
	if !spent[0] || !spent[1] {
		t.Fatalf("the window never ran dry (admitted %d)", admitted)
	}
	st := w.stats(l.Id, win)
	if admitted > G-stranded {
		t.Fatalf("admitted %d, above G %d minus the %d tokens stranded in the dead Redis", admitted, G, stranded)
	}
	if st.Granted-st.Credited > G {
		t.Fatalf("granted %d - credited %d > G", st.Granted, st.Credited)
	}
	if admitted < G-stranded-50 {
		t.Fatalf("admitted only %d of the %d not stranded: the region was left dry", admitted, G-stranded)
	}
	t.Logf("admitted %d of G = %d; %d stranded in the dead Redis; granted %d, credited %d", admitted, G, stranded,
		st.Granted, st.Credited)
}

// TestRedisHealth: the breaker trips after redisTrip consecutive failures
// (a success in between starts the count again), counts an episode each
// time, and only failures of Redis itself count.
func TestRedisHealth(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	h := newRedisHealth()
	steps := []struct {
		ok       bool
		tripped  bool
		down     bool
		episodes uint64
	}{
		{false, false, false, 0},
		{false, false, false, 0},
		{true, false, false, 0}, // a success: the count starts again
		{false, false, false, 0},
		{false, false, false, 0},
		{false, true, true, 1},
		{false, false, true, 1}, // already down
	}
	for i, s := range steps {
		var tripped bool
		if s.ok {
			h.ok()
		} else {
			tripped = h.fail(t0.Add(time.Duration(i) * time.Second))
		}
		if tripped != s.tripped || h.isDown() != s.down || h.episode.Load() != s.episodes {
			t.Fatalf("step %d: tripped %v down %v episodes %d, want %v %v %d", i, tripped, h.isDown(),
				h.episode.Load(), s.tripped, s.down, s.episodes)
		}
	}
	select {
	case <-h.wake:
	default:
		t.Fatal("the prober was not woken")
	}
	if was, d := h.up(t0.Add(10 * time.Second)); !was || d != 5*time.Second {
		t.Fatalf("up: was down %v for %v, want true, 5s", was, d)
	}
	if was, _ := h.up(t0.Add(11 * time.Second)); h.isDown() || was {
		t.Fatal("up twice")
	}
	for range redisTrip - 1 {
		h.fail(t0)
	}
	if !h.fail(t0) || h.episode.Load() != 2 {
		t.Fatal("a second outage is not a second episode")
	}

	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, true},
		{io.EOF, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{fmt.Errorf("bucket: spend: %w", redis.ErrClosed), true},
		{fmt.Errorf("%w: now -1", bucket.ErrInvalid), false},
		{redis.Nil, false},
		{fmt.Errorf("bucket: spend: %w", redisErr("ERR Error running script")), false},
		{redisErr("LOADING Redis is loading the dataset in memory"), true},
		{redisErr("READONLY You can't write against a read only replica."), true},
	} {
		if got := redisUnavailable(c.err); got != c.want {
			t.Errorf("redisUnavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// redisErr is an error reply of Redis, as go-redis returns it.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

// openLocal counts the open leases a replica holds in process, in the
// windows around win.
func openLocal(ctx context.Context, a *Agent, limit string, win int64) int {
	n := 0
	for w := win - 1; w <= win+1; w++ {
		b, _, _ := a.local.read(ctx, store.Key{Limit: limit, Window: w})
		for _, o := range b.Open {
			if o.Remaining > 0 {
				n++
			}
		}
	}
	return n
}

// TestDepositLocal: in-process deadlines (the core measures them from when
// the request was sent, minus the safety margin: here 1.3 + 11.5 - 2 =
// 10.8 ms) round down to the ms; a next-window lease's start (the reply
// at 2.2 ms plus starts_in 3.1 ms) rounds up. Steps at fixed instants
// after the store's epoch t0.
func TestDepositLocal(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	now := t0
	clock := func() time.Time { return now }
	a := &Agent{opt: options{now: clock, redisTimeout: time.Second}, local: newMemStore(clock, "r1.n"),
		lm: newLocalMetrics(nil), m: newMetrics(nil), wake: make(chan struct{}, 1),
		core: core.New(core.Config{Region: "eu", RequestPrefix: "r1", Seed: 1})}
	ctx := context.Background()
	key := func(w int64) store.Key { return store.Key{Limit: "tenant/dl", Window: w} }
	dep := func(id string, w int64, start, deadline time.Time) core.Deposit {
		return core.Deposit{Limit: "tenant/dl", Store: core.Local, Key: key(w), LeaseID: id, Tokens: 10, Start: start,
			Deadline: deadline, KeyExpiry: deadline.Add(time.Minute)}
	}
	now = ms(2)
	a.deposit(ctx, dep("cur", 5, time.Time{}, ms(10.8)))
	now = ms(2.2)
	a.deposit(ctx, dep("next", 6, ms(5.3), ms(1000)))
	for i, s := range []struct {
		at     float64
		window int64
		ok     bool
	}{
		{9.9, 5, true},
		{10.0, 5, false}, // 10.0 < 10.8, but the deadline rounds down
		{10.9, 5, false},
		{5.9, 6, false},
		{6.0, 6, true},
	} {
		now = ms(s.at)
		r, err := a.local.spend(ctx, []store.Key{key(s.window)}, []int64{1}, nil)
		if err != nil || r.Allowed != s.ok {
			t.Fatalf("step %d: spend of window %d at %.1f ms: allowed %v (%v), want %v", i, s.window, s.at, r.Allowed, err, s.ok)
		}
	}
	// A lease that expires before it could be spent is useless.
	now = ms(3)
	if _, err := a.local.deposit(ctx, dep("late", 5, time.Time{}, ms(3))); !errors.Is(err, errUselessLease) {
		t.Fatalf("useless lease: %v", err)
	}
	// Deposits are idempotent; a closed lease counts its unspent once.
	if r, err := a.local.deposit(ctx, dep("cur", 5, time.Time{}, ms(10.8))); err != nil || r.Status != store.AlreadyDeposited {
		t.Fatalf("second deposit: %+v, %v", r, err)
	}
	now = ms(4)
	if r, _ := a.local.close(ctx, key(5), "cur"); r.Unspent != 9 || r.AlreadyClosed {
		t.Fatalf("close: %+v, want 9 unspent", r)
	}
	if r, _ := a.local.close(ctx, key(5), "cur"); !r.AlreadyClosed {
		t.Fatalf("second close: %+v", r)
	}
	if got := testutil.ToFloat64(a.lm.leaseTokens); got != 20 {
		t.Fatalf("local leased tokens %v, want 20", got)
	}
}
