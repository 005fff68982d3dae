package allocator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// commitTiming says how long one transaction may take and how long a
// failed one is retried.
type commitTiming struct {
	// attempt is the timeout of a transaction's first attempt. A proposal
	// that an etcd member forwarded to a raft leader that then died waits
	// out its timeout, so it is short: within an election.
	attempt time.Duration
	// budget bounds the retries of a failed transaction, from its first
	// failure; then the term ends.
	budget time.Duration
	// backoff between retries that failed fast.
	backoff func() backoff.BackOff
}

// hedge is how long a retry waits for an answer before it sends the same
// transaction once more beside the copies in flight (see hedged): half an
// attempt.
func (t commitTiming) hedge() time.Duration { return t.attempt / 2 }

// maxAttempt is how long one retry waits for any of its copies, so a slow
// but healthy etcd still gets through: four attempts.
func (t commitTiming) maxAttempt() time.Duration { return 4 * t.attempt }

// batch is the writes of one transaction, numbered in the order taken.
type batch struct {
	seq uint64
	ops []*pendingOp
}

// committer group-commits writes: workers take up to maxOps queued writes
// at a time and commit them in one fenced etcd transaction. While a
// transaction is in flight new writes queue up, so under load each
// transaction carries many grants; an idle allocator commits one write at
// once with no added delay. Safe for concurrent use.
//
// A transaction that fails because etcd could not answer (its raft leader
// changed or died, the member the client spoke to died, the attempt timed
// out) is retried within the term, still fenced, so a retry can never
// land after the term really ended: a leader change of etcd costs the
// time of its election, not the allocator's leadership. While a failed
// transaction is retried, no other starts: retries commit in the order
// the writes were taken, and a write that a later transaction already
// committed is not written again (see superseded). The outcome of a
// timed-out attempt is unknown; writing it again is safe because every
// write is a whole record (a put of the record's current state, or a
// delete). Only a fenced transaction (leadership lost), an error etcd will
// give again (too many ops, too large), or retries that outlast the budget
// end the term (onFail).
type committer struct {
	ctx     context.Context // the term: retries stop when it ends
	store   *Store
	fence   Fence
	maxOps  int
	timing  commitTiming
	onFail  func(error) // ends the term; called once per failed commit
	metrics *metrics

	mu         sync.Mutex // protects the fields below
	cond       *sync.Cond
	queue      []*pendingOp
	closed     error
	seq        uint64                   // batches taken so far
	inflight   map[uint64]bool          // seqs of the transactions in flight
	failed     []*batch                 // failed batches waiting for their retry
	recovering bool                     // a worker retries the failed batches; take hands out nothing
	committed  map[uint64][]clientv3.Op // writes of batches that committed while an older one was in flight
	wg         sync.WaitGroup
}

