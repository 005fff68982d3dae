package regionagent

import (
	"context"
	"errors"
	"sync"
	"time"

	"leasehold/regionagent/bucket"
)

// spendReq is one Check's spend waiting for its batch.
type spendReq struct {
	op  bucket.SpendOp
	res bucket.SpendResult
	err error
	// A Check's first step (the spender's hooks set): begun in the core
	// by the batch (check), and decided by it when it spends in Redis;
	// skip: it does not (it goes on in its caller); at: when the batch
	// was sent.
	check *checkStart
	skip  bool
	at    time.Time
	// done receives once the result is set. Buffered (1) so the flusher
	// never blocks on a caller that gave up.
	done chan struct{}
}

var spendReqPool = sync.Pool{New: func() any { return &spendReq{done: make(chan struct{}, 1)} }}

// spender batches concurrent spends: each flusher takes every spend that
// is waiting (up to maxBatch) and sends them in one Redis pipeline. Under
// load a batch of concurrent Checks costs one round trip; an idle agent
// sends a lone spend at once. Safe for concurrent use.
type spender struct {
	b        *bucket.Buckets
	queue    chan *spendReq
	maxBatch int
	timeout  time.Duration
	wg       sync.WaitGroup
	stop     chan struct{}
	// onBatch sees each batch's size and error (non-nil only when no
	// spend of the batch was decided: Redis did not answer).
	onBatch func(n int, err error)
	// begin and decide, when set, are called with every batch before
	// its spends are sent and after their results are set: begin sets
	// each request's op (or skip), decide hands the results on. They let
	// a batch of Checks be begun and decided in the core at once.
	begin, decide func(reqs []*spendReq)
}

func newSpender(b *bucket.Buckets, flushers, maxBatch int, timeout time.Duration, onBatch func(int, error)) *spender {
	s := &spender{b: b, queue: make(chan *spendReq, 4*maxBatch*flushers), maxBatch: maxBatch,
		timeout: timeout, stop: make(chan struct{}), onBatch: onBatch}
	for range flushers {
		s.wg.Add(1)
		go s.flusher()
	}
	return s
}

func (s *spender) close() {
	close(s.stop)
	s.wg.Wait()
}

// spend queues one spend and waits for its result. The returned request
// must be released with release after its result is read.
func (s *spender) spend(ctx context.Context, keys []string, costs []int64, nowMs int64) (*spendReq, error) {
	r := spendReqPool.Get().(*spendReq)
	r.op = bucket.SpendOp{Keys: keys, Costs: costs, NowMs: nowMs}
	return s.submit(ctx, r)
}

// start queues a Check's first step (begin and decide set) and waits
// for the batch to have carried it out. The returned request must be
// released with release.
func (s *spender) start(ctx context.Context, c *checkStart) (*spendReq, error) {
	r := spendReqPool.Get().(*spendReq)
	r.check = c
	return s.submit(ctx, r)
}

// submit queues r and waits for its batch.
func (s *spender) submit(ctx context.Context, r *spendReq) (*spendReq, error) {
	select {
	case s.queue <- r:
	case <-ctx.Done():
		release(r)
		return nil, ctx.Err()
	}
	select {
	case <-r.done:
		return r, nil
	case <-ctx.Done():
		// The flusher still owns r and will signal done; it is not reused.
		return nil, ctx.Err()
	}
}

func release(r *spendReq) {
	r.op, r.res, r.err = bucket.SpendOp{}, bucket.SpendResult{}, nil
	r.check, r.skip, r.at = nil, false, time.Time{}
	spendReqPool.Put(r)
}

// errBatchAbandoned: a spend batch's Redis call did not return within
// twice its timeout (a client that ignores its deadline); its spends are
// not decided, and the flusher goes on with a new caller.
var errBatchAbandoned = errors.New("redis: spend batch did not return in time; abandoned")

// batchCall is a flusher's caller of SpendBatch: a goroutine of its own,
// so that a call wedged past its deadline (a Redis client bug: it has been
// seen in a Cluster pipeline) holds up that goroutine only, not the
// flusher and every Check that queues behind it.
type batchCall struct {
	ops chan []bucket.SpendOp // closed when the flusher abandons or stops the caller
	out chan batchResult      // buffered (1): an abandoned call's late result is dropped
}

type batchResult struct {
	res []bucket.SpendResult
	err error
}

func (s *spender) newBatchCall() *batchCall {
	c := &batchCall{ops: make(chan []bucket.SpendOp), out: make(chan batchResult, 1)}
	go func() {
		for ops := range c.ops {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			res, err := s.b.SpendBatch(ctx, ops)
			cancel()
			c.out <- batchResult{res, err}
		}
	}()
	return c
}

// finish hands a batch's results on (decide) and wakes its callers.
func (s *spender) finish(batch []*spendReq) {
	if s.decide != nil {
		s.decide(batch)
	}
	for _, r := range batch {
		r.done <- struct{}{}
	}
}

func (s *spender) flusher() {
	defer s.wg.Done()
	batch := make([]*spendReq, 0, s.maxBatch)
	ops := make([]bucket.SpendOp, 0, s.maxBatch)
	sent := make([]*spendReq, 0, s.maxBatch) // the requests of ops
	call := s.newBatchCall()
	defer func() { close(call.ops) }()
	// A call gets twice its timeout (at least 1 s) before it is abandoned:
	// the Redis client's own deadline comes first unless it is broken.
	abandonAfter := max(2*s.timeout, time.Second)
	timer := time.NewTimer(abandonAfter)
	timer.Stop()
	for {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		case <-s.stop:
			return
		}
	fill:
		for len(batch) < s.maxBatch {
			select {
			case r := <-s.queue:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		if s.begin != nil {
			s.begin(batch)
		}
		sent = sent[:0]
		for _, r := range batch {
			if !r.skip {
				ops = append(ops, r.op)
				sent = append(sent, r)
			}
		}
		if len(ops) == 0 {
			s.finish(batch)
			clear(batch)
			batch = batch[:0]
			continue
		}
		call.ops <- ops
		timer.Reset(abandonAfter)
		var res []bucket.SpendResult
		var err error
		select {
		case r := <-call.out:
			timer.Stop()
			res, err = r.res, r.err
		case <-timer.C:
			// The wedged caller keeps its ops; the flusher takes new ones.
			err = errBatchAbandoned
			close(call.ops)
			call = s.newBatchCall()
			ops = make([]bucket.SpendOp, 0, s.maxBatch)
		}
		if s.onBatch != nil {
			s.onBatch(len(sent), err)
		}
		for i, r := range sent {
			if err != nil {
				r.err = err
			} else {
				r.res, r.err = res[i], res[i].Err
			}
		}
		s.finish(batch)
		clear(batch)
		clear(sent)
		clear(ops)
		batch, ops = batch[:0], ops[:0]
	}
}
