package lease

import (
	"math"
	"math/big"
	"math/rand"
	"reflect"
	"testing"
	"testing/quick"
	"time"
)

// The tests of fair shares (rules 5-10 of Size). Every case with G == 0 is
// also a case of the plain sizing tested in size_test.go.

// fd is a region's report with what it was granted in the window.
func fd(region string, rate float64, held, granted int64) RegionDemand {
	return RegionDemand{Region: region, Rate: rate, Held: held, Granted: granted}
}

func TestAllotTable(t *testing.T) {
	s := time.Second
	// Issue 13: G = 600 per 10 s, eu 480 tokens/s, us 20/s: fair shares
	// 576 and 24 (4 %). Leases of 5 s.
	issue := func(pool int64, left time.Duration, region string, euGranted, usGranted int64) SizeRequest {
		return SizeRequest{Pool: pool, Left: left, Horizon: 5 * s, Region: region, G: 600, MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 0, euGranted), fd("us", 20, 0, usGranted)}}
	}
	cases := []struct {
		name  string
		r     SizeRequest
		want  int64
		avail int64
		spent bool
	}{
		// Without fair shares eu, asking first, takes the pool in a few asks.
		{"no G: eu takes what is left (today's rule)", SizeRequest{Pool: 600, Left: 10 * s, Horizon: 5 * s, Region: "eu", MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 0, 0), fd("us", 20, 0, 0)}}, 576, 600, false},
		{"no G: eu's second ask takes most of the rest", SizeRequest{Pool: 24, Left: 9 * s, Horizon: 5 * s, Region: "eu", MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 576, 576), fd("us", 20, 0, 0)}}, 22, 24, false},

		{"eu first: us's share is kept", issue(600, 10*s, "eu", 0, 0), 576, 576, false},
		{"eu again: its share is spent", issue(24, 9*s, "eu", 576, 0), 0, 0, true},
		{"us then gets its whole share at once", issue(24, 9*s, "us", 576, 0), 24, 24, false},
		{"us first: eu's share is kept", issue(600, 10*s, "us", 0, 0), 24, 24, false},
		{"us again after its share: spent", issue(576, 9*s, "us", 0, 24), 0, 0, true},
		{"eu then gets the rest", issue(576, 9*s, "eu", 0, 24), 576, 576, false},
		{"eu took 558 (old rule): us's own part is not shared with eu's excess", issue(42, 9*s, "us", 558, 0), 24, 24, false},
		{"us's claim shrinks with the window: 0.5 s of 20/s", issue(24, s/2, "eu", 576, 0), 14, 14, false},
		{"us over its share: no claim, eu may take the pool", issue(100, 5*s, "eu", 476, 24), 100, 100, false},
		{"us returned 10 of 24: its claim is back to 10, the rest shared by need", issue(34, 5*s, "eu", 576, 14), 23, 24, false},
		{"us not listed (stale): no claim", SizeRequest{Pool: 24, Left: 9 * s, Horizon: 5 * s, Region: "eu", G: 600, MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 0, 576)}}, 24, 24, false},
		{"pool empty is not share spent", issue(0, 9*s, "eu", 576, 24), 0, 0, false},
		{"window over is not share spent", issue(24, 0, "eu", 576, 0), 0, 0, false},

		{"work conserving: everyone fits, past the fair share", SizeRequest{Pool: 1000, Left: 60 * s, Horizon: 15 * s, Region: "eu", G: 1000,
			Demands: []RegionDemand{fd("eu", 50, 0, 500), fd("us", 10, 0, 0)}}, 750, 834, false},
		{"claims beyond the horizon's need still protect", SizeRequest{Pool: 400, Left: 60 * s, Horizon: 15 * s, Region: "eu", G: 1000,
			Demands: []RegionDemand{fd("eu", 50, 0, 600), fd("us", 10, 0, 0)}}, 234, 234, false},
		{"own part first, the free rest shared by need", SizeRequest{Pool: 500, Left: 60 * s, Horizon: 15 * s, Region: "eu", G: 1000,
			Demands: []RegionDemand{fd("eu", 25, 0, 400), fd("us", perMin(500), 0, 150)}}, 375, 400, false},
		{"floor limited by available", SizeRequest{Pool: 30, Left: 60 * s, Horizon: 15 * s, Region: "us", G: 1000, MinChunk: 10,
			Demands: []RegionDemand{fd("eu", 100, 0, 972), fd("us", 0.1, 0, 7)}}, 3, 3, false},
		{"cap applies to a fair share too", SizeRequest{Pool: 600, Left: 10 * s, Horizon: 5 * s, Region: "eu", G: 600, MaxChunk: 100,
			Demands: []RegionDemand{fd("eu", 480, 0, 0), fd("us", 20, 0, 0)}}, 100, 576, false},
		{"shares round down: 3 of 10 each, the last token shared by need", SizeRequest{Pool: 10, Left: 60 * s, Region: "ap", G: 10,
			Demands: []RegionDemand{fd("eu", 1, 0, 0), fd("us", 1, 0, 0), fd("ap", 1, 0, 0)}}, 3, 4, false},
		{"requester with no report: share spent when the others claim all", SizeRequest{Pool: 600, Left: 10 * s, Region: "ap", G: 600, MinChunk: 5,
			Demands: []RegionDemand{fd("eu", 480, 0, 0), fd("us", 20, 0, 0)}}, 0, 0, true},
		{"share spent even when nothing is needed", issue(24, 9*s, "eu", 576, 0), 0, 0, true},
		{"claims above the pool are scaled to it: each gets its part", SizeRequest{Pool: 50, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 300, 0, 0), fd("us", 300, 0, 0)}}, 25, 25, false},
		{"claims 275+300 above a pool of 25: eu 11, us keeps 13", SizeRequest{Pool: 25, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 300, 0, 25), fd("us", 300, 0, 0)}}, 11, 12, false},
		{"three owed more than is left: nobody blocked", SizeRequest{Pool: 2, Left: 10 * s, Region: "ap", G: 600, MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 1, 0, 0), fd("us", 1, 0, 0), fd("ap", 1, 0, 0), fd("sa", 100, 0, 598)}}, 1, 2, false},
		{"us holds what it can spend in the rest of the window: no claim", SizeRequest{Pool: 24, Left: s, Region: "eu", G: 600, MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 0, 576), fd("us", 20, 20, 0)}}, 24, 24, false},
		{"us holds part of what it can spend: the rest is claimed", SizeRequest{Pool: 24, Left: s, Region: "eu", G: 600, MinChunk: 1,
			Demands: []RegionDemand{fd("eu", 480, 0, 576), fd("us", 20, 5, 0)}}, 9, 9, false},
		{"no weight anywhere: plain sizing", SizeRequest{Pool: 100, Left: 10 * s, Region: "eu", G: 600, Want: 30,
			Demands: []RegionDemand{fd("eu", 0, 0, 0), fd("us", 0, 0, 0)}}, 30, 100, false},
		{"negative granted counts as 0", SizeRequest{Pool: 600, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 480, 0, 0), fd("us", 20, 0, -1000)}}, 576, 576, false},
		{"duplicates of others each claim", SizeRequest{Pool: 600, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 100, 0, 0), fd("us", 100, 0, 0), fd("us", 100, 0, 0)}}, 200, 200, false},
		{"requester's duplicate ignored", SizeRequest{Pool: 600, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 100, 0, 0), fd("us", 100, 0, 0), fd("eu", 1e6, 0, 0)}}, 300, 300, false},
		{"NaN rate: no weight, no claim", SizeRequest{Pool: 600, Left: 10 * s, Region: "eu", G: 600,
			Demands: []RegionDemand{fd("eu", 10, 0, 0), fd("us", math.NaN(), 0, 0)}}, 100, 600, false},
		{"huge everything", SizeRequest{Pool: math.MaxInt64, Left: math.MaxInt64, Region: "eu", Want: math.MaxInt64, G: math.MaxInt64,
			Demands: []RegionDemand{fd("eu", math.MaxFloat64, 0, 0), fd("us", math.MaxFloat64, 0, 0)}}, math.MaxInt64 / 2, math.MaxInt64/2 + 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Allot(c.r)
			if got.Tokens != c.want || got.Available != c.avail || got.ShareSpent != c.spent {
				t.Errorf("Allot(%+v) = %+v, want tokens %d available %d spent %v", c.r, got, c.want, c.avail, c.spent)
			}
			if s := Size(c.r); s != got.Tokens {
				t.Errorf("Size = %d, Allot.Tokens = %d", s, got.Tokens)
			}
			if ref := refAllot(c.r, floatNeed, floatWeight, floatSpend); ref.Allotment != got {
				t.Errorf("reference = %+v, want %+v (the table or the reference is wrong)", ref.Allotment, got)
			}
		})
	}
}

