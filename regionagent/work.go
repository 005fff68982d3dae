package regionagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// workLoop carries out the core's actions as they become ready, and its
// timed work when it is due, until ctx ends. Nothing here runs per limit
// on a timer: an idle agent sleeps until its core's next wake-up.
func (a *Agent) workLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		a.work(ctx)
		a.mu.Lock()
		next, ok := a.core.NextWake()
		a.mu.Unlock()
		d := time.Hour
		if ok {
			d = max(0, next.Sub(a.opt.now()))
		}
		t.Reset(d)
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-t.C:
			now := a.opt.now()
			a.withCore(func(c *core.Core) { c.Tick(now) })
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// work carries out every action the core has ready, and those they lead
// to, until none is left. Store actions run here (several at a time);
// allocator calls run in the background, batched (their results come
// back as events, and wake the loop).
func (a *Agent) work(ctx context.Context) {
	for range 10000 {
		a.mu.Lock()
		rd := a.core.Ready()
		if !rd.Empty() {
			a.inflight.add() // under the lock: settle never sees it taken but not begun
		}
		var seq uint64
		if len(rd.Wake) > 0 {
			seq = a.wakeSeq.Add(1) // a Check deciding to wait from now on may miss these wakes (wait)
		}
		a.mu.Unlock()
		if rd.Empty() {
			return
		}
		a.execute(ctx, rd)
		// Waiters look again once the batch's deposits have landed: a
		// Wake names a limit whose lease this very batch deposits.
		a.mu.Lock()
		a.wakeLocked(rd.Wake)
		a.wokeSeq = max(a.wokeSeq, seq)
		a.mu.Unlock()
		a.inflight.done()
	}
}

// settle works until nothing is ready and nothing is in flight (store
// actions of any goroutine's work, allocator calls): the agent's state is
// then quiescent (shutdown, and tests stepping the agent by hand).
func (a *Agent) settle(ctx context.Context) {
	for range 1000 {
		a.work(ctx)
		a.inflight.wait()
		a.mu.Lock()
		more := a.core.HasReady()
		a.mu.Unlock()
		if !more || ctx.Err() != nil {
			return
		}
	}
}

// tick does the core's timed work due at the agent's now, and settles
// (tests step the agent's clock and call it).
func (a *Agent) tick(ctx context.Context) {
	now := a.opt.now()
	a.withCore(func(c *core.Core) { c.Tick(now) })
	a.settle(ctx)
}

// storeWorkers bounds the store actions of one Ready run at once.
const storeWorkers = 16

func (a *Agent) execute(ctx context.Context, rd core.Ready) {
	for _, f := range rd.Fallback {
		if f.Kind == 0 {
			a.m.fallbackMode.DeleteLabelValues(f.Limit)
		} else {
			a.m.fallbackMode.WithLabelValues(f.Limit).Set(float64(f.Kind))
		}
	}
	a.notes.log(a.log, rd.Notes)
	if len(rd.Acquires) > 0 {
		a.calls.acquires.add(a, rd.Acquires)
	}
	if len(rd.Returns) > 0 {
		a.calls.returns.add(a, rd.Returns)
	}
	if len(rd.Reports) > 0 {
		a.calls.reports.add(a, rd.Reports)
	}
	if len(rd.Shares) > 0 {
		a.calls.shares.add(a, rd.Shares)
	}
	if len(rd.Closes) > 0 {
		// Closes are background work (a window boundary closes every
		// lease of thousands of limits at once): they must not hold up the
		// rounds and deposits that Checks wait for.
		a.calls.closes.add(a, rd.Closes)
	}
	// A Ready's rounds, deposits and unlocks go to their store in one
	// call each (one Redis pipeline for all the limits they touch); they
	// run side by side, since actions of one Ready are independent.
	var jobs []func()
	for _, st := range []core.Store{core.Shared, core.Local} {
		if rs := ofStore(rd.Rounds, st, func(r core.Round) core.Store { return r.Store }); len(rs) > 0 {
			jobs = append(jobs, func() { a.rounds(ctx, st, rs) })
		}
		if ds := ofStore(rd.Deposits, st, func(d core.Deposit) core.Store { return d.Store }); len(ds) > 0 {
			jobs = append(jobs, func() { a.deposits(ctx, st, ds) })
		}
	}
	if len(rd.Installs) > 0 {
		jobs = append(jobs, func() { a.installs(ctx, rd.Installs) })
	}
	for _, op := range rd.Counters {
		jobs = append(jobs, func() {
			rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
			defer cancel()
			_, _ = a.store(op.Store).add(rctx, op.Key, op.Name, op.Delta)
		})
	}
	if len(rd.Unlocks) > 0 {
		jobs = append(jobs, func() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.opt.redisTimeout)
			defer cancel()
			a.shared.unlocks(uctx, rd.Unlocks)
		})
	}
	runAll(jobs, storeWorkers)
}

