package regionagent

import (
	"context"
	"fmt"
	"time"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

// Reservation is the agent's answer to Reserve.
type Reservation struct {
	Decision
	// Granted tokens, to be spent by the caller only before ExpiresIn has
	// passed since it sent the request.
	Granted   int64
	ExpiresIn time.Duration
}

// Reserve takes up to tokens (at least minTokens) of the region's balance
// of limit for one client to spend in process. Idempotent by id.
func (a *Agent) Reserve(ctx context.Context, limit string, tokens, minTokens int64, id string) (Reservation, error) {
	l, err := a.lookup(limit)
	if err != nil {
		return Reservation{}, err
	}
	if err := allocator.ValidateRequestID("reservation_id", id); err != nil {
		return Reservation{}, fieldErr("reservation_id", "%s", err.(*allocator.FieldError).Reason)
	}
	if minTokens == 0 {
		minTokens = 1
	}
	switch {
	case tokens < 1 || tokens > l.tokens:
		return Reservation{}, fieldErr("tokens", "must be 1..%d (the limit's G), got %d", l.tokens, tokens)
	case minTokens < 1 || minTokens > tokens:
		return Reservation{}, fieldErr("min_tokens", "must be 1..tokens, got %d", minTokens)
	}
	now := a.opt.now()
	st := a.state(l, now)
	w := a.windowOf(now, l)
	out := Reservation{Decision: Decision{Limit: l.tokens, Window: l.window, Version: l.version,
		ResetAfter: max(0, a.windowEnd(w).Sub(now))}}
	if a.rh.isDown() {
		// Sub-leases live in the shared bucket only: while Redis is down the
		// client falls back to per-request Checks, served in process.
		out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
		return out, nil
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	r, err := a.buckets.Reserve(rctx, bucket.Key(l.id, w.Index), id, tokens, minTokens, a.redisNowMs())
	cancel()
	if err != nil {
		out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
		return out, nil
	}
	out.Remaining = r.Balance
	switch r.Status {
	case bucket.Reserved, bucket.ReplayedReservation:
		out.Allowed, out.Reason = true, pb.Reason_REASON_OK
		out.Granted = r.Granted
		out.ExpiresIn = time.Duration(max(0, r.DeadlineMs-r.NowMs)) * time.Millisecond
		if r.Balance < a.lowWater(st, l, w, now) {
			a.kick(l.id)
		}
	default:
		st.mu.Lock()
		spent := st.spentWindow == w.Index
		st.kickCost = max(st.kickCost, minTokens)
		st.mu.Unlock()
		a.kick(l.id)
		out.Reason = pb.Reason_REASON_OVER_LIMIT
		out.RetryAfter = a.retryAfter(spent, out.ResetAfter)
	}
	return out, nil
}

// Release ends a reservation made by Reserve; unspent tokens go back to the
// region's balance until the reservation's deadline. It returns what went
// back. The reservation is looked for in the current window and the one
// before (a reservation may outlive a boundary by its caller's delay).
func (a *Agent) Release(ctx context.Context, limit, id string, unspent int64) (int64, error) {
	l, err := a.lookup(limit)
	if err != nil {
		return 0, err
	}
	if err := allocator.ValidateRequestID("reservation_id", id); err != nil {
		return 0, fieldErr("reservation_id", "%s", err.(*allocator.FieldError).Reason)
	}
	if unspent < 0 || unspent > l.tokens {
		return 0, fieldErr("unspent", "must be 0..%d, got %d", l.tokens, unspent)
	}
	w := a.windowOf(a.opt.now(), l)
	for _, idx := range []int64{w.Index, w.Index - 1} {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		r, err := a.buckets.Release(rctx, bucket.Key(l.id, idx), id, unspent, a.redisNowMs())
		cancel()
		if err != nil {
			return 0, fmt.Errorf("regionagent: release: %w", err)
		}
		if r.Status != bucket.UnknownReservation {
			return r.Returned, nil
		}
	}
	return 0, nil // unknown: nothing to give back (it expired long ago, or never was)
}

// lookup validates a limit id and finds the limit.
func (a *Agent) lookup(limit string) (*limitView, error) {
	switch {
	case limit == "":
		return nil, fieldErr("limit_id", "required")
	case len(limit) > 200:
		return nil, fieldErr("limit_id", "longer than 200 characters")
	}
	l := a.limits.get(limit)
	if l == nil {
		return nil, fmt.Errorf("%w: %q is not a limit of region %s", ErrUnknownLimit, limit, a.cfg.Region)
	}
	return l, nil
}
