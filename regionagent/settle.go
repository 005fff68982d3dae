package regionagent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Settlement is the agent's answer to Settle.
type Settlement struct {
	Estimate int64 // what the decision charged
	Charged  int64 // extra taken from the region's balance of the window
	Refunded int64 // tokens back in the region's balance
	// Overrun is the extra the window's balance could not hold: admitted
	// all the same, and counted in the window's settlement term.
	Overrun int64
	// Debt is the part of Overrun carried into the region's next window.
	Debt int64
	// Replayed is true when the decision was settled before: the answer
	// is the first settle's.
	Replayed bool
}

// CheckSettleLater decides a request whose cost is known only afterwards:
// estimate is charged now, all or nothing, like a Check's cost, and an
// admitted decision gets an id that Settle settles with the actual cost
// within the limit's settle grace. It is served from the region's Redis
// alone (a decision is a reservation there, which any replica settles):
// while Redis is down the answer is UNAVAILABLE, never an admission the
// agent could not settle.
func (a *Agent) CheckSettleLater(ctx context.Context, limit string, estimate int64) (Decision, error) {
	if err := checkLimitID(limit); err != nil {
		return Decision{}, err
	}
	if estimate == 0 {
		estimate = 1
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
		return Decision{}, a.lookupErr(lerr)
	}
	if l.ID == "" {
		return Decision{Reason: pb.Reason_REASON_UNAVAILABLE, RetryAfter: time.Second}, nil
	}
	if estimate < 1 || estimate > l.Tokens {
		return Decision{}, fieldErr("cost", "must be 1..%d (the limit's G), got %d", l.Tokens, estimate)
	}
	out := Decision{Limit: l.Tokens, Window: l.Window, Version: l.Version}
	if !ok {
		out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
		return out, nil
	}
	id := decisionID(key.Window)
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		r, err := a.shared.reserveInBatch(rctx, bucket.ReserveOp{Key: bucket.KeyOf(key), ID: id, Want: estimate, Min: estimate,
			GraceMs: l.SettleGrace.Milliseconds(), NowMs: a.shared.nowMs()})
		cancel()
		a.observeRedis(err)
		if err != nil {
			out.Reason, out.RetryAfter = pb.Reason_REASON_UNAVAILABLE, time.Second
			return out, nil
		}
		granted := r.Status == bucket.Reserved
		now = a.opt.now()
		var an core.Answer
		a.withCore(func(c *core.Core) {
			an = c.Reserved(now, key, granted, r.Balance, estimate)
			if granted {
				c.Charged(now, key)
			}
		})
		out = decisionOf(an)
		if granted {
			out.DecisionID, out.SettleWithin = id, l.SettleGrace
		}
		// Dry while the renewal the core just kicked is in flight (a
		// limit's first use, above all): wait for it once, as a Check
		// waits, at most the agent's cold wait.
		if granted || try > 0 || an.Reason != core.ReasonUnavailable || a.opt.wait <= 0 {
			return out, nil
		}
		if err := a.awaitRound(ctx, limit, a.opt.wait); err != nil {
			return out, nil
		}
	}
}

