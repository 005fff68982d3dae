package lease

import (
	"fmt"
	"math"
	"math/big"
	"math/rand"
	"reflect"
	"testing"
	"testing/quick"
	"time"
)

// perMin converts tokens per minute, the unit limits are written in, to
// the tokens per second RegionDemand carries.
func perMin(n float64) float64 { return n / 60 }

func TestSizeTable(t *testing.T) {
	s := time.Second
	eu := func(rate float64, held int64) RegionDemand { return RegionDemand{Region: "eu", Rate: rate, Held: held} }
	us := func(rate float64, held int64) RegionDemand { return RegionDemand{Region: "us", Rate: rate, Held: held} }
	cases := []struct {
		name string
		r    SizeRequest
		want int64
	}{
		// The allocator's expectations: G = 1000/min, horizon 15 s.
		{"900+100: EU served", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(perMin(900), 0), us(perMin(100), 0)}}, 225},
		{"900+100: US served", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "us",
			Demands: []RegionDemand{eu(perMin(900), 0), us(perMin(100), 0)}}, 25},
		{"1500+500 at start: EU served", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(perMin(1500), 0), us(perMin(500), 0)}}, 375},
		{"1500+500 at start: US served (125, not 126)", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "us",
			Demands: []RegionDemand{eu(perMin(1500), 0), us(perMin(500), 0)}}, 125},
		{"1500+500, pool 200: EU shares", SizeRequest{Pool: 200, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(perMin(1500), 0), us(perMin(500), 0)}}, 150},
		{"1500+500, pool 200: US shares", SizeRequest{Pool: 200, Left: 60 * s, Horizon: 15 * s, Region: "us",
			Demands: []RegionDemand{eu(perMin(1500), 0), us(perMin(500), 0)}}, 50},

		{"held is subtracted", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(25, 125), us(0, 0)}}, 250},
		{"held above need: nothing", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(25, 500)}}, 0},
		{"others' held frees pool for the requester", SizeRequest{Pool: 300, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(25, 0), us(25, 375)}}, 300},
		{"horizon past the window's end: Left wins", SizeRequest{Pool: 1000, Left: 10 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(10, 0)}}, 100},
		{"no horizon: rest of the window", SizeRequest{Pool: 1000, Left: 40 * s, Region: "eu",
			Demands: []RegionDemand{eu(10, 0)}}, 400},
		{"fractional demand rounds up", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(0.01, 0)}}, 1},
		{"explicit want overrides demand", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu", Want: 40,
			Demands: []RegionDemand{eu(25, 0)}}, 40},
		{"explicit want is shared too", SizeRequest{Pool: 100, Left: 60 * s, Horizon: 15 * s, Region: "eu", Want: 300,
			Demands: []RegionDemand{eu(25, 0), us(20, 0)}}, 50},
		{"requester missing: MinChunk", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "ap", MinChunk: 10,
			Demands: []RegionDemand{eu(25, 0)}}, 10},
		{"requester missing, no floor: nothing", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "ap",
			Demands: []RegionDemand{eu(25, 0)}}, 0},
		{"quiet requester gets the floor", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "us", MinChunk: 10,
			Demands: []RegionDemand{eu(25, 0), us(0, 0)}}, 10},
		{"floor holds when sharing", SizeRequest{Pool: 100, Left: 60 * s, Horizon: 15 * s, Region: "us", MinChunk: 10,
			Demands: []RegionDemand{eu(100, 0), us(0.1, 0)}}, 10},
		{"floor limited by pool", SizeRequest{Pool: 5, Left: 60 * s, Horizon: 15 * s, Region: "us", MinChunk: 10,
			Demands: []RegionDemand{eu(100, 0), us(0.1, 0)}}, 5},
		{"cap", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu", MaxChunk: 100,
			Demands: []RegionDemand{eu(25, 0)}}, 100},
		{"others are capped too before sharing", SizeRequest{Pool: 150, Left: 60 * s, Horizon: 15 * s, Region: "eu", MaxChunk: 100,
			Demands: []RegionDemand{eu(25, 0), us(1000, 0)}}, 75},
		{"cap wins over a larger floor", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu", MinChunk: 50, MaxChunk: 20,
			Demands: []RegionDemand{eu(0, 0)}}, 20},
		{"duplicate requester entry ignored", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(10, 0), eu(1000, 0)}}, 150},

		{"empty pool", SizeRequest{Pool: 0, Left: 60 * s, Region: "eu", MinChunk: 10, Demands: []RegionDemand{eu(25, 0)}}, 0},
		{"negative pool", SizeRequest{Pool: -5, Left: 60 * s, Region: "eu", MinChunk: 10, Demands: []RegionDemand{eu(25, 0)}}, 0},
		{"window over", SizeRequest{Pool: 1000, Left: 0, Region: "eu", MinChunk: 10, Demands: []RegionDemand{eu(25, 0)}}, 0},
		{"negative left", SizeRequest{Pool: 1000, Left: -s, Region: "eu", Want: 10}, 0},
		{"NaN rate", SizeRequest{Pool: 1000, Left: 60 * s, Region: "eu", Demands: []RegionDemand{eu(math.NaN(), 0)}}, 0},
		{"+Inf rate", SizeRequest{Pool: 1000, Left: 60 * s, Region: "eu", Demands: []RegionDemand{eu(math.Inf(1), 0)}}, 0},
		{"negative rate", SizeRequest{Pool: 1000, Left: 60 * s, Region: "eu", Demands: []RegionDemand{eu(-5, 0)}}, 0},
		{"others' NaN does not poison the share", SizeRequest{Pool: 100, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(25, 0), us(math.NaN(), 0)}}, 100},
		{"negative held counts as 0", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu",
			Demands: []RegionDemand{eu(10, -1000)}}, 150},
		{"negative chunks count as none", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu", MinChunk: -3, MaxChunk: -3,
			Demands: []RegionDemand{eu(10, 0)}}, 150},
		{"huge rate saturates, gets the pool", SizeRequest{Pool: 1000, Left: 60 * s, Region: "eu",
			Demands: []RegionDemand{eu(math.MaxFloat64, 0)}}, 1000},
		{"huge everything: exact shares", SizeRequest{Pool: math.MaxInt64, Left: math.MaxInt64, Region: "eu", Want: math.MaxInt64,
			Demands: []RegionDemand{eu(1, 0), us(math.MaxFloat64, 0), {Region: "ap", Rate: 1e300}}}, math.MaxInt64 / 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Size(c.r); got != c.want {
				t.Errorf("Size(%+v) = %d, want %d", c.r, got, c.want)
			}
			if ref := refSize(c.r, floatNeed); ref != c.want {
				t.Errorf("reference = %d, want %d (the table or the reference is wrong)", ref, c.want)
			}
		})
	}
}

