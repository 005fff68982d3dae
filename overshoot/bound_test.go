package overshoot

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"
)

const maxI = math.MaxInt64

func TestCarryOver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		carried int64
		want    int64
	}{
		{"clamped leases carry nothing", 0, 0},
		{"one chunk from the previous window", 100, 100},
		{"two regions, one chunk each", 200, 200},
		{"negative reads as 0", -5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Compute(Window{Limit: 1000, Granted: 1000, CarriedOver: tc.carried})
			if b.CarryOver != tc.want || b.Total != tc.want {
				t.Errorf("CarryOver, Total = %d, %d; want %d, %d", b.CarryOver, b.Total, tc.want, tc.want)
			}
		})
	}
}

func TestFallback(t *testing.T) {
	local := func(name string, a, admitted int64) Region {
		return Region{Name: name, Fallback: FallbackLocal, LocalAllowance: a, FallbackAdmitted: admitted}
	}
	for _, tc := range []struct {
		name     string
		regions  []Region
		want     int64
		infinite bool
	}{
		{"no region fell back", []Region{{Name: "eu"}, {Name: "us"}}, 0, false},
		{"closed adds nothing", []Region{{Name: "eu", Fallback: FallbackClosed}}, 0, false},
		{"allowance of a region not in fallback is not counted",
			[]Region{{Name: "eu", LocalAllowance: 100}, local("us", 100, 0)}, 100, false},
		{"local:100 counts A even if it admitted less", []Region{local("eu", 100, 30)}, 100, false},
		{"local:100 counts A even if it admitted more (a bug observed as overshoot)", []Region{local("eu", 100, 500)}, 100, false},
		{"two regions in local:100", []Region{local("eu", 100, 100), local("us", 100, 60)}, 200, false},
		{"local:100 and local:50", []Region{local("eu", 100, 0), local("us", 50, 0)}, 150, false},
		{"negative allowance reads as 0", []Region{local("eu", -7, 0)}, 0, false},
		{"open makes the bound infinite", []Region{local("eu", 100, 0), {Name: "us", Fallback: FallbackOpen}}, 100, true},
		{"unknown mode is treated as open", []Region{{Name: "eu", Fallback: FallbackMode(9)}}, 0, true},
		{"allowances saturate", []Region{local("eu", maxI, 0), local("us", maxI, 0)}, maxI, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Compute(Window{Limit: 1000, Granted: 1000, Regions: tc.regions})
			if b.Fallback != tc.want || b.Infinite != tc.infinite {
				t.Fatalf("Fallback, Infinite = %d, %v; want %d, %v", b.Fallback, b.Infinite, tc.want, tc.infinite)
			}
			wantTotal := tc.want
			if tc.infinite {
				wantTotal = maxI
			}
			if b.Total != wantTotal {
				t.Errorf("Total = %d, want %d", b.Total, wantTotal)
			}
		})
	}
}

// TestGrantTerms steps LostGrants and LimitLowered through a window whose
// G is lowered, raised, or overrun by a buggy allocator.
func TestGrantTerms(t *testing.T) {
	for _, tc := range []struct {
		name                              string
		limit, atGrant, granted, returned int64
		lost, lowered                     int64
	}{
		{"all granted, G unchanged", 1000, 1000, 1000, 0, 0, 0},
		{"LimitAtGrant 0 means unchanged", 1000, 0, 1000, 0, 0, 0},
		{"part granted", 1000, 1000, 800, 0, 0, 0},
		{"returns credited back", 1000, 1000, 1000, 400, 0, 0},
		{"bug: granted beyond G", 1000, 1000, 1200, 0, 200, 0},
		{"granted beyond G, but returned enough", 1000, 1000, 1200, 300, 0, 0},
		{"G lowered 1000 -> 600 after 900 granted", 600, 1000, 900, 0, 0, 300},
		{"G lowered 1000 -> 600 after all granted", 600, 1000, 1000, 0, 0, 400},
		{"G lowered, and a bug granted 100 more", 600, 1000, 1100, 0, 100, 400},
		{"G lowered below what was granted, then returns", 600, 1000, 1000, 300, 0, 100},
		{"G lowered, fewer granted than the new G", 600, 1000, 500, 0, 0, 0},
		{"G raised 1000 -> 1200", 1200, 1000, 1100, 0, 0, 0},
		{"returned more than granted (invalid)", 100, 100, 50, 80, 0, 0},
		{"negative limit reads as 0", -10, 0, 5, 0, 5, 0},
		{"huge counts do not overflow", 0, maxI, maxI, 0, 0, maxI},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Compute(Window{Limit: tc.limit, LimitAtGrant: tc.atGrant, Granted: tc.granted, Returned: tc.returned})
			if b.LostGrants != tc.lost || b.LimitLowered != tc.lowered {
				t.Errorf("LostGrants, LimitLowered = %d, %d; want %d, %d", b.LostGrants, b.LimitLowered, tc.lost, tc.lowered)
			}
			if want := tc.lost + tc.lowered; b.Total != want {
				t.Errorf("Total = %d, want %d", b.Total, want)
			}
		})
	}
}

