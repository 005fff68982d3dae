// Package client is the Go client Leasehold's gateways use to ask a region
// agent whether a request may pass a limit.
//
// A [Client] wraps one gRPC connection to the region's agents and adds what
// a gateway needs on its request path:
//
//   - Deadlines: every call has a timeout (WithTimeout, default 250 ms).
//   - Retries that never repeat an ambiguous debit. Check charges the limit,
//     so a Check that failed after it may have reached the agent (a timeout,
//     Unavailable mid-call) is never sent again: the caller gets an error
//     and decides (httplimit answers 503). gRPC's transparent retry still
//     covers requests that never left the client. Reserve and Release are
//     idempotent by reservation id and are retried with the same id.
//   - A denial cache. After the agent denies a limit with OVER_LIMIT, the
//     client answers that limit itself, denied, until max(retry_after,
//     floor) has passed (floor 250 ms by default). It only ever answers
//     with a denial, so it can over-deny, never over-admit.
//   - Local sub-leases for hot limits (WithSubLeases). When this client
//     asks a limit for more than HotRate cost per second, it reserves a
//     chunk of the region's balance (Reserve: debited from the region's
//     Redis bucket at once, with a deadline no later than the lease the
//     tokens came from) and spends it in process with one atomic
//     compare-and-swap per decision, until the chunk's deadline (measured
//     from when the Reserve was sent, minus a safety margin). The chunk
//     covers Horizon of the client's own rate, so a quiet caller holds
//     nothing. The next chunk is asked for before this one runs out;
//     what is left is released when the limit goes idle, when the caller
//     slows down, on Close, or never (at the deadline: expired tokens
//     count as admitted). Tokens are taken from the region before they are
//     spent, so sub-leases add nothing to the overshoot bound; their cost
//     is undershoot (tokens one client holds that another cannot use).
//
// When the agent does not implement Reserve (an agent older than the
// client), the client falls back to a plain Check per call and asks again
// a minute later.
package client