// ofStore returns the items of xs in store st.
func ofStore[T any](xs []T, st core.Store, storeOf func(T) core.Store) []T {
	var out []T
	for _, x := range xs {
		if storeOf(x) == st {
			out = append(out, x)
		}
	}
	return out
}

// runAll runs jobs on up to n goroutines and waits for them.
func runAll(jobs []func(), n int) {
	if len(jobs) == 1 {
		jobs[0]()
		return
	}
	work := make(chan func())
	var wg sync.WaitGroup
	for range min(n, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	for _, f := range jobs {
		work <- f
	}
	close(work)
	wg.Wait()
}

// rounds takes the limits' renewal locks (shared store) and reads their
// buckets, all in one call to store st.
func (a *Agent) rounds(ctx context.Context, st core.Store, rs []core.Round) {
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	res := a.store(st).rounds(rctx, rs)
	cancel()
	now := a.opt.now()
	if st == core.Shared {
		for i, r := range rs {
			if res[i].Err == nil && res[i].Locked {
				a.failover.sawAdmitted(r.Limit, r.Key.Window, res[i].Balance.Admitted, now)
			}
		}
	}
	a.withCore(func(c *core.Core) {
		for i, r := range rs {
			c.RoundRead(now, r, res[i])
		}
	})
}

// deposits stores leases, all in one call to store st.
func (a *Agent) deposits(ctx context.Context, st core.Store, ds []core.Deposit) {
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	res, errs := a.store(st).deposits(rctx, ds)
	cancel()
	for i, d := range ds {
		if errs[i] == nil && res[i].Status == store.Deposited {
			if st == core.Local {
				a.lm.leaseTokens.Add(float64(d.Tokens))
			} else {
				a.m.leaseTokens.Add(float64(d.Tokens))
			}
		}
	}
	now := a.opt.now()
	a.withCore(func(c *core.Core) {
		for i, d := range ds {
			unanswered := errs[i] != nil && st == core.Shared && redisUnavailable(errs[i])
			c.Deposited(now, d, res[i], errs[i], unanswered)
		}
	})
}

// deposit stores one lease (deposits).
func (a *Agent) deposit(ctx context.Context, d core.Deposit) {
	a.deposits(ctx, d.Store, []core.Deposit{d})
}

// closeAll closes leases, storeWorkers limits at a time.
func (a *Agent) closeAll(ctx context.Context, cls []core.Close) {
	jobs := make([]func(), len(cls))
	for i, cl := range cls {
		jobs[i] = func() { a.close(ctx, cl) }
	}
	runAll(jobs, storeWorkers)
}

func (a *Agent) close(ctx context.Context, cl core.Close) {
	s := a.store(cl.Store)
	res := make([]store.CloseResult, len(cl.IDs))
	errs := make([]error, len(cl.IDs))
	for i, id := range cl.IDs {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		res[i], errs[i] = s.close(rctx, cl.Key, id)
		cancel()
	}
	now := a.opt.now()
	a.withCore(func(c *core.Core) { c.Closed(now, cl, res, errs) })
}

// tracker counts work in flight; wait returns once none is. Unlike a
// sync.WaitGroup, work may start while another goroutine waits.
type tracker struct {
	mu   sync.Mutex // protects n
	n    int
	cond *sync.Cond
}

func (t *tracker) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.cond != nil {
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// waitFor waits like wait, but at most d; it reports whether nothing was
// in flight when it returned. (A wait that times out leaves one goroutine
// behind until the work ends.)
func (t *tracker) waitFor(d time.Duration) bool {
	t.mu.Lock()
	idle := t.n == 0
	t.mu.Unlock()
	if idle {
		return true // nothing to wait for, and no goroutine to start
	}
	done := make(chan struct{})
	go func() { t.wait(); close(done) }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

func (t *tracker) wait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cond == nil {
		t.cond = sync.NewCond(&t.mu)
	}
	for t.n > 0 {
		t.cond.Wait()
	}
}

// ---- allocator calls, batched ----

// callQueues batch the core's allocator work: every Acquire (Return,
// report) ready while a call is in flight goes in the next call, so
// concurrent renewals of many limits cost few calls.
type callQueues struct {
	acquires batcher[core.Acquire]
	returns  batcher[core.Return]
	reports  batcher[core.ReportRead]
	closes   batcher[core.Close] // store work, off the urgent path
	shares   batcher[core.ShareAcquire]
}

// maxPerCall bounds the items of one allocator call (the allocator takes
// up to 10,000).
const maxPerCall = 1000

// batcher queues items and sends them with up to callSenders calls in
// flight, each carrying everything queued (up to maxPerCall).
type batcher[T any] struct {
	send func(context.Context, []T)

	mu      sync.Mutex // protects queue, running
	queue   []T
	running int
}

// callSenders bounds one kind of allocator call in flight.
const callSenders = 2

func (b *batcher[T]) add(a *Agent, items []T) {
	b.mu.Lock()
	b.queue = append(b.queue, items...)
	start := b.running < callSenders
	if start {
		b.running++
	}
	b.mu.Unlock()
	if !start {
		return
	}
	a.inflight.add()
	go func() {
		defer a.inflight.done()
		for {
			b.mu.Lock()
			n := min(len(b.queue), maxPerCall)
			if n == 0 {
				b.running--
				b.mu.Unlock()
				return
			}
			batch := append([]T(nil), b.queue[:n]...)
			b.queue = b.queue[n:]
			b.mu.Unlock()
			b.send(a.runCtx(), batch)
		}
	}()
}

func (a *Agent) sendAcquires(ctx context.Context, reqs []core.Acquire) {
	if a.groups.active() {
		a.sendAcquiresByGroup(ctx, reqs) // groups.go
		return
	}
	sent, recv, resp, err := a.callAcquire(ctx, a.alloc, reqs)
	if err != nil {
		a.notes.callFailed(a.log, "lease requests", len(reqs), err)
		a.withCore(func(c *core.Core) { c.AcquireFailed(recv, reqs, ctx.Err() != nil) })
		return
	}
	gs := make([]core.Grant, len(reqs))
	for i, r := range resp.Results {
		gs[i] = grantOf(r)
	}
	a.withCore(func(c *core.Core) { c.Acquired(sent, recv, reqs, gs) })
}

// callAcquire sends one AcquireLeases call of reqs through cl; sent and
// recv are when it was sent and answered (the leases are timed from them).
func (a *Agent) callAcquire(ctx context.Context, cl *allocClient, reqs []core.Acquire) (sent, recv time.Time, resp *pb.AcquireLeasesResponse, err error) {
	in := make([]*pb.LeaseRequest, len(reqs))
	for i, r := range reqs {
		choice := pb.WindowChoice_WINDOW_CHOICE_CURRENT
		if r.Next {
			choice = pb.WindowChoice_WINDOW_CHOICE_NEXT
		}
		in[i] = &pb.LeaseRequest{RequestId: r.RequestID, LimitId: r.Limit, Window: choice,
			DemandPerSecond: r.Demand, HeldTokens: r.Held, WantTokens: r.Want}
	}
	sent = a.opt.now()
	err = cl.call(ctx, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
		var err error
		resp, err = ac.AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: a.cfg.Region, Requests: in}, opts...)
		return err
	})
	recv = a.opt.now()
	if err == nil && len(resp.Results) != len(reqs) {
		err = fmt.Errorf("regionagent: the allocator answered %d of %d lease requests", len(resp.Results), len(reqs))
	}
	return sent, recv, resp, err
}

