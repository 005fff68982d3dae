// Package simulations is Leasehold's deterministic simulator: a
// discrete-event simulation on virtual time, stepped in one goroutine, that
// runs the real lease sizing (package lease), the real allocator core
// (allocator.Core), the real agent core (regionagent/core.Core: every
// decision a region agent makes) and the real overshoot bound (package
// overshoot), over a simulated network with per-link delay, jitter, loss,
// duplication and partitions, and hosts whose clocks have an offset and a
// drift.
//
// Each region's agent is one core.Core in a thin simulated shell (agent.go),
// as the region agent (package regionagent) is one in a shell of loops,
// Redis calls and allocator calls: the shell carries out the core's actions
// on virtual time and hands their results back, converts the core's
// agent-clock instants to Redis's clock with bucket.ClockSync, and wakes the
// core at its NextWake. Nothing of the agent is re-implemented here; its
// settings are the core's defaults.
//
// The Redis bucket is replaced by [Bucket] (store.Mem), an in-memory bucket
// with the same semantics as the Lua scripts of regionagent/bucket (its
// tests replay the scripts' step tables). etcd is played as "a commit takes
// X ms", and an allocator failover rebuilds a new Core from the grants
// committed so far, as a new leader does from etcd.
//
// Bucket limits (rate shares) run under the Leasehold strategy only:
// [RunKinds] plays a window limit and a bucket limit under the same
// traffic and measures each one's most admitted in any interval beside
// its kind's bound ([KindScenarios]).
//
// Four strategies run on the same traffic (same seed, same arrivals):
// independent regional limits, a static split, a central authority, and
// Leasehold leases. [Run] plays one scenario with one strategy and returns
// its [Result]; [RunAll] plays every scenario; [WriteReport] renders the
// markdown report and the plots of docs/simulations/.
//
// Everything is a function of the seed: an event queue ordered by (virtual
// time, sequence number), math/rand/v2 PCG sources derived from the seed,
// no wall clock, no goroutines inside a run and no map iteration that
// reaches an output. Independent runs may execute in parallel; each is
// deterministic on its own.
package simulations
