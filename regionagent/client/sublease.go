package client

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
)

// closedLeft marks a chunk given back: no take can succeed on it.
const closedLeft = math.MinInt64 / 2

// maxCAS bounds the compare-and-swap attempts of one take; past it the
// decision goes the slow way (contention that high is not a fast path).
const maxCAS = 64

// reservation is one chunk reserved from the region (a sub-lease). Times
// are ns on the client's clock. Immutable but for left and kicked.
type reservation struct {
	left   atomic.Int64 // tokens left to spend; closedLeft once given back
	kicked atomic.Bool  // the next chunk was asked for

	id, limit   string
	nonce       uint64 // the decision ids' prefix
	granted     int64
	sent        int64 // when the (first) Reserve was sent
	deadline    int64 // no token is spent at or after this
	renewAt     int64 // ask for the next chunk from here on
	low         int64 // ... or when left drops below this
	resetAt     int64 // the window's end as the agent said
	regionLeft  int64 // the region's balance after the reservation
	limitTokens int64
	window      time.Duration
	version     int64
}

// take spends cost if the chunk is alive at now and holds it; it returns
// what is left.
func (r *reservation) take(now, cost int64) (int64, bool) {
	if now >= r.deadline {
		return 0, false
	}
	for range maxCAS {
		v := r.left.Load()
		if v < cost {
			return v, false
		}
		if r.left.CompareAndSwap(v, v-cost) {
			return v - cost, true
		}
	}
	return 0, false
}

// spent is what was spent from the chunk so far (0 once closed).
func (r *reservation) spent() int64 {
	l := r.left.Load()
	if l < 0 {
		return 0
	}
	return r.granted - l
}

// close makes the chunk unspendable and returns what was left, or -1 if it
// was closed before.
func (r *reservation) close() int64 {
	old := r.left.Swap(closedLeft)
	if old < 0 {
		return -1
	}
	return old
}

// unspent is what the chunk holds: 0 once given back, or for no chunk.
func (r *reservation) unspent() int64 {
	if r == nil {
		return 0
	}
	return max(0, r.left.Load())
}

// usable: spendable at now.
func (r *reservation) usable(now int64) bool { return now < r.deadline && r.left.Load() > 0 }

func (r *reservation) decision(now, left int64) Decision {
	return Decision{
		Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: left + r.regionLeft,
		ResetAfter: time.Duration(max(0, r.resetAt-now)),
		Limit:      r.limitTokens, Window: r.window, Version: r.version,
		ID: decisionIDWith(r.nonce), Source: SourceSubLease,
	}
}

// subDecision is r's decision of cost at now, with left after it, told to
// the local decision observer if there is one (the fast path, fromChunk,
// returns r.decision itself when there is none).
func (c *Client) subDecision(st *limitState, r *reservation, now, cost, left int64) Decision {
	d := r.decision(now, left)
	if c.opt.localObserver != nil {
		c.observe(st.id, cost, r.id, d)
	}
	return d
}

// subSlow is the sub-lease path when the current chunk could not serve:
// promote the chunk waiting next, or, if the limit is hot and nothing is
// on its way, reserve one now (this caller pays one Reserve instead of a
// Check). ok false: decide with a Check.
func (c *Client) subSlow(ctx context.Context, st *limitState, now, cost int64) (Decision, bool) {
	st.mu.Lock()
	if n := st.next; n != nil {
		st.next = nil
		c.retireLocked(st, st.cur.Swap(n), now)
		st.pending.Store(false)
	}
	if r := st.cur.Load(); r != nil {
		if left, ok := r.take(now, cost); ok {
			st.mu.Unlock()
			if (left < r.low || now >= r.renewAt) && r.kicked.CompareAndSwap(false, true) {
				c.kickRefill(st)
			}
			return c.subDecision(st, r, now, cost, left), true
		}
	}
	rate := st.observeLocked(now)
	if !c.chunkable(st, rate) || now < st.reserveAfter || st.dead || !st.pending.CompareAndSwap(false, true) {
		st.mu.Unlock()
		return Decision{}, false
	}
	c.hold(st)
	want, least := c.chunk(st, now, rate, cost)
	st.mu.Unlock()

	r, resp, err := c.reserve(ctx, st, want, least, false)

	st.mu.Lock()
	defer st.mu.Unlock()
	st.pending.Store(false)
	now = c.mono()
	if r == nil {
		c.backOffLocked(st, now, resp, err)
		return Decision{}, false
	}
	c.learnLocked(st, r)
	if st.dead || c.closed.Load() {
		c.retireLocked(st, r, now)
		return Decision{}, false
	}
	if shortLived(r, rate, now) {
		left, ok := r.take(now, cost)
		c.giveUpShortLocked(st, r, now)
		if !ok {
			return Decision{}, false
		}
		return c.subDecision(st, r, now, cost, left), true
	}
	c.retireLocked(st, st.cur.Swap(r), now)
	left, ok := r.take(now, cost)
	if !ok {
		return Decision{}, false
	}
	return c.subDecision(st, r, now, cost, left), true
}

