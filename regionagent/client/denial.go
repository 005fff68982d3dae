package client

import (
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// denial is a cached OVER_LIMIT answer. Times are ns on the client's
// clock. Immutable.
type denial struct {
	until     int64 // answered locally before this
	remaining int64 // the region's balance then: a cost within it still asks
	resetAt   int64
	limit     int64
	window    time.Duration
	version   int64
}

// cacheDenial remembers an OVER_LIMIT answer received at now for
// max(retry_after, floor), and never past the window's reset: the agent
// jitters retry_after past the reset (up to a tenth of it) to spread the
// retries, but the next window is a new pool, and a denial held into it
// would refuse honest traffic OVER_LIMIT. An answer whose retry_after is
// below the floor is not cached: the agent says that when its region is
// only briefly dry (a renewal in flight), not when the window's pool is
// spent, and holding such a denial for the floor would deny a quarter
// second of honest traffic. Either way the cache only ever denies.
func (c *Client) cacheDenial(st *limitState, now int64, d Decision) {
	if d.RetryAfter < c.opt.denialFloor {
		return
	}
	hold := max(d.RetryAfter, c.opt.denialFloor)
	if d.ResetAfter > 0 {
		hold = min(hold, d.ResetAfter)
	}
	st.deny.Store(&denial{
		until: now + int64(hold), remaining: max(0, d.Remaining), resetAt: now + int64(d.ResetAfter),
		limit: d.Limit, window: d.Window, version: d.Version,
	})
	c.hold(st)
}

// answer is the cached denial as seen at now. It is always a denial.
func (dn *denial) answer(now int64) Decision {
	return Decision{
		Allowed: false, Reason: pb.Reason_REASON_OVER_LIMIT, Remaining: dn.remaining,
		RetryAfter: time.Duration(max(0, dn.until-now)), ResetAfter: time.Duration(max(0, dn.resetAt-now)),
		Limit: dn.limit, Window: dn.window, Version: dn.version,
		ID: newDecisionID(), Source: SourceDenialCache,
	}
}
