package limitspec

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Bounds on a bucket limit's rate.
const (
	// DefaultRatePeriod is the rate period of a bucket limit that names
	// none: R tokens per second.
	DefaultRatePeriod = time.Second
	// MinRatePeriod and MaxRatePeriod bound the period R is counted per.
	// The regional buckets count in units of 1/(1000 x period in ms) of a
	// token (lease.BucketUnit), so the longer the period, the smaller the
	// largest burst (lease.MaxBurst): 52,125 tokens for 24 hours.
	MinRatePeriod = time.Millisecond
	MaxRatePeriod = 24 * time.Hour
)

// checkKindFields refuses the bucket fields on a limit of another kind.
func checkKindFields(l *pb.Limit) error {
	switch {
	case l.RateTokens != 0:
		return fieldErr("limit.rate_tokens", "only bucket limits have a rate (kind bucket)")
	case l.RatePeriod != nil:
		return fieldErr("limit.rate_period", "only bucket limits have a rate period (kind bucket)")
	case l.BurstTokens != 0:
		return fieldErr("limit.burst_tokens", "only bucket limits have a burst (kind bucket)")
	}
	return nil
}

// ValidateBucket checks the rate and burst of a bucket limit (R tokens per
// rate_period, burst B) and fills in the default period. The error is a
// *vocab.FieldError naming the field: R <= 0, a period outside [1ms, 24h]
// or not whole milliseconds, B < 1, or B above the maximum for the period.
func ValidateBucket(l *pb.Limit) error {
	if l.RateTokens <= 0 {
		return fieldErr("limit.rate_tokens", "must be >= 1 token per period, got %d", l.RateTokens)
	}
	p := DefaultRatePeriod
	if l.RatePeriod != nil {
		if err := l.RatePeriod.CheckValid(); err != nil {
			return fieldErr("limit.rate_period", "%v", err)
		}
		p = l.RatePeriod.AsDuration()
	}
	switch {
	case p < MinRatePeriod:
		return fieldErr("limit.rate_period", "must be >= %v, got %v", MinRatePeriod, p)
	case p > MaxRatePeriod:
		return fieldErr("limit.rate_period", "must be <= %v, got %v", MaxRatePeriod, p)
	case p%time.Millisecond != 0:
		return fieldErr("limit.rate_period", "must be whole milliseconds, got %v", p)
	}
	// Shares are in thousandths of a token per period: the whole rate in
	// those units must fit the buckets' exact range too.
	if l.RateTokens > lease.MaxBucketUnits/lease.MilliTokens {
		return fieldErr("limit.rate_tokens", "must be <= %d per period, got %d", lease.MaxBucketUnits/lease.MilliTokens, l.RateTokens)
	}
	if l.BurstTokens < 1 {
		return fieldErr("limit.burst_tokens", "must be >= 1, got %d", l.BurstTokens)
	}
	if m := lease.MaxBurst(p); l.BurstTokens > m {
		return fieldErr("limit.burst_tokens", "must be <= %d for a rate period of %v, got %d", m, p, l.BurstTokens)
	}
	return nil
}

// checkKind validates what the limit's kind requires: a window limit
// has no bucket fields, a bucket limit a valid rate and burst.
func checkKind(l *pb.Limit) error {
	switch l.Kind {
	case pb.LimitKind_LIMIT_KIND_UNSPECIFIED, pb.LimitKind_LIMIT_KIND_WINDOW:
		return checkKindFields(l)
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		return ValidateBucket(l)
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		return checkKindFields(l)
	}
	return fieldErr("limit.kind", "must be window, bucket or concurrency, got %v", l.Kind)
}

// Bounds on a bucket limit's share ttl (limit.lease.ttl): how long a rate
// share lives. Agents renew a share at half its life, so the ttl sets the
// allocator calls per region (two per ttl per active limit) and how long
// a silent region's rate stays reserved.
const (
	DefaultShareTTL = 10 * time.Second
	MinShareTTL     = time.Second
	MaxShareTTL     = 10 * time.Minute
)

