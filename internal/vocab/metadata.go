package vocab

// gRPC metadata keys (lower case, as gRPC sends them).
const (
	// LeaderMetadataKey is the trailer in which an allocator follower
	// names the leader's address when it refuses a call (UNAVAILABLE).
	LeaderMetadataKey = "leasehold-leader"
	// GroupMetadataKey and GroupAllocatorMetadataKey are the trailers in
	// which an allocator of one group names the group a limit lives in,
	// and one of its allocators, when it refuses an admin call about it
	// (FAILED_PRECONDITION).
	GroupMetadataKey          = "leasehold-group"
	GroupAllocatorMetadataKey = "leasehold-group-allocator"
	// AuthorizationMetadataKey carries "Bearer <token>" credentials to the
	// allocator.
	AuthorizationMetadataKey = "authorization"
)