// refSize is a naive transcription of Size's documented rules in math/big:
// no shortcuts, no saturation, no 128-bit tricks. needOf gives a region's
// derived need (rule 3) over horizon h, so the rounding of rates can be
// checked exactly where the inputs allow it.
func refSize(r SizeRequest, needOf func(d RegionDemand, h time.Duration) *big.Int) int64 {
	if r.Pool <= 0 || r.Left <= 0 {
		return 0
	}
	h := r.Left
	if r.Horizon > 0 && r.Horizon < r.Left {
		h = r.Horizon
	}
	limit := func(n *big.Int) *big.Int {
		if r.MaxChunk > 0 && n.Cmp(big.NewInt(r.MaxChunk)) > 0 {
			return big.NewInt(r.MaxChunk)
		}
		return n
	}
	mine := big.NewInt(0)
	total := big.NewInt(0)
	found := false
	for _, d := range r.Demands {
		if d.Region != r.Region {
			total.Add(total, limit(needOf(d, h)))
			continue
		}
		if !found {
			found = true
			mine = needOf(d, h)
		}
	}
	if r.Want > 0 {
		mine = big.NewInt(r.Want)
	}
	if r.MinChunk > 0 && mine.Cmp(big.NewInt(r.MinChunk)) < 0 {
		mine = big.NewInt(r.MinChunk)
	}
	mine = limit(mine)
	total.Add(total, mine)
	pool := big.NewInt(r.Pool)
	if total.Cmp(pool) <= 0 {
		return mine.Int64()
	}
	g := new(big.Int).Mul(pool, mine)
	g.Quo(g, total)
	if r.MinChunk > 0 {
		floor := big.NewInt(min(r.MinChunk, r.Pool))
		if g.Cmp(floor) < 0 {
			g = floor
		}
	}
	g = limit(g)
	if g.Cmp(pool) > 0 {
		g = pool
	}
	return g.Int64()
}

// floatNeed is rule 3 for arbitrary float rates: the product is rounded by
// tokensOver (checked on its own in TestTokensOver), the rest in big.Int.
func floatNeed(d RegionDemand, h time.Duration) *big.Int {
	n := big.NewInt(tokensOver(d.Rate, h))
	n.Sub(n, big.NewInt(max(d.Held, 0)))
	if n.Sign() < 0 {
		n.SetInt64(0)
	}
	return n
}

