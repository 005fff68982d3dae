package simulations

import "fmt"

const reportIntro = `Each scenario runs four strategies on the same traffic (same seed, same arrivals):

- **independent**: every region enforces G on its own (a regional limiter per region);
- **static split**: every region enforces G / regions;
- **central**: every request asks one exact counter in the home region and waits for the WAN round trip;
- **leasehold**: the real allocator core grants leases; in each region the real agent core (` + "`regionagent/core`" + `),
  in a simulated shell, spends, renews and returns them.

How to read the columns (every figure is per limit and per window of the allocator's clock, over every window of the run):

- **admitted/G**: tokens admitted in the window divided by the limit. Above 1.000 is overshoot.
- **observed overshoot**: the largest max(0, admitted - G) of a window, in tokens and in % of G, and how many windows went over.
  Admissions are counted at the real instant they were decided, in the window of the allocator's clock at that
  instant, so a token spent after its lease's window ended would count against the next window.
- **computed bound**: for Leasehold, the largest per-window bound from ` + "`overshoot.Compute`" + ` on what the allocator
  committed and what the regions did (fallback modes); observed above it is a bug and is flagged under the table.
  The other strategies compute no bound; the column says what they allow by construction.
- **stranded**: tokens denied although the window ended with room for them, per window: min(denied, G - admitted),
  in % of G. It is what a limiter costs a tenant who stays under the limit.
- **allocator calls/s**: calls received by the home region (lease acquires and returns, retries and duplicates
  included; for the central authority, one per request).
- **latency added**: what the limiter adds to a request: a regional Redis round trip (1 ms) for the local strategies
  and Leasehold (plus, when the region holds no tokens and the pool is not known to be spent, the wait for a lease in
  flight: at most 500 ms, then unavailable), the WAN round trip for the central authority (a request without an
  answer after 1 s counts 1 s and is unavailable).
- **unavailable**: requests the limiter could not decide (partition, authority down, closed fallback, lost messages).

`

