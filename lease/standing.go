package lease

import "strconv"

// ID formats a lease id, as the allocator names the leases it grants:
// "<window>/<region>/<request id>". Region and request ids contain no
// "/", so the id parses back without a lookup table.
func ID(window int64, region, requestID string) string {
	return strconv.FormatInt(window, 10) + "/" + region + "/" + requestID
}

// StandingRequestID is the request id in the lease id of a region's
// standing share of a window (StandingLeaseID). No request carries it: a
// request id has no "~", so it never names a lease granted on request.
const StandingRequestID = "~standing"

// StandingLeaseID is the lease id of region's standing share of a window:
// the same for every replica of the region's agent, so that the share is
// deposited once, and returned once, whichever replica does it.
func StandingLeaseID(window int64, region string) string {
	return ID(window, region, StandingRequestID)
}