func newCommitter(ctx context.Context, s *Store, f Fence, maxOps, workers int, timing commitTiming, m *metrics, onFail func(error)) *committer {
	c := &committer{ctx: ctx, store: s, fence: f, maxOps: max(1, maxOps), timing: timing, metrics: m, onFail: onFail,
		inflight: map[uint64]bool{}, committed: map[uint64][]clientv3.Op{}}
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

// take waits for queued writes (none are handed out while failed ones are
// retried) and returns the next batch, now in flight; nil once closed.
func (c *committer) take() *batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	for (len(c.queue) == 0 || c.recovering) && c.closed == nil {
		c.cond.Wait()
	}
	if c.closed != nil {
		return nil
	}
	n := min(len(c.queue), max(1, c.maxOps-1)) // room for a retry's mark (CommitBatch)
	b := &batch{ops: make([]*pendingOp, n)}
	copy(b.ops, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	c.seq++
	b.seq = c.seq
	c.inflight[b.seq] = true
	return b
}

func (c *committer) worker() {
	defer c.wg.Done()
	for {
		b := c.take()
		if b == nil {
			return
		}
		err := c.attempt(b)
		if err != nil && retryable(err) && c.ctx.Err() == nil {
			c.retryLater(b, err)
			continue
		}
		c.finish(b, err)
	}
}

// attempt runs b's first fenced transaction, within the attempt timeout.
func (c *committer) attempt(b *batch) error {
	txn := make([]clientv3.Op, len(b.ops))
	for i, p := range b.ops {
		txn[i] = p.op
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.timing.attempt)
	start := time.Now()
	err := c.store.CommitBatch(ctx, c.fence, b.seq, txn, false)
	cancel()
	c.metrics.txnOps.Observe(float64(len(txn)))
	c.metrics.txnDur.Observe(time.Since(start).Seconds())
	return err
}

// finish completes an in-flight batch with err (and ends the term if err
// is not nil).
func (c *committer) finish(b *batch, err error) {
	c.mu.Lock()
	delete(c.inflight, b.seq)
	if err == nil && c.olderPending(b.seq) {
		// An older transaction may still fail and be retried: it must not
		// write again what this one wrote.
		c.committed[b.seq] = opsOf(b.ops)
	}
	c.prune()
	c.cond.Broadcast()
	c.mu.Unlock()
	complete(b.ops, err)
	if err != nil {
		c.metrics.txnFailures.Inc()
		c.onFail(err)
	}
}

func complete(ops []*pendingOp, err error) {
	for _, p := range ops {
		p.err = err
		p.op = clientv3.Op{} // release the encoded record
		close(p.done)
	}
}

// olderPending reports whether a batch older than seq is in flight or
// failed (c.mu held).
func (c *committer) olderPending(seq uint64) bool {
	for s := range c.inflight {
		if s < seq {
			return true
		}
	}
	for _, b := range c.failed {
		if b.seq < seq {
			return true
		}
	}
	return false
}

// prune forgets the keys of committed batches no older batch can need
// (c.mu held).
func (c *committer) prune() {
	for s := range c.committed {
		if !c.olderPending(s) {
			delete(c.committed, s)
		}
	}
}

// retryLater puts a failed batch aside for its retry. The first worker to
// fail becomes the one that retries: it waits until no transaction is in
// flight, then retries every failed batch in order, while take hands out
// nothing.
func (c *committer) retryLater(b *batch, cause error) {
	c.mu.Lock()
	delete(c.inflight, b.seq)
	c.failed = append(c.failed, b)
	if c.recovering {
		c.cond.Broadcast()
		c.mu.Unlock()
		return
	}
	c.recovering = true
	for len(c.inflight) > 0 {
		c.cond.Wait()
	}
	failed := c.failed
	c.failed = nil
	slices.SortFunc(failed, func(x, y *batch) int { return cmp.Compare(x.seq, y.seq) })
	committed := make(map[uint64][]clientv3.Op, len(c.committed))
	for s, k := range c.committed {
		committed[s] = k
	}
	c.mu.Unlock()

	err := c.recover(failed, committed, cause)

	c.mu.Lock()
	c.recovering = false
	c.prune()
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		c.metrics.txnFailures.Inc()
		c.onFail(err)
	}
}

// recover retries the failed batches in order until each commits; on an
// error that ends the term it fails them all and returns it.
func (c *committer) recover(failed []*batch, committed map[uint64][]clientv3.Op, cause error) error {
	start := time.Now()
	bo := c.timing.backoff()
	bo.Reset()
	for i, b := range failed {
		// The batch less what later batches overwrote, plus their newest
		// state of those keys: b's first attempt may still land after
		// them (before this retry; after it, the retry's mark voids it).
		ops := append(opsOf(superseded(b, committed)), restored(b, committed)...)
		for len(ops) > 0 {
			wait := bo.NextBackOff()
			if wait == backoff.Stop || time.Since(start)+wait >= c.timing.budget {
				err := fmt.Errorf("allocator: commit not landed after retrying for %v: %w", time.Since(start).Round(time.Millisecond), cause)
				c.failAll(failed[i:], err)
				return err
			}
			select {
			case <-c.ctx.Done():
				err := fmt.Errorf("%w: %v", errTermEnded, cause)
				c.failAll(failed[i:], err)
				return err
			case <-time.After(wait):
			}
			err := c.hedged(b.seq, ops)
			if err == nil {
				break
			}
			if !retryable(err) || c.ctx.Err() != nil {
				c.failAll(failed[i:], err)
				return err
			}
			cause = err
		}
		complete(b.ops, nil)
	}
	return nil
}

