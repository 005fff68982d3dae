package simulations

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"leasehold/lease"
)

// A window limit of G per W admits G at the end of one window and G again
// at the start of the next; a bucket limit of rate R (per period P) and
// burst B admits at most B + R*T in any interval of length T. The kinds
// scenarios put one limit of each kind, with the same long-run rate (G per
// W = R per P), under the same traffic in one Leasehold run, and measure,
// for each, the most it admitted in any interval of a few lengths (every
// interval of the run, not only windows) beside what its kind promises.

// KindLengths are the interval lengths the kinds scenarios measure.
var KindLengths = []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute}

// KindScenarios returns the kinds scenarios: a boundary burst and a
// demand shift, each with a window limit (G = 1,000 per minute) and a
// bucket limit (1,000 per minute, burst 100) under the same demand.
func KindScenarios() []Scenario {
	limits := []LimitSpec{{ID: "window/atlas", G: 1000}, {ID: "bucket/atlas", Rate: 1000, RatePeriod: minute, Burst: 100}}
	both := func(f Flow) []Flow {
		g := f
		g.Limit = 1
		return []Flow{f, g}
	}
	burst := func(region int) Flow {
		f := Flow{Region: region, Poisson: true, Phases: []Phase{{At: 0, PerMin: 100}}}
		for _, b := range []time.Duration{2 * minute, 4 * minute, 6 * minute, 8 * minute} {
			f.Phases = append(f.Phases, Phase{At: b - second, PerMin: 90_000}, Phase{At: b + second, PerMin: 100})
		}
		return f
	}
	shift := func(region int, before, after float64) Flow {
		return Flow{Region: region, Poisson: true, Phases: []Phase{{At: 0, PerMin: before}, {At: 4*minute + 30*second, PerMin: after}}}
	}
	return []Scenario{
		{Name: "kinds-burst", Title: "Window limit against bucket limit: boundary burst",
			About: "A window limit (G = 1,000 per minute) and a bucket limit (1,000 per minute, burst 100) under the same " +
				"traffic: 100 per minute in each region, and 1,500 requests per second in both regions for the second " +
				"before and the second after the window boundaries at 2, 4, 6 and 8 minutes.",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: limits,
			Flows: append(both(burst(0)), both(burst(1))...)},
		{Name: "kinds-shift", Title: "Window limit against bucket limit: demand shift",
			About: "The same two limits; EU 900 / US 100 per minute, shifting to EU 100 / US 900 at 4m30s: demand equals " +
				"the limits' rate.",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: limits,
			Flows: append(both(shift(0, 900, 100)), both(shift(1, 100, 900))...)},
	}
}

// KindResult is one limit of a kinds scenario.
type KindResult struct {
	Scenario string
	Limit    string
	Kind     string // "window" or "bucket"
	Admitted int64
	// MaxIn[i] is the most admitted in any interval of KindLengths[i];
	// Bound[i] what the limit's kind promises for it (window: G for each
	// window the interval meets; bucket: B + R*T).
	MaxIn, Bound []int64
	// After is what each region admitted in the run's last five minutes
	// (from the shift's new demand on), by region name.
	After map[string]int64
	// CallsPerSec is the run's allocator calls per second (both limits).
	CallsPerSec float64
}

// RunKinds plays a kinds scenario under Leasehold with seed.
func RunKinds(sc Scenario, seed uint64) []KindResult {
	admits := make([][]time.Duration, len(sc.Limits))
	after := make([][]int64, len(sc.Limits)) // by limit, by region: admitted from 5 minutes on
	for li := range after {
		after[li] = make([]int64, len(sc.Regions))
	}
	res := run(sc, Leasehold, seed, func(region, limit int, at time.Duration) {
		admits[limit] = append(admits[limit], at)
		if at >= 5*minute {
			after[limit][region]++
		}
	})
	var out []KindResult
	for li, l := range sc.Limits {
		kr := KindResult{Scenario: sc.Name, Limit: l.ID, Kind: "window", Admitted: int64(len(admits[li])), CallsPerSec: res.AllocCallsPerSec}
		if l.IsBucket() {
			kr.Kind = "bucket"
		}
		ts := slices.Clone(admits[li])
		slices.Sort(ts)
		for _, T := range KindLengths {
			kr.MaxIn = append(kr.MaxIn, maxInAny(ts, T))
			if l.IsBucket() {
				kr.Bound = append(kr.Bound, lease.BucketBound(l.Rate, l.RatePeriod, l.Burst, T, 0))
			} else {
				// An interval of length T meets at most ceil(T/W) + 1
				// windows (strict mode, no faults: at most G each).
				n := int64((T+sc.Window-1)/sc.Window) + 1
				kr.Bound = append(kr.Bound, n*l.G)
			}
		}
		kr.After = map[string]int64{}
		for ri, r := range sc.Regions {
			kr.After[r.Name] = after[li][ri]
		}
		out = append(out, kr)
	}
	return out
}

