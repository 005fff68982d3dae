package overshoot

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/big"
	"testing"
	"time"
)

// FuzzCompute: whatever the window, Compute, Observed, Stranded and
// NewReport do not panic, nothing is negative, and sums saturate at
// math.MaxInt64 instead of wrapping.
//
//	go test -run '^$' -fuzz '^FuzzCompute$' -fuzztime 60s ./overshoot/
func FuzzCompute(f *testing.F) {
	f.Add(int64(1000), int64(1000), int64(1000), int64(0), int64(0), []byte{})
	f.Add(int64(600), int64(1000), int64(1000), int64(100), int64(200),
		regionBytes(Region{Admitted: 600, FallbackAdmitted: 100, Fallback: FallbackLocal, LocalAllowance: 100,
			Failovers: []Failover{{Lag: 300 * time.Millisecond, AdmitRate: 10, Observed: 2}}}))
	f.Add(int64(-1), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MinInt64), int64(math.MaxInt64),
		regionBytes(
			Region{Admitted: math.MaxInt64, FallbackAdmitted: math.MaxInt64, Fallback: FallbackLocal, LocalAllowance: math.MaxInt64,
				Failovers: []Failover{{Lag: math.MaxInt64, AdmitRate: math.MaxFloat64, Observed: math.MaxInt64}}},
			Region{Admitted: math.MinInt64, Fallback: FallbackOpen,
				Failovers: []Failover{{Lag: math.MinInt64, AdmitRate: math.NaN(), Observed: math.MinInt64}}}))

	f.Fuzz(func(t *testing.T, limit, atGrant, granted, returned, carried int64, data []byte) {
		w := Window{Limit: limit, LimitAtGrant: atGrant, Granted: granted, Returned: returned, CarriedOver: carried,
			Regions: decodeRegions(data)}
		b := Compute(w)
		terms := []int64{b.CarryOver, b.Fallback, b.LostGrants, b.RedisRollback, b.LimitLowered, b.Settlement}
		for _, v := range terms {
			if v < 0 || v > b.Total {
				t.Fatalf("term %d outside [0, Total]: %v", v, b)
			}
		}
		if b.Infinite && b.Total != math.MaxInt64 {
			t.Fatalf("infinite bound with Total %d", b.Total)
		}
		if !b.Infinite {
			// The exact sum, past int64: saturated, never wrapped.
			exact := new(big.Int)
			for _, v := range terms {
				exact.Add(exact, big.NewInt(v))
			}
			want := int64(math.MaxInt64)
			if exact.IsInt64() {
				want = exact.Int64()
			}
			if b.Total != want {
				t.Fatalf("Total %d, exact sum %v", b.Total, exact)
			}
		}
		// The two grant terms split max(0, outstanding - G) exactly.
		n := max(0, granted) - min(max(0, returned), max(0, granted))
		if got, want := b.LostGrants+b.LimitLowered, max(0, n-max(0, limit)); got != want {
			t.Fatalf("LostGrants + LimitLowered = %d, want %d", got, want)
		}
		if Observed(w) < 0 || Stranded(w) < 0 {
			t.Fatalf("negative Observed %d or Stranded %d", Observed(w), Stranded(w))
		}
		rep := NewReport("fuzz", time.Time{}, time.Time{}, w)
		if rep.AdmittedTotal < 0 || rep.FallbackAdmitted > rep.AdmittedTotal {
			t.Fatalf("report totals %d, %d", rep.AdmittedTotal, rep.FallbackAdmitted)
		}
		js, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if back.Bound != rep.Bound {
			t.Fatalf("bound %v came back as %v", rep.Bound, back.Bound)
		}
	})
}

// Regions are encoded for the fuzzer as a flat run of 8-byte fields per
// region: admitted, fallback admitted, mode, allowance, failover count,
// then per failover lag, rate (float64 bits), observed.

func regionBytes(rs ...Region) []byte {
	var b []byte
	put := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	for _, r := range rs {
		put(uint64(r.Admitted))
		put(uint64(r.FallbackAdmitted))
		put(uint64(r.Fallback))
		put(uint64(r.LocalAllowance))
		put(uint64(len(r.Failovers)))
		for _, f := range r.Failovers {
			put(uint64(f.Lag))
			put(math.Float64bits(f.AdmitRate))
			put(uint64(f.Observed))
		}
		put(uint64(r.SettleOverrun))
	}
	return b
}

func decodeRegions(b []byte) []Region {
	next := func() (uint64, bool) {
		if len(b) < 8 {
			return 0, false
		}
		v := binary.LittleEndian.Uint64(b)
		b = b[8:]
		return v, true
	}
	var rs []Region
	for len(b) >= 8 {
		var r Region
		var v [5]uint64
		for i := range v {
			v[i], _ = next()
		}
		r.Admitted, r.FallbackAdmitted = int64(v[0]), int64(v[1])
		r.Fallback, r.LocalAllowance = FallbackMode(int64(v[2])), int64(v[3])
		for range min(v[4], 8) {
			lag, _ := next()
			rate, _ := next()
			obs, _ := next()
			r.Failovers = append(r.Failovers, Failover{Lag: time.Duration(lag), AdmitRate: math.Float64frombits(rate), Observed: int64(obs)})
		}
		so, _ := next()
		r.SettleOverrun = int64(so)
		rs = append(rs, r)
	}
	return rs
}