func TestRedisRollback(t *testing.T) {
	fo := func(lag time.Duration, rate float64, observed int64) Failover {
		return Failover{Lag: lag, AdmitRate: rate, Observed: observed}
	}
	for _, tc := range []struct {
		name      string
		failovers []Failover
		want      int64
	}{
		{"no failover", nil, 0},
		{"300ms x 10/s = 3, exactly", []Failover{fo(300*time.Millisecond, 10, 0)}, 3},
		{"250ms x 10/s = 2.5, rounded up", []Failover{fo(250*time.Millisecond, 10, 0)}, 3},
		{"1s x 1000/s", []Failover{fo(time.Second, 1000, 0)}, 1000},
		{"1ns x 1/s rounds up to one token", []Failover{fo(1, 1, 0)}, 1},
		{"observed above the estimate wins", []Failover{fo(300*time.Millisecond, 10, 7)}, 7},
		{"estimate above observed wins", []Failover{fo(300*time.Millisecond, 10, 2)}, 3},
		{"observed only (no lag reported)", []Failover{fo(0, 0, 5)}, 5},
		{"two failovers add", []Failover{fo(time.Second, 20, 0), fo(500*time.Millisecond, 20, 0)}, 30},
		{"zero rate", []Failover{fo(time.Second, 0, 0)}, 0},
		{"negative lag and rate read as 0", []Failover{fo(-time.Second, 10, 0), fo(time.Second, -10, 0)}, 0},
		{"unknown (NaN) rate saturates", []Failover{fo(time.Second, math.NaN(), 0)}, maxI},
		{"infinite rate saturates", []Failover{fo(time.Second, math.Inf(1), 0)}, maxI},
		{"huge product saturates", []Failover{fo(time.Hour, 1e300, 0)}, maxI},
		{"sum saturates", []Failover{fo(0, 0, maxI), fo(0, 0, 1)}, maxI},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Compute(Window{Regions: []Region{{Name: "eu", Failovers: tc.failovers}}})
			if b.RedisRollback != tc.want || b.Total != tc.want {
				t.Errorf("RedisRollback, Total = %d, %d; want %d", b.RedisRollback, b.Total, tc.want)
			}
		})
	}
	t.Run("failovers of several regions add", func(t *testing.T) {
		b := Compute(Window{Regions: []Region{
			{Name: "eu", Failovers: []Failover{fo(time.Second, 10, 0)}},
			{Name: "us", Failovers: []Failover{fo(time.Second, 5, 0)}},
		}})
		if b.RedisRollback != 15 {
			t.Errorf("RedisRollback = %d, want 15", b.RedisRollback)
		}
	})
}

func TestTotalSaturates(t *testing.T) {
	b := Compute(Window{
		CarriedOver: maxI,
		Regions:     []Region{{Fallback: FallbackLocal, LocalAllowance: maxI, Failovers: []Failover{{Observed: maxI}}}},
		Granted:     maxI,
	})
	if b.Total != maxI || b.Infinite {
		t.Errorf("Total, Infinite = %d, %v; want MaxInt64, false", b.Total, b.Infinite)
	}
}

func TestObservedAndStranded(t *testing.T) {
	for _, tc := range []struct {
		name               string
		w                  Window
		observed, stranded int64
	}{
		{"empty", Window{}, 0, 0},
		{"under the limit, all spent", Window{Limit: 1000, Granted: 800, Regions: []Region{{Admitted: 500}, {Admitted: 300}}}, 0, 0},
		{"exactly the limit", Window{Limit: 1000, Granted: 1000, Regions: []Region{{Admitted: 600}, {Admitted: 400}}}, 0, 0},
		{"fallback admits over the limit", Window{Limit: 1000, Granted: 1000,
			Regions: []Region{{Admitted: 600, FallbackAdmitted: 100}, {Admitted: 400, FallbackAdmitted: 60}}}, 160, 0},
		{"a quiet region strands its lease", Window{Limit: 1000, Granted: 1000,
			Regions: []Region{{Admitted: 600}, {Admitted: 250}}}, 0, 150},
		{"returns are not stranded", Window{Limit: 1000, Granted: 1000, Returned: 100,
			Regions: []Region{{Admitted: 600}, {Admitted: 250}}}, 0, 50},
		{"re-spends after a failover hide stranded tokens", Window{Limit: 100, Granted: 100,
			Regions: []Region{{Admitted: 103}}}, 3, 0},
		{"negative counts read as 0", Window{Limit: -1, Granted: -5, Returned: -5,
			Regions: []Region{{Admitted: -3, FallbackAdmitted: 4}}}, 4, 0},
		{"admitted sums saturate", Window{Limit: 10, Regions: []Region{{Admitted: maxI}, {FallbackAdmitted: maxI}}}, maxI - 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Observed(tc.w); got != tc.observed {
				t.Errorf("Observed = %d, want %d", got, tc.observed)
			}
			if got := Stranded(tc.w); got != tc.stranded {
				t.Errorf("Stranded = %d, want %d", got, tc.stranded)
			}
		})
	}
}

