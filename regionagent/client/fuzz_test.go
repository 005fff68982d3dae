package client

import (
	"math"
	"testing"
	"time"
)

// FuzzChunkSize: whatever the rate, horizons, caps, window and cost, a
// chunk asks for at least the cost and at most what its caps allow
// (MaxChunk, G, a warm chunk's G/64, 2^50) unless the cost itself is
// above them, and what is worth taking lies between the cost (or the
// whole chunk, if smaller) and the chunk.
//
//	go test -run '^$' -fuzz FuzzChunkSize ./regionagent/client/
func FuzzChunkSize(f *testing.F) {
	f.Add(100.0, int64(250e6), int64(4e9), int64(0), int64(1000), int64(0), int64(0), 50.0, int64(1))
	f.Add(2.0, int64(250e6), int64(4e9), int64(0), int64(0), int64(1_000_000), int64(3e9), 50.0, int64(7))
	f.Add(math.Inf(1), int64(1e9), int64(1e9), int64(64), int64(1<<50), int64(0), int64(1), 50.0, int64(1<<40))
	f.Add(math.NaN(), int64(0), int64(0), int64(-5), int64(-1), int64(-1), int64(-1), 0.0, int64(1))
	f.Fuzz(func(t *testing.T, rate float64, horizon, warmHorizon, maxChunk, limitTokens, gHint, resetIn int64, hotRate float64, cost int64) {
		if cost < 1 {
			cost = 1 // the client's callers: cost 0 means 1; a negative cost never reaches sizing
		}
		cfg := SubLeaseConfig{HotRate: hotRate, Horizon: time.Duration(horizon), WarmHorizon: time.Duration(warmHorizon),
			MaxChunk: maxChunk, WarmRate: 1}.WithDefaults()
		c := &Client{opt: options{sub: &cfg}}
		const now = int64(1_700_000_000e9)
		st := &limitState{limitTokens: limitTokens}
		if resetIn > 0 {
			st.resetAt = now + resetIn
		}
		st.gHint.Store(gHint)
		want, least := c.chunk(st, now, rate, cost)
		if want < cost || least < 1 || least > want || least < min(cost, want) {
			t.Fatalf("rate %v cost %d: want %d, least %d", rate, cost, want, least)
		}
		capped := func(limit int64, what string) {
			if limit > 0 && cost <= limit && want > limit {
				t.Fatalf("rate %v cost %d: want %d above %s %d", rate, cost, want, what, limit)
			}
		}
		capped(cfg.MaxChunk, "MaxChunk")
		capped(st.limitTokens, "G")
		capped(1<<50, "2^50")
		if rate < cfg.HotRate {
			capped(st.warmCap(), "a warm chunk's cap")
		}
	})
}

// FuzzRateEstimate: the estimate stays a finite rate in [0, 1e15]
// whatever the times and counts it is fed, and a sample over at least
// ratePeriod never leaves it below that sample's own rate.
//
//	go test -run '^$' -fuzz FuzzRateEstimate ./regionagent/client/
func FuzzRateEstimate(f *testing.F) {
	f.Add(int64(0), int64(0), int64(250e6), int64(10), int64(1e9), int64(1000))
	f.Add(int64(5e9), int64(1<<50), int64(-1), int64(-1<<50), int64(1), int64(1<<62))
	f.Add(int64(0), int64(0), int64(250e6), int64(1<<52), int64(1e9), int64(0)) // above 1e15 a second
	f.Fuzz(func(t *testing.T, t0, c0, dt1, dc1, dt2, dc2 int64) {
		var e rateEst
		now, total := t0, c0
		for _, s := range [][2]int64{{0, 0}, {dt1, dc1}, {dt2, dc2}} {
			if s[0] < 0 || s[1] < 0 || now > math.MaxInt64-s[0] || total > math.MaxInt64-s[1] {
				return // the client's clock is monotonic and its counts only grow
			}
			now, total = now+s[0], total+s[1]
			before := e
			r := e.observe(now, total)
			if math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || r > 1e15 {
				t.Fatalf("rate %v after a sample of %d in %d ns", r, s[1], s[0])
			}
			if before.started && now-before.at >= ratePeriod {
				inst := float64(total-before.total) / (float64(now-before.at) / 1e9)
				if r < min(inst, 1e15)*(1-1e-9) {
					t.Fatalf("rate %v below the sample's own %v (%d in %d ns)", r, inst, total-before.total, now-before.at)
				}
			}
		}
	})
}