func TestTokensOver(t *testing.T) {
	s := time.Second
	cases := []struct {
		rate float64
		d    time.Duration
		want int64
	}{
		{perMin(500), 15 * s, 125}, // 125.00000000000001 in float64
		{perMin(100), 15 * s, 25},
		{perMin(500), 5 * s, 42}, // 41.67
		{10, 100 * time.Millisecond, 1},
		{10, 100*time.Millisecond + 1, 1},                // 1.00000001: within the slack
		{10, 100*time.Millisecond + time.Microsecond, 2}, // 1.00001: a real fraction
		{1, s + 10*time.Microsecond, 2},                  // a real fraction rounds up
		{0.5, s, 1},
		{1e-9, s, 0}, // below the slack: noise, not demand
		{0, s, 0},
		{-1, s, 0},
		{math.NaN(), s, 0},
		{math.Inf(1), s, 0},
		{math.Inf(-1), s, 0},
		{1, -s, 0},
		{1, 0, 0},
		{1e18, 10 * s, math.MaxInt64},
		{math.MaxFloat64, math.MaxInt64, math.MaxInt64},
		{9.2e18, s, 9200000000000000000},
	}
	for _, c := range cases {
		if got := tokensOver(c.rate, c.d); got != c.want {
			t.Errorf("tokensOver(%v, %v) = %d, want %d", c.rate, c.d, got, c.want)
		}
		if got := LowWater(c.rate, c.d); got != c.want {
			t.Errorf("LowWater(%v, %v) = %d, want %d", c.rate, c.d, got, c.want)
		}
	}
}

// sizeCase is a small random sizing problem whose rates are whole tokens
// per minute and whose durations are whole 100 ms steps, so that an exact
// rational reference applies: every true fraction of a token is then at
// least 1/600, far above the float slack of rule 3.
type sizeCase struct {
	r       SizeRequest
	perMins map[string]int64 // region -> tokens per minute
}

func (sizeCase) Generate(rnd *rand.Rand, _ int) reflect.Value {
	regions := []string{"eu", "us", "ap", "sa"}
	c := sizeCase{perMins: map[string]int64{}}
	pick := func(choices ...int64) int64 { return choices[rnd.Intn(len(choices))] }
	c.r.Pool = pick(-1, 0, 1, 2, 10, 100, 1000, rnd.Int63n(5000))
	c.r.Left = time.Duration(pick(-1, 0, 1, 50, 150, 600, rnd.Int63n(601))) * 100 * time.Millisecond
	c.r.Horizon = time.Duration(pick(-1, 0, 50, 150, rnd.Int63n(601))) * 100 * time.Millisecond
	c.r.Want = pick(0, 0, 0, -1, 1, rnd.Int63n(2000))
	c.r.MinChunk = pick(0, 0, -1, 1, 5, rnd.Int63n(100))
	c.r.MaxChunk = pick(0, 0, -1, 1, 50, rnd.Int63n(1000))
	n := rnd.Intn(len(regions) + 1)
	for _, i := range rnd.Perm(len(regions))[:n] {
		pm := pick(0, 1, 100, 500, 900, 1500, rnd.Int63n(10000))
		c.perMins[regions[i]] = pm
		held := pick(0, 0, -1, 1, rnd.Int63n(1000))
		c.r.Demands = append(c.r.Demands, RegionDemand{Region: regions[i], Rate: float64(pm) / 60, Held: held})
	}
	c.r.Region = regions[rnd.Intn(len(regions))] // sometimes missing from Demands
	return reflect.ValueOf(c)
}

// exactNeed is rule 3 in exact rationals: ceil(perMin * h / 1 min) - held.
func (c sizeCase) exactNeed(d RegionDemand, h time.Duration) *big.Int {
	x := new(big.Int).Mul(big.NewInt(c.perMins[d.Region]), big.NewInt(int64(h)))
	q, m := new(big.Int).QuoRem(x, big.NewInt(int64(time.Minute)), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	q.Sub(q, big.NewInt(max(d.Held, 0)))
	if q.Sign() < 0 {
		q.SetInt64(0)
	}
	return q
}

// TestSizeQuick compares Size with the exact reference and checks the
// invariants: 0 <= grant <= Pool, grant <= MaxChunk, and when everyone fits
// the grant is the requester's need.
func TestSizeQuick(t *testing.T) {
	f := func(c sizeCase) bool {
		got := Size(c.r)
		want := refSize(c.r, c.exactNeed)
		if got != want {
			t.Logf("Size(%+v) = %d, reference %d", c.r, got, want)
			return false
		}
		return checkSize(c.r, got) == ""
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 50000}); err != nil {
		t.Error(err)
	}
}

