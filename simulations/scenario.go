package simulations

import (
	"time"

	"leasehold/allocator"
)

// Strategy names one way of enforcing a global limit.
type Strategy int

// The strategies compared.
const (
	// Independent: each region enforces G on its own (a regional limiter).
	Independent Strategy = iota
	// StaticSplit: each region enforces a fixed share G / regions.
	StaticSplit
	// Central: every request asks the home-region authority (exact; pays
	// the WAN round trip; unavailable while the home region is unreachable).
	Central
	// Leasehold: leases from the allocator, spent locally.
	Leasehold
)

// Strategies lists every strategy in report order.
var Strategies = []Strategy{Independent, StaticSplit, Central, Leasehold}

func (s Strategy) String() string {
	switch s {
	case Independent:
		return "independent"
	case StaticSplit:
		return "static split"
	case Central:
		return "central"
	case Leasehold:
		return "leasehold"
	}
	return "?"
}

// Region is one serving region: its link to the home region (where the
// allocator and the central authority run), and the clocks of its agent
// and of its Redis.
type Region struct {
	Name   string
	RTT    time.Duration // round trip to the home region (base)
	Jitter time.Duration // one-way jitter, uniform in [0, Jitter)
	Loss   float64       // per message, each way
	Dup    float64       // per message, each way
	Agent  Clock
	Redis  Clock
}

// LimitSpec is one global limit: a window limit (G per window), or a
// bucket limit when Rate > 0 (Rate tokens per RatePeriod, bursts of Burst;
// TTL is then its rate shares' ttl, default 10 s). Only the Leasehold
// strategy runs bucket limits (RunKinds).
type LimitSpec struct {
	ID       string
	G        int64
	TTL      time.Duration // lease ttl (default W/4)
	MinChunk int64         // default 1
	MaxChunk int64         // 0: none

	Rate       int64
	RatePeriod time.Duration // default 1 s
	Burst      int64
}

// IsBucket tells whether the limit is a bucket limit.
func (l *LimitSpec) IsBucket() bool { return l.Rate > 0 }

// Phase is a demand rate that applies from At on.
type Phase struct {
	At     time.Duration
	PerMin float64
}

// Flow is the demand of one limit in one region: requests of cost 1 whose
// rate changes at the phases' instants.
type Flow struct {
	Region  int
	Limit   int
	Poisson bool // else constant spacing
	Phases  []Phase
}

// FaultKind is a fault injected at an instant.
type FaultKind int

// Faults.
const (
	// Partition cuts the region from the home region for Duration.
	Partition FaultKind = iota
	// RegionLoss takes a region down for good: agent, Redis and traffic.
	RegionLoss
	// AllocatorFailover kills the allocator leader (and the central
	// authority); a new leader serves after Duration, rebuilt from what
	// was committed.
	AllocatorFailover
)

// Fault is one fault of a scenario.
type Fault struct {
	Kind     FaultKind
	At       time.Duration
	Region   int
	Duration time.Duration
}

// Scenario is everything one run needs besides the strategy and the seed.
type Scenario struct {
	Name    string // short id, file names
	Title   string
	About   string // one paragraph for the report
	Window  time.Duration
	Windows int // run length, in windows
	Home    Clock
	Regions []Region
	Limits  []LimitSpec
	Flows   []Flow
	Faults  []Fault
	// Commit is how long an etcd commit takes (default 5ms).
	Commit time.Duration
	// LocalRTT is the round trip from a gateway to its region's limiter
	// (Redis), the latency a local decision adds (default 1ms).
	LocalRTT time.Duration
	// Series is the limit whose per-window figures the report plots.
	Series int
}

func (sc *Scenario) defaults() {
	if sc.Commit == 0 {
		sc.Commit = 5 * time.Millisecond
	}
	if sc.LocalRTT == 0 {
		sc.LocalRTT = time.Millisecond
	}
	for i := range sc.Limits {
		l := &sc.Limits[i]
		if l.IsBucket() {
			if l.RatePeriod == 0 {
				l.RatePeriod = time.Second
			}
			if l.TTL == 0 {
				l.TTL = allocator.DefaultShareTTL
			}
			continue
		}
		if l.TTL == 0 {
			l.TTL = sc.Window / 4
		}
		if l.MinChunk == 0 {
			l.MinChunk = 1
		}
	}
}

// Duration is the run's length.
func (sc *Scenario) Duration() time.Duration { return time.Duration(sc.Windows) * sc.Window }