// checkBucketOnly refuses a window limit's fields, and the settings the
// agent does not apply to a bucket limit in this version, on a bucket
// limit: accepted, they would promise something nobody enforces.
func checkBucketOnly(l *pb.Limit) error {
	switch {
	case l.LimitTokens != 0:
		return fieldErr("limit.limit_tokens", "bucket limits have a rate and a burst (rate_tokens, burst_tokens), not limit_tokens")
	case l.Window != nil:
		return fieldErr("limit.window", "bucket limits have a rate period (rate_period), not a window")
	case l.Calendar != nil:
		return fieldErr("limit.calendar", "bucket limits have a rate period (rate_period), not calendar windows")
	case l.WindowPhase != nil:
		return fieldErr("limit.window_phase", "bucket limits have no windows to shift (window limits only)")
	case l.SettleGrace != nil:
		return fieldErr("limit.settle_grace", "settle-later Checks are for window limits only in this version")
	case l.DebtPolicy != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED:
		return fieldErr("limit.debt_policy", "settle-later Checks are for window limits only in this version")
	}
	return nil
}

// kindWord names a limit's kind as limits files write it.
func kindWord(l *pb.Limit) string {
	switch l.Kind {
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		return "bucket"
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		return "concurrency"
	}
	return "window"
}

// grantedAs says how a windowless limit is granted.
func grantedAs(l *pb.Limit) string {
	if l.Kind == pb.LimitKind_LIMIT_KIND_CONCURRENCY {
		return "concurrency limits are granted as slot shares"
	}
	return "bucket limits are granted as rate shares"
}

// checkShareSettings checks a bucket or concurrency limit's lease settings (its share
// ttl; no chunks) and fills in the default ttl.
func checkShareSettings(l *pb.Limit) error {
	switch {
	case l.Lease.MinChunk != 0:
		return fieldErr("limit.lease.min_chunk", "%s, not chunks", grantedAs(l))
	case l.Lease.MaxChunk != 0:
		return fieldErr("limit.lease.max_chunk", "%s, not chunks", grantedAs(l))
	case l.Lease.Standing != 0:
		return fieldErr("limit.lease.standing", "%s: standing shares are shares of a window limit's windows", grantedAs(l))
	}
	ttl := DefaultShareTTL
	if l.Lease.Ttl != nil {
		if err := l.Lease.Ttl.CheckValid(); err != nil {
			return fieldErr("limit.lease.ttl", "%v", err)
		}
		ttl = l.Lease.Ttl.AsDuration()
		if ttl < MinShareTTL || ttl > MaxShareTTL || ttl%time.Millisecond != 0 {
			return fieldErr("limit.lease.ttl", "a "+kindWord(l)+" limit's share ttl must be whole milliseconds in %v..%v, got %v", MinShareTTL, MaxShareTTL, ttl)
		}
	}
	l.Lease.Ttl = durationpb.New(ttl)
	return nil
}

// ParseRate parses a bucket limit's rate as people write it: "N/UNIT" with
// UNIT one of ms, s, m, h (per one of them: "100/s") or a Go duration
// ("5/250ms", "1000/1m30s"). N is a whole number of tokens >= 1 and the
// period is checked as ValidateBucket checks rate_period. The error says
// what is wrong with the text; the caller names its flag or field.
func ParseRate(s string) (tokens int64, period time.Duration, err error) {
	n, p, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, fmt.Errorf("want N/PERIOD (e.g. 100/s, 5/250ms), got %q", s)
	}
	tokens, err = strconv.ParseInt(strings.TrimSpace(n), 10, 64)
	if err != nil || tokens < 1 {
		return 0, 0, fmt.Errorf("want a whole number of tokens >= 1 before the /, got %q", n)
	}
	switch p = strings.TrimSpace(p); p {
	case "ms", "s", "m", "h":
		p = "1" + p
	}
	period, err = time.ParseDuration(p)
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("want a period after the / (s, m, h, ms or a duration such as 250ms), got %q", p)
	case period < MinRatePeriod || period > MaxRatePeriod:
		return 0, 0, fmt.Errorf("the period must be %v to %v, got %v", MinRatePeriod, MaxRatePeriod, period)
	case period%time.Millisecond != 0:
		return 0, 0, fmt.Errorf("the period must be whole milliseconds, got %v", period)
	case tokens > lease.MaxBucketUnits/lease.MilliTokens:
		return 0, 0, fmt.Errorf("at most %d tokens per period, got %d", lease.MaxBucketUnits/lease.MilliTokens, tokens)
	}
	return tokens, period, nil
}

// FormatRate writes a rate as ParseRate reads it: "100/s", "5/250ms".
func FormatRate(tokens int64, period time.Duration) string {
	unit := period.String()
	switch period {
	case time.Millisecond:
		unit = "ms"
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "m"
	case time.Hour:
		unit = "h"
	}
	return strconv.FormatInt(tokens, 10) + "/" + unit
}
