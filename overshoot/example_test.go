package overshoot_test

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"leasehold/overshoot"
)

// The worked example of docs/overshoot.md: G = 1,000 tokens a minute, two
// regions, leases of 100 tokens, fallback local:100 in each region. All
// 1,000 tokens are granted (600 to eu, 400 to us) and spent; then etcd loses
// quorum, no more leases can be granted, and both regions fall back.
func Example() {
	window := func(mode overshoot.FallbackMode, fallbackEU, fallbackUS, carried int64) overshoot.Window {
		return overshoot.Window{
			Limit: 1000, LimitAtGrant: 1000, Granted: 1000, CarriedOver: carried,
			Regions: []overshoot.Region{
				{Name: "eu", Admitted: 600 + carried/2, Fallback: mode, LocalAllowance: 100, FallbackAdmitted: fallbackEU},
				{Name: "us", Admitted: 400 + carried/2, Fallback: mode, LocalAllowance: 100, FallbackAdmitted: fallbackUS},
			},
		}
	}
	show := func(name string, w overshoot.Window) {
		b := overshoot.Compute(w)
		var admitted int64
		for _, r := range w.Regions {
			admitted += r.Admitted + r.FallbackAdmitted
		}
		fmt.Printf("%-19s admitted %d <= G %d + bound %d = %d, observed overshoot %d\n",
			name+":", admitted, w.Limit, b.Total, w.Limit+b.Total, overshoot.Observed(w))
		fmt.Printf("%-19s %v\n", "", b)
	}

	// Bounded: each region admits up to 100 tokens of its own.
	show("bounded", window(overshoot.FallbackLocal, 100, 60, 0))
	// Strict: fallback closed, so the regions deny once their leases run out.
	show("strict", window(overshoot.FallbackClosed, 0, 0, 0))
	// Without clamping, each region could also spend a 100-token lease left
	// over from the previous window.
	show("strict, unclamped", window(overshoot.FallbackClosed, 0, 0, 200))
	// Output:
	// bounded:            admitted 1160 <= G 1000 + bound 200 = 1200, observed overshoot 160
	//                     200 (carry_over 0, fallback 200, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)
	// strict:             admitted 1000 <= G 1000 + bound 0 = 1000, observed overshoot 0
	//                     0 (carry_over 0, fallback 0, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)
	// strict, unclamped:  admitted 1200 <= G 1000 + bound 200 = 1200, observed overshoot 200
	//                     200 (carry_over 200, fallback 0, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)
}

// A report row as JSON: one region went to open fallback, so the bound is
// "+Inf"; the other failed over its Redis and lost 300 ms of spends at
// 10 tokens/s.
func ExampleNewReport() {
	start := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	w := overshoot.Window{
		Limit: 1000, LimitAtGrant: 1000, Granted: 1000, Returned: 50,
		Regions: []overshoot.Region{
			{Name: "eu", Admitted: 550, Failovers: []overshoot.Failover{{Lag: 300 * time.Millisecond, AdmitRate: 10}}},
			{Name: "us", Admitted: 380, Fallback: overshoot.FallbackOpen, FallbackAdmitted: 240},
		},
	}
	r := overshoot.NewReport("tenant/atlas", start, start.Add(time.Minute), w)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		fmt.Println(err)
	}
	fmt.Println("terms:", r.Terms)
	// Output:
	// {
	//   "limit": "tenant/atlas",
	//   "window_start": "2026-11-29T18:00:00Z",
	//   "window_end": "2026-11-29T18:01:00Z",
	//   "limit_tokens": 1000,
	//   "granted": 1000,
	//   "returned": 50,
	//   "admitted": {
	//     "eu": 550,
	//     "us": 620
	//   },
	//   "admitted_total": 1170,
	//   "fallback_admitted": 240,
	//   "bound": "+Inf",
	//   "observed_overshoot": 170,
	//   "stranded": 20
	// }
	// terms: +Inf (carry_over 0, fallback 0, lost_grants 0, redis_rollback 3, limit_lowered 0, settlement 0)
}
