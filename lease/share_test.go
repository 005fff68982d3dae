package lease

import (
	"math"
	"testing"
)

func TestSizeShare(t *testing.T) {
	eu, us := RegionDemand{Region: "eu", Rate: 300}, RegionDemand{Region: "us", Rate: 100}
	for _, c := range []struct {
		name              string
		r                 ShareRequest
		wantRate, wantBst int64
	}{
		{"alone: everything", ShareRequest{Rate: 100_000, Burst: 200, Region: "eu", Demands: []RegionDemand{eu}}, 100_000, 200},
		{"by demand: 3/4", ShareRequest{Rate: 100_000, Burst: 200, Region: "eu", Demands: []RegionDemand{eu, us}}, 75_000, 150},
		{"by demand: 1/4", ShareRequest{Rate: 100_000, Burst: 200, Region: "us", Demands: []RegionDemand{eu, us}}, 25_000, 50},
		{"capped by what the others hold", ShareRequest{Rate: 100_000, Burst: 200, Region: "eu", Demands: []RegionDemand{eu, us},
			OthersRate: 90_000, OthersBurst: 180}, 10_000, 20},
		{"others hold everything", ShareRequest{Rate: 100_000, Burst: 200, Region: "eu", Demands: []RegionDemand{eu},
			OthersRate: 100_000, OthersBurst: 300}, 0, 0},
		{"quiet region: the floor", ShareRequest{Rate: 100_000, Burst: 200, Region: "us",
			Demands: []RegionDemand{eu, {Region: "us"}}}, 990, 1},
		{"nobody reports demand: equal", ShareRequest{Rate: 90_000, Burst: 9, Region: "us",
			Demands: []RegionDemand{{Region: "eu"}, {Region: "us"}, {Region: "ap"}}}, 30_000, 3},
		{"requester missing: a quiet region's part", ShareRequest{Rate: 100_000, Burst: 200, Region: "ap", Demands: []RegionDemand{eu}}, 990, 1},
		{"a rate gets a burst of 1 if one is left", ShareRequest{Rate: 1000, Burst: 1, Region: "us", Demands: []RegionDemand{eu, us}}, 250, 1},
		{"bad demands count as 0", ShareRequest{Rate: 1000, Burst: 10, Region: "eu",
			Demands: []RegionDemand{{Region: "eu", Rate: math.NaN()}, {Region: "us", Rate: -1}}}, 500, 5},
		{"infinite demand", ShareRequest{Rate: 1000, Burst: 10, Region: "eu",
			Demands: []RegionDemand{{Region: "eu", Rate: math.Inf(1)}, {Region: "us", Rate: math.MaxFloat64}}}, 500, 5},
		{"negative limits", ShareRequest{Rate: -1, Burst: -1, Region: "eu", Demands: []RegionDemand{eu}, OthersRate: -5}, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if r, b := SizeShare(c.r); r != c.wantRate || b != c.wantBst {
				t.Fatalf("SizeShare = (%d, %d), want (%d, %d)", r, b, c.wantRate, c.wantBst)
			}
		})
	}
}

// FuzzSizeShare: whatever the reports, a share is never negative, never
// more than what the other regions leave, and regions that ask one after
// another, each counting what the others were given, never hold more than
// R and B together.
func FuzzSizeShare(f *testing.F) {
	f.Add(int64(100_000), int64(200), 300.0, 100.0, 0.0, int64(0), int64(0), uint8(0))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), math.Inf(1), math.NaN(), -1.0, int64(math.MaxInt64), int64(-1), uint8(255))
	f.Fuzz(func(t *testing.T, rate, burst int64, d0, d1, d2 float64, othersRate, othersBurst int64, order uint8) {
		names := []string{"eu", "us", "ap"}
		demands := []RegionDemand{{Region: "eu", Rate: d0}, {Region: "us", Rate: d1}, {Region: "ap", Rate: d2}}
		r := ShareRequest{Rate: rate, Burst: burst, Region: names[order%3], Demands: demands, OthersRate: othersRate, OthersBurst: othersBurst}
		gr, gb := SizeShare(r)
		if gr < 0 || gb < 0 || gr > max(0, max(rate, 0)-max(othersRate, 0)) || gb > max(0, max(burst, 0)-max(othersBurst, 0)) {
			t.Fatalf("SizeShare(%+v) = (%d, %d)", r, gr, gb)
		}
		// Three rounds of renewals in some order: the holdings always fit.
		held := map[string][2]int64{}
		for i := range 9 {
			region := names[(int(order)+i*(1+int(order>>2)%2))%3]
			var or, ob int64
			for n, h := range held {
				if n != region {
					or, ob = or+h[0], ob+h[1]
				}
			}
			gr, gb := SizeShare(ShareRequest{Rate: rate, Burst: burst, Region: region, Demands: demands, OthersRate: or, OthersBurst: ob})
			held[region] = [2]int64{gr, gb}
			var sr, sb int64
			for _, h := range held {
				sr, sb = sr+h[0], sb+h[1]
			}
			if sr > max(rate, 0) || sb > max(burst, 0) {
				t.Fatalf("holdings %v exceed (%d, %d)", held, rate, burst)
			}
		}
	})
}
