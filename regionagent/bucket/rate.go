package bucket

import (
	"context"

	"leasehold/regionagent/store"
)

// A bucket limit (rate R per period, burst B) keeps one token bucket per
// region under [RateKey], refilled by the region's rate share and spent by
// Take, in one atomic script (lua/rate.lua) that implements
// lease.TokenBucket step for step on Redis's clock. The hash holds the
// share in force (seq, rate, burst, unit, d), the level in units (lvl), the
// latest instant seen (t: time never goes back, so a failover to a replica
// whose clock is behind refills nothing twice) and the cost counters
// admitted and denied.

// The vocabulary of rate shares is package store's, as for leases.
type (
	ShareInstall = store.ShareInstall
	ShareResult  = store.ShareResult
	ShareStatus  = store.ShareStatus
	TakeResult   = store.TakeResult
)

// Share statuses (see [store.ShareStatus]).
const (
	ShareInstalled        = store.ShareInstalled
	ShareStale            = store.ShareStale
	ShareRefusedKeyExpiry = store.ShareRefusedKeyExpiry
)

var rateScript = newScript("rate.lua", true)

// InstallShare puts a rate share in force in its region's token bucket
// (key: RateKey), unless the share in force has an equal or greater Seq
// (ShareStale: nothing changes), so it may be retried freely and a late
// reply cannot bring back an older share while a newer one is in force. The level is kept, capped at the
// new burst, when the old share was still in force, and the bucket starts
// empty otherwise. Refusals are results, not errors.
func (b *Buckets) InstallShare(ctx context.Context, key string, in ShareInstall) (ShareResult, error) {
	s := in.Share
	switch {
	case key == "":
		return ShareResult{}, invalid("empty key")
	case !s.Valid():
		return ShareResult{}, invalid("share %+v", s)
	case in.ExpireAtMs < s.DeadlineMs || !checkInt(in.ExpireAtMs):
		return ShareResult{}, invalid("key expiry %d before deadline %d", in.ExpireAtMs, s.DeadlineMs)
	case in.NowMs < 0 || !checkInt(in.NowMs):
		return ShareResult{}, invalid("now %d", in.NowMs)
	}
	v, err := b.eval(ctx, rateScript, []string{key}, "install", in.NowMs, b.ttlArg,
		s.Seq, s.Rate, s.Burst, s.Unit, s.DeadlineMs, in.ExpireAtMs)
	if err != nil {
		return ShareResult{}, err
	}
	a, err := replyArray(v, 2)
	if err != nil {
		return ShareResult{}, err
	}
	var st, tokens int64
	if err := ints(a, &st, &tokens); err != nil {
		return ShareResult{}, err
	}
	if st != int64(ShareInstalled) && st != int64(ShareStale) && st != int64(ShareRefusedKeyExpiry) {
		return ShareResult{}, ErrBadReply
	}
	return ShareResult{Status: ShareStatus(st), Tokens: tokens}, nil
}

// Take spends cost tokens from a token bucket (key: RateKey) if it holds
// them at now, all or nothing, and counts the cost as admitted or denied.
// With no share in force (none yet, or past its deadline) it is denied. A
// denial is a result, not an error. In shadow mode (shadow: the limit is
// tried, not enforced) a take it cannot pay charges nothing and is counted
// in WouldDeny instead of Denied (Shadowed: the caller admits it).
func (b *Buckets) Take(ctx context.Context, key string, cost, nowMs int64, shadow bool) (TakeResult, error) {
	switch {
	case key == "":
		return TakeResult{}, invalid("empty key")
	case cost < 0 || !checkInt(cost):
		return TakeResult{}, invalid("cost %d", cost)
	case nowMs < 0 || !checkInt(nowMs):
		return TakeResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, rateScript, []string{key}, "take", nowMs, b.ttlArg, cost, boolArg(shadow))
	if err != nil {
		return TakeResult{}, err
	}
	return parseTake(v)
}

// boolArg is a script's 0/1 flag.
func boolArg(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// takeReply is the number of values in one take's reply.
const takeReply = 8

// parseTake parses {allowed (0, 1, or 2: a shadow share's would-be
// denial), tokens, wait, deadline, admitted, denied,
// would_deny, would_deny_checks}.
func parseTake(v any) (TakeResult, error) {
	a, err := replyArray(v, takeReply)
	if err != nil {
		return TakeResult{}, err
	}
	var r TakeResult
	allowed, err := asInt(a[0])
	if err != nil {
		return TakeResult{}, err
	}
	switch allowed {
	case 0:
	case 1:
		r.Allowed = true
	case 2:
		r.Shadowed = true
	default:
		return TakeResult{}, ErrBadReply
	}
	if err := ints(a[1:], &r.Tokens, &r.WaitMs, &r.DeadlineMs, &r.Admitted, &r.Denied, &r.WouldDeny, &r.WouldDenyChecks); err != nil {
		return TakeResult{}, err
	}
	if r.Tokens < 0 || r.WaitMs < -1 || r.WouldDeny < 0 || r.WouldDenyChecks < 0 {
		return TakeResult{}, ErrBadReply
	}
	return r, nil
}

// parseTakeCall parses one 'takes' reply: takeReply values per take of idx, in
// order, into res[idx[j]].Take (and Allowed).
func parseTakeCall(v any, idx []int, res []SpendResult) error {
	a, err := replyArray(v, takeReply*len(idx))
	if err != nil {
		return err
	}
	for j, i := range idx {
		t, err := parseTake(a[takeReply*j : takeReply*j+takeReply])
		if err != nil {
			return err
		}
		res[i] = SpendResult{Allowed: t.Allowed, Failed: -1, Take: t}
		if !t.Allowed {
			res[i].Failed = 0
		}
	}
	return nil
}