// maxInAny is the most of the sorted instants ts in any interval [t, t+T).
func maxInAny(ts []time.Duration, T time.Duration) int64 {
	var best int64
	j := 0
	for i := range ts {
		for ts[i]-ts[j] >= T {
			j++
		}
		best = max(best, int64(i-j+1))
	}
	return best
}

// WriteKinds writes one line per limit of rs: what it admitted, the most
// in any interval of each length beside its bound, what each region
// admitted in the last five minutes.
func WriteKinds(w io.Writer, rs []KindResult) error {
	for _, r := range rs {
		var b strings.Builder
		fmt.Fprintf(&b, "%-11s %-6s %-12s adm %5d |", r.Scenario, r.Kind, r.Limit, r.Admitted)
		for i, T := range KindLengths {
			mark := ""
			if r.MaxIn[i] > r.Bound[i] {
				mark = "!"
			}
			fmt.Fprintf(&b, " %v: %d%s (bound %d)", T, r.MaxIn[i], mark, r.Bound[i])
		}
		names := make([]string, 0, len(r.After))
		for n := range r.After {
			names = append(names, n)
		}
		slices.Sort(names)
		b.WriteString(" | last 5 min")
		for _, n := range names {
			fmt.Fprintf(&b, " %s %d", n, r.After[n])
		}
		fmt.Fprintf(&b, " | calls/s %.2f\n", r.CallsPerSec)
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
	}
	return nil
}

// KindsTable renders a kinds scenario's results as a markdown table.
func KindsTable(rs []KindResult) string {
	var b strings.Builder
	b.WriteString("| limit | kind | admitted |")
	for _, T := range KindLengths {
		fmt.Fprintf(&b, " most in any %v (bound) |", T)
	}
	b.WriteString(" last 5 min per region | allocator calls/s |\n|---|---|---:|")
	for range KindLengths {
		b.WriteString("---:|")
	}
	b.WriteString("---|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %s | %d |", r.Limit, r.Kind, r.Admitted)
		for i := range KindLengths {
			mark := ""
			if r.MaxIn[i] > r.Bound[i] {
				mark = " **above its bound: a bug**"
			}
			fmt.Fprintf(&b, " %d (%d)%s |", r.MaxIn[i], r.Bound[i], mark)
		}
		names := make([]string, 0, len(r.After))
		for n := range r.After {
			names = append(names, n)
		}
		slices.Sort(names)
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = fmt.Sprintf("%s %d", n, r.After[n])
		}
		fmt.Fprintf(&b, " %s | %.2f |\n", strings.Join(parts, ", "), r.CallsPerSec)
	}
	return b.String()
}

const kindsIntro = `## Window limits against bucket limits

A window limit (G per W, aligned on the allocator's clock) promises G per
window: an interval of length T that meets n windows may admit n x G, so
G at the end of one window and G again at the start of the next. A bucket
limit (rate R per period P, burst B) promises at most B + R x T in every
interval of length T. Each scenario below runs one limit of each kind,
with the same long-run rate (1,000 per minute), under the same traffic in
one Leasehold run (the allocator grants the window limit leases and the
bucket limit rate shares; the agent core spends both). For every interval
of the run, not only windows, the table gives the most admitted in any
interval of each length, beside what the limit's kind promises for it.

`

// kindsText explains a kinds scenario's figures.
var kindsText = map[string]func([]KindResult) string{
	"kinds-burst": func(rs []KindResult) string {
		w, b := rs[0], rs[1]
		return fmt.Sprintf("At each boundary burst the window limit admits what is left of one window and then a whole "+
			"new G: %d tokens within two seconds (its bound, two windows, is %d). The bucket limit admits its burst and "+
			"its rate: %d within two seconds, against B + R x 2 s = %d. Over the whole run the bucket limit admits "+
			"less (%d against %d): outside the bursts demand is only 200 per minute, and a bucket does not save what "+
			"was not spent beyond its burst.", w.MaxIn[1], w.Bound[1], b.MaxIn[1], b.Bound[1], b.Admitted, w.Admitted)
	},
	"kinds-shift": func(rs []KindResult) string {
		w, b := rs[0], rs[1]
		return fmt.Sprintf("Demand equals the rate, so both kinds admit about 1,000 per minute and both follow the "+
			"shift: in the last five minutes the US admits %d (window) and %d (bucket), the EU %d and %d. The "+
			"bucket limit's shares follow demand within a share's life (10 s) and two renewals; the most it admits "+
			"in any minute is %d (B + R x 1 min = %d), the window limit's %d.",
			w.After["us"], b.After["us"], w.After["eu"], b.After["eu"], b.MaxIn[3], b.Bound[3], w.MaxIn[3])
	},
}
