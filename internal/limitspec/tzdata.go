package limitspec

// The time zone database is embedded so that every process checks (and,
// once calendar windows are enforced, computes) a calendar limit's zone
// the same way on a machine without /usr/share/zoneinfo: a zone the
// allocator accepts is one every agent can load.
import _ "time/tzdata"
