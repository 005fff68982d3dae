package store

import "leasehold/lease"

// RateKey names a region's token bucket of one bucket limit (package
// bucket, RateKey): bucket limits have no windows, so one bucket per limit.
type RateKey struct {
	Limit   string
	HashTag string
}

// ShareInstall describes a rate share to install in a region's token
// bucket: the arguments of rate.lua's install. Times are milliseconds on
// the store's clock.
type ShareInstall struct {
	Key        RateKey
	Share      lease.BucketShare
	ExpireAtMs int64 // the key's expiry (only ever extended), >= Share.DeadlineMs
	NowMs      int64
}

// ShareStatus says what installing a share did.
type ShareStatus int

const (
	// ShareInstalled: the share is in force.
	ShareInstalled ShareStatus = 1
	// ShareStale: the share in force (not expired) has this Seq or a
	// greater one; nothing changed.
	ShareStale ShareStatus = 2
	// ShareRefusedKeyExpiry: ExpireAtMs is not after the store's current
	// time; nothing was written (as [RefusedKeyExpiry]).
	ShareRefusedKeyExpiry ShareStatus = 4
)

// ShareResult is the outcome of installing a share.
type ShareResult struct {
	Status ShareStatus
	Tokens int64 // whole tokens in the bucket after the call
}

// TakeResult is the outcome of one take from a token bucket.
type TakeResult struct {
	Allowed bool
	// Tokens is what the bucket holds after the take, in whole tokens.
	Tokens int64
	// WaitMs is how long until the bucket would hold the cost if nothing
	// else were spent: 0 now, -1 never under the share in force (the cost
	// is above its burst, it has no rate, or its deadline comes first).
	WaitMs int64
	// DeadlineMs is the deadline of the share in force, 0 if none.
	DeadlineMs int64
	// Admitted and Denied are the bucket's cost counters after the take.
	Admitted, Denied int64
	// WouldDeny and WouldDenyChecks are the bucket's shadow counters
	// after the take: the cost and the number of takes a shadow share
	// could not pay (what Denied would have counted if enforced).
	WouldDeny, WouldDenyChecks int64
	// Shadowed: this take was one a shadow share could not pay (Allowed
	// false): nothing was charged or denied, it was counted in WouldDeny
	// and WouldDenyChecks, and the caller admits it.
	Shadowed bool
}

// memRate is one token bucket key of a [Mem].
type memRate struct {
	b                lease.TokenBucket
	admitted, denied int64
	wd, wdc          int64 // would_deny, would_deny_checks
	expireAt         int64 // ms; 0: no expiry
}

// rate returns the live token bucket of key at now, nil if it does not
// exist (never created, or expired).
func (b *Mem) rate(key RateKey, nowMs int64) *memRate {
	r := b.rates[key]
	if r != nil && r.expireAt > 0 && r.expireAt <= nowMs {
		delete(b.rates, key)
		return nil
	}
	return r
}

// InstallShare installs a rate share in its token bucket, as rate.lua's
// install does: refused (nothing written) when the key's expiry is not
// after now, stale when the share in force has an equal or greater Seq,
// and the key's expiry only ever extended. An invalid share is an error.
func (b *Mem) InstallShare(in ShareInstall) (ShareResult, error) {
	if !in.Share.Valid() || in.ExpireAtMs < in.Share.DeadlineMs {
		return ShareResult{}, errMem
	}
	r := b.rate(in.Key, in.NowMs)
	if in.ExpireAtMs <= in.NowMs {
		if r == nil {
			return ShareResult{Status: ShareRefusedKeyExpiry}, nil
		}
		return ShareResult{Status: ShareRefusedKeyExpiry, Tokens: r.b.Tokens()}, nil
	}
	if r == nil {
		r = &memRate{}
		if b.rates == nil {
			b.rates = map[RateKey]*memRate{}
		}
		b.rates[in.Key] = r
	}
	st := r.b.Install(in.NowMs, in.Share)
	if st == lease.ShareInstalled && (r.expireAt == 0 || r.expireAt < in.ExpireAtMs) {
		r.expireAt = in.ExpireAtMs
	}
	status := ShareInstalled
	if st != lease.ShareInstalled {
		status = ShareStale
	}
	return ShareResult{Status: status, Tokens: r.b.Tokens()}, nil
}

// Take spends cost tokens from a token bucket if it holds them, as
// rate.lua's take does, and counts the cost as admitted or denied. A take
// on a bucket with no share is denied and creates the key, with the
// orphan TTL, for its denied counter. In shadow mode (shadow: the limit
// is tried, not enforced) a take the bucket cannot pay charges nothing
// and is counted in WouldDeny instead of Denied (Shadowed: the caller
// admits it).
func (b *Mem) Take(key RateKey, cost, nowMs int64, shadow bool) (TakeResult, error) {
	if cost < 0 {
		return TakeResult{}, errMem
	}
	r := b.rate(key, nowMs)
	if r == nil && cost == 0 {
		return TakeResult{WaitMs: -1}, nil // denied, and nothing to count: no key
	}
	if r == nil {
		r = &memRate{}
		if b.orphanTTL > 0 {
			r.expireAt = nowMs + b.orphanTTL
		}
		if b.rates == nil {
			b.rates = map[RateKey]*memRate{}
		}
		b.rates[key] = r
	}
	ok := r.b.Take(nowMs, cost)
	shadowed := !ok && shadow
	switch {
	case ok:
		r.admitted += cost
	case shadowed:
		r.wd += cost
		r.wdc++
	default:
		r.denied += cost
	}
	res := TakeResult{Allowed: ok, Tokens: r.b.Tokens(), WaitMs: r.b.WaitMs(cost), Admitted: r.admitted, Denied: r.denied,
		WouldDeny: r.wd, WouldDenyChecks: r.wdc, Shadowed: shadowed}
	if r.b.Share.Seq > 0 {
		res.DeadlineMs = r.b.Share.DeadlineMs
	}
	return res, nil
}
