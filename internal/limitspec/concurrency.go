package limitspec

import (
	pb "leasehold/proto/leasehold/v1"
)

// A concurrency limit holds at most limit_tokens (N) slots at once, all
// regions together: slots are acquired, heartbeated and released by
// holders, and granted to regions as slot shares with a ttl
// (limit.lease.ttl, DefaultShareTTL unless set, MinShareTTL..MaxShareTTL).

// isConcurrency reports whether l is a concurrency limit.
func isConcurrency(l *pb.Limit) bool { return l.Kind == pb.LimitKind_LIMIT_KIND_CONCURRENCY }

// checkConcurrencyOnly refuses, on a concurrency limit, a window limit's
// window and the settings the agent does not apply to slots: accepted,
// they would promise something nobody enforces.
func checkConcurrencyOnly(l *pb.Limit) error {
	switch {
	case l.Window != nil:
		return fieldErr("limit.window", "concurrency limits cap slots held at once (limit_tokens), they have no window")
	case l.WindowPhase != nil:
		return fieldErr("limit.window_phase", "concurrency limits have no windows to shift (window limits only)")
	case l.Shadow:
		return fieldErr("limit.shadow", "shadow mode is for window and bucket limits: a slot is held state, not a count, and admitting beyond N would hold slots beyond N")
	case l.SettleGrace != nil:
		return fieldErr("limit.settle_grace", "settle-later Checks are for window limits only in this version")
	case l.DebtPolicy != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED:
		return fieldErr("limit.debt_policy", "settle-later Checks are for window limits only in this version")
	}
	return nil
}
