package lease

import (
	"math"
	"math/big"
	"math/rand"
	"testing"
	"time"
)

func TestBucketUnitAndMaxBurst(t *testing.T) {
	for _, c := range []struct {
		period    time.Duration
		unit, max int64
	}{
		{time.Second, 1_000_000, MaxBucketUnits / 1_000_000},
		{time.Minute, 60_000_000, MaxBucketUnits / 60_000_000},
		{time.Hour, 3_600_000_000, MaxBucketUnits / 3_600_000_000},
		{time.Millisecond, 1000, MaxBucketUnits / 1000},
		{time.Millisecond - 1, 0, 0},
		{0, 0, 0},
		{-time.Second, 0, 0},
		{math.MaxInt64, MaxBucketUnits, 1},
	} {
		if u, m := BucketUnit(c.period), MaxBurst(c.period); u != c.unit || m != c.max {
			t.Errorf("period %v: unit %d, max burst %d; want %d, %d", c.period, u, m, c.unit, c.max)
		}
	}
	if MaxBurst(time.Second) < 4_000_000_000 || MaxBurst(time.Hour) < 1_000_000 {
		t.Errorf("max bursts smaller than documented: %d/s, %d/h", MaxBurst(time.Second), MaxBurst(time.Hour))
	}
}

// TestTokenBucketSteps is the bucket's behaviour as a step table at fixed
// instants: 10 tokens per second (10,000 milli-tokens per second, so
// 10,000 units per ms, a token being 1,000,000 units), burst 20.
func TestTokenBucketSteps(t *testing.T) {
	const u = 1_000_000 // BucketUnit(time.Second)
	share := func(seq, rate, burst, deadline int64) BucketShare {
		return BucketShare{Seq: seq, Rate: rate, Burst: burst, Unit: u, DeadlineMs: deadline}
	}
	type step struct {
		op      string // install, take
		now     int64
		share   BucketShare
		cost    int64
		want    any   // BucketStatus or bool
		tokens  int64 // after the step
		waitFor int64 // WaitMs(waitCost) after the step
	}
	const t0 = 1_000_000
	var b TokenBucket
	steps := []step{
		{op: "take", now: t0, cost: 1, want: false, tokens: 0, waitFor: -1},                                             // no share yet
		{op: "install", now: t0, share: share(1, 10_000, 20, t0+10_000), want: ShareInstalled, tokens: 0, waitFor: 100}, // starts empty
		{op: "take", now: t0 + 99, cost: 1, want: false, tokens: 0, waitFor: 1},
		{op: "take", now: t0 + 100, cost: 1, want: true, tokens: 0, waitFor: 100},    // refilled one token in 100 ms
		{op: "take", now: t0 + 3_000, cost: 21, want: false, tokens: 20, waitFor: 0}, // capped at burst 20
		{op: "take", now: t0 + 3_000, cost: 20, want: true, tokens: 0, waitFor: 100},
		{op: "take", now: t0 + 2_000, cost: 1, want: false, tokens: 0, waitFor: 100}, // clock back: no refill twice
		{op: "take", now: t0 + 3_050, cost: 0, want: true, tokens: 0, waitFor: 50},   // half a token
		{op: "install", now: t0 + 3_050, share: share(1, 1, 1, t0+99_000), want: ShareStale, tokens: 0, waitFor: 50},
		// A renewal with a smaller burst caps the level; a larger rate refills faster.
		{op: "take", now: t0 + 4_000, cost: 0, want: true, tokens: 10, waitFor: 0},
		{op: "install", now: t0 + 4_000, share: share(2, 20_000, 5, t0+20_000), want: ShareInstalled, tokens: 5, waitFor: 0},
		{op: "take", now: t0 + 4_000, cost: 5, want: true, tokens: 0, waitFor: 50},
		{op: "take", now: t0 + 4_050, cost: 1, want: true, tokens: 0, waitFor: 50},
		// Past the deadline the bucket is empty and gives nothing.
		{op: "take", now: t0 + 19_999, cost: 5, want: true, tokens: 0, waitFor: -1}, // the deadline comes first
		{op: "take", now: t0 + 20_000, cost: 0, want: false, tokens: 0, waitFor: -1},
		{op: "take", now: t0 + 19_000, cost: 0, want: false, tokens: 0, waitFor: -1}, // clock back does not revive it
		// A share after an expired one starts empty, whatever the old level.
		{op: "install", now: t0 + 30_000, share: share(3, 10_000, 20, t0+40_000), want: ShareInstalled, tokens: 0, waitFor: 100},
		{op: "install", now: t0 + 30_000, share: BucketShare{Seq: 4, Unit: 0, DeadlineMs: 1}, want: ShareInvalid, tokens: 0, waitFor: 100},
		{op: "take", now: t0 + 31_000, cost: 10, want: true, tokens: 0, waitFor: 100},
	}
	for i, s := range steps {
		var got any
		switch s.op {
		case "install":
			got = b.Install(s.now, s.share)
		case "take":
			got = b.Take(s.now, s.cost)
		}
		if got != s.want {
			t.Fatalf("step %d (%s at t0%+d): got %v, want %v", i, s.op, s.now-t0, got, s.want)
		}
		if b.Tokens() != s.tokens {
			t.Fatalf("step %d (%s at t0%+d): %d tokens, want %d", i, s.op, s.now-t0, b.Tokens(), s.tokens)
		}
		if w := b.WaitMs(1); w != s.waitFor {
			t.Fatalf("step %d (%s at t0%+d): WaitMs(1) = %d, want %d", i, s.op, s.now-t0, w, s.waitFor)
		}
	}
}