func TestBoundMethods(t *testing.T) {
	fin := Bound{Total: 200, Fallback: 200}
	inf := Bound{Infinite: true, Total: maxI, Fallback: 100}
	if !fin.Covers(200) || fin.Covers(201) || !inf.Covers(maxI) {
		t.Error("Covers")
	}
	if fin.Float64() != 200 || !math.IsInf(inf.Float64(), 1) {
		t.Error("Float64")
	}
	for _, tc := range []struct {
		b    Bound
		want string
	}{
		{fin, "200 (carry_over 0, fallback 200, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)"},
		{inf, "+Inf (carry_over 0, fallback 100, lost_grants 0, redis_rollback 0, limit_lowered 0, settlement 0)"},
	} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	for m, want := range map[FallbackMode]string{
		FallbackNone: "none", FallbackClosed: "closed", FallbackLocal: "local", FallbackOpen: "open", 7: "FallbackMode(7)",
	} {
		if got := m.String(); got != want {
			t.Errorf("FallbackMode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Window{Limit: 1000, LimitAtGrant: 1000, Granted: 1000, Returned: 100, Regions: []Region{
		{Name: "eu", Admitted: 500, Fallback: FallbackLocal, LocalAllowance: 100, FallbackAdmitted: 100,
			Failovers: []Failover{{Lag: time.Second, AdmitRate: 10, Observed: 3}}},
		{Name: "us", Admitted: 400, Fallback: FallbackOpen, FallbackAdmitted: 1e6},
		{Name: "ap", Fallback: FallbackClosed},
	}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good window: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(w *Window)
	}{
		{"negative limit", func(w *Window) { w.Limit = -1 }},
		{"negative granted", func(w *Window) { w.Granted = -1 }},
		{"returned above granted", func(w *Window) { w.Returned = 1001 }},
		{"negative carry-over", func(w *Window) { w.CarriedOver = -1 }},
		{"duplicate region", func(w *Window) { w.Regions[1].Name = "eu" }},
		{"unknown mode", func(w *Window) { w.Regions[2].Fallback = 4 }},
		{"fallback admits while closed", func(w *Window) { w.Regions[2].FallbackAdmitted = 1 }},
		{"fallback admits above A", func(w *Window) { w.Regions[0].FallbackAdmitted = 101 }},
		{"negative admitted", func(w *Window) { w.Regions[0].Admitted = -1 }},
		{"negative lag", func(w *Window) { w.Regions[0].Failovers[0].Lag = -1 }},
		{"NaN rate", func(w *Window) { w.Regions[0].Failovers[0].AdmitRate = math.NaN() }},
		{"negative observed", func(w *Window) { w.Regions[0].Failovers[0].Observed = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := clone(good)
			tc.mutate(&w)
			err := w.Validate()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate() = %v, want ErrInvalid", err)
			}
			t.Log(err)
		})
	}
}

// TestConcurrentUse backs the package doc's claim: the functions only read
// the Window, so many goroutines may share one (run with -race).
func TestConcurrentUse(t *testing.T) {
	w := Window{Limit: 1000, Granted: 1000, Regions: []Region{
		{Name: "eu", Admitted: 600, Fallback: FallbackLocal, LocalAllowance: 100, FallbackAdmitted: 100,
			Failovers: []Failover{{Lag: time.Second, AdmitRate: 10}}},
		{Name: "us", Admitted: 400},
	}}
	want := Compute(w)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if Compute(w) != want || Observed(w) != 100 || Stranded(w) != 0 ||
					NewReport("x", time.Time{}, time.Time{}, w).AdmittedTotal != 1100 {
					t.Error("different answer under concurrency")
					return
				}
			}
		})
	}
	wg.Wait()
}
