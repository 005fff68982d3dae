// Package regionagent is Leasehold's region agent: it answers gateways'
// Check calls from the region alone and keeps the region supplied with
// leases from the allocator.
//
// The request path is: validate, name the current window, spend the cost
// from the region's Redis bucket of (limit, window) in one atomic script,
// answer. Concurrent Checks are pipelined together, so a batch of them
// costs one Redis round trip. No call on this path leaves the region; the
// one exception is the first Check of a limit the region holds no lease
// for, which waits (briefly, bounded) for the first lease.
//
// Off the request path, per active limit, one agent replica at a time
// (chosen by a lock in Redis) renews before the balance runs dry: when
// spendable tokens drop below the low-water mark (regional demand x
// renewal lead time, capped by what the rest of the window can use), it
// asks the allocator with the region's smoothed demand and holdings, and
// deposits the lease with its deadline converted to Redis's clock so it is
// never later than the agent's. Near a window's end it fetches the next
// window's lease ahead. Expired leases are closed and their unspent tokens
// returned; per-window admitted, denied and fallback counts are reported
// to the allocator.
package regionagent
