package lease

import (
	"math"
	"time"
)

// A bucket limit admits at most R tokens per period P on average, in bursts
// of at most B tokens, all regions together. The allocator grants each
// region a rate share (r_i, b_i); the region refills a token bucket of its
// own at r_i up to b_i and spends from it. Rate shares are counted in
// thousandths of a token per period (milli-tokens), so that a small rate
// can still be split between regions: 1 token per second shared by three
// regions is 333 + 333 + 333 milli-tokens per second.
//
// The regional bucket keeps its level in units of 1/(1000*P_ms) of a token
// (see [BucketUnit]). In those units a share of r milli-tokens per period
// refills exactly r units per millisecond: integer arithmetic, the same in
// Go and in Redis's Lua, with nothing lost to rounding.

// MilliTokens is how many rate units make one token per period: rate shares
// are in milli-tokens per period.
const MilliTokens = 1000

// MaxBucketUnits is the most units a regional bucket may hold (2^52): the
// Lua scripts compute in float64, exact for integers up to 2^53, and one
// millisecond's refill on top of a full bucket must stay exact.
const MaxBucketUnits = 1 << 52

// BucketUnit returns how many units make one token for a limit whose rate
// is counted per period: 1000 * period in whole milliseconds. It is 0 for a
// period below one millisecond (no valid limit has one) and saturates so
// that it never exceeds MaxBucketUnits.
func BucketUnit(period time.Duration) int64 {
	ms := period.Milliseconds()
	if ms < 1 {
		return 0
	}
	if ms > MaxBucketUnits/MilliTokens {
		return MaxBucketUnits
	}
	return ms * MilliTokens
}

// MaxBurst returns the largest burst a bucket limit with this rate period
// may have: its full bucket must fit in MaxBucketUnits. It is about 4.5
// billion tokens for a period of one second, 75 million for a minute, 1.25
// million for an hour; 0 for a period below one millisecond.
func MaxBurst(period time.Duration) int64 {
	u := BucketUnit(period)
	if u == 0 {
		return 0
	}
	return MaxBucketUnits / u
}

// BucketShare is one region's rate share of a bucket limit, as the agent
// installs it in its regional bucket.
type BucketShare struct {
	// Seq orders the shares a region receives for one limit: a share
	// replaces the one in force only if its Seq is greater (or the one in
	// force has expired), so a late or repeated reply cannot bring back an
	// older share.
	Seq int64
	// Rate is r_i in milli-tokens per period, which is units per
	// millisecond (>= 0).
	Rate int64
	// Burst is b_i in tokens (>= 0).
	Burst int64
	// Unit is the limit's BucketUnit: units per token (>= 1).
	Unit int64
	// DeadlineMs is the instant (ms on the bucket's clock, exclusive) after
	// which the share gives nothing: no refill, no spend.
	DeadlineMs int64
}

// Valid reports whether s can be installed: every field in range and the
// full bucket (Burst*Unit) within MaxBucketUnits.
func (s BucketShare) Valid() bool {
	return s.Seq > 0 && s.Rate >= 0 && s.Rate <= MaxBucketUnits && s.Burst >= 0 &&
		s.Unit >= 1 && s.Unit <= MaxBucketUnits && s.Burst <= MaxBucketUnits/s.Unit &&
		s.DeadlineMs > 0 && s.DeadlineMs <= MaxBucketUnits
}

// TokenBucket is a region's token bucket under its current rate share: the
// model that the Redis script lua/rate.lua (package regionagent/bucket)
// implements step for step, and the in-memory bucket and the simulator run.
//
// Model: the bucket holds Level units (a token is Share.Unit units). Time
// only moves forward: an instant earlier than Last (a clock stepping back,
// as after a Redis failover to a replica whose clock is behind) counts as
// Last, so the same milliseconds are never refilled twice and an expired
// share never comes back. Between Last and now the level grows by
// Share.Rate units per millisecond up to Share.Burst tokens, but only up to
// the share's deadline; at or after the deadline the bucket is empty and
// stays empty until a newer share arrives. A new share keeps the level
// (capped at its burst) when the old share was still in force and starts
// empty otherwise: tokens only ever come from refill, which is what makes
// the bound B + R*T hold for every interval (docs/overshoot.md).
//
// The zero value is an empty bucket with no share: every Take is denied.
// Time is an argument (milliseconds on the bucket's clock); nothing here
// reads a clock. A TokenBucket is not safe for concurrent use.
type TokenBucket struct {
	Share BucketShare // the share in force (Seq 0: none yet)
	Level int64       // units, in [0, Share.Burst*Share.Unit]
	Last  int64       // ms: the latest instant seen since the first share
}

// BucketStatus is what [TokenBucket.Install] did with a share.
type BucketStatus int

const (
	// ShareInstalled: the share is now in force.
	ShareInstalled BucketStatus = 1
	// ShareStale: the share in force has this Seq or a greater one;
	// nothing changed.
	ShareStale BucketStatus = 2
	// ShareInvalid: the share is not [BucketShare.Valid]; nothing changed.
	ShareInvalid BucketStatus = 3
)

