// Package history records what a real Leasehold run decided, and checks
// the per-window invariants from that record alone, not from the
// product's own counters.
//
// # What is recorded
//
// Every process writes its own history: JSON lines, one [Record] a line
// (format version [Version], every string at most [MaxString] bytes, a
// line at most [MaxLine]). A run starts with a start record naming the
// process, its role and region, and a clean shutdown ends it with an end
// record; a process restarted on the same file appends a new run.
//
//   - region agents record every decision at the point where its answer is
//     final (Check, CheckMulti and the Envoy API, which is CheckMulti; the
//     agent's chunks), and every sub-lease reservation and release;
//   - gateways (the Go client) record the decisions they make themselves:
//     from a sub-lease, and from their denial cache (decisions the agent
//     made are in the agent's history);
//   - the allocator records every grant (new or replayed), return and
//     usage report where AcquireLeases, ReturnLeases and ReportUsage
//     answer, after the commit succeeded.
//
// # The Recorder never holds up the request path
//
// [Recorder.Record] hands a record to a bounded queue and returns; one
// goroutine encodes, writes through a buffer and flushes every 200 ms. If
// the queue is full the record is dropped and counted, and the history
// says so (a dropped record): a history with drops is incomplete and
// [Report.Certified] is false.
//
// # Killed processes: what a truncated history may lose, and why the
// checker stays correct
//
// A process killed with SIGKILL loses what it had not yet written: up to
// one flush interval of records, and its end record (so the checker knows
// the run is truncated and does not certify the history). The invariants
// are upper bounds on what was admitted, so a missing decision can only
// hide a violation, never invent one. Missing grants and returns are
// different: a lease spent by a region but missing from the history would
// be a false "spent tokens it was not leased", and a return missing while
// the tokens it credited were granted again would be a false budget
// violation. So the allocator writes its grants and returns with
// [Recorder.Durable]: written to the file (the kernel's page cache, which
// a killed process does not lose) before the answer leaves the allocator.
// That costs one write per AcquireLeases or ReturnLeases call, small
// beside the etcd commit each of them already waits for. A grant that was
// committed but whose answer never left (the allocator was killed between
// the commit and the write) cannot be spent by anyone until a replica
// answers it again, replayed, and that replica records it then. The one
// case left: a return committed, the allocator killed before its write,
// and the agent never retrying it (killed too) while the credited tokens
// were granted again in the same window; the checker would then report a
// budget violation that did not happen. Decisions, reservations and
// reports are written asynchronously: their loss only leaves the history
// incomplete. A sub-lease decision whose reservation record was lost is
// counted nowhere and makes the history incomplete.
//
// # Clocks
//
// Windows are [k·W, (k+1)·W) on the allocator's clock; grant records carry
// the allocator's instants (start, expiry, window end), decisions the
// deciding process's clock (the agent's, or a gateway's). The checker
// compares the two only for "no spend after the region's last lease
// deadline" and "no spend before its first lease started", and allows
// [Options.ClockTolerance] (default [DefaultClockTolerance]) for the offset
// between the processes' clocks. Processes on one host share one clock;
// across hosts, set it to the bound of their clock offset (what NTP
// reports, with its dispersion). A decision's time for the deadline check
// is the instant the agent sent its last spend (a lower bound of when the
// spend happened); for the start check, when its answer was final (an
// upper bound). Everything else (budget, idempotency, clamp, what each
// region was leased, the strict promise) is on one clock or on none.
//
// # Not checked
//
// Redis failovers that lose writes let a region re-spend tokens (the
// product's bound has a term for it); the history cannot see such a loss,
// so a run with one shows violations of "leased" and "promise" that the
// bound explains (the violation names the rollback the agents reported).
package history
