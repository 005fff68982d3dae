package regionagent

import (
	"context"
	"errors"
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

// TestSpenderAbandonsWedgedBatch: a spend batch whose Redis call does not
// return past twice its deadline is answered "not decided"
// (errBatchAbandoned, counted as a Redis failure) instead of holding its
// Checks and its flusher for as long as the client is stuck; the next
// batch is sent on a new caller and decided by Redis while the wedged
// call is still held.
func TestSpenderAbandonsWedgedBatch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	h := &wedgeHook{wedged: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(h)
	var mu sync.Mutex
	var batchErrs []error
	sp := newSpender(bucket.New(rdb), 1, 16, 50*time.Millisecond, func(_ int, err error) {
		mu.Lock()
		batchErrs = append(batchErrs, err)
		mu.Unlock()
	})
	t.Cleanup(sp.close)
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()

	h.armed.Store(true)
	r, err := sp.spend(context.Background(), []string{"{t}:wedged"}, []int64{1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.err, errBatchAbandoned) {
		t.Fatalf("a spend whose batch is wedged: err %v, want errBatchAbandoned", r.err)
	}
	release(r)
	<-h.wedged // (it was held, not failed)

	// The wedged call is still held: a new spend goes out on a new caller.
	r, err = sp.spend(context.Background(), []string{"{t}:next"}, []int64{1}, 0)
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

	mu.Lock()
	defer mu.Unlock()
	if len(batchErrs) != 2 || !errors.Is(batchErrs[0], errBatchAbandoned) || batchErrs[1] != nil {
		t.Fatalf("batch outcomes %v, want [abandoned, nil]", batchErrs)
	}
	if !redisUnavailable(errBatchAbandoned) {
		t.Fatal("an abandoned batch is not counted as a Redis failure")
	}
}