// awaitRound waits until a renewal round of limit has deposited (the
// limit's waiters are woken), d has passed, or ctx is done.
func (a *Agent) awaitRound(ctx context.Context, limit string, d time.Duration) error {
	wt := &waiter{ch: make(chan struct{})}
	a.mu.Lock()
	a.waiters[limit] = append(a.waiters[limit], wt)
	a.mu.Unlock()
	a.signal()
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-wt.ch:
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	a.mu.Lock()
	ws := a.waiters[limit]
	for i, w := range ws {
		if w == wt {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(a.waiters, limit)
	} else {
		a.waiters[limit] = ws
	}
	a.mu.Unlock()
	return err
}

// decisionID names a settle-later decision made in window: "s<window>-"
// and 32 random hex digits. Settle finds the window's bucket from it.
func decisionID(window int64) string {
	return "s" + strconv.FormatInt(window, 10) + "-" + randomHex(16)
}

// decisionWindow is the window a decision id names.
func decisionWindow(id string) (int64, error) {
	if err := vocab.ValidateRequestID("decision_id", id); err != nil {
		return 0, err
	}
	w, rest, ok := strings.Cut(strings.TrimPrefix(id, "s"), "-")
	n, err := strconv.ParseInt(w, 10, 64)
	if !strings.HasPrefix(id, "s") || !ok || err != nil || n < 0 || strconv.FormatInt(n, 10) != w || len(rest) != 32 {
		return 0, fieldErr("decision_id", "%q is not a decision id of this agent", id)
	}
	return n, nil
}

// Settle settles a settle-later decision of limit with its actual cost:
// the difference with the estimate is charged to the decision's window
// (a refund when actual is lower); what that window's balance cannot hold
// is admitted all the same, counted in its settlement term, and carried
// into the region's next window as debt unless the limit's debt policy
// forgives it. Idempotent by decision id: a retry with the same actual
// answers what the first settle did.
func (a *Agent) Settle(ctx context.Context, limit, decision string, actual int64) (Settlement, error) {
	if err := checkLimitID(limit); err != nil {
		return Settlement{}, err
	}
	window, err := decisionWindow(decision)
	if err != nil {
		return Settlement{}, err
	}
	now := a.opt.now()
	var (
		l         core.Limit
		key, next store.Key
		lerr      error
	)
	a.withCore(func(c *core.Core) { l, key, next, lerr = c.Settlement(now, limit, window) })
	switch {
	case errors.Is(lerr, core.ErrSettleTooLate):
		a.m.settles.WithLabelValues("refused").Inc()
		return Settlement{}, fmt.Errorf("%w: window %d of %q ended too long ago", ErrSettleRefused, window, limit)
	case lerr != nil:
		return Settlement{}, a.lookupErr(lerr)
	case l.ID == "":
		return Settlement{}, fmt.Errorf("%w: the agent has no limits from the allocator yet", errNotSynced)
	case actual < 0 || actual > l.Tokens:
		return Settlement{}, fieldErr("actual", "must be 0..%d (the limit's G), got %d", l.Tokens, actual)
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	r, err := a.shared.b.Settle(rctx, bucket.KeyOf(key), bucket.KeyOf(next), decision, actual, l.CarryDebt, a.shared.nowMs())
	cancel()
	a.observeRedis(err)
	if err != nil {
		a.m.settles.WithLabelValues("failed").Inc()
		return Settlement{}, fmt.Errorf("regionagent: settle: %w", err)
	}
	out := Settlement{Estimate: r.Estimate, Charged: r.Charged, Refunded: r.Refunded, Overrun: r.Overrun, Debt: r.Debt,
		Replayed: r.Status == bucket.SettledBefore}
	switch r.Status {
	case bucket.UnknownDecision:
		a.m.settles.WithLabelValues("unknown").Inc()
		return Settlement{}, fmt.Errorf("%w: %q of limit %q (never made, released, or its window's records are gone)", ErrUnknownDecision, decision, limit)
	case bucket.SettleTooLate:
		a.m.settles.WithLabelValues("refused").Inc()
		return Settlement{}, fmt.Errorf("%w: the settle grace of %v after the decision has passed; the estimate stands", ErrSettleRefused, l.SettleGrace)
	case bucket.SettledOtherwise:
		a.m.settles.WithLabelValues("refused").Inc()
		return Settlement{}, fmt.Errorf("%w: already settled with another actual cost (estimate %d, charged %d, refunded %d, overrun %d)",
			ErrSettleRefused, r.Estimate, r.Charged, r.Refunded, r.Overrun)
	case bucket.SettledBefore:
		a.m.settles.WithLabelValues("replayed").Inc()
	case bucket.Settled:
		a.m.settles.WithLabelValues("settled").Inc()
		a.m.settleTokens.WithLabelValues("charged").Add(float64(r.Charged))
		a.m.settleTokens.WithLabelValues("refunded").Add(float64(r.Refunded))
		a.m.settleTokens.WithLabelValues("overrun").Add(float64(r.Overrun))
		a.m.settleTokens.WithLabelValues("debt").Add(float64(r.Debt))
		now = a.opt.now()
		a.withCore(func(c *core.Core) {
			c.Charged(now, key)
			if r.Debt > 0 {
				c.Charged(now, next)
			}
		})
	}
	return out, nil
}
