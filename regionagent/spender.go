package regionagent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"leasehold/regionagent/bucket"
)

// spendReq is one Check's spend waiting for its batch.
type spendReq struct {
	op  bucket.SpendOp
	res bucket.SpendResult
	err error
	// A Check's first step (the spender's hooks set): begun in the core
	// by the batch (check, which points at cs), and decided by it when it
	// spends in Redis; skip: it does not (it goes on in its caller); at:
	// when the batch was sent. cs is kept in the request so that a Check
	// allocates no checkStart of its own.
	check *checkStart
	cs    checkStart
	skip  bool
	at    time.Time
	// key backs op.Keys for a Check of one limit: no slice made per
	// Check (SpendBatch copies the names into its commands).
	key [1]string
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
	// onBatch sees each batch's size, how long its Redis call took (to
	// its answer, or to its abandonment), and its error (non-nil only when no
	// spend of the batch was decided: Redis did not answer).
	onBatch func(n int, took time.Duration, err error)
	// begin and decide, when set, are called with every batch before
	// its spends are sent and after their results are set: begin sets
	// each request's op (or skip), decide hands the results on. They let
	// a batch of Checks be begun and decided in the core at once.
	begin, decide func(reqs []*spendReq)
	// onFire and onLateFire, when set (tests), are called as a batch's
	// watchdog timer fires, before the watchdog looks at the batch, and
	// as a flusher whose call returned first waits for that watchdog.
	onFire, onLateFire func()
}

func newSpender(b *bucket.Buckets, flushers, maxBatch int, timeout time.Duration, onBatch func(int, time.Duration, error)) *spender {
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
func (s *spender) spend(ctx context.Context, keys []string, costs []int64, counted []bool, nowMs int64, dep *bucket.Deposit) (*spendReq, error) {
	r := spendReqPool.Get().(*spendReq)
	r.op = bucket.SpendOp{Keys: keys, Costs: costs, Counted: counted, NowMs: nowMs, Deposit: dep}
	return s.submit(ctx, r)
}

// start queues the Check's first step of r (from checkReq, its cs set:
// begin and decide set) and waits for the batch to have carried it out;
// the begun Check is then r.cs.chk. The returned request must be released
// with release.
func (s *spender) start(ctx context.Context, r *spendReq) (*spendReq, error) {
	r.check = &r.cs
	return s.submit(ctx, r)
}

// checkReq is a request from the pool for a Check's first step, for
// start: its cs is set by the caller.
func checkReq() *spendReq { return spendReqPool.Get().(*spendReq) }

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
	r.check, r.cs, r.skip, r.at, r.key = nil, checkStart{}, false, time.Time{}, [1]string{}
	spendReqPool.Put(r)
}

// errBatchAbandoned: a spend batch's Redis call did not return within
// twice its timeout (a client that ignores its deadline); its spends are
// not decided, and the flusher goes on with a new caller.
var errBatchAbandoned = errors.New("redis: spend batch did not return in time; abandoned")

// finish hands a batch's results on (decide) and wakes its callers.
func (s *spender) finish(batch []*spendReq) {
	if s.decide != nil {
		s.decide(batch)
	}
	for _, r := range batch {
		r.done <- struct{}{}
	}
}

// flusher runs flush until the spender stops. One abandoned in a wedged
// call hands its place in wg to its replacement, so close does not wait
// for the call.
func (s *spender) flusher() {
	if !s.flush() {
		s.wg.Done()
	}
}