func grantOf(r *pb.LeaseResult) core.Grant {
	if r.Code != pb.ItemCode_ITEM_CODE_OK {
		return core.Grant{Message: r.Code.String() + ": " + r.Message}
	}
	ls := r.Lease
	if ls == nil {
		return core.Grant{OK: true}
	}
	return core.Grant{OK: true, LeaseID: ls.LeaseId, Tokens: ls.Tokens, Window: ls.WindowIndex, WindowLen: dur(ls.Window), WindowPhase: dur(ls.WindowPhase),
		WindowCal: calOf(ls.Calendar), StartsIn: dur(ls.StartsIn), ExpiresIn: dur(ls.ExpiresIn), WindowLeft: dur(ls.WindowLeft), PoolLeft: ls.PoolLeft,
		ShareSpent: ls.ShareSpent, Replayed: r.Replayed}
}

func dur(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

func (a *Agent) sendReturns(ctx context.Context, rets []core.Return) {
	if a.groups.active() {
		a.sendReturnsByGroup(ctx, rets) // groups.go
		return
	}
	a.sendReturnsTo(ctx, a.alloc, rets)
}

// sendReturnsTo sends rets in one ReturnLeases call through cl.
func (a *Agent) sendReturnsTo(ctx context.Context, cl *allocClient, rets []core.Return) {
	in := make([]*pb.LeaseReturn, len(rets))
	var tokens int64
	for i, r := range rets {
		in[i] = &pb.LeaseReturn{LimitId: r.Limit, LeaseId: r.LeaseID, Unspent: r.Unspent}
		tokens += r.Unspent
	}
	err := cl.call(ctx, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
		_, err := ac.ReturnLeases(ctx, &pb.ReturnLeasesRequest{Region: a.cfg.Region, Returns: in}, opts...)
		return err
	})
	now := a.opt.now()
	if err != nil {
		a.notes.callFailed(a.log, "lease returns (sent again when the allocator answers)", len(rets), err)
	} else {
		a.m.returned.Add(float64(tokens))
	}
	a.withCore(func(c *core.Core) { c.ReturnsDone(now, rets, err) })
}

