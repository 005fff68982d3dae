package lease

import (
	"math"
	"math/bits"
)

// u128 is an unsigned 128-bit integer. Sizing multiplies two int64 token
// counts (pool x need) and sums one need per region; both overflow int64 for
// large limits, and math/big would allocate on the allocator's hot path, so
// the few operations needed are done here with math/bits.
type u128 struct{ hi, lo uint64 }

// mul64 returns the full 128-bit product a*b.
func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

// add64 returns u+v. The caller keeps sums far below 2^128 (at most one
// int64 per region), so the carry out of hi cannot happen.
func (u u128) add64(v uint64) u128 {
	lo, c := bits.Add64(u.lo, v, 0)
	return u128{u.hi + c, lo}
}

// sub returns u-v for u >= v.
func (u u128) sub(v u128) u128 {
	lo, b := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, b)
	return u128{hi, lo}
}

// cmp returns -1, 0 or +1 as u is less than, equal to or greater than v.
func (u u128) cmp(v u128) int {
	switch {
	case u.hi < v.hi:
		return -1
	case u.hi > v.hi:
		return 1
	case u.lo < v.lo:
		return -1
	case u.lo > v.lo:
		return 1
	}
	return 0
}

// lsh returns u<<n for n < 64.
func (u u128) lsh(n uint) u128 {
	if n == 0 {
		return u
	}
	return u128{u.hi<<n | u.lo>>(64-n), u.lo << n}
}

// rsh1 returns u>>1.
func (u u128) rsh1() u128 {
	return u128{u.hi >> 1, u.lo>>1 | u.hi<<63}
}

// mul64 returns the low 128 bits of u*v.
func (u u128) mul64(v uint64) u128 {
	hi, lo := bits.Mul64(u.lo, v)
	return u128{hi + u.hi*v, lo}
}

// quo returns floor(u/v) when it fits in 64 bits and math.MaxUint64
// otherwise (and for v == 0), so that it can never panic the way
// bits.Div64 does. Sizing only divides when the quotient is below the pool,
// so saturation is a guard, not a path.
func quo(u, v u128) uint64 {
	if v.hi == 0 {
		if u.hi >= v.lo { // quotient >= 2^64, or v == 0
			return math.MaxUint64
		}
		q, _ := bits.Div64(u.hi, u.lo, v.lo)
		return q
	}
	// Two-word divisor: the quotient is below 2^64 and a trial quotient
	// from the normalised top word is within one of it (Hacker's Delight
	// 9-5, as in lukechampine.com/uint128).
	n := uint(bits.LeadingZeros64(v.hi))
	v1 := v.lsh(n)
	u1 := u.rsh1() // u1.hi < 2^63 <= v1.hi, so Div64 cannot panic
	tq, _ := bits.Div64(u1.hi, u1.lo, v1.hi)
	tq >>= 63 - n
	if tq != 0 {
		tq--
	}
	if u.sub(v.mul64(tq)).cmp(v) >= 0 {
		tq++
	}
	return tq
}

// mulDiv returns floor(a*b/c) for a, b >= 0 and c > 0 with no intermediate
// overflow, saturating at math.MaxInt64.
func mulDiv(a, b int64, c u128) int64 {
	q := quo(mul64(uint64(a), uint64(b)), c)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}