// shortLived: at the caller's rate, less than half the chunk could be
// spent before its deadline. The agent takes tokens earliest deadline
// first and gives the chunk the deadline of the first lease it took from;
// it skips leases about to end when the others hold enough, but a chunk
// can still come from one (or from an older agent); kept, most of it
// would expire unspent, and reserved tokens that expire are lost to the
// window.
func shortLived(r *reservation, rate float64, now int64) bool {
	return float64(r.granted) > 2*rate*float64(r.deadline-now)/1e9
}

// giveUpShortLocked releases a short-lived chunk at once (its tokens go
// back to the region with the chunk's deadline, where Checks, earliest
// deadline first, spend them) and decides by Check until it would have
// expired (a Reserve before then would get the same short lease).
func (c *Client) giveUpShortLocked(st *limitState, r *reservation, now int64) {
	c.retireLocked(st, r, now)
	st.reserveAfter = max(st.reserveAfter, r.deadline)
}

// backOffLocked: no Reserve of this limit for a while after one failed or
// found the region short: the refusal's retry-after, from 250 ms to
// maxReserveBackOff. (An OVER_LIMIT's retry-after runs to the window's
// reset, but the refusal may have come between two of the region's
// leases, the next one landing a moment later: waiting to the reset
// would send the limit's every call to the agent until then. Checks keep
// deciding meanwhile; a Reserve a second costs the region little.)
func (c *Client) backOffLocked(st *limitState, now int64, resp *pb.ReserveResponse, err error) {
	wait := maxReserveBackOff
	if err == nil && resp != nil {
		wait = min(max(dur(resp.RetryAfter), 250*time.Millisecond), maxReserveBackOff)
		if reset := dur(resp.ResetAfter); reset > 0 {
			wait = min(wait, reset) // the next window has a pool of its own
		}
	}
	st.reserveAfter = now + int64(wait)
}

// maxReserveBackOff is the longest a limit waits after a Reserve that
// failed or was refused before it may ask again.
const maxReserveBackOff = time.Second

// learnLocked records what a reservation said about the limit.
func (c *Client) learnLocked(st *limitState, r *reservation) {
	st.limitTokens = r.limitTokens
	st.resetAt = r.resetAt
}

// chunk sizes the next reservation: the client's own rate over the
// horizon (WarmHorizon for a warm limit; or what is left of the window,
// if that is shorter), at least cost, at most MaxChunk and G (a warm
// chunk at most 1/64 of G). least is what is worth taking: a quarter of
// it (fewer tokens than that and plain Checks share the region's last
// tokens better), at least cost.
func (c *Client) chunk(st *limitState, now int64, rate float64, cost int64) (want, least int64) {
	h, warm := c.opt.sub.Horizon, rate < c.opt.sub.HotRate
	if warm {
		h = c.opt.sub.WarmHorizon
	}
	if st.resetAt > now && time.Duration(st.resetAt-now) < h {
		h = time.Duration(st.resetAt - now)
	}
	f := math.Ceil(rate * h.Seconds())
	want = 1
	if f > 1 {
		want = int64(min(f, 1<<50))
	}
	if c.opt.sub.MaxChunk > 0 {
		want = min(want, c.opt.sub.MaxChunk)
	}
	if st.limitTokens > 0 {
		want = min(want, st.limitTokens)
	}
	if warm {
		want = min(want, st.warmCap())
	}
	want = max(want, cost)
	least = min(want, max(cost, (want+3)/4))
	return want, least
}

// kickRefill asks for the next chunk in the background.
func (c *Client) kickRefill(st *limitState) {
	if !st.pending.CompareAndSwap(false, true) {
		return
	}
	c.hold(st)
	c.bgMu.RLock()
	if c.closed.Load() {
		c.bgMu.RUnlock()
		st.pending.Store(false)
		return
	}
	c.bg.Add(1)
	c.bgMu.RUnlock()
	go func() {
		defer c.bg.Done()
		c.refill(st)
	}()
}

