package limitspec

// The time zone database is embedded (by internal/zones, which loads
// every zone once per process) so that every process checks and computes
// a calendar limit's zone the same way on a machine without
// /usr/share/zoneinfo: a zone the allocator accepts is one every agent can
// load.
import _ "leasehold/internal/zones"
