// Package allocator is Leasehold's home-region authority for global limits.
//
// It owns the limits and, per (limit, window), the pool G - granted +
// returned. It grants leases to region agents, takes their returns and usage
// reports, and keeps every decision durable in etcd before answering.
//
// The package has three layers, in the manner of etcd's raft:
//
//   - [Core] is a synchronous state machine: a request and the pool state in,
//     a grant (and the record to persist) out. It never touches etcd, the
//     network or the wall clock; time is an argument. It can be tested alone.
//   - [Store] persists records in etcd under a prefix. Every write is fenced
//     by the leader's election key, so an allocator that lost leadership
//     cannot commit. Concurrent grants are group-committed: many grants per
//     etcd transaction.
//   - [Allocator] runs leader election, rebuilds the core from etcd when it
//     becomes leader, and serves the Allocator and Admin gRPC services.
//
// Invariants kept here (ARCHITECTURE.md): for every (limit, window), tokens
// granted minus tokens returned never exceed G, and a grant is durable
// before its reply leaves (budget); a retried request id gets the same lease
// and a retried return counts once (idempotency); no lease expires after its
// window's end (clamp); a deposed leader cannot commit (fencing).
package allocator
