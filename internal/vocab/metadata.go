package vocab

// gRPC metadata keys (lower case, as gRPC sends them).
const (
	// LeaderMetadataKey is the trailer in which an allocator follower
	// names the leader's address when it refuses a call (UNAVAILABLE).
	LeaderMetadataKey = "leasehold-leader"
	// AuthorizationMetadataKey carries "Bearer <token>" credentials to the
	// allocator.
	AuthorizationMetadataKey = "authorization"
)
