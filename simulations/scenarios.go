package simulations

import (
	"fmt"
	"time"
)

const (
	minute = time.Minute
	second = time.Second
	ms     = time.Millisecond
)

// twoRegions is EU and US at 90 and 110 ms from the home region, with a
// little loss and duplication, and clocks a few ms apart.
func twoRegions() []Region {
	return []Region{
		{Name: "eu", RTT: 90 * ms, Jitter: 10 * ms, Loss: 0.001, Dup: 0.001,
			Agent: Clock{Offset: 3 * ms, DriftPPM: 20}, Redis: Clock{Offset: -2 * ms, DriftPPM: -15}},
		{Name: "us", RTT: 110 * ms, Jitter: 10 * ms, Loss: 0.001, Dup: 0.001,
			Agent: Clock{Offset: -4 * ms, DriftPPM: -25}, Redis: Clock{Offset: 1 * ms, DriftPPM: 10}},
	}
}

func atlas() []LimitSpec { return []LimitSpec{{ID: "tenant/atlas", G: 1000}} }

func flat(region int, perMin float64) Flow {
	return Flow{Region: region, Limit: 0, Poisson: true, Phases: []Phase{{At: 0, PerMin: perMin}}}
}

// Scenarios returns the report's scenarios. The random one is built from
// seed.
func Scenarios(seed uint64) []Scenario {
	burst := func(region int) Flow {
		f := Flow{Region: region, Poisson: true, Phases: []Phase{{At: 0, PerMin: 100}}}
		for _, b := range []time.Duration{2 * minute, 4 * minute, 6 * minute, 8 * minute} {
			f.Phases = append(f.Phases, Phase{At: b - second, PerMin: 90_000}, Phase{At: b + second, PerMin: 100})
		}
		return f
	}
	drift := []Region{
		{Name: "eu", RTT: 80 * ms, Jitter: 20 * ms, Loss: 0.001, Dup: 0.001,
			Agent: Clock{Offset: 40 * ms, DriftPPM: 200}, Redis: Clock{Offset: -35 * ms, DriftPPM: -200}},
		{Name: "us", RTT: 300 * ms, Jitter: 40 * ms, Loss: 0.001, Dup: 0.001,
			Agent: Clock{Offset: -50 * ms, DriftPPM: -200}, Redis: Clock{Offset: 45 * ms, DriftPPM: 200}},
	}
	return []Scenario{
		{Name: "steady", Title: "Steady demand under G",
			About:  "EU 400 + US 400 requests per minute (Poisson) against G = 1,000 per minute, for 10 windows.",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: atlas(),
			Flows: []Flow{flat(0, 400), flat(1, 400)}},
		{Name: "shift", Title: "Demand shift",
			About: "EU 900 / US 100 per minute against G = 1,000; at 4m30s (mid-window) the demand shifts to EU 100 / US 900. " +
				"Demand equals G: a static split strands what the busy region cannot use.",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: atlas(),
			Flows: []Flow{
				{Region: 0, Poisson: true, Phases: []Phase{{At: 0, PerMin: 900}, {At: 4*minute + 30*second, PerMin: 100}}},
				{Region: 1, Poisson: true, Phases: []Phase{{At: 0, PerMin: 100}, {At: 4*minute + 30*second, PerMin: 900}}},
			}},
		{Name: "contention", Title: "Contention",
			About:  "EU 1,500 / US 500 per minute against G = 1,000: demand is twice the limit.",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: atlas(),
			Flows: []Flow{flat(0, 1500), flat(1, 500)}},
		{Name: "burst", Title: "Boundary burst",
			About: "100 per minute in each region, and a burst of 1,500 requests per second in both regions for the " +
				"second before and the second after the window boundaries at 2, 4, 6 and 8 minutes (3,000 per region " +
				"per burst).",
			Window: minute, Windows: 10, Regions: twoRegions(), Limits: atlas(),
			Flows: []Flow{burst(0), burst(1)}},
		{Name: "partition", Title: "Region partitioned while holding tokens",
			About: "EU 200 / US 800 per minute (a US lease covers ~200 tokens for the 15 s ttl). The US is cut off from the " +
				"home region at 2m15s, just after a renewal (with seed 1 it holds 200 tokens then), for 90 s; its fallback " +
				"is closed.",
			Window: minute, Windows: 8, Regions: twoRegions(), Limits: atlas(),
			Flows:  []Flow{flat(0, 200), flat(1, 800)},
			Faults: []Fault{{Kind: Partition, At: 2*minute + 15*second, Region: 1, Duration: 90 * second}}},
		{Name: "regionloss", Title: "Region loss",
			About:  "EU 700 / US 600 per minute; the US region (agent, Redis, gateways) is lost for good at 2m30s.",
			Window: minute, Windows: 8, Regions: twoRegions(), Limits: atlas(),
			Flows:  []Flow{flat(0, 700), flat(1, 600)},
			Faults: []Fault{{Kind: RegionLoss, At: 2*minute + 30*second, Region: 1}}},
		{Name: "failover", Title: "Allocator failover mid-window",
			About: "EU 600 / US 600 per minute; the allocator leader dies at 2m20s (grants not yet committed are lost) " +
				"and a follower serves 5 s later, rebuilt from the committed grants. The central authority is down " +
				"for the same 5 s.",
			Window: minute, Windows: 8, Regions: twoRegions(), Limits: atlas(),
			Flows:  []Flow{flat(0, 600), flat(1, 600)},
			Faults: []Fault{{Kind: AllocatorFailover, At: 2*minute + 20*second, Duration: takeover}}},
		{Name: "drift", Title: "Clock drift 200 ppm, RTT 80-300 ms",
			About: "Every agent and Redis clock drifts by 200 ppm (alternating sign) and is offset by 35-50 ms; " +
				"EU is 80 ms and US 300 ms from the home region, with jitter. EU 700 / US 700 per minute.",
			Window: minute, Windows: 10, Home: Clock{DriftPPM: 200}, Regions: drift, Limits: atlas(),
			Flows: []Flow{flat(0, 700), flat(1, 700)}},
		RandomScenario(seed, 10, 1000, 2, 20*second),
	}
}