// scenarioText are the plain words under each scenario's table.
var scenarioText = map[string]func([]Result) string{
	"steady": func(rs []Result) string {
		lh, c := find(rs, Leasehold), find(rs, Central)
		return fmt.Sprintf("Under the limit every strategy admits what is asked. Leasehold denies a handful of requests "+
			"at window boundaries (mean stranding %.2f%% of G) and adds %.1f ms; the central authority adds %.0f ms to "+
			"every request and loses requests with lost messages (%d unavailable).",
			100*lh.MeanStrandedG, lh.LatencyMeanMs, c.LatencyMeanMs, c.Unavailable)
	},
	"shift": func(rs []Result) string {
		in, st, lh := find(rs, Independent), find(rs, StaticSplit), find(rs, Leasehold)
		return fmt.Sprintf("Demand equals G, so the regional limiters overshoot only by Poisson noise (independent: "+
			"max %.3f x G). The static split holds the busy region to 500 and strands up to %s of G per window "+
			"(mean %.1f%%) while the quiet region's half goes unused. Leasehold follows the shift within the "+
			"window: stranding max %s, mean %.2f%%, observed overshoot %d, with %.2f allocator calls per second.",
			in.MaxAdmittedG, pct(st.MaxStrandedG), 100*st.MeanStrandedG, pct(lh.MaxStrandedG), 100*lh.MeanStrandedG,
			lh.MaxOvershoot, lh.AllocCallsPerSec)
	},
	"contention": func(rs []Result) string {
		in, st, lh := find(rs, Independent), find(rs, StaticSplit), find(rs, Leasehold)
		return fmt.Sprintf("Demand is twice G. Independent limits admit %.2f x G per window (EU up to 1,000 plus US "+
			"500). The static split admits G but strands up to %s when US demand dips under its 500. Leasehold admits "+
			"exactly G (max %.3f), shares it in proportion to demand, strands at most %s.",
			in.MaxAdmittedG, pct(st.MaxStrandedG), lh.MaxAdmittedG, pct(lh.MaxStrandedG))
	},
	"burst": func(rs []Result) string {
		in, lh, c := find(rs, Independent), find(rs, Leasehold), find(rs, Central)
		return fmt.Sprintf("Independent limits admit %.2f x G around a boundary (each region spends a full G on each "+
			"side of it). Leasehold never exceeds G (overshoot %d) and strands at most %s of G (central: %s). This "+
			"scenario once found an agent problem: the burst drains window k's pool in a dozen small leases whose "+
			"deadlines all fall a few tens of ms before the boundary, and an agent that returned them one awaited "+
			"ReturnLeases call at a time before it could acquire straddled the boundary and denied the burst of "+
			"window k+1. The agent acquires first and returns a round's leases in one call.",
			in.MaxAdmittedG, lh.MaxOvershoot, pct(lh.MaxStrandedG), pct(c.MaxStrandedG))
	},
	"partition": func(rs []Result) string {
		lh, c := find(rs, Leasehold), find(rs, Central)
		return fmt.Sprintf("While cut off, the US region spends the leases it holds, then answers unavailable "+
			"(closed fallback). The allocator counts the silent region's leases as spent, so overshoot stays %d; the "+
			"cost is stranding in the partition windows (max %s for Leasehold, %s for the central authority, which "+
			"cannot admit anything in the cut-off region and adds up to the 1 s timeout). Local limiters do not notice "+
			"the partition.", lh.MaxOvershoot, pct(lh.MaxStrandedG), pct(c.MaxStrandedG))
	},
	"regionloss": func(rs []Result) string {
		in, st, lh := find(rs, Independent), find(rs, StaticSplit), find(rs, Leasehold)
		return fmt.Sprintf("Before the loss demand exceeds G: independent limits admit up to %.2f x G. After it, "+
			"the static split keeps the lost region's half forever (stranding mean %.1f%%, max %s). Leasehold loses "+
			"what the lost region held (its leases expire unspent: max %s stranded in the loss window); the lost "+
			"region's demand report ages out and the survivor gets the whole pool from the next window.",
			in.MaxAdmittedG, 100*st.MeanStrandedG, pct(st.MaxStrandedG), pct(lh.MaxStrandedG))
	},
	"failover": func(rs []Result) string {
		lh, c := find(rs, Leasehold), find(rs, Central)
		return fmt.Sprintf("Agents keep spending the leases they hold through the 5 s takeover and retry their "+
			"requests with the same ids; the new leader, rebuilt from the committed grants, answers replays with the "+
			"original leases. Leasehold: overshoot %d, stranding max %s, %d unavailable answers. The central "+
			"authority answers nothing for 5 s (%d unavailable, p99 latency %.0f ms).",
			lh.MaxOvershoot, pct(lh.MaxStrandedG), lh.Unavailable, c.Unavailable, c.LatencyP99Ms)
	},
	"drift": func(rs []Result) string {
		st, lh := find(rs, StaticSplit), find(rs, Leasehold)
		return fmt.Sprintf("Lease deadlines are durations measured from the agent's send, minus a margin of "+
			"2 ms + 1,000 ppm of the lease, converted to Redis's clock with the conservative bound: Leasehold's "+
			"observed overshoot is %d. The static split, which counts windows on each region's own clock, admits "+
			"up to %d tokens over G in a window of the allocator's clock: clock offsets move a region's boundary.",
			lh.MaxOvershoot, st.MaxOvershoot)
	},
	"random": func(rs []Result) string {
		in, st, c, lh := find(rs, Independent), find(rs, StaticSplit), find(rs, Central), find(rs, Leasehold)
		return fmt.Sprintf("Independent limits overshoot in %d of %d limit-windows (up to %.2f x G); the static split "+
			"strands %.1f%% of G on average. Leasehold admits %.3f x G on average against the central authority's %.3f, "+
			"with overshoot %d, at %.0f allocator calls per second for all limits (the central authority: %.0f) and "+
			"%.1f ms mean added latency (central: %.0f ms; Leasehold's mean includes the first request of each "+
			"limit in each region, and any request that finds its region dry, waiting for a lease). Its worst limit-window strands %s (mean %.2f%%, "+
			"against the central authority's %s worst); which limits strand most, and why, is not analysed yet.",
			in.OvershootWindows, in.LimitWindows, in.MaxAdmittedG, 100*st.MeanStrandedG, lh.MeanAdmittedG, c.MeanAdmittedG,
			lh.MaxOvershoot, lh.AllocCallsPerSec, c.AllocCallsPerSec, lh.LatencyMeanMs, c.LatencyMeanMs,
			pct(lh.MaxStrandedG), 100*lh.MeanStrandedG, pct(c.MaxStrandedG))
	},
}