// refill reserves the next chunk of a limit whose chunk runs low; it waits
// as next, or becomes current if the current one is spent.
func (c *Client) refill(st *limitState) {
	now := c.mono()
	st.mu.Lock()
	rate := st.observeLocked(now)
	if st.dead || st.next != nil || !c.chunkable(st, rate) || now < st.reserveAfter {
		st.pending.Store(st.next != nil)
		st.mu.Unlock()
		return
	}
	want, least := c.chunk(st, now, rate, 1)
	st.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.opt.retryFor+c.opt.timeout)
	defer cancel()
	r, resp, err := c.reserve(ctx, st, want, least, true)

	st.mu.Lock()
	now = c.mono()
	if r == nil {
		st.pending.Store(false)
		c.backOffLocked(st, now, resp, err)
		st.mu.Unlock()
		return
	}
	c.learnLocked(st, r)
	switch cur := st.cur.Load(); {
	case st.dead || c.closed.Load():
		// Closed meanwhile: give it back from here (this goroutine is one
		// Close waits for; a release started now would not be).
		st.pending.Store(false)
		unspent := r.close()
		if h := c.onRetire; h != nil {
			h(r, unspent, now)
		}
		st.mu.Unlock()
		if unspent > 0 {
			_, _ = c.releaseRPC(ctx, r, unspent)
		}
		return
	case shortLived(r, rate, now):
		st.pending.Store(false)
		c.giveUpShortLocked(st, r, now)
	case cur == nil || !cur.usable(now):
		st.cur.Store(r)
		c.retireLocked(st, cur, now)
		st.pending.Store(false)
	default:
		st.next = r // pending stays set until it is promoted
	}
	st.mu.Unlock()
}

// retireLocked closes a chunk no longer held and gives back what is left
// (in the background), also after its deadline: nothing is spent from it
// then, and the agent puts the tokens back into the leases they came from
// while those are not closed, whose close returns them to the allocator (a
// release not sent would count them as admitted and strand them).
func (c *Client) retireLocked(st *limitState, r *reservation, now int64) {
	if r == nil {
		return
	}
	unspent := r.close()
	if unspent < 0 {
		return
	}
	st.retired += r.granted - unspent
	if h := c.onRetire; h != nil {
		h(r, unspent, now)
	}
	if unspent > 0 {
		c.goRelease(r, unspent)
	}
}

// maxReleaseWorkers bounds the goroutines that send background releases
// (the agent's spend batch holds 128 ops).
const maxReleaseWorkers = 128

// queuedRelease is a background release waiting for a worker.
type queuedRelease struct {
	r       *reservation
	unspent int64
}

// goRelease releases in the background: queued for one of at most
// maxReleaseWorkers goroutines, started as needed, each ending when the
// queue is empty. A sweep that retires many chunks at once (traffic that
// moved on from many limits) sends their releases on a few goroutines,
// each sending one after another, instead of one goroutine per release,
// whose stack the call would grow every time.
func (c *Client) goRelease(r *reservation, unspent int64) {
	c.bgMu.RLock()
	if c.closed.Load() {
		c.bgMu.RUnlock()
		go c.release(queuedRelease{r, unspent}) // a straggler after Close: best effort
		return
	}
	c.bg.Add(1)
	c.bgMu.RUnlock()
	c.relMu.Lock()
	c.relQueue = append(c.relQueue, queuedRelease{r, unspent})
	start := c.relWorkers < maxReleaseWorkers
	if start {
		c.relWorkers++
	}
	c.relMu.Unlock()
	if start {
		go c.releaseWorker()
	}
}

// releaseWorker sends queued releases until the queue is empty.
func (c *Client) releaseWorker() {
	for {
		c.relMu.Lock()
		if len(c.relQueue) == 0 {
			c.relWorkers--
			c.relQueue = nil // its backing may have grown large
			c.relMu.Unlock()
			return
		}
		x := c.relQueue[0]
		c.relQueue[0] = queuedRelease{}
		c.relQueue = c.relQueue[1:]
		c.relMu.Unlock()
		c.release(x)
		c.bg.Done()
	}
}

// release sends one background release, retried within the client's
// retry budget.
func (c *Client) release(x queuedRelease) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opt.retryFor+c.opt.timeout)
	defer cancel()
	_, _ = c.releaseRPC(ctx, x.r, x.unspent)
}

func (c *Client) newReservationID() string {
	return c.idPrefix + strconv.FormatUint(c.seq.Add(1), 10)
}