// RandomScenario is regions x limits with random G, random demand split
// unevenly across the regions, random RTTs (80-300 ms), loss and
// duplication up to 0.5%, and clocks with offsets up to 50 ms and drift up
// to 200 ppm.
func RandomScenario(seed uint64, regions, limits, windows int, window time.Duration) Scenario {
	rng := stream(seed, 9, 0)
	sc := Scenario{Name: "random", Title: fmt.Sprintf("%d regions x %d limits, random demand", regions, limits),
		Window: window, Windows: windows, Home: Clock{DriftPPM: rng.Float64()*400 - 200}}
	sc.About = fmt.Sprintf("%d regions (RTT 80-300 ms, loss and duplication up to 0.5%%, clock offsets up to 50 ms, "+
		"drift up to 200 ppm) and %d limits with G from 100 to 1,000 per %v; each limit's demand is 0.3 to 1.6 x G, "+
		"split unevenly (some regions far busier than others). %d windows.", regions, limits, window, windows)
	clock := func() Clock {
		return Clock{Offset: time.Duration(rng.Int64N(int64(100*ms))) - 50*ms, DriftPPM: rng.Float64()*400 - 200}
	}
	for i := range regions {
		sc.Regions = append(sc.Regions, Region{Name: fmt.Sprintf("r%02d", i),
			RTT:    80*ms + time.Duration(rng.Int64N(int64(220*ms))),
			Jitter: time.Duration(1 + rng.Int64N(int64(20*ms))),
			Loss:   rng.Float64() * 0.005, Dup: rng.Float64() * 0.005, Agent: clock(), Redis: clock()})
	}
	perW := float64(minute) / float64(window)
	for li := range limits {
		g := 100 + rng.Int64N(901)
		sc.Limits = append(sc.Limits, LimitSpec{ID: fmt.Sprintf("t%04d", li), G: g})
		total := (0.3 + 1.3*rng.Float64()) * float64(g) * perW // per minute
		weights := make([]float64, regions)
		var sum float64
		for r := range weights {
			x := rng.ExpFloat64()
			weights[r] = x * x
			sum += weights[r]
		}
		for r, wt := range weights {
			if rate := total * wt / sum; rate >= 2 {
				sc.Flows = append(sc.Flows, Flow{Region: r, Limit: li, Poisson: true, Phases: []Phase{{PerMin: rate}}})
			}
		}
	}
	return sc
}