// checkSize returns what is wrong with grant = Size(r), or "".
func checkSize(r SizeRequest, grant int64) string {
	switch {
	case grant < 0:
		return "negative grant"
	case grant > max(r.Pool, 0):
		return "grant above pool"
	case r.MaxChunk > 0 && grant > r.MaxChunk:
		return "grant above MaxChunk"
	case (r.Pool <= 0 || r.Left <= 0) && grant != 0:
		return "grant with nothing to give"
	}
	return ""
}

// TestSizeMonotone checks two properties that follow from the rules:
// a larger pool never shrinks a grant (the share grows with Pool, and at
// total <= Pool it becomes the full need, which no share exceeds), and more
// demand elsewhere never grows it (the share shrinks with total).
func TestSizeMonotone(t *testing.T) {
	f := func(c sizeCase, extraPool uint16, extraRate uint16, who uint8) bool {
		g := Size(c.r)
		more := c.r
		more.Pool += int64(extraPool)
		if gp := Size(more); gp < g {
			t.Logf("Pool %d -> %d: grant %d -> %d", c.r.Pool, more.Pool, g, gp)
			return false
		}
		if len(c.r.Demands) == 0 {
			return true
		}
		busier := c.r
		busier.Demands = append([]RegionDemand(nil), c.r.Demands...)
		i := int(who) % len(busier.Demands)
		if busier.Demands[i].Region == c.r.Region {
			return true
		}
		busier.Demands[i].Rate += float64(extraRate) / 60
		if gb := Size(busier); gb > g {
			t.Logf("%s busier: grant %d -> %d", busier.Demands[i].Region, g, gb)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}

// TestSizeSimultaneous: if every region asked against the same pool at the
// same instant, with no floor and no explicit wants, the grants would add up
// to at most the pool. The allocator sizes grants one at a time, but this is
// why proportional shares cannot oversubscribe.
func TestSizeSimultaneous(t *testing.T) {
	f := func(c sizeCase) bool {
		r := c.r
		r.MinChunk, r.Want = 0, 0
		var sum int64
		seen := map[string]bool{}
		for _, d := range r.Demands {
			if seen[d.Region] {
				continue
			}
			seen[d.Region] = true
			r.Region = d.Region
			sum += Size(r)
		}
		return sum <= max(r.Pool, 0)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}

func TestSizeAllocs(t *testing.T) {
	r := benchRequest(10)
	if n := testing.AllocsPerRun(100, func() { Size(r) }); n != 0 {
		t.Errorf("Size allocates %v times per call, want 0", n)
	}
}

// TestQuo checks the 128-bit division against math/big, with divisors of
// one and two words.
func TestQuo(t *testing.T) {
	f := func(uhi, ulo, vhi, vlo uint64, shift uint8) bool {
		vhi >>= shift % 64
		u, v := u128{uhi, ulo}, u128{vhi, vlo}
		if v == (u128{}) {
			return quo(u, v) == math.MaxUint64
		}
		bu := new(big.Int).Lsh(new(big.Int).SetUint64(uhi), 64)
		bu.Or(bu, new(big.Int).SetUint64(ulo))
		bv := new(big.Int).Lsh(new(big.Int).SetUint64(vhi), 64)
		bv.Or(bv, new(big.Int).SetUint64(vlo))
		want := new(big.Int).Quo(bu, bv)
		got := quo(u, v)
		if !want.IsUint64() {
			return got == math.MaxUint64
		}
		if got != want.Uint64() {
			t.Logf("%v / %v = %d, want %v", bu, bv, got, want)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 100000}); err != nil {
		t.Error(err)
	}
}

// benchRequest returns a sizing request with n regions whose demands
// exceed the pool, so that Size takes the proportional path.
func benchRequest(n int) SizeRequest {
	r := SizeRequest{Pool: 200, Left: 45 * time.Second, Horizon: 15 * time.Second, Region: "r0", MinChunk: 5, MaxChunk: 500}
	for i := range n {
		r.Demands = append(r.Demands, RegionDemand{Region: fmt.Sprintf("r%d", i), Rate: float64(10 + i), Held: int64(i)})
	}
	return r
}
