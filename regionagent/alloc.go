package regionagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"leasehold/internal/bounds"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// allocClient calls the allocator: it follows a follower's redirect to
// the leader, and retries retryable failures with jittered exponential
// backoff. A retried call is sent unchanged, so a grant retried after an
// ambiguous timeout keeps its request id and gets the same lease.
type allocClient struct {
	addrs    []string
	dialOpts []grpc.DialOption
	timeout  time.Duration // per attempt
	retryFor time.Duration // total, per call

	mu    sync.Mutex // protects conns, cur
	conns map[string]*grpc.ClientConn
	cur   string

	br breaker
	// onHealth is told when the breaker opens (false) and when a call
	// succeeds again after that (true).
	onHealth func(up bool)
	now      func() time.Time // the agent's clock: the breaker's cooldowns run on it

	// reconnected is told (without blocking) when a connection to an
	// allocator becomes READY again (alloc_ready.go); the sync loop syncs
	// on it. watchCtx ends the watchers on close.
	reconnected chan struct{}
	watchCtx    context.Context
	stopWatch   context.CancelFunc
}

// errBreakerOpen fails a call at once while the allocator is known down.
var errBreakerOpen = errors.New("regionagent: allocator unreachable (circuit open)")

// breaker is a circuit breaker: after `trip` consecutive failed calls it
// opens for a cooldown that doubles (up to max) while probes keep failing,
// so a dead allocator costs nothing per renewal and every limit learns at
// once. One call at a time probes a half-open breaker; the limit sync
// (every second) is such a call, so a healed allocator is found within
// about a second of the cooldown's cap. Safe for concurrent use.
type breaker struct {
	mu        sync.Mutex // protects the fields below
	failures  int
	openUntil time.Time
	cooldown  time.Duration
	probing   bool
	down      bool // the breaker opened and no call succeeded since
}

const (
	breakerTrip = 3
	breakerMin  = 250 * time.Millisecond
	breakerMax  = time.Second
)

// allow reports whether a call may go out now.
func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < breakerTrip {
		return true
	}
	if now.Before(b.openUntil) || b.probing {
		return false
	}
	b.probing = true // half-open: this call probes
	return true
}

// done records a call's outcome and reports a change of health: changed,
// and whether the allocator is up now.
func (b *breaker) done(now time.Time, ok bool) (changed, up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if ok {
		b.failures, b.cooldown = 0, 0
		changed, b.down = b.down, false
		return changed, true
	}
	b.failures++
	if b.failures >= breakerTrip {
		b.cooldown = min(breakerMax, max(breakerMin, 2*b.cooldown))
		b.openUntil = now.Add(b.cooldown)
		changed, b.down = !b.down, true
	}
	return changed, !b.down
}

// assumeDown marks the allocator down without waiting for breakerTrip
// failures (an agent that starts and cannot reach it: it has never been
// up for this process), so the next call probes at once and its success
// reports the allocator up. It reports whether that changed the health.
func (b *breaker) assumeDown(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return false
	}
	b.failures, b.cooldown, b.openUntil, b.down = breakerTrip, breakerMin, now, true
	return true
}

// open reports whether the breaker is open (the allocator is down).
func (b *breaker) open(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= breakerTrip && (now.Before(b.openUntil) || b.probing)
}

// connectParams make gRPC reconnect to an allocator that comes back
// within about a second: its default backoff grows to 120 s, which after a
// long outage kept a region denied for most of a minute.
var connectParams = grpc.ConnectParams{
	Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: time.Second,
}

func newAllocClient(addrs []string, timeout, retryFor time.Duration, now func() time.Time, onHealth func(up bool),
	opts ...grpc.DialOption) *allocClient {
	opts = append([]grpc.DialOption{
		grpc.WithConnectParams(connectParams),
		// A SyncLimits answer may be as large as the allocator sends.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(bounds.AllocatorMaxSend)),
		grpc.WithKeepaliveParams(bounds.AgentClientKeepalive),
	}, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	return &allocClient{addrs: addrs, dialOpts: opts, timeout: timeout, retryFor: retryFor,
		conns: map[string]*grpc.ClientConn{}, cur: addrs[0], onHealth: onHealth, now: now,
		reconnected: make(chan struct{}, 1), watchCtx: ctx, stopWatch: cancel}
}

func (c *allocClient) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("regionagent: dial allocator %s: %w", addr, err)
	}
	c.conns[addr] = cc
	go c.watchReady(cc)
	return cc, nil
}

func (c *allocClient) current() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// next moves to the named leader, or to the next configured address.
func (c *allocClient) next(leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if leader != "" {
		c.cur = leader
		return
	}
	for i, a := range c.addrs {
		if a == c.cur {
			c.cur = c.addrs[(i+1)%len(c.addrs)]
			return
		}
	}
	c.cur = c.addrs[0]
}

func (c *allocClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopWatch()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
}

func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// rpc is one allocator RPC on a connection.
type rpc func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error

// call runs one allocator RPC with redirects and retries until it
// succeeds, fails for good, or retryFor (or ctx) runs out.
func (c *allocClient) call(ctx context.Context, fn rpc) error { return c.callFor(ctx, c.retryFor, fn) }

// callFor is call with its own retry budget.
func (c *allocClient) callFor(ctx context.Context, retryFor time.Duration, fn rpc) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = time.Second
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = retryFor
	op := func() error {
		addr := c.current()
		cc, err := c.conn(addr)
		if err != nil {
			return backoff.Permanent(err)
		}
		actx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		var trailer metadata.MD
		err = fn(actx, pb.NewAllocatorClient(cc), grpc.Trailer(&trailer))
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return backoff.Permanent(ctx.Err())
		}
		if !retryable(err) {
			return backoff.Permanent(err)
		}
		leader := ""
		if v := trailer.Get(vocab.LeaderMetadataKey); len(v) > 0 && v[0] != addr {
			leader = v[0]
		}
		if leader != "" || len(c.addrs) > 1 || status.Code(err) == codes.Unavailable {
			c.next(leader)
		}
		return err
	}
	if !c.br.allow(c.now()) {
		return errBreakerOpen
	}
	err := backoff.Retry(op, backoff.WithContext(b, ctx))
	if ctx.Err() == nil {
		changed, up := c.br.done(c.now(), err == nil || !retryable(err) && !errors.Is(err, context.DeadlineExceeded))
		if changed && c.onHealth != nil {
			c.onHealth(up)
		}
	}
	return err
}