// runCtx is the context of the agent's run (background calls end with it).
func (a *Agent) runCtx() context.Context {
	if p := a.running.Load(); p != nil {
		return *p
	}
	return context.Background()
}

// noteLog logs the core's notes and failed calls, at most one line per
// kind per call of log (a window boundary in a partition makes thousands
// of limits fail at once: one line says so, with a count and an example).
type noteLog struct {
	mu       sync.Mutex // protects lastFail, quieted
	lastFail map[string]time.Time
	quieted  map[string]int // lines left out since the last of their kind
}

// every reports whether a line of kind what may be logged now (at most
// one a second), and how many were left out since the last one.
func (n *noteLog) every(what string, count int) (bool, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lastFail == nil {
		n.lastFail, n.quieted = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if now.Sub(n.lastFail[what]) < time.Second {
		n.quieted[what] += count
		return false, 0
	}
	left := n.quieted[what]
	n.lastFail[what], n.quieted[what] = now, 0
	return true, left
}

func (n *noteLog) log(l *slog.Logger, notes []core.Note) {
	if len(notes) == 0 {
		return
	}
	type agg struct {
		count int
		first core.Note
	}
	byKind := map[core.NoteKind]*agg{}
	var order []core.NoteKind
	for _, x := range notes {
		g := byKind[x.Kind]
		if g == nil {
			g = &agg{first: x}
			byKind[x.Kind] = g
			order = append(order, x.Kind)
		}
		g.count++
	}
	for _, k := range order {
		g := byKind[k]
		attrs := []any{"limits", g.count, "limit", vocab.Cap(g.first.Limit, maxLogValue)}
		if g.first.Lease != "" {
			attrs = append(attrs, "lease", vocab.Cap(g.first.Lease, maxLogValue))
		}
		if g.first.Text != "" {
			attrs = append(attrs, "detail", vocab.Cap(g.first.Text, maxLogValue))
		}
		switch k {
		case core.NoteRefused:
			l.Warn("lease request refused", attrs...)
		case core.NoteFallback:
			l.Warn("lease request failed; the limit's fallback applies until the allocator answers", attrs...)
		case core.NoteStranded:
			l.Warn("deposit unanswered; the lease stays stranded", attrs...)
		case core.NoteReturning:
			l.Warn("deposit failed; returning the lease", attrs...)
		case core.NoteDrained:
			l.Info("returning in-process leases", attrs...)
		case core.NoteReturnLost:
			l.Warn("unacknowledged lease returns dropped over the cap; their tokens stay stranded", attrs...)
		case core.NoteCrossSlot:
			// Every such Check is refused (InvalidArgument): once a second
			// is enough to find the callers, or the Envoy mapping, to fix.
			if ok, left := n.every("cross-slot", g.count); ok {
				l.Warn("CheckMulti refused: its limits do not share a hash tag, which Redis Cluster needs",
					append(attrs, "refused_since_last_line", left)...)
			}
		}
	}
}

// callFailed logs a failed allocator call, at most once a second per kind.
func (n *noteLog) callFailed(l *slog.Logger, what string, items int, err error) {
	if errors.Is(err, errBreakerOpen) {
		return // the breaker's opening was logged once (allocatorHealth)
	}
	if ok, _ := n.every(what, 1); ok {
		l.Warn("allocator call failed: "+what, "items", items, "err", vocab.Cap(err.Error(), maxLogValue))
	}
}

// maxLogValue caps every string the agent logs from its input or from
// other services (ids, messages, errors).
const maxLogValue = 512