const shiftPlotText = `**What this plot shows.** One point per one-minute window and strategy: the tokens admitted in
the window divided by G. The demand (1,000 per minute in total) moves from EU to US in the middle of window 4. The
central authority and Leasehold stay at about 1.0 (what was asked, never more). The static split sits near 0.6: the
busy region is held to its 500 while the other half of G goes unused. Independent limits follow the demand and, when
Poisson noise pushes it above G, admit it.`

const sweepIntro = `## Lease ttl and chunk size: the trade

The demand-shift scenario again, Leasehold only, with the lease ttl from 1 s to the whole window and three caps on
a single grant (max chunk). Overshoot stays 0 everywhere; what moves is how often agents call the allocator and
how many tokens a region holds that the other could have used.

`

const strandPlotText = `**What this plot shows.** Mean stranded tokens per window (% of G) against the lease ttl, one
line per max-chunk setting. Both ends cost: leases no longer than the agent's renewal lead (2 s) are renewed as
soon as they arrive and count for nothing the region holds when it asks, so a region keeps asking and holds more
than it spends (3-3.5% stranded on average), and very long leases without a cap on a grant let the busy region sit
on most of the pool after the demand has moved (30 s: 30% in the worst window; 60 s: 9% on average, 37% in the
worst). Between 5 and 15 s stranding stays around 0.3-0.6% on average; a max chunk removes most of the long-lease
stranding.`

const callsPlotText = `**What this plot shows.** Allocator calls per second (acquires and returns) against the lease ttl,
for the same runs. Leases of 1-2 s cost 17-28 calls per second for this one limit; from 5 s on it falls to one or
two, and a small max chunk keeps it higher because each grant covers less demand. Read the two plots together: the
default ttl W/4 (15 s for a one-minute window) strands well under 1% on average at about 0.5 calls per second per
limit.`

const driftIntro = `## Clock drift and round-trip time

The drift scenario (EU 700 / US 700 per minute, G = 1,000) with every clock drifting by the stated rate (agents and
their Redis in opposite directions, the allocator too) and both regions at the stated RTT from the home region.

`

const driftPlotText = `**What this plot shows.** The largest per-window overshoot against clock drift, for the static
split and Leasehold at 80 ms and 300 ms RTT. Leasehold's deadlines are measured from the agent's send on its own
clock with a margin of 2 ms + 1,000 ppm of the lease: within that drift it never overshoots, and the one-way
delay of the request adds slack beyond it. The static split counts windows on each region's own clock, so an
offset or drift moves admissions across the allocator's boundaries.`

const reportMethod = `## How the simulator works

` + "`simulations/`" + ` is a discrete-event simulator on virtual time, stepped in one goroutine. Events are ordered by
(time, sequence), random draws come from PCG streams derived from the seed (one stream per traffic flow, so every
strategy sees the same arrivals), and nothing reads the wall clock: the same seed gives the same report.

- **Real code**: ` + "`allocator.Core`" + ` decides every grant and return; ` + "`lease`" + ` sizes, clamps and times
  leases; ` + "`regionagent/core.Core`" + ` makes every agent decision (Checks, waits, renewal rounds, deposits, closes,
  returns, its own timers), with its default settings; ` + "`bucket.ClockSync`" + ` converts the agent's deadlines to
  Redis's clock; ` + "`store.Mem`" + ` is the Redis bucket (the Lua scripts' semantics, tested against their step
  tables); ` + "`overshoot.Compute`" + ` gives the bound.
- **Played by the simulator**: etcd (a commit takes 5 ms; a failover rebuilds a new Core with ` + "`Restore`" + ` from
  the grants committed so far), the network (per-link delay, jitter, loss, duplication, cuts), host clocks (offset and
  drift), and the agent's shell: it carries out the core's actions on virtual time, sends the acquires (returns) of
  one batch of actions in one allocator call, retried with the same request ids (1 s per attempt for up to 5 s), and
  wakes the core when it asks to be woken.
- **Simplifications**: one agent replica per region (the renewal lock is not exercised); Redis never fails (the
  in-process store is not exercised); fallback is closed everywhere; the shell has no circuit breaker (a call that
  fails for good is reported to the core as failed; the core's own fallback then applies); store operations take no
  time; allocator replicas share one clock; the home region holds only the allocator, so every region pays a WAN
  round trip to it.
`
