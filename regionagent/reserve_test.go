package regionagent

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

func TestReserveRelease(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/sub", 100, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 100 // one lease holds the whole window
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	ctx := context.Background()
	t0 := w.clock.Now()
	a.Check(ctx, l.Id, 1)
	a.evaluate(ctx, l.Id) // the lease: expires_in 15s from t0, margin 2ms + 15ms
	win := lease.WindowOf(t0, time.Minute).Index

	w.clock.Add(time.Second)
	r, err := a.Reserve(ctx, l.Id, 40, 10, "client-1")
	if err != nil {
		t.Fatal(err)
	}
	deadline := t0.Add(15*time.Second - a.opt.safetyMargin(15*time.Second)).Truncate(time.Millisecond)
	if !r.Allowed || r.Granted != 40 || w.clock.Now().Add(r.ExpiresIn) != deadline {
		t.Fatalf("reserve: %+v; want 40 tokens until the lease's deadline %v (expires_in %v)", r, deadline, deadline.Sub(w.clock.Now()))
	}
	if r2, _ := a.Reserve(ctx, l.Id, 40, 10, "client-1"); r2.Granted != 40 || r2.ExpiresIn != r.ExpiresIn {
		t.Fatalf("retried reserve: %+v", r2)
	}
	// Others see the balance without the reserved tokens.
	if d, _ := a.Check(ctx, l.Id, 61); d.Allowed || d.Remaining != 60 {
		t.Fatalf("check of 61 with 60 left: %+v", d)
	}
	// A usage report while the reservation is out counts its 40 tokens as
	// admitted (a client that crashes is counted as having spent them).
	a.report(ctx)
	// The client spent 15 of 40: 25 come back and are spendable by Checks.
	if n, err := a.Release(ctx, l.Id, "client-1", 25); err != nil || n != 25 {
		t.Fatalf("release: %d %v", n, err)
	}
	if n, _ := a.Release(ctx, l.Id, "client-1", 25); n != 25 {
		t.Fatalf("retried release: %d", n)
	}
	// The allocator keeps each reporter's highest counts: the report before
	// the release (40) must not stand for more than was admitted (15).
	a.report(ctx)
	if got := w.regionUsage(l.Id, "eu", win).NetAdmitted(); got != 15 {
		t.Fatalf("after the release the allocator counts %d admitted, want 15", got)
	}
	if d, _ := a.Check(ctx, l.Id, 85); !d.Allowed {
		t.Fatalf("the released tokens are not spendable: %+v", d)
	}
	// Conservation: granted = admitted (15 by the client + 85) + held, the
	// bucket's admitted less what the release gave back (every counter
	// only grows).
	bal := balance(t, a, l.Id, win, w.clock.Now())
	net := bal.Admitted - counterOf(bal, "released")
	if got := w.stats(l.Id, win).Granted; got != net+bal.Spendable || net != 100 {
		t.Fatalf("granted %d, admitted %d (less released), held %d", got, net, bal.Spendable)
	}
	// The allocator, which keeps each reporter's highest counts, has what
	// was really admitted: the report before the release (40 admitted)
	// is not taken for more than it was.
	a.report(ctx)
	if got := w.regionUsage(l.Id, "eu", win).NetAdmitted(); got != 100 {
		t.Fatalf("the allocator counts %d admitted, want 100", got)
	}
	// Nothing left: a reservation gets nothing and says why.
	if r, _ := a.Reserve(ctx, l.Id, 10, 1, "client-2"); r.Allowed || r.Granted != 0 {
		t.Fatalf("reserve from an empty region: %+v", r)
	}
	for _, bad := range []struct {
		tokens, min int64
		id          string
	}{{0, 1, "x"}, {101, 1, "x"}, {10, 11, "x"}, {10, 1, ""}, {10, 1, "a/b"}} {
		if _, err := a.Reserve(ctx, l.Id, bad.tokens, bad.min, bad.id); err == nil {
			t.Errorf("Reserve(%d, %d, %q) accepted", bad.tokens, bad.min, bad.id)
		}
	}
	if _, err := a.Release(ctx, l.Id, "client-1", -1); err == nil {
		t.Error("negative unspent accepted")
	}
}