// reserve asks the agent for a chunk. retry: retried with the same
// reservation id on failures that may be transient. nil reservation with a
// nil error: the region had fewer than least tokens (resp says why).
func (c *Client) reserve(ctx context.Context, st *limitState, want, least int64, retry bool) (*reservation, *pb.ReserveResponse, error) {
	req := &pb.ReserveRequest{LimitId: st.id, Tokens: want, MinTokens: least, ReservationId: c.newReservationID()}
	sent := c.mono() // expires_in is measured from here, whichever attempt succeeds
	attempt := func() (*pb.ReserveResponse, error) {
		actx, cancel := context.WithTimeout(ctx, c.opt.timeout)
		defer cancel()
		return c.rpc.Reserve(actx, req)
	}
	budget := c.opt.retryFor
	if !retry {
		budget = 0
	}
	resp, err := retryIdempotent(ctx, budget, attempt)
	if err != nil {
		switch code := status.Code(err); {
		case code == codes.Unimplemented:
			c.noReserveUntil.Store(c.mono() + int64(c.opt.reprobe))
		case !definite(code):
			// The reservation may exist: get it (same id) and give it back.
			c.abandon(req)
		}
		return nil, nil, wrapRPC("reserve", st.id, err)
	}
	if resp.Granted <= 0 {
		return nil, resp, nil
	}
	exp := dur(resp.ExpiresIn)
	margin := c.opt.margin + c.opt.releaseLead + time.Duration(float64(exp)*c.opt.driftPPM/1e6)
	r := &reservation{
		id: req.ReservationId, limit: st.id, granted: resp.Granted, sent: sent, deadline: sent,
		resetAt: sent + int64(dur(resp.ResetAfter)), regionLeft: max(0, resp.Remaining),
		limitTokens: resp.LimitTokens, window: dur(resp.Window), version: resp.LimitVersion,
		low: (resp.Granted + 3) / 4, nonce: rand.Uint64(),
	}
	if exp > margin {
		r.deadline = sent + int64(exp-margin)
	}
	r.renewAt = sent + (r.deadline-sent)*3/4
	r.left.Store(resp.Granted)
	if c.mono() >= r.deadline {
		// Dead on arrival (the window was ending): give it back.
		c.goRelease(r, r.close())
		return nil, resp, nil
	}
	return r, resp, nil
}

// definite: the agent certainly did not act on the request.
func definite(code codes.Code) bool {
	switch code {
	case codes.Unimplemented, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition,
		codes.PermissionDenied, codes.Unauthenticated, codes.OutOfRange, codes.AlreadyExists:
		return true
	}
	return false
}

// abandon gives back a reservation whose Reserve failed ambiguously: it
// asks again with the same id (the agent answers the same reservation, or
// makes it now) and releases all of it.
func (c *Client) abandon(req *pb.ReserveRequest) {
	c.bgMu.RLock()
	if c.closed.Load() {
		c.bgMu.RUnlock()
		return // the reservation, if any, expires and counts as spent
	}
	c.bg.Add(1)
	c.bgMu.RUnlock()
	go func() {
		defer c.bg.Done()
		budget := max(c.opt.retryFor, c.opt.timeout)
		ctx, cancel := context.WithTimeout(context.Background(), budget+c.opt.timeout)
		defer cancel()
		resp, err := retryIdempotent(ctx, budget, func() (*pb.ReserveResponse, error) {
			actx, cancel := context.WithTimeout(ctx, c.opt.timeout)
			defer cancel()
			return c.rpc.Reserve(actx, req)
		})
		if err != nil || resp.Granted <= 0 {
			return
		}
		r := &reservation{id: req.ReservationId, limit: req.LimitId, granted: resp.Granted, deadline: math.MaxInt64}
		_, _ = c.releaseRPC(ctx, r, resp.Granted)
	}()
}

// releaseRPC gives back unspent tokens of r (retried with the same id).
func (c *Client) releaseRPC(ctx context.Context, r *reservation, unspent int64) (int64, error) {
	sentAt := c.mono()
	req := &pb.ReleaseRequest{LimitId: r.limit, ReservationId: r.id, Unspent: unspent}
	resp, err := retryIdempotent(ctx, c.opt.retryFor, func() (*pb.ReleaseResponse, error) {
		actx, cancel := context.WithTimeout(ctx, c.opt.timeout)
		defer cancel()
		return c.rpc.Release(actx, req)
	})
	if f := c.opt.releaseObserver; f != nil {
		var returned int64
		if err == nil {
			returned = resp.Returned
		}
		f(unspent, returned, err)
	}
	if h := c.onRelease; h != nil {
		var returned int64 = -1
		if err == nil {
			returned = resp.Returned
		}
		h(r, sentAt, unspent, returned)
	}
	if err != nil {
		return 0, wrapRPC("release", r.limit, err)
	}
	return resp.Returned, nil
}

// retryIdempotent runs f, retrying failures that may be transient with
// jittered exponential backoff for at most budget (0: one attempt). Only
// for idempotent calls.
func retryIdempotent[T any](ctx context.Context, budget time.Duration, f func() (T, error)) (T, error) {
	op := func() (T, error) {
		v, err := f()
		if err != nil && definite(status.Code(err)) {
			return v, backoff.Permanent(err)
		}
		return v, err
	}
	if budget <= 0 {
		return f()
	}
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(20*time.Millisecond),
		backoff.WithMaxInterval(250*time.Millisecond),
		backoff.WithMaxElapsedTime(budget), // RandomizationFactor 0.5: jitter
	)
	return backoff.RetryWithData(op, backoff.WithContext(backoff.WithMaxRetries(b, 10), ctx))
}