func TestBucketBound(t *testing.T) {
	for _, c := range []struct {
		rate   int64
		period time.Duration
		burst  int64
		t      time.Duration
		extra  int64
		want   int64
	}{
		{100, time.Second, 200, 0, 0, 200},
		{100, time.Second, 200, time.Second, 0, 300},
		{100, time.Second, 200, 10 * time.Millisecond, 0, 201},
		{100, time.Second, 200, 11 * time.Millisecond, 0, 202}, // 1.1 rounds up
		{1, time.Hour, 1, time.Minute, 5, 7},
		{-1, time.Second, -1, -time.Second, -1, 0},
		{100, 0, 200, time.Second, 0, math.MaxInt64},
		{math.MaxInt64, time.Nanosecond, 0, math.MaxInt64, 0, math.MaxInt64},
		{1, time.Second, math.MaxInt64, time.Second, math.MaxInt64, math.MaxInt64},
	} {
		if got := BucketBound(c.rate, c.period, c.burst, c.t, c.extra); got != c.want {
			t.Errorf("BucketBound(%d, %v, %d, %v, %d) = %d, want %d", c.rate, c.period, c.burst, c.t, c.extra, got, c.want)
		}
	}
}

// refBucketBound is BucketBound in math/big, with no saturation until the
// end.
func refBucketBound(rate int64, period time.Duration, burst int64, t time.Duration, extra int64) int64 {
	if period <= 0 {
		return math.MaxInt64
	}
	r := new(big.Int).Mul(big.NewInt(max(rate, 0)), big.NewInt(int64(max(t, 0))))
	p := big.NewInt(int64(period))
	r.Add(r, p).Sub(r, big.NewInt(1)).Quo(r, p)
	r.Add(r, big.NewInt(max(burst, 0))).Add(r, big.NewInt(max(extra, 0)))
	if !r.IsInt64() {
		return math.MaxInt64
	}
	return r.Int64()
}