// refAllotment is the reference's answer, with what the properties need.
type refAllotment struct {
	Allotment
	mine     *big.Int         // the requester's need (rule 4)
	raw      map[int]*big.Int // claim of each Demands entry that counts, by index (rule 5)
	claims   map[int]*big.Int // the same, scaled to the pool (rule 6)
	needs    map[int]*big.Int // capped need of each other entry, by index
	others   []int            // indexes of the other regions' entries
	mineAt   int              // the requester's entry, or -1
	unshared func() int64     // Size of the same request with G = 0
}

// refAllot is a naive transcription of Size's documented rules 1-11 in
// math/big, written apart from Size: no shortcuts, no saturation, no
// 128-bit tricks, every region's claim computed on its own. needOf gives a
// region's derived need over h (rule 3), weightOf its weight (rule 5) and
// spendOf ceil(Rate*left) (rule 5), so that the rounding of rates can be
// exact where the inputs allow it.
func refAllot(r SizeRequest, needOf func(d RegionDemand, h time.Duration) *big.Int,
	weightOf func(d RegionDemand) *big.Int, spendOf func(d RegionDemand, left time.Duration) *big.Int) refAllotment {
	out := refAllotment{raw: map[int]*big.Int{}, claims: map[int]*big.Int{}, needs: map[int]*big.Int{}, mineAt: -1}
	out.unshared = func() int64 {
		r0 := r
		r0.G = 0
		return refSize(r0, needOf)
	}
	if r.Pool <= 0 || r.Left <= 0 {
		return out
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
	bmin := func(a, b *big.Int) *big.Int {
		if a.Cmp(b) < 0 {
			return a
		}
		return b
	}
	bpos := func(a *big.Int) *big.Int {
		if a.Sign() < 0 {
			return big.NewInt(0)
		}
		return a
	}
	// The entries that count: the requester's first one and every other.
	counted := []int{}
	for i, d := range r.Demands {
		if d.Region == r.Region {
			if out.mineAt >= 0 {
				continue
			}
			out.mineAt = i
		} else {
			out.others = append(out.others, i)
		}
		counted = append(counted, i)
	}
	// Rule 4.
	mine := big.NewInt(0)
	if out.mineAt >= 0 {
		mine = needOf(r.Demands[out.mineAt], h)
	}
	if r.Want > 0 {
		mine = big.NewInt(r.Want)
	}
	if r.MinChunk > 0 && mine.Cmp(big.NewInt(r.MinChunk)) < 0 {
		mine = big.NewInt(r.MinChunk)
	}
	mine = limit(mine)
	out.mine = mine
	// Rule 5: every counted entry's fair share and claim.
	sumW := big.NewInt(0)
	for _, i := range counted {
		sumW.Add(sumW, weightOf(r.Demands[i]))
	}
	sumC := big.NewInt(0)
	for _, i := range counted {
		d := r.Demands[i]
		c := big.NewInt(0)
		if r.G > 0 && sumW.Sign() > 0 {
			f := new(big.Int).Mul(big.NewInt(r.G), weightOf(d))
			f.Quo(f, sumW)
			e := bpos(f.Sub(f, big.NewInt(max(d.Granted, 0))))
			c = bmin(e, bpos(new(big.Int).Sub(spendOf(d, r.Left), big.NewInt(max(d.Held, 0)))))
		}
		out.raw[i] = c
		sumC.Add(sumC, c)
	}
	// Rule 6.
	for _, i := range counted {
		c := out.raw[i]
		if sumC.Cmp(big.NewInt(r.Pool)) > 0 {
			c = new(big.Int).Mul(c, big.NewInt(r.Pool))
			c.Quo(c, sumC)
		}
		out.claims[i] = c
	}
	// Rule 7.
	avail := big.NewInt(r.Pool)
	for _, i := range out.others {
		avail.Sub(avail, out.claims[i])
	}
	avail = bpos(avail)
	if avail.Sign() == 0 {
		out.ShareSpent = true
		return out
	}
	p := big.NewInt(0)
	if out.mineAt >= 0 {
		p = bmin(bmin(mine, out.claims[out.mineAt]), avail)
	}
	// Rule 8.
	free := new(big.Int).Sub(avail, p)
	rest := new(big.Int).Sub(mine, p)
	total := new(big.Int).Set(rest)
	for _, i := range out.others {
		n := limit(needOf(r.Demands[i], h))
		out.needs[i] = n
		total.Add(total, bpos(new(big.Int).Sub(n, out.claims[i])))
	}
	out.Available = avail.Int64()
	// Rule 9.
	if total.Cmp(free) <= 0 {
		out.Tokens = mine.Int64()
		return out
	}
	// Rule 10.
	g := new(big.Int).Mul(free, rest)
	g.Quo(g, total)
	g.Add(g, p)
	if r.MinChunk > 0 {
		floor := bmin(big.NewInt(r.MinChunk), avail)
		if g.Cmp(floor) < 0 {
			g = floor
		}
	}
	// Rule 11.
	g = bmin(limit(g), avail)
	out.Tokens = g.Int64()
	return out
}

// floatWeight and floatSpend are rule 5's roundings for arbitrary float
// rates, by tokensOver (checked on its own in TestTokensOver).
func floatWeight(d RegionDemand) *big.Int { return big.NewInt(tokensOver(d.Rate, weightUnit)) }
func floatSpend(d RegionDemand, left time.Duration) *big.Int {
	return big.NewInt(tokensOver(d.Rate, left))
}

// fairCase is a sizeCase with fair shares: a G (sometimes 0) and what
// each region was granted in the window.
type fairCase struct{ sizeCase }

func (fairCase) Generate(rnd *rand.Rand, size int) reflect.Value {
	c := fairCase{sizeCase.Generate(sizeCase{}, rnd, size).Interface().(sizeCase)}
	pick := func(choices ...int64) int64 { return choices[rnd.Intn(len(choices))] }
	c.r.G = pick(0, -1, 1, 10, 600, 1000, max(c.r.Pool, 0)+rnd.Int63n(2000), rnd.Int63n(10000))
	for i := range c.r.Demands {
		c.r.Demands[i].Granted = pick(0, 0, -1, 1, 24, rnd.Int63n(max(c.r.G, 1)+1), rnd.Int63n(5000))
	}
	return reflect.ValueOf(c)
}

// exactWeight is rule 5's weight in exact rationals: ceil(perMin * 10^6 / 60).
func (c fairCase) exactWeight(d RegionDemand) *big.Int {
	return ceilDiv(big.NewInt(c.perMins[d.Region]*1_000_000), big.NewInt(60))
}

// exactSpend is ceil(perMin * left / 1 min) in exact rationals, 0 for left <= 0.
func (c fairCase) exactSpend(d RegionDemand, left time.Duration) *big.Int {
	if left <= 0 {
		return big.NewInt(0)
	}
	return ceilDiv(new(big.Int).Mul(big.NewInt(c.perMins[d.Region]), big.NewInt(int64(left))), big.NewInt(int64(time.Minute)))
}

func ceilDiv(a, b *big.Int) *big.Int {
	q, m := new(big.Int).QuoRem(a, b, new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// TestAllotQuick compares Allot with the exact reference and checks the
// properties fair shares promise.
func TestAllotQuick(t *testing.T) {
	f := func(c fairCase) bool {
		got := Allot(c.r)
		ref := refAllot(c.r, c.exactNeed, c.exactWeight, c.exactSpend)
		if got != ref.Allotment {
			t.Logf("Allot(%+v) = %+v, reference %+v", c.r, got, ref.Allotment)
			return false
		}
		if msg := checkAllot(c.r, got, ref); msg != "" {
			t.Logf("Allot(%+v) = %+v: %s", c.r, got, msg)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 50000}); err != nil {
		t.Error(err)
	}
}

// checkAllot returns what is wrong with a = Allot(r), given the
// reference's view of r, or "".
func checkAllot(r SizeRequest, a Allotment, ref refAllotment) string {
	if msg := checkSize(r, a.Tokens); msg != "" {
		return msg
	}
	live := r.Pool > 0 && r.Left > 0
	// The claims, scaled, never promise more than the pool.
	allClaims := new(big.Int)
	for _, c := range ref.claims {
		allClaims.Add(allClaims, c)
	}
	if live && allClaims.Cmp(big.NewInt(r.Pool)) > 0 {
		return "claims above the pool"
	}
	// The others' protected claims.
	othersClaim := new(big.Int)
	othersFloor := new(big.Int) // max(need, claim) of each other region
	for _, i := range ref.others {
		othersClaim.Add(othersClaim, ref.claims[i])
		m := ref.claims[i]
		if n := ref.needs[i]; n != nil && n.Cmp(m) > 0 {
			m = n
		}
		othersFloor.Add(othersFloor, m)
	}
	pool := big.NewInt(max(r.Pool, 0))
	left := new(big.Int).Sub(pool, big.NewInt(a.Tokens))
	switch {
	case a.Tokens > a.Available:
		return "grant above available"
	case live && othersClaim.Cmp(pool) <= 0 && left.Cmp(othersClaim) < 0:
		return "grant takes another region's claim"
	case live && othersClaim.Cmp(pool) > 0 && a.Tokens != 0:
		return "grant while the others' claims exceed the pool"
	case a.ShareSpent != (live && a.Available == 0):
		return "share-spent flag wrong"
	case a.ShareSpent && a.Tokens != 0:
		return "share spent, yet a grant"
	case a.ShareSpent && ref.mineAt >= 0 && ref.raw[ref.mineAt].Sign() > 0:
		return "share spent, yet the requester has a claim"
	case r.G <= 0 && a.Tokens != ref.unshared():
		return "without G, not the plain sizing"
	}
	if !live || a.ShareSpent {
		return ""
	}
	// Work conservation: when the pool covers the requester's need and
	// every other region's need and claim, the requester gets its need,
	// past its fair share if need be.
	if new(big.Int).Add(othersFloor, ref.mine).Cmp(pool) <= 0 && big.NewInt(a.Tokens).Cmp(ref.mine) != 0 {
		return "everyone fits, but the requester did not get its need"
	}
	// ... and when no other region has a claim, fair shares never give
	// the requester less than the plain sizing.
	if othersClaim.Sign() == 0 && a.Tokens < ref.unshared() {
		return "no other claim, yet less than the plain sizing"
	}
	// The requester's own claim is granted (up to its need) before any
	// sharing.
	if ref.mineAt >= 0 {
		own := ref.claims[ref.mineAt]
		if own.Cmp(ref.mine) > 0 {
			own = ref.mine
		}
		if own.Cmp(big.NewInt(a.Available)) > 0 {
			own = big.NewInt(a.Available)
		}
		if big.NewInt(a.Tokens).Cmp(own) < 0 {
			return "less than the requester's own claim"
		}
	}
	return ""
}

// FuzzAllot checks Allot against the reference at any magnitude, with
// float rates, and the same properties.
func FuzzAllot(f *testing.F) {
	s := int64(time.Second)
	f.Add(int64(600), int64(600), 10*s, 5*s, int64(0), int64(1), int64(0), uint8(4), 480.0, int64(0), int64(0), 20.0, int64(0), int64(0))
	f.Add(int64(24), int64(600), 9*s, 5*s, int64(0), int64(1), int64(0), uint8(8), 480.0, int64(0), int64(576), 20.0, int64(0), int64(0))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(0), int64(math.MaxInt64), int64(0), int64(0),
		uint8(14), math.MaxFloat64, int64(0), int64(math.MinInt64), math.Inf(1), int64(-1), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, pool, g, left, horizon, want, minChunk, maxChunk int64, who uint8,
		rate0 float64, held0, granted0 int64, rate1 float64, held1, granted1 int64) {
		names := []string{"eu", "us", "ap"}
		all := []RegionDemand{fd("eu", rate0, held0, granted0), fd("us", rate1, held1, granted1)}
		region := "sa"
		if i := int(who & 3); i < len(names) {
			region = names[i]
		}
		r := SizeRequest{
			Pool: pool, Left: time.Duration(left), Horizon: time.Duration(horizon),
			Region: region, Want: want, Demands: all[:int(who>>2)%3],
			MinChunk: minChunk, MaxChunk: maxChunk, G: g,
		}
		a := Allot(r)
		ref := refAllot(r, floatNeed, floatWeight, floatSpend)
		if a != ref.Allotment {
			t.Fatalf("Allot(%+v) = %+v, reference %+v", r, a, ref.Allotment)
		}
		if msg := checkAllot(r, a, ref); msg != "" {
			t.Fatalf("Allot(%+v) = %+v: %s", r, a, msg)
		}
	})
}

func TestAllotAllocs(t *testing.T) {
	r := benchRequest(10)
	r.G = 1000
	if n := testing.AllocsPerRun(100, func() { Allot(r) }); n != 0 {
		t.Errorf("Allot allocates %v times per call, want 0", n)
	}
}
