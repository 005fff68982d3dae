package allocator

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "leasehold/proto/leasehold/v1"
)

// withOverride returns base's record overridden from its own version on
// by a version that set (a change of the numbers), ending at end: what
// overrideRecord stores, decoded as the core sees it.
func withOverride(base *Limit, end time.Time, set func(*pb.Limit)) *Limit {
	after := cloneLimit(base.Proto)
	p := cloneLimit(base.Proto)
	set(p)
	p.Version = base.Version + 1
	p.Override = &pb.LimitOverride{Reason: "test", EndsAt: timestamppb.New(end), After: after}
	return decodeLimit(p)
}

// TestSharesAcrossOverride: random requests from three regions around the
// start and the end of an override that raises or cuts R and B (or N),
// checked at every grant and expiry instant against a reference: the
// shares in force never add up to more than the largest limit any of them
// was granted under; from one share ttl after the start, within the
// override's; from one ttl after the end, within the old version's. A
// new leader rebuilds from the records now and then (the end is read
// from the record, not from who saw it start).
func TestSharesAcrossOverride(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	regions := []string{"eu", "us", "ap"}
	for seed := range seeds {
		rng := rand.New(rand.NewSource(int64(seed)))
		ttl := time.Duration(1+rng.Intn(10)) * time.Second
		concurrency := seed%2 == 1
		var base *Limit
		var n1, n2, b1, b2 int64
		if concurrency {
			n1, n2 = 1+rng.Int63n(20), 1+rng.Int63n(20)
			base = concLimit(t, "x", n1, ttl, regions...)
		} else {
			n1, n2, b1, b2 = 1+rng.Int63n(1000), 1+rng.Int63n(1000), 1+rng.Int63n(500), 1+rng.Int63n(500)
			base = bucketLimit("x", n1, b1, ttl, regions...)
		}
		start := t0.Add(time.Duration(20+rng.Intn(20)) * time.Second)
		end := start.Add(time.Duration(20+rng.Intn(40)) * time.Second)
		over := withOverride(base, end, func(p *pb.Limit) {
			if concurrency {
				p.LimitTokens = n2
			} else {
				p.RateTokens, p.BurstTokens = n2, b2
			}
		})
		c := NewCore()
		c.SetLimit(base)
		var all []*ShareGrant
		now, overridden := t0, false
		check := func(step int, at time.Time) {
			t.Helper()
			var sum, burst, top, topBurst int64
			if concurrency {
				held := map[string]int64{}
				for _, g := range all {
					if g.GrantedAt <= at.UnixNano() && at.UnixNano() < g.ExpiresAt {
						k := g.Region + "/" + g.Holder
						held[k] = max(held[k], g.Slots)
						top = max(top, g.LimitN)
					}
				}
				for _, v := range held {
					sum += v
				}
			} else {
				sum, burst = refReserved(all, at)
				for _, g := range all {
					if g.GrantedAt <= at.UnixNano() && at.UnixNano() < g.ExpiresAt {
						top, topBurst = max(top, g.LimitRate*1000), max(topBurst, g.LimitBurst)
					}
				}
			}
			want, wantBurst := top, topBurst // the largest version any share in force was granted under
			switch {
			case !at.Before(end.Add(ttl)):
				want, wantBurst = n1, b1
			case !at.Before(start.Add(ttl)) && at.Before(end):
				want, wantBurst = n2, b2
			}
			if !concurrency && !at.Before(start.Add(ttl)) && (at.Before(end) || !at.Before(end.Add(ttl))) {
				want *= 1000
			}
			if sum > want || !concurrency && burst > wantBurst {
				t.Fatalf("seed %d step %d at %v (override %v..%v, %d -> %d, ttl %v): in force %d (burst %d), want at most %d (%d)",
					seed, step, at.Sub(t0), start.Sub(t0), end.Sub(t0), n1, n2, ttl, sum, burst, want, wantBurst)
			}
		}
		for i := 0; i < 5000 && !now.After(end.Add(2*ttl)); i++ { // about 500 steps at ttl 1s
			now = now.Add(time.Duration(rng.Int63n(int64(ttl / 2))))
			if !overridden && !now.Before(start) {
				// The override is written at start (the instant of its
				// change): from then on the core has its record.
				c.SetLimit(over)
				overridden = true
			}
			region := regions[rng.Intn(3)]
			d := c.AcquireShare(now, region, ShareAcquire{RequestID: fmt.Sprintf("r%d", i), Limit: "x",
				Demand: rng.Float64() * 1000, HeldSlots: rng.Int63n(25)})
			if d.New {
				if lim := c.limits["x"].At(now); concurrency && d.Grant.LimitN != lim.Tokens || !concurrency && d.Grant.LimitRate != lim.Rate {
					t.Fatalf("seed %d step %d at %v: a share granted under %d/%d, the version in force has %d/%d",
						seed, i, now.Sub(t0), d.Grant.LimitN, d.Grant.LimitRate, lim.Tokens, lim.Rate)
				}
				all = append(all, d.Grant)
			}
			for _, at := range append([]time.Time{now}, expiriesAfter(all, now)...) {
				check(i, at)
			}
			if rng.Intn(20) == 0 { // a new leader rebuilds from the records
				nc := NewCore()
				nc.SetLimit(c.limits["x"])
				for _, gs := range c.shares["x"].byRegion {
					for _, g := range gs {
						nc.RestoreShare(g)
					}
				}
				c = nc
			}
		}
		if !overridden || !now.After(end.Add(ttl)) {
			t.Fatalf("seed %d: the run ended at %v, before the override's end %v + ttl", seed, now.Sub(t0), end.Sub(t0))
		}
	}
}
