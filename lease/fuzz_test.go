package lease

import (
	"math"
	"testing"
	"time"
)

// FuzzSize checks that Size never panics, keeps its invariants, matches the
// math/big reference at any magnitude, and never shrinks a grant when the
// pool grows.
func FuzzSize(f *testing.F) {
	s := int64(time.Second)
	f.Add(int64(1000), 60*s, 15*s, int64(0), int64(0), int64(0), uint8(0), 25.0, int64(0), 25.0/3, int64(0), 0.0, int64(0))
	f.Add(int64(200), 60*s, 15*s, int64(0), int64(1), int64(0), uint8(1), 25.0, int64(0), 25.0/3, int64(0), 0.0, int64(0))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(0), int64(math.MaxInt64), int64(math.MaxInt64), int64(0),
		uint8(2), math.MaxFloat64, int64(0), math.Inf(1), int64(-1), math.NaN(), int64(math.MinInt64))
	f.Add(int64(5), 1*s, -s, int64(-3), int64(10), int64(3), uint8(7), -1.0, int64(5), 1e-300, int64(0), 1e300, int64(0))
	f.Fuzz(func(t *testing.T, pool, left, horizon, want, minChunk, maxChunk int64, who uint8,
		rate0 float64, held0 int64, rate1 float64, held1 int64, rate2 float64, held2 int64) {
		names := []string{"eu", "us", "ap"}
		all := []RegionDemand{{Region: "eu", Rate: rate0, Held: held0}, {Region: "us", Rate: rate1, Held: held1}, {Region: "ap", Rate: rate2, Held: held2}}
		// Low bits of who pick the requester (maybe absent: "sa"), the
		// next ones how many regions report.
		region := "sa"
		if i := int(who & 3); i < len(names) {
			region = names[i]
		}
		r := SizeRequest{
			Pool: pool, Left: time.Duration(left), Horizon: time.Duration(horizon),
			Region: region, Want: want, Demands: all[:int(who>>2)%4],
			MinChunk: minChunk, MaxChunk: maxChunk,
		}
		g := Size(r)
		if msg := checkSize(r, g); msg != "" {
			t.Fatalf("Size(%+v) = %d: %s", r, g, msg)
		}
		if ref := refSize(r, floatNeed); g != ref {
			t.Fatalf("Size(%+v) = %d, reference %d", r, g, ref)
		}
		if r.Pool < math.MaxInt64 {
			r.Pool++
			if g2 := Size(r); g2 < g {
				t.Fatalf("one more token in the pool shrank the grant: %d -> %d", g, g2)
			}
		}
	})
}

// FuzzSchedule checks that window arithmetic, Clamp, Schedule and the agent
// side never panic and never let a lease outlive its window, start early or
// grow its ttl.
func FuzzSchedule(f *testing.F) {
	s := int64(time.Second)
	f.Add(int64(0), int64(0), int64(time.Minute), int64(0), 15*s, int64(0), int64(0), int64(0))
	f.Add(int64(55), int64(0), int64(time.Minute), int64(1), 15*s, 50*int64(time.Millisecond), 50*int64(time.Millisecond), int64(time.Second))
	f.Add(int64(-1), int64(999999999), int64(time.Hour), int64(-1), int64(-1), int64(0), int64(0), int64(-5))
	f.Add(int64(1)<<40, int64(1), int64(1), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MinInt64))
	f.Fuzz(func(t *testing.T, sec, nsec, length, k, ttl, up, down, margin int64) {
		// time.Time itself cannot hold instants much past ±2^62 s from
		// the epoch (and windows saturate there); stay inside.
		sec %= 1 << 61
		now := time.Unix(sec, nsec)
		l := time.Duration(length)
		w := WindowOf(now, l)
		if l <= 0 {
			if w != (Window{}) {
				t.Fatalf("WindowOf(%v, %v) = %+v, want Window{}", now, l, w)
			}
		} else if w.Index != math.MaxInt64 && w.Index != math.MinInt64 { // saturated: no window number fits
			if !w.Contains(now) {
				t.Fatalf("WindowOf(%v, %v) = %+v does not contain it", now, l, w)
			}
			if left := w.Left(now); left <= 0 || left > l {
				t.Fatalf("Left = %v out of (0, %v]", left, l)
			}
		}
		// Look at a nearby window too: past, current or future.
		if k %= 8; k > 0 {
			for range k {
				w = w.Next()
			}
		} else if w.Index > math.MinInt64+8 {
			w.Index += k
		}
		if c := Clamp(now, time.Duration(ttl), w); c < 0 || c > max(time.Duration(ttl), 0) ||
			(c > 0 && now.Add(c).After(w.End())) {
			t.Fatalf("Clamp(%v, %v, %+v) = %v", now, time.Duration(ttl), w, c)
		}
		tm := Schedule(now, w, time.Duration(ttl))
		if msg := checkTiming(now, w, time.Duration(ttl), tm); msg != "" {
			t.Fatalf("Schedule(%v, %+v, %v) = %+v: %s", now, w, time.Duration(ttl), tm, msg)
		}
		// The agent, on the same clock, sent before now and received after.
		sent := now.Add(-time.Duration(up & math.MaxInt64))
		received := now.Add(time.Duration(down & math.MaxInt64))
		start := StartAt(received, tm.StartsIn)
		deadline := Deadline(sent, tm.ExpiresIn, time.Duration(margin))
		if deadline.Before(sent) || deadline.After(now.Add(tm.ExpiresIn)) {
			t.Fatalf("Deadline %v outside [sent %v, allocator's expiry %v]", deadline, sent, now.Add(tm.ExpiresIn))
		}
		if tm.ExpiresIn > tm.StartsIn && Spendable(start, start, deadline) &&
			(start.Before(w.Start()) || !deadline.After(start) || deadline.After(w.End())) {
			t.Fatalf("agent may spend in [%v, %v), window [%v, %v)", start, deadline, w.Start(), w.End())
		}
	})
}
