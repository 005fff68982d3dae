package regionagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
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
	if err := checkLimitID(limit); err != nil {
		return Reservation{}, err
	}
	if err := vocab.ValidateRequestID("reservation_id", id); err != nil {
		return Reservation{}, err
	}
	now := a.opt.now()
	var (
		l    core.Limit
		key  store.Key
		ok   bool
		lerr error
	)
	a.withCore(func(c *core.Core) { l, key, ok, lerr = c.Reservation(now, limit) })
	if lerr != nil {
		return Reservation{}, a.lookupErr(lerr)
	}
	if l.IsBucket() {
		return Reservation{}, errBucketSubLease(limit)
	}
	if l.IsConcurrency() {
		return Reservation{}, fieldErr("limit_id", "%q is a concurrency limit: acquire a slot (AcquireSlot), not a sub-lease", limit)
	}
	if l.ID == "" {
		// Not synced: the agent does not know the limit yet.
		return Reservation{Decision: Decision{Reason: pb.Reason_REASON_UNAVAILABLE, RetryAfter: time.Second}}, nil
	}
	if minTokens == 0 {
		minTokens = 1
	}
	switch {
	case tokens < 1 || tokens > l.Tokens:
		return Reservation{}, fieldErr("tokens", "must be 1..%d (the limit's G), got %d", l.Tokens, tokens)
	case minTokens < 1 || minTokens > tokens:
		return Reservation{}, fieldErr("min_tokens", "must be 1..tokens, got %d", minTokens)
	}
	out := Reservation{Decision: Decision{Limit: l.Tokens, Window: l.Window, Phase: l.Phase, Cal: l.Cal, Version: l.Version}}
	if l.Cal.Loc != nil {
		out.Decision.Window = l.Windows().ByIndex(key.Window).Length
	}
	if !ok {
		// Sub-leases live in the shared bucket only: while Redis is down the
		// client falls back to per-request Checks, served in process.
		out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
		return out, nil
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	r, err := a.shared.reserveInBatch(rctx, bucket.ReserveOp{Key: bucket.KeyOf(key), ID: id, Want: tokens, Min: minTokens,
		LastMs: reserveLast(l.TTL).Milliseconds(), NowMs: a.shared.nowMs()})
	cancel()
	a.observeRedis(err)
	if err != nil {
		out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
		return out, nil
	}
	granted := r.Status == bucket.Reserved || r.Status == bucket.ReplayedReservation
	now = a.opt.now()
	var an core.Answer
	a.withCore(func(c *core.Core) { an = c.Reserved(now, key, granted, r.Balance, minTokens) })
	out.Decision = decisionOf(an)
	if granted {
		out.Granted = r.Granted
		out.ExpiresIn = time.Duration(max(0, r.DeadlineMs-r.NowMs)) * time.Millisecond
		if a.opt.hist != nil {
			a.recordReserve(now, l, key, id, out, r.Status == bucket.ReplayedReservation)
		}
	}
	return out, nil
}

// reserveLast: a reservation is taken from leases that last at least this
// long, when they hold enough: 1 s, or half the limit's lease ttl if that
// is shorter. A chunk ends 500 ms before its lease and is given back at
// once if it could not be half spent in its life; one taken from the
// region's oldest lease, a moment from its end, was given back at once
// and the limit then went to Redis until that lease had ended.
func reserveLast(ttl time.Duration) time.Duration {
	return min(time.Second, ttl/2)
}

// Release ends a reservation made by Reserve; unspent tokens go back to the
// region's balance until the reservation's deadline. It returns what went
// back. The reservation is looked for in the current window and the one
// before (a reservation may outlive a boundary by its caller's delay).
func (a *Agent) Release(ctx context.Context, limit, id string, unspent int64) (int64, error) {
	if err := checkLimitID(limit); err != nil {
		return 0, err
	}
	if err := vocab.ValidateRequestID("reservation_id", id); err != nil {
		return 0, err
	}
	now := a.opt.now()
	var (
		l    core.Limit
		key  store.Key
		lerr error
	)
	a.withCore(func(c *core.Core) { l, key, _, lerr = c.Reservation(now, limit) })
	if lerr != nil {
		return 0, a.lookupErr(lerr)
	}
	if l.IsBucket() {
		return 0, errBucketSubLease(limit)
	}
	if l.IsConcurrency() {
		return 0, fieldErr("limit_id", "%q is a concurrency limit: release slots with ReleaseSlot", limit)
	}
	if l.ID == "" {
		return 0, fmt.Errorf("%w: the agent has no limits from the allocator yet", errNotSynced)
	}
	if unspent < 0 || unspent > l.Tokens {
		return 0, fieldErr("unspent", "must be 0..%d, got %d", l.Tokens, unspent)
	}
	for _, idx := range []int64{key.Window, key.Window - 1} {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		r, err := a.shared.releaseInBatch(rctx, bucket.ReleaseOp{Key: bucket.Key(key.HashTag, limit, idx), ID: id, Unspent: unspent, NowMs: a.shared.nowMs()})
		cancel()
		a.observeRedis(err)
		if errors.Is(err, bucket.ErrUnspentTooLarge) {
			return 0, fieldErr("unspent", "%d is more than reservation %q holds", unspent, id)
		}
		if err != nil {
			return 0, fmt.Errorf("regionagent: release: %w", err)
		}
		if r.Status != bucket.UnknownReservation {
			if a.opt.hist != nil {
				a.recordRelease(limit, idx, id, unspent, r.Returned)
			}
			return r.Returned, nil
		}
	}
	return 0, nil // unknown: nothing to give back (it expired long ago, or never was)
}

// checkLimitID validates a limit id named by a call.
func checkLimitID(limit string) error {
	switch {
	case limit == "":
		return fieldErr("limit_id", "required")
	case len(limit) > core.MaxLimitID:
		return fieldErr("limit_id", "longer than %d characters", core.MaxLimitID)
	}
	return nil
}

// lookupErr maps the core's lookup errors.
func (a *Agent) lookupErr(err error) error {
	var ie *core.ItemError
	if errors.As(err, &ie) && errors.Is(ie, core.ErrUnknownLimit) {
		return fmt.Errorf("%w: %s", ErrUnknownLimit, ie.Reason)
	}
	return err
}

// errBucketSubLease refuses a sub-lease of a bucket limit: its tokens
// refill continuously in the region's bucket, and this version hands none
// out in chunks.
func errBucketSubLease(limit string) error {
	return fieldErr("limit_id", "%q is a bucket limit: it has no sub-leases (use Check)", limit)
}