func counterOf(b store.BalanceResult, name string) int64 {
	for _, c := range b.Counters {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}

// pipeHook records each pipeline's commands and, once armed, holds the
// next pipeline until released.
type pipeHook struct {
	armed   atomic.Bool
	held    chan struct{} // closed when a pipeline is held
	release chan struct{}
	mu      sync.Mutex
	pipes   [][]string // each pipeline's commands, "evalsha <sha> <first key>" for scripts
}

func (h *pipeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
			if args := c.Args(); c.Name() == "evalsha" && len(args) > 3 {
				names[i] += " " + fmt.Sprint(args[1]) + " " + fmt.Sprint(args[3])
			}
		}
		h.mu.Lock()
		h.pipes = append(h.pipes, names)
		h.mu.Unlock()
		if h.held != nil && h.armed.CompareAndSwap(true, false) {
			close(h.held)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// TestReservesRideSpendBatches: reservations, releases and settle-later
// decisions travel in the spend batches' pipeline: queued behind a batch
// in flight, they and a Check go to Redis in one round trip, not one
// each, and the four in one script call (the Check's spend in another).
func TestReservesRideSpendBatches(t *testing.T) {
	w := newWorld(t, "eu")
	var ids []string
	for _, id := range []string{"tenant/p1", "tenant/p2", "tenant/p3"} {
		l := limit(id, 1000, time.Minute, 15*time.Second, "eu")
		l.Lease.MinChunk = 1000
		ids = append(ids, w.putLimit(l).Id)
	}
	st := limit("tenant/later", 1000, time.Minute, 15*time.Second, "eu")
	st.Lease.MinChunk = 1000
	st = w.putLimit(st)
	w.clock.Add(time.Second)
	h := &pipeHook{held: make(chan struct{}), release: make(chan struct{})}
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(h)
	a := w.agentOn(rdb, "eu", "r1", nil, WithBatching(1, 64))
	ctx := context.Background()
	for _, id := range append(slices.Clone(ids), st.Id) {
		a.Check(ctx, id, 1)
		a.evaluate(ctx, id)
		if d, _ := a.Check(ctx, id, 1); !d.Allowed {
			t.Fatalf("%s not leased: %+v", id, d)
		}
	}
	if r, err := a.Reserve(ctx, ids[0], 10, 1, "before"); err != nil || r.Granted != 10 {
		t.Fatalf("reserve: %+v %v", r, err)
	}

	// Every script known to Redis (a first use would be sent again after
	// NOSCRIPT, alone).
	if err := a.shared.b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// Hold one batch in flight (a Check), queue the others behind it.
	h.armed.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { a.Check(ctx, ids[1], 1) })
	<-h.held
	h.mu.Lock()
	before := len(h.pipes)
	h.mu.Unlock()
	results := make([]any, 5)
	wg.Go(func() { results[0], _ = a.Reserve(ctx, ids[1], 10, 1, "c1") })
	wg.Go(func() { results[1], _ = a.Reserve(ctx, ids[2], 10, 1, "c2") })
	wg.Go(func() { results[2], _ = a.Release(ctx, ids[0], "before", 4) })
	wg.Go(func() { results[3], _ = a.Check(ctx, ids[2], 1) })
	wg.Go(func() { results[4], _ = a.CheckSettleLater(ctx, st.Id, 5) })
	for give := time.Now().Add(10 * time.Second); len(a.shared.spender.queue) < 5; runtime.Gosched() {
		if time.Now().After(give) {
			close(h.release)
			t.Fatalf("%d of 5 calls queued behind the held batch", len(a.shared.spender.queue))
		}
	}
	close(h.release)
	wg.Wait()

	if r := results[0].(Reservation); r.Granted != 10 {
		t.Errorf("reserve c1: %+v", r)
	}
	if r := results[1].(Reservation); r.Granted != 10 {
		t.Errorf("reserve c2: %+v", r)
	}
	if n := results[2].(int64); n != 4 {
		t.Errorf("release returned %d, want 4", n)
	}
	if d := results[3].(Decision); !d.Allowed {
		t.Errorf("check: %+v", d)
	}
	if d := results[4].(Decision); !d.Allowed || d.DecisionID == "" {
		t.Errorf("settle-later check: %+v", d)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	after := h.pipes[before:] // before counts the held one
	if len(after) != 1 {
		t.Fatalf("%d pipelines after the held one, want 1 carrying all five: %v", len(after), after)
	}
	// Two reserves, a release and a settle-later reserve in one call; the
	// Check's spend.
	if len(after[0]) != 2 {
		t.Errorf("the pipeline carried %v, want 2 script calls", after[0])
	}
}
