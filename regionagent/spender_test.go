package regionagent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"leasehold/internal/redistest"
	"leasehold/regionagent/bucket"
)

// wedgeHook holds the next pipeline once armed, ignoring its context,
// until released: a Redis client that does not keep its deadline (seen in
// go-redis's Cluster pipeline: a spend batch waited six minutes on a reply
// past its 250 ms context deadline).
type wedgeHook struct {
	armed   atomic.Bool
	wedged  chan struct{} // closed when a pipeline is held
	release chan struct{}
}

func (h *wedgeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *wedgeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *wedgeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.CompareAndSwap(true, false) {
			close(h.wedged)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// wedgeableSpender is a spender of one flusher, 16 spends a batch and a
// 50 ms deadline on a real redis-server (rdb's) whose calls h can hold;
// outcomes lists what onBatch was told of each batch, in order.
func wedgeableSpender(t *testing.T) (sp *spender, rdb *redis.Client, h *wedgeHook, outcomes func() []batchOutcome) {
	t.Helper()
	srv := redistest.Start(t)
	rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	h = &wedgeHook{wedged: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(h)
	var mu sync.Mutex
	var outs []batchOutcome
	sp = newSpender(bucket.New(rdb), 1, 16, 50*time.Millisecond, func(_ int, took time.Duration, err error) {
		mu.Lock()
		outs = append(outs, batchOutcome{err, took})
		mu.Unlock()
	})
	return sp, rdb, h, func() []batchOutcome {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(outs)
	}
}

// batchOutcome is what a spender's onBatch was told of one batch.
type batchOutcome struct {
	err  error
	took time.Duration
}

// TestSpenderAbandonsWedgedBatch: a spend batch whose Redis call does not
// return past twice its deadline is answered "not decided"
// (errBatchAbandoned, counted as a Redis failure) instead of holding its
// Checks and its flusher for as long as the client is stuck; the next
// batch is sent on a new caller and decided by Redis while the wedged
// call is still held.
func TestSpenderAbandonsWedgedBatch(t *testing.T) {
	sp, _, h, outcomes := wedgeableSpender(t)
	t.Cleanup(sp.close)
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()

	h.armed.Store(true)
	r, err := sp.spend(context.Background(), []string{"{t}:wedged"}, []int64{1}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.err, errBatchAbandoned) {
		t.Fatalf("a spend whose batch is wedged: err %v, want errBatchAbandoned", r.err)
	}
	release(r)
	<-h.wedged // (it was held, not failed)

	// The wedged call is still held: a new spend goes out on a new caller.
	r, err = sp.spend(context.Background(), []string{"{t}:next"}, []int64{1}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.err != nil {
		t.Fatalf("the spend after an abandoned batch: %v, want it decided by Redis", r.err)
	}
	if r.res.Allowed {
		t.Fatal("a spend of a bucket with no leases was allowed")
	}
	release(r)
	close(h.release)
	released = true

	outs := outcomes()
	if len(outs) != 2 || !errors.Is(outs[0].err, errBatchAbandoned) || outs[1].err != nil {
		t.Fatalf("batch outcomes %v, want [abandoned, nil]", outs)
	}
	// The abandoned batch's time runs to its abandonment: at least
	// twice its deadline, and never less than the watchdog's 1 s.
	if outs[0].took < time.Second || outs[1].took <= 0 {
		t.Errorf("the batches took %v and %v: want the abandoned one >= 1 s, the next > 0", outs[0].took, outs[1].took)
	}
	if !redisUnavailable(errBatchAbandoned) {
		t.Fatal("an abandoned batch is not counted as a Redis failure")
	}
}

// TestSpenderWatchdogLateFire: a flusher's watchdog timer (one per
// flusher, reset for each batch) that fires just as its batch's call
// returns loses to the call: that batch has the call's own outcome (here
// its deadline, as the hook held it), not errBatchAbandoned, and the late
// watchdog does not abandon the flusher's next batch, which the flusher
// sends only once the watchdog is done.
func TestSpenderWatchdogLateFire(t *testing.T) {
	sp, rdb, h, outcomes := wedgeableSpender(t)
	fired, fireGo := make(chan struct{}), make(chan struct{})
	var fires atomic.Int32
	sp.onFire = func() {
		if fires.Add(1) == 1 {
			close(fired)
			<-fireGo
		}
	}
	lateWait := make(chan struct{})
	sp.onLateFire = func() { close(lateWait) }
	t.Cleanup(sp.close)
	var once sync.Once
	unblock := func() { once.Do(func() { close(fireGo) }) }
	t.Cleanup(unblock)

	type outcome struct {
		r   *spendReq
		err error
	}
	spendAsync := func(key string) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			r, err := sp.spend(context.Background(), []string{key}, []int64{1}, nil, 0, nil)
			ch <- outcome{r, err}
		}()
		return ch
	}
	first := spendAsync("{t}:first")
	h.armed.Store(true)
	// The first batch may have gone before the hook was armed: then
	// send another, which the hook holds.
	select {
	case o := <-first:
		if o.err != nil || o.r.err != nil {
			t.Fatal(o.err, o.r.err)
		}
		release(o.r)
		first = spendAsync("{t}:first")
	case <-h.wedged:
	}
	<-h.wedged
	<-fired          // the batch's timer fired while its call is held
	close(h.release) // the call returns before the watchdog looks
	o := <-first
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.r.err == nil || errors.Is(o.r.err, errBatchAbandoned) {
		t.Fatalf("a batch whose call returned (past its deadline) before its watchdog looked: %v, want the call's own error", o.r.err)
	}
	release(o.r)

	// The next batch is held too, should it go before the watchdog is
	// done.
	h2 := &wedgeHook{wedged: make(chan struct{}), release: make(chan struct{})}
	h2.armed.Store(true)
	rdb.AddHook(h2)
	close(h2.release) // held batches go on at once: the order is what counts
	second := spendAsync("{t}:second")
	select {
	case <-lateWait:
	case <-h2.wedged:
		t.Fatal("the next batch was sent while the late watchdog was still to look")
	}
	unblock() // the late watchdog goes on: it finds its batch decided
	o = <-second
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.r.err != nil {
		t.Fatalf("the batch after a late watchdog: %v, want it decided by Redis", o.r.err)
	}
	release(o.r)
	outs := outcomes()
	for i, o := range outs {
		if errors.Is(o.err, errBatchAbandoned) {
			t.Fatalf("batch %d abandoned, want none", i)
		}
	}
	if n := len(outs); n < 2 || outs[n-1].err != nil {
		t.Fatalf("batch outcomes %v, want the last decided", outs)
	}
	if fires.Load() != 1 {
		t.Fatalf("%d watchdogs fired, want 1 (the held batch's)", fires.Load())
	}
}
