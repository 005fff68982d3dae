package allocator

import (
	"context"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pendingOp is one write waiting for its group commit.
type pendingOp struct {
	op   clientv3.Op
	done chan struct{} // closed once err is set
	err  error
}

func (p *pendingOp) isDone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait blocks until the op is committed (nil) or failed, or ctx ends.
func (p *pendingOp) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errTermEnded fails writes queued after a leadership term ended.
var errTermEnded = errors.New("allocator: leadership term ended before commit")

// committer group-commits writes: workers take up to maxOps queued writes
// at a time and commit them in one fenced etcd transaction. While a
// transaction is in flight new writes queue up, so under load each
// transaction carries many grants; an idle allocator commits one write at
// once with no added delay. Safe for concurrent use.
type committer struct {
	store   *Store
	fence   Fence
	maxOps  int
	timeout time.Duration
	onFail  func(error) // ends the term; called once per failed commit
	metrics *metrics

	mu     sync.Mutex // protects queue and closed
	cond   *sync.Cond
	queue  []*pendingOp
	closed error
	wg     sync.WaitGroup
}

func newCommitter(s *Store, f Fence, maxOps, workers int, timeout time.Duration, m *metrics, onFail func(error)) *committer {
	c := &committer{store: s, fence: f, maxOps: max(1, maxOps), timeout: timeout, metrics: m, onFail: onFail}
	c.cond = sync.NewCond(&c.mu)
	for range max(1, workers) {
		c.wg.Add(1)
		go c.worker()
	}
	return c
}

// enqueue queues a write; the returned op completes when it is committed.
func (c *committer) enqueue(op clientv3.Op) *pendingOp {
	p := &pendingOp{op: op, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed != nil {
		p.err = c.closed
		close(p.done)
		return p
	}
	c.queue = append(c.queue, p)
	c.cond.Signal()
	return p
}

func (c *committer) take() []*pendingOp {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.queue) == 0 && c.closed == nil {
		c.cond.Wait()
	}
	if len(c.queue) == 0 {
		return nil
	}
	n := min(len(c.queue), c.maxOps)
	batch := make([]*pendingOp, n)
	copy(batch, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	return batch
}

func (c *committer) worker() {
	defer c.wg.Done()
	for {
		batch := c.take()
		if batch == nil {
			return
		}
		ops := make([]clientv3.Op, len(batch))
		for i, p := range batch {
			ops[i] = p.op
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		start := time.Now()
		err := c.store.Commit(ctx, c.fence, ops)
		cancel()
		c.metrics.observeCommit(len(ops), time.Since(start), err)
		for _, p := range batch {
			p.err = err
			p.op = clientv3.Op{} // release the encoded record
			close(p.done)
		}
		if err != nil {
			// The in-memory state is now ahead of etcd (or the outcome is
			// unknown): the term must end and a new one reload from etcd.
			c.onFail(err)
		}
	}
}

// close fails every queued write with err and stops the workers once their
// in-flight transactions end.
func (c *committer) close(err error) {
	c.mu.Lock()
	if c.closed == nil {
		c.closed = err
	}
	q := c.queue
	c.queue = nil
	c.cond.Broadcast()
	c.mu.Unlock()
	for _, p := range q {
		p.err = err
		close(p.done)
	}
	c.wg.Wait()
}
