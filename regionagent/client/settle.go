package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
)

// Errors of Settle, besides the others (ErrInvalid, ErrUnknownLimit,
// ErrUnavailable, ErrClosed).
var (
	// ErrUnknownDecision: the agent has no such settle-later decision (never
	// made, or its window's records are gone): its estimate stands.
	ErrUnknownDecision = errors.New("client: unknown decision")
	// ErrSettleRefused: the decision's settle grace has passed, or it was
	// settled before with another actual cost: its first settlement (or
	// its estimate) stands.
	ErrSettleRefused = errors.New("client: settle refused")
)

// Pending is an admitted settle-later request: Settle it with its actual
// cost within SettleWithin.
type Pending struct {
	Decision
	// SettleID names the decision for Settle ("" when not admitted).
	SettleID     string
	SettleWithin time.Duration
}

// AllowSettleLater decides a request whose cost is known only when it
// ends (tokens of a model's answer, bytes of a download): estimate is
// charged now, like Allow's cost, and an admitted request must be settled
// with Settle once its actual cost is known. Always asks the agent (no
// sub-lease, no denial cache: the decision lives in the region's Redis).
// An error means no decision, as for Allow.
func (c *Client) AllowSettleLater(ctx context.Context, limit string, estimate int64) (Pending, error) {
	if estimate == 0 {
		estimate = 1
	}
	if estimate < 0 || limit == "" {
		return Pending{}, invalid(limit, estimate)
	}
	if c.closed.Load() {
		return Pending{}, ErrClosed
	}
	cctx, cancel := context.WithTimeout(ctx, c.opt.timeout)
	resp, err := c.rpc.Check(cctx, &pb.CheckRequest{LimitId: limit, Cost: estimate, SettleLater: true})
	cancel()
	if err != nil {
		c.counts.agent[agentError].Add(1)
		return Pending{Decision: Decision{Reason: pb.Reason_REASON_UNAVAILABLE, ID: newDecisionID(), Source: SourceAgent}},
			wrapRPC("check", limit, err)
	}
	d := fromCheck(resp)
	c.counts.countAgent(d.Reason)
	return Pending{Decision: d, SettleID: resp.DecisionId, SettleWithin: dur(resp.SettleWithin)}, nil
}

// Settlement is what Settle did.
type Settlement struct {
	Estimate int64 // what the decision charged
	Charged  int64 // extra taken from the region's balance
	Refunded int64 // tokens given back
	// Overrun is the extra the window could not hold: admitted all the
	// same, in the window's settlement term.
	Overrun int64
	// Debt is the part of Overrun the region's next window pays.
	Debt int64
	// Replayed: the decision was settled before; this is that answer.
	Replayed bool
}

// Settle settles a Pending of limit with the request's actual cost (>= 0).
// It is idempotent: after an ErrUnavailable, call it again with the same
// actual cost (a settle the agent applied is answered again, not applied
// twice) until the settle grace has passed.
func (c *Client) Settle(ctx context.Context, limit, settleID string, actual int64) (Settlement, error) {
	switch {
	case limit == "":
		return Settlement{}, fmt.Errorf("%w: limit is required", ErrInvalid)
	case settleID == "":
		return Settlement{}, fmt.Errorf("%w: settle id is required", ErrInvalid)
	case actual < 0:
		return Settlement{}, fmt.Errorf("%w: actual cost %d of %q: must be >= 0", ErrInvalid, actual, limit)
	case c.closed.Load():
		return Settlement{}, ErrClosed
	}
	cctx, cancel := context.WithTimeout(ctx, c.opt.timeout)
	r, err := c.rpc.Settle(cctx, &pb.SettleRequest{LimitId: limit, DecisionId: settleID, Actual: actual})
	cancel()
	if err != nil {
		st, _ := status.FromError(err)
		switch {
		case st.Code() == codes.FailedPrecondition:
			return Settlement{}, fmt.Errorf("%w: settle %q: %w", ErrSettleRefused, limit, err)
		case st.Code() == codes.NotFound && strings.HasPrefix(st.Message(), "decision_id"):
			return Settlement{}, fmt.Errorf("%w: settle %q: %w", ErrUnknownDecision, limit, err)
		}
		return Settlement{}, wrapRPC("settle", limit, err)
	}
	return Settlement{Estimate: r.Estimate, Charged: r.Charged, Refunded: r.Refunded, Overrun: r.Overrun, Debt: r.Debt,
		Replayed: r.Replayed}, nil
}