// hedged retries one transaction: it sends it, and sends it again beside
// the copies in flight each time hedge passes without an answer, until
// one commits or fails for good, all failed, or maxAttempt passed (every
// hedge interval, at most maxAttempt / hedge copies). Why
// copies rather than a longer timeout: a proposal that an etcd member
// forwarded to a raft leader that then died is lost, and its request
// waits until its deadline; a copy sent once the members elected a new
// leader commits at once, so the retry costs the election, not the
// election plus a timeout. A slow etcd still gets maxAttempt for the
// first copy. Copies are harmless: each is marked (Store.CommitBatch), so
// the first to commit makes every other copy of the batch, and the timed
// out first attempt, do nothing if they land later, after newer batches.
func (c *committer) hedged(seq uint64, txn []clientv3.Op) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.timing.maxAttempt())
	defer cancel()
	results := make(chan error, 1+int(c.timing.maxAttempt()/max(c.timing.hedge(), time.Millisecond)))
	send := func() {
		c.metrics.txnRetries.Inc()
		c.metrics.txnOps.Observe(float64(len(txn)))
		go func() {
			start := time.Now()
			err := c.store.CommitBatch(ctx, c.fence, seq, txn, true)
			c.metrics.txnDur.Observe(time.Since(start).Seconds())
			results <- err
		}()
	}
	send()
	sent, answered := 1, 0
	again := time.NewTimer(c.timing.hedge())
	defer again.Stop()
	var last error
	for {
		select {
		case err := <-results:
			answered++
			if err == nil || !retryable(err) {
				return err
			}
			last = err
			if answered == sent {
				return last // every copy failed: back off, then retry
			}
		case <-again.C:
			if sent < cap(results) {
				send()
				sent++
				again.Reset(c.timing.hedge())
			}
		case <-ctx.Done():
			if last == nil || c.ctx.Err() != nil {
				last = ctx.Err()
			}
			return fmt.Errorf("allocator: commit %d ops: no copy answered within %v: %w", len(txn), c.timing.maxAttempt(), last)
		}
	}
}

func (c *committer) failAll(bs []*batch, err error) {
	for _, b := range bs {
		complete(b.ops, err)
	}
}

// opKey is what one write touches: a key, or the range [key, end) of a
// range delete.
type opKey struct {
	key, end string
}

func opsOf(ops []*pendingOp) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, p := range ops {
		out[i] = p.op
	}
	return out
}

func keyOf(op clientv3.Op) opKey {
	return opKey{key: string(op.KeyBytes()), end: string(op.RangeBytes())}
}

// covers reports whether l (a key or a range) includes key k.
func (l opKey) covers(k string) bool {
	if l.end == "" {
		return l.key == k
	}
	return l.key <= k && (l.end == "\x00" || k < l.end)
}

// restored returns, for each of b's single-key writes that a later
// committed batch overwrote, the newest later state of that key: the
// later put, or a delete of the key if a later delete covered it.
func restored(b *batch, committed map[uint64][]clientv3.Op) []clientv3.Op {
	var later []uint64
	for s := range committed {
		if s > b.seq {
			later = append(later, s)
		}
	}
	if len(later) == 0 {
		return nil
	}
	slices.Sort(later)
	var out []clientv3.Op
	seen := map[string]bool{}
	for _, p := range b.ops {
		k := string(p.op.KeyBytes())
		if len(p.op.RangeBytes()) != 0 || seen[k] {
			continue
		}
		var newest *clientv3.Op
		for _, s := range later {
			for i, op := range committed[s] {
				if keyOf(op).covers(k) {
					newest = &committed[s][i]
				}
			}
		}
		if newest == nil {
			continue
		}
		seen[k] = true
		if newest.IsPut() && len(newest.RangeBytes()) == 0 {
			out = append(out, *newest)
		} else {
			out = append(out, clientv3.OpDelete(k))
		}
	}
	return out
}

// superseded returns b's writes less those that a later transaction
// (committed, by seq) already overwrote: a put or delete of the same key,
// or a range delete that covers it. Writing them again would put an older
// state back. (A later put inside a range that b deletes cannot happen: a
// window's records are deleted only after nothing writes them any more.)
func superseded(b *batch, committed map[uint64][]clientv3.Op) []*pendingOp {
	var later []opKey
	for s, ops := range committed {
		if s > b.seq {
			for _, op := range ops {
				later = append(later, keyOf(op))
			}
		}
	}
	if len(later) == 0 {
		return b.ops
	}
	out := make([]*pendingOp, 0, len(b.ops))
	for _, p := range b.ops {
		k := string(p.op.KeyBytes())
		if len(p.op.RangeBytes()) == 0 && slices.ContainsFunc(later, func(l opKey) bool { return l.covers(k) }) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// retryable reports whether a failed commit may succeed if sent again:
// etcd (or the member the client spoke to) could not answer in time or
// had no raft leader. A fenced commit, and errors etcd would give again,
// are not.
func retryable(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrFenced), errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	switch status.Code(err) { // (it looks through wraps)
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	// A member without a raft leader drops proposals ("raft proposal
	// dropped"), and a member being stopped fails them ("raft: stopped");
	// etcd passes raft's errors on without a code.
	msg := err.Error()
	return strings.Contains(msg, "raft proposal dropped") || strings.Contains(msg, "raft: stopped")
}

// close fails every queued write with err and stops the workers once their
// in-flight transactions (and retries) end.
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
