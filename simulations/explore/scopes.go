package explore

import "leasehold/regionagent/core"

// The scopes. The CI scopes (CIScopes) each explore one family of faults
// to a depth that covers a grant, its spending, a renewal and a window
// boundary; together they run in CI in well under two minutes. The larger
// ones (LargeScopes) run behind the test flag -explore.large.
var (
	// LossyScope: requests and answers lost, sent again, given up.
	LossyScope = Scope{Name: "Lossy", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 8, Checks: 3, Lose: 1, Retry: 1, Fail: 1}
	// LeaderScope: a leader change between any decision, its commit and
	// its answer; the deposed term's commits are fenced.
	LeaderScope = Scope{Name: "Leader", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 9, Checks: 2, Retry: 1, LeaderChanges: 1}
	// RedisScope: Redis down and back (in-process leases), or taking
	// writes whose answers are lost before the agent notices.
	RedisScope = Scope{Name: "Redis", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 8, Checks: 3, RedisOutages: 1}
	// RollbackScope: a Redis failover that rolls back unreplicated writes.
	RollbackScope = Scope{Name: "Rollback", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 8, Checks: 3, Rollbacks: 1}
	// FallbackScope: calls given up under local:1 fallback.
	FallbackScope = Scope{Name: "Fallback", Tokens: 1, Replicas: [2]int{1, 1}, Depth: 8, Checks: 3, Fail: 1,
		Fallback: core.Fallback{Kind: core.FallbackLocal, LocalTokens: 1}}
	// ReplicasScope: two replicas in one region share its bucket and its
	// renewal lock.
	ReplicasScope = Scope{Name: "Replicas", Tokens: 2, Replicas: [2]int{2, 1}, Depth: 8, Checks: 3, Retry: 1}
	// LimitScope: G lowered or raised while leases are out.
	LimitScope = Scope{Name: "Limit", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 8, Checks: 3, LimitChanges: 1}

	// RestartScope: an agent replica killed and started again, holding
	// leases, with calls in flight; it must not admit before its first
	// limit sync.
	RestartScope = Scope{Name: "Restart", Tokens: 2, Replicas: [2]int{2, 1}, Depth: 8, Checks: 2, Restarts: 1}
	// ReturnsScope: a lease returned with tokens left while its window is
	// open, and the return sent again.
	ReturnsScope = Scope{Name: "Returns", Tokens: 3, Replicas: [2]int{1, 1}, Depth: 10, Checks: 1, Retry: 1}
)

// CIScopes are explored by every test run.
var CIScopes = []Scope{LossyScope, LeaderScope, RedisScope, RollbackScope, FallbackScope, ReplicasScope, LimitScope, RestartScope, ReturnsScope}

// The large scopes go deeper, with two replicas per region and several
// fault kinds at once; they take from minutes to hours (go test
// ./simulations/explore/ -run TestLargeScopes -explore.large -timeout 0).
var (
	LossyDeepScope  = Scope{Name: "LossyDeep", Tokens: 3, Replicas: [2]int{1, 1}, Depth: 10, Checks: 4, Lose: 2, Retry: 2, Fail: 1}
	LeaderDeepScope = Scope{Name: "LeaderDeep", Tokens: 2, Replicas: [2]int{1, 1}, Depth: 10, Checks: 3, Lose: 1, Retry: 2,
		LeaderChanges: 2}
	RedisDeepScope = Scope{Name: "RedisDeep", Tokens: 3, Replicas: [2]int{2, 1}, Depth: 10, Checks: 4, RedisOutages: 1,
		Rollbacks: 1, Retry: 1}
	FallbackDeepScope = Scope{Name: "FallbackDeep", Tokens: 2, Replicas: [2]int{2, 2}, Depth: 10, Checks: 4, Fail: 2,
		Fallback: core.Fallback{Kind: core.FallbackLocal, LocalTokens: 1}}
	EverythingScope = Scope{Name: "Everything", Tokens: 3, Replicas: [2]int{2, 2}, Depth: 9, Checks: 3, Lose: 1, Retry: 1,
		Fail: 1, LeaderChanges: 1, RedisOutages: 1, Rollbacks: 1, LimitChanges: 1, Restarts: 1}
)

// LargeScopes are explored with -explore.large.
var LargeScopes = []Scope{LossyDeepScope, LeaderDeepScope, RedisDeepScope, FallbackDeepScope, EverythingScope}