func FuzzBucketBound(f *testing.F) {
	f.Add(int64(100), int64(time.Second), int64(200), int64(time.Second), int64(0))
	f.Add(int64(math.MaxInt64), int64(1), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(int64(-5), int64(-1), int64(-1), int64(-1), int64(-1))
	f.Fuzz(func(t *testing.T, rate, period, burst, d, extra int64) {
		got := BucketBound(rate, time.Duration(period), burst, time.Duration(d), extra)
		if want := refBucketBound(rate, time.Duration(period), burst, time.Duration(d), extra); got != want {
			t.Fatalf("BucketBound(%d, %d, %d, %d, %d) = %d, reference %d", rate, period, burst, d, extra, got, want)
		}
	})
}

// takeEvent is one admitted Take of a run: when and how many units.
type takeEvent struct{ at, units int64 }

// checkRun holds a run of a TokenBucket against the brute-force rule for
// every interval [a, b] between two instants of the run: the units
// admitted in it are at most the largest capacity of any share of the run
// plus the largest rate times (b - a). Every share of a run has the same
// unit. It also checks Level within [0, capacity] after every step.
func checkRun(t *testing.T, takes []takeEvent, maxCap, maxRate int64) {
	t.Helper()
	for i := range takes {
		var sum int64
		for j := i; j < len(takes); j++ {
			sum += takes[j].units
			span := takes[j].at - takes[i].at
			// maxCap + maxRate*span, in big arithmetic: both may be large.
			lim := new(big.Int).Mul(big.NewInt(maxRate), big.NewInt(span))
			lim.Add(lim, big.NewInt(maxCap))
			if big.NewInt(sum).Cmp(lim) > 0 {
				t.Fatalf("admitted %d units in [%d, %d], bound %s (cap %d, rate %d)", sum, takes[i].at, takes[j].at, lim, maxCap, maxRate)
			}
		}
	}
}

// FuzzTokenBucket drives a TokenBucket with arbitrary steps (shares of
// any size, clocks going backward, huge costs) and checks that it never
// panics, keeps its level in range, never admits after a share's deadline
// and never admits more in any interval than the brute-force bound.
func FuzzTokenBucket(f *testing.F) {
	f.Add([]byte{0, 10, 20, 1, 5, 1, 1, 200, 1, 0, 0, 1, 255, 255})
	f.Add([]byte{0, 255, 255, 255, 1, 255, 2, 0, 0, 1, 255})
	f.Fuzz(func(t *testing.T, prog []byte) {
		const unit = 1000 // a 1 ms period: the smallest unit, the most refill per unit
		var (
			b               TokenBucket
			now             int64 = 1_000
			seq             int64
			takes           []takeEvent
			maxCap, maxRate int64
		)
		next := func(i *int) int64 {
			if *i >= len(prog) {
				return 0
			}
			v := int64(prog[*i])
			*i++
			return v
		}
		for i := 0; i < len(prog); {
			switch next(&i) % 4 {
			case 0: // install a share
				rate := next(&i) << (next(&i) % 48)
				burst := next(&i) << (next(&i) % 40)
				s := BucketShare{Seq: seq + 1 - next(&i)%2, Rate: rate, Burst: burst, Unit: unit, DeadlineMs: now + next(&i)<<(next(&i)%20)}
				if st := b.Install(now, s); st == ShareInstalled {
					seq = s.Seq
					maxCap, maxRate = max(maxCap, s.Burst*s.Unit), max(maxRate, s.Rate)
				}
			case 1: // time passes
				now += next(&i) << (next(&i) % 24)
			case 2: // the clock steps back
				now -= next(&i)
			case 3: // take
				cost := next(&i) << (next(&i) % 40)
				before := b.Share
				if b.Take(now, cost) {
					if before.Seq == 0 || max(now, b.Last) >= before.DeadlineMs {
						t.Fatalf("admitted with no share in force at %d: %+v", now, before)
					}
					takes = append(takes, takeEvent{at: b.Last, units: cost * unit})
				}
			}
			if capacity := b.Share.Burst * b.Share.Unit; b.Level < 0 || b.Level > capacity {
				t.Fatalf("level %d outside [0, %d]", b.Level, capacity)
			}
			if w := b.WaitMs(1); w < -1 {
				t.Fatalf("WaitMs = %d", w)
			}
		}
		checkRun(t, takes, maxCap, maxRate)
	})
}

// TestTokenBucketRandom runs random programs (the fuzzer's check, many
// seeds, on every test run).
func TestTokenBucketRandom(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	for seed := range seeds {
		rng := rand.New(rand.NewSource(int64(seed)))
		const unit = 1_000_000
		var (
			b               TokenBucket
			now             int64 = 1_000
			seq             int64
			takes           []takeEvent
			maxCap, maxRate int64
		)
		for range 400 {
			switch rng.Intn(6) {
			case 0:
				s := BucketShare{Seq: seq + 1, Rate: rng.Int63n(50_000), Burst: rng.Int63n(30), Unit: unit, DeadlineMs: now + rng.Int63n(20_000)}
				if b.Install(now, s) == ShareInstalled {
					seq = s.Seq
					maxCap, maxRate = max(maxCap, s.Burst*unit), max(maxRate, s.Rate)
				}
			case 1:
				now += rng.Int63n(500)
			case 2:
				now -= rng.Int63n(50)
			default:
				cost := rng.Int63n(5)
				if b.Take(now, cost) {
					takes = append(takes, takeEvent{at: b.Last, units: cost * unit})
				}
			}
		}
		checkRun(t, takes, maxCap, maxRate)
	}
}

func TestSumShares(t *testing.T) {
	r, b := SumShares([]BucketShare{{Rate: 500, Burst: 10}, {Rate: 250, Burst: -3}, {Rate: -1, Burst: 5}})
	if r != 750 || b != 15 {
		t.Fatalf("sums %d, %d; want 750, 15", r, b)
	}
	r, b = SumShares([]BucketShare{{Rate: math.MaxInt64, Burst: math.MaxInt64}, {Rate: 1, Burst: 1}})
	if r != math.MaxInt64 || b != math.MaxInt64 {
		t.Fatalf("sums do not saturate: %d, %d", r, b)
	}
}
