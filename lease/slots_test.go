package lease

import (
	"math"
	"testing"
)

func TestSizeSlots(t *testing.T) {
	d := func(region string, rate float64) RegionDemand { return RegionDemand{Region: region, Rate: rate} }
	for _, tc := range []struct {
		name     string
		r        SlotRequest
		n, admit int64
	}{
		{"alone: the whole cap", SlotRequest{N: 3, Region: "eu", Demands: []RegionDemand{d("eu", 8)}}, 3, 3},
		{"two alike, first asks: rounded up", SlotRequest{N: 3, Region: "eu", Demands: []RegionDemand{d("eu", 8), d("us", 8)}}, 2, 2},
		{"two alike, second asks: what is left", SlotRequest{N: 3, Region: "us", Demands: []RegionDemand{d("eu", 8), d("us", 8)}, Others: 2}, 1, 1},
		{"held above the part: kept, nothing admitted beyond the part", SlotRequest{N: 3, Region: "eu",
			Demands: []RegionDemand{d("eu", 8), d("us", 8)}, Held: 3}, 3, 2},
		{"held above what the others leave: capped", SlotRequest{N: 3, Region: "eu",
			Demands: []RegionDemand{d("eu", 8), d("us", 8)}, Held: 3, Others: 2}, 1, 1},
		{"others hold everything", SlotRequest{N: 3, Region: "eu", Demands: []RegionDemand{d("eu", 1)}, Others: 3}, 0, 0},
		{"a quiet region keeps a slot to restart", SlotRequest{N: 10, Region: "us", Demands: []RegionDemand{d("eu", 100), d("us", 0)}}, 1, 1},
		{"nobody reports: all alike", SlotRequest{N: 4, Region: "eu"}, 4, 4},
		{"negative inputs", SlotRequest{N: -1, Held: -5, Others: -3, Region: "eu"}, 0, 0},
		{"nan and inf demands", SlotRequest{N: 5, Region: "eu", Demands: []RegionDemand{d("eu", math.NaN()), d("us", math.Inf(1))}}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, admit := SizeSlots(tc.r)
			if n != tc.n || admit != tc.admit {
				t.Fatalf("SizeSlots(%+v) = %d, %d; want %d, %d", tc.r, n, admit, tc.n, tc.admit)
			}
		})
	}
}

// FuzzSizeSlots: whatever the inputs, 0 <= admit <= n <= N - Others, and
// the requester keeps what it holds while the others leave room.
func FuzzSizeSlots(f *testing.F) {
	f.Add(int64(3), int64(0), int64(0), 8.0, 8.0)
	f.Add(int64(1<<62), int64(5), int64(1<<61), 1e300, 0.0)
	f.Fuzz(func(t *testing.T, n, held, others int64, mine, theirs float64) {
		got, admit := SizeSlots(SlotRequest{N: n, Held: held, Others: others, Region: "a",
			Demands: []RegionDemand{{Region: "a", Rate: mine}, {Region: "b", Rate: theirs}}})
		free := max(0, max(n, 0)-max(others, 0))
		if admit < 0 || admit > got || got > free {
			t.Fatalf("N %d held %d others %d: n %d admit %d, free %d", n, held, others, got, admit, free)
		}
		if got < min(max(held, 0), free) {
			t.Fatalf("N %d held %d others %d: n %d below what it holds", n, held, others, got)
		}
	})
}
