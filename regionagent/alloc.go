package regionagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"leasehold/allocator"
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
}

// errBreakerOpen fails a call at once while the allocator is known down.
var errBreakerOpen = errors.New("regionagent: allocator unreachable (circuit open)")

// breaker is a circuit breaker: after `trip` consecutive failed calls it
// opens for a cooldown that doubles (up to max) while probes keep failing,
// so a dead allocator costs nothing per renewal and every limit learns at
// once. One call at a time probes a half-open breaker. Safe for concurrent
// use.
type breaker struct {
	mu        sync.Mutex // protects the fields below
	failures  int
	openUntil time.Time
	cooldown  time.Duration
	probing   bool
}

const (
	breakerTrip = 3
	breakerMin  = 500 * time.Millisecond
	breakerMax  = 10 * time.Second
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

// done records a call's outcome.
func (b *breaker) done(now time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if ok {
		b.failures, b.cooldown = 0, 0
		return
	}
	b.failures++
	if b.failures >= breakerTrip {
		b.cooldown = min(breakerMax, max(breakerMin, 2*b.cooldown))
		b.openUntil = now.Add(b.cooldown)
	}
}

// open reports whether the breaker is open (the allocator is down).
func (b *breaker) open(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= breakerTrip && (now.Before(b.openUntil) || b.probing)
}

func newAllocClient(addrs []string, timeout, retryFor time.Duration, opts ...grpc.DialOption) *allocClient {
	return &allocClient{addrs: addrs, dialOpts: opts, timeout: timeout, retryFor: retryFor,
		conns: map[string]*grpc.ClientConn{}, cur: addrs[0]}
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

// call runs one allocator RPC with redirects and retries until it
// succeeds, fails for good, or retryFor (or ctx) runs out.
func (c *allocClient) call(ctx context.Context, fn func(ctx context.Context, cl pb.AllocatorClient, opts ...grpc.CallOption) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = time.Second
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = c.retryFor
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
		if v := trailer.Get(allocator.LeaderMetadataKey); len(v) > 0 && v[0] != addr {
			leader = v[0]
		}
		if leader != "" || len(c.addrs) > 1 || status.Code(err) == codes.Unavailable {
			c.next(leader)
		}
		return err
	}
	if !c.br.allow(time.Now()) {
		return errBreakerOpen
	}
	err := backoff.Retry(op, backoff.WithContext(b, ctx))
	if ctx.Err() == nil {
		c.br.done(time.Now(), err == nil || !retryable(err) && !errors.Is(err, context.DeadlineExceeded))
	}
	return err
}