// advance moves the bucket to now (never backward) and returns the
// effective instant: max(now, Last).
func (b *TokenBucket) advance(nowMs int64) int64 {
	now := max(nowMs, b.Last)
	s := b.Share
	if s.Seq == 0 {
		return now // nothing to refill, and no instant to keep yet
	}
	if end := min(now, s.DeadlineMs); end > b.Last {
		b.Level = refill(b.Level, s.Rate, end-b.Last, s.Burst*s.Unit)
	}
	if now >= s.DeadlineMs {
		b.Level = 0
	}
	b.Last = now
	return now
}

// refill returns min(capacity, level + rate*elapsed) for level <= capacity
// and non-negative rate and elapsed, without overflow.
func refill(level, rate, elapsed, capacity int64) int64 {
	need := capacity - level
	if need <= 0 {
		return capacity
	}
	if rate == 0 || elapsed == 0 {
		return level
	}
	if mul64(uint64(rate), uint64(elapsed)).cmp(u128{0, uint64(need)}) >= 0 {
		return capacity
	}
	return level + rate*elapsed // < need, so it fits
}

// Install puts share s in force at now, unless the share in force has an
// equal or greater Seq (ShareStale, nothing changes). Once the share in
// force has expired any valid share may follow: a new allocator leader
// that lost count of the sequence can still be heard, and every share an
// agent may install is one the allocator still counts as in force. The level
// is first brought to now under the old share; it is kept, capped at the
// new burst, if the old share was still in force, and 0 otherwise. An
// invalid share is refused (ShareInvalid) before anything changes.
func (b *TokenBucket) Install(nowMs int64, s BucketShare) BucketStatus {
	if !s.Valid() {
		return ShareInvalid
	}
	now := b.advance(nowMs)
	if s.Seq <= b.Share.Seq && now < b.Share.DeadlineMs {
		return ShareStale
	}
	if b.Share.Seq == 0 || now >= b.Share.DeadlineMs {
		b.Level = 0
	}
	b.Share, b.Last = s, now
	b.Level = min(b.Level, s.Burst*s.Unit)
	if now >= s.DeadlineMs {
		b.Level = 0
	}
	return ShareInstalled
}

// Take spends cost tokens at now if the bucket holds them (all or nothing)
// and reports whether it did. A cost <= 0 is always taken (it spends
// nothing), while a share is in force; with no share in force (none yet,
// or past its deadline) every Take is denied.
func (b *TokenBucket) Take(nowMs, cost int64) bool {
	now := b.advance(nowMs)
	if b.Share.Seq == 0 || now >= b.Share.DeadlineMs {
		return false
	}
	cost = max(cost, 0)
	if cost > b.Level/b.Share.Unit { // cost*Unit <= Level exactly when cost <= floor(Level/Unit)
		return false
	}
	b.Level -= cost * b.Share.Unit
	return true
}

// Tokens returns the whole tokens the bucket holds (at its Last instant).
func (b *TokenBucket) Tokens() int64 {
	if b.Share.Unit <= 0 {
		return 0
	}
	return b.Level / b.Share.Unit
}

// WaitMs returns how long after Last the bucket will hold cost tokens if
// nothing else is spent: 0 if it holds them now, -1 if it never will under
// its share (cost above the burst, no rate, or the deadline comes first).
func (b *TokenBucket) WaitMs(cost int64) int64 {
	s := b.Share
	if s.Seq == 0 || b.Last >= s.DeadlineMs || cost > s.Burst || s.Unit <= 0 {
		return -1
	}
	c := max(cost, 0) * s.Unit // <= Burst*Unit for a valid share
	if c <= b.Level {
		return 0
	}
	if s.Rate == 0 {
		return -1
	}
	w := (c - b.Level + s.Rate - 1) / s.Rate
	if w >= s.DeadlineMs-b.Last {
		return -1
	}
	return w
}

// BucketBound returns the most tokens a bucket limit of rate tokens per
// period and burst tokens may admit in any interval of length t, all
// regions together, when no fault adds to it: burst + ceil(rate*t/period).
// extra is added for the fault terms (fallback admits, re-spends after a
// Redis failover). Negative arguments count as 0; the result saturates at
// math.MaxInt64 instead of overflowing, and is math.MaxInt64 for a period
// below one millisecond (no such limit is valid).
func BucketBound(rate int64, period time.Duration, burst int64, t time.Duration, extra int64) int64 {
	if period <= 0 {
		return math.MaxInt64
	}
	rate, burst, t, extra = max(rate, 0), max(burst, 0), max(t, 0), max(extra, 0)
	// ceil(rate*t/period) = floor((rate*t + period - 1) / period), in 128 bits.
	p := mul64(uint64(rate), uint64(t)).add64(uint64(period) - 1)
	refilled := quo(p, u128{0, uint64(period)})
	if refilled > math.MaxInt64 {
		return math.MaxInt64
	}
	return addSat64(addSat64(burst, int64(refilled)), extra)
}

// SumShares returns the sums of the rates (milli-tokens per period) and of
// the bursts (tokens) of shares, each saturating at math.MaxInt64; negative
// values count as 0. The allocator keeps both sums, over every share that
// may still be in force, at or below the limit's: sum r_i <= 1000*R and
// sum b_i <= B.
func SumShares(shares []BucketShare) (rate, burst int64) {
	for _, s := range shares {
		rate = addSat64(rate, max(s.Rate, 0))
		burst = addSat64(burst, max(s.Burst, 0))
	}
	return rate, burst
}

// addSat64 returns a+b for a, b >= 0, saturating at math.MaxInt64.
func addSat64(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