// flush is a flusher's loop: it takes every spend waiting (up to
// maxBatch) and sends them in one SpendBatch call, made on its own
// goroutine. A call that has not returned within twice its timeout (at
// least 1 s; the Redis client's own deadline comes first unless it is
// broken: a wedged Cluster pipeline has been seen) is abandoned by a
// watchdog timer: its spends are answered errBatchAbandoned at once, a
// replacement flusher takes new ones, and when the wedged call returns
// at last, flush drops its results and reports true. A call on the
// flusher's own goroutine costs no hand-off to a caller goroutine and
// back: two wake-ups fewer per batch, which a lone Check waits for.
func (s *spender) flush() (abandoned bool) {
	batch := make([]*spendReq, 0, s.maxBatch)
	ops := make([]bucket.SpendOp, 0, s.maxBatch)
	var scratch bucket.SpendScratch          // SpendBatchInto's buffers, reused
	sent := make([]*spendReq, 0, s.maxBatch) // the requests of ops
	abandonAfter := max(2*s.timeout, time.Second)
	// One watchdog timer per flusher, reset for each batch: no timer and
	// closure made per batch.
	w := &watchdog{s: s, fired: make(chan struct{}, 1)}
	for {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		case <-s.stop:
			return false
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
		// The watchdog's batch; then outcome 0 (the call runs), set
		// after the batch so that a watchdog that sees 0 sees the batch.
		w.batch, w.sent, w.sentAt = batch, sent, time.Now()
		w.outcome.Store(0)
		if w.timer == nil {
			w.timer = time.AfterFunc(abandonAfter, w.fire)
		} else {
			w.timer.Reset(abandonAfter)
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		res, err := s.b.SpendBatchInto(ctx, ops, &scratch)
		took := time.Since(w.sentAt)
		cancel()
		stopped := w.timer.Stop()
		if !w.outcome.CompareAndSwap(0, 1) {
			return true // the watchdog answered the batch; its slices are its
		}
		w.batch, w.sent = nil, nil
		s.conclude(batch, sent, res, took, err)
		if !stopped {
			// The timer fired as the call returned: its watchdog lost the
			// race above and must be done before the next batch sets
			// outcome to 0 again (it would abandon that batch).
			if s.onLateFire != nil {
				s.onLateFire()
			}
			<-w.fired
		}
		clear(batch)
		clear(sent)
		clear(ops)
		batch, ops = batch[:0], ops[:0]
	}
}

// watchdog abandons a flusher's batch whose Redis call has not returned
// in time (flush). The flusher sets batch and sent, then outcome to 0,
// before each call; its timer runs fire.
type watchdog struct {
	s           *spender
	timer       *time.Timer
	batch, sent []*spendReq
	sentAt      time.Time // when the batch's call began
	// outcome: 0 while the call runs, then 1 (it returned) or 2 (the
	// watchdog abandoned it), whichever comes first.
	outcome atomic.Int32
	// fired receives once each time fire has run (buffered 1): a flusher
	// whose timer could not be stopped waits for it.
	fired chan struct{}
}

// fire answers the running batch errBatchAbandoned, unless its call has
// returned, and starts a replacement flusher.
func (w *watchdog) fire() {
	if w.s.onFire != nil {
		w.s.onFire()
	}
	if w.outcome.CompareAndSwap(0, 2) {
		w.s.conclude(w.batch, w.sent, nil, time.Since(w.sentAt), errBatchAbandoned)
		go w.s.flusher() // in this flusher's place in wg
	}
	w.fired <- struct{}{}
}

// conclude sets a sent batch's results (err: none was decided) and
// finishes it. res is the flusher's scratch: a Check's result is handed
// on (decide) before the flusher's next batch, a plain spend's is copied.
func (s *spender) conclude(batch, sent []*spendReq, res []bucket.SpendResult, took time.Duration, err error) {
	if s.onBatch != nil {
		s.onBatch(len(sent), took, err)
	}
	for i, r := range sent {
		if err != nil {
			r.err = err
		} else {
			r.res, r.err = res[i], res[i].Err
			if r.check == nil && r.res.Keys != nil {
				// A plain spend's caller reads its result after the
				// flusher has gone on (and after it released r): a
				// copy of its own.
				r.res.Keys = slices.Clone(r.res.Keys)
			}
		}
	}
	s.finish(batch)
}
