// Package core is the region agent's decision state machine: what one agent
// replica holds of each limit, what it asks the allocator for and when,
// what it closes and returns, how it answers a Check that its region's
// store cannot pay for, and how it reports usage. It does no I/O and reads
// no clock, in the manner of etcd's raft: events go in as method calls
// (each takes now), actions come out of [Core.Ready] for the caller to
// carry out, and the caller hands every action's result back as another
// event. The region agent (package regionagent) runs one Core inside a thin
// shell of loops, Redis calls, allocator calls and metrics; the simulator
// and the protocol explorer drive the same Core over virtual time.
//
// # Events and actions
//
//   - Limits: [Core.SetLimits] replaces the snapshot of the region's
//     limits; [Core.SetAllocatorClock] names windows on the allocator's
//     clock.
//   - Checks: [Core.Begin] starts a [Check]; its Step says what to do next
//     (spend from a store, wait, count fallback admits) and the results go
//     back through [Core.Spent], [Core.Woke] and [Core.Counted] until the
//     Check is done. A spend's result carries the bucket's balance and
//     counters, so the Core learns the region's demand and when a limit
//     runs low from the spends it makes anyway: nothing is read on a timer.
//   - Renewal: a limit that runs low (or is denied, or whose lease is about
//     to expire while it has demand, or nears its window's end while it has
//     demand) gets a [Round]: read its bucket under the renewal lock
//     ([Core.RoundRead]), then [Acquire] ([Core.Acquired],
//     [Core.AcquireFailed]), [Deposit] ([Core.Deposited]) and [Close]
//     ([Core.Closed]); closed leases' unspent tokens become [Return]s
//     ([Core.ReturnsDone]). Rounds of many limits are ready at the same
//     time, so the caller sends their requests in one allocator call.
//   - Health: [Core.SetRedisHealth] switches between the region's shared
//     store and this replica's in-process store (while Redis is down);
//     [Core.SetAllocatorHealth] tells it when the allocator answers.
//   - Time: [Core.NextWake] says when the Core next has something to do on
//     its own (a lease deadline, a renewal before expiry, a usage report);
//     [Core.Tick] does it.
//
// An idle limit costs nothing: the Core keeps a few hundred bytes for it
// until it is forgotten, and no action names it once its leases have been
// closed and returned and its last usage reported.
//
// # Stores and clocks
//
// Every time the Core hands out is on the agent's own clock (the caller's
// now, monotonic). A lease's deadline is measured from when its request was
// sent, minus a safety margin, and a next-window lease starts when its
// reply arrived plus starts_in (see package lease); the caller converts
// them to the store's clock with the conservative bound (bucket.ClockSync
// for Redis), so that no token is spent after its lease's agent deadline.
//
// The zero value is not usable; call [New]. A Core is not safe for
// concurrent use: the caller serializes every call.
package core
