package lease

import "strconv"

// StandingRequestID is the request id in the lease id of a region's
// standing share of a window (StandingLeaseID). No request carries it: a
// request id has no "~", so it never names a lease granted on request.
const StandingRequestID = "~standing"

// StandingLeaseID is the lease id of region's standing share of a window,
// in the allocator's "<window>/<region>/<request id>" form: the same for
// every replica of the region's agent, so that the share is deposited
// once, and returned once, whichever replica does it.
func StandingLeaseID(window int64, region string) string {
	return strconv.FormatInt(window, 10) + "/" + region + "/" + StandingRequestID
}
