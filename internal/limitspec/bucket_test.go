package limitspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// TestValidateBucketNamesTheField: bad rates and bursts (R <= 0, B < 1, B
// above the maximum for the period, a bad period) and bucket fields on a
// window limit are refused with an error naming the field.
func TestValidateBucketNamesTheField(t *testing.T) {
	bucket := func(edit func(*pb.Limit)) *pb.Limit {
		l := &pb.Limit{Id: "tenant/a", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 100, BurstTokens: 200,
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT}
		edit(l)
		return l
	}
	window := func(edit func(*pb.Limit)) *pb.Limit {
		l := &pb.Limit{Id: "tenant/a", LimitTokens: 100, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT}
		edit(l)
		return l
	}
	for _, tc := range []struct {
		name, field, text string
		l                 *pb.Limit
	}{
		{"R = 0", "limit.rate_tokens", ">= 1", bucket(func(l *pb.Limit) { l.RateTokens = 0 })},
		{"R < 0", "limit.rate_tokens", ">= 1", bucket(func(l *pb.Limit) { l.RateTokens = -5 })},
		{"R too large", "limit.rate_tokens", "<=", bucket(func(l *pb.Limit) { l.RateTokens = lease.MaxBucketUnits })},
		{"B = 0", "limit.burst_tokens", ">= 1", bucket(func(l *pb.Limit) { l.BurstTokens = 0 })},
		{"B above the maximum", "limit.burst_tokens", "for a rate period of 1s", bucket(func(l *pb.Limit) { l.BurstTokens = lease.MaxBurst(time.Second) + 1 })},
		{"B above the maximum for 1h", "limit.burst_tokens", "for a rate period of 1h0m0s", bucket(func(l *pb.Limit) {
			l.RatePeriod, l.BurstTokens = durationpb.New(time.Hour), lease.MaxBurst(time.Hour)+1
		})},
		{"period below 1ms", "limit.rate_period", ">= 1ms", bucket(func(l *pb.Limit) { l.RatePeriod = durationpb.New(time.Microsecond) })},
		{"period above 24h", "limit.rate_period", "<= 24h", bucket(func(l *pb.Limit) { l.RatePeriod = durationpb.New(25 * time.Hour) })},
		{"period not whole ms", "limit.rate_period", "whole milliseconds", bucket(func(l *pb.Limit) { l.RatePeriod = durationpb.New(1500 * time.Microsecond) })},
		{"period invalid", "limit.rate_period", "", bucket(func(l *pb.Limit) { l.RatePeriod = &durationpb.Duration{Seconds: 1, Nanos: -1} })},
		{"limit_tokens on a bucket limit", "limit.limit_tokens", "not limit_tokens", bucket(func(l *pb.Limit) { l.LimitTokens = 5 })},
		{"window on a bucket limit", "limit.window", "not a window", bucket(func(l *pb.Limit) { l.Window = durationpb.New(time.Minute) })},
		{"phase on a bucket limit", "limit.window_phase", "window limits only", bucket(func(l *pb.Limit) { l.WindowPhase = durationpb.New(time.Second) })},
		{"calendar on a bucket limit", "limit.calendar", "not calendar windows", bucket(func(l *pb.Limit) {
			l.Calendar = &pb.CalendarWindows{Unit: "month", Zone: "UTC"}
		})},
		{"settle grace on a bucket", "limit.settle_grace", "window limits only", bucket(func(l *pb.Limit) { l.SettleGrace = durationpb.New(time.Second) })},
		{"debt policy on a bucket", "limit.debt_policy", "window limits only", bucket(func(l *pb.Limit) { l.DebtPolicy = pb.DebtPolicy_DEBT_POLICY_FORGIVE })},
		{"local fallback on a bucket", "limit.fallback[eu]", "closed only", bucket(func(l *pb.Limit) {
			l.Mode, l.Fallback = pb.Mode_MODE_BOUNDED, map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 5}}
		})},
		{"chunks on a bucket", "limit.lease.min_chunk", "rate shares", bucket(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{MinChunk: 1} })},
		{"standing share on a bucket", "limit.lease.standing", "window limit", bucket(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Standing: 1} })},
		{"share ttl too short", "limit.lease.ttl", "1s..10m0s", bucket(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(999 * time.Millisecond)} })},
		{"share ttl too long", "limit.lease.ttl", "1s..10m0s", bucket(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(11 * time.Minute)} })},
		{"unknown kind", "limit.kind", "window, bucket or concurrency", window(func(l *pb.Limit) { l.Kind = 99 })},
		{"rate on a window limit", "limit.rate_tokens", "only bucket", window(func(l *pb.Limit) { l.RateTokens = 5 })},
		{"period on a window limit", "limit.rate_period", "only bucket", window(func(l *pb.Limit) { l.RatePeriod = durationpb.New(time.Second) })},
		{"burst on a window limit", "limit.burst_tokens", "only bucket", window(func(l *pb.Limit) { l.BurstTokens = 5 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ValidateLimit(tc.l, []string{"eu"})
			var fe *vocab.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("got %v, want an error on %s saying %q", err, tc.field, tc.text)
			}
		})
	}
	// A valid bucket limit is accepted: the default share ttl filled in,
	// no chunks, closed fallbacks (bounded mode with them too).
	for _, l := range []*pb.Limit{bucket(func(*pb.Limit) {}), bucket(func(l *pb.Limit) {
		l.Mode, l.Fallback = pb.Mode_MODE_BOUNDED, map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}}
		l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(30 * time.Second)}
	})} {
		got, err := ValidateLimit(l, []string{"eu"})
		if err != nil {
			t.Fatalf("valid bucket limit: %v", err)
		}
		want := DefaultShareTTL
		if l.Lease != nil {
			want = l.Lease.Ttl.AsDuration()
		}
		if got.Lease.Ttl.AsDuration() != want || got.Lease.MinChunk != 0 || got.LimitTokens != 0 || got.Window != nil {
			t.Errorf("normalized bucket limit: %v", got)
		}
	}
	// The largest valid burst passes the field checks.
	l := bucket(func(l *pb.Limit) { l.BurstTokens = lease.MaxBurst(time.Second) })
	if err := ValidateBucket(l); err != nil {
		t.Fatalf("max burst: %v", err)
	}
	if _, err := ValidateLimit(window(func(l *pb.Limit) { l.Kind = pb.LimitKind_LIMIT_KIND_WINDOW }), []string{"eu"}); err != nil {
		t.Fatalf("kind window: %v", err)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]struct {
		n int64
		p time.Duration
	}{
		"100/s": {100, time.Second}, " 5 / 250ms ": {5, 250 * time.Millisecond}, "1/h": {1, time.Hour}, "60/m": {60, time.Minute},
		"7/ms": {7, time.Millisecond}, "1000/1m30s": {1000, 90 * time.Second}, "2/24h": {2, 24 * time.Hour},
	} {
		n, p, err := ParseRate(in)
		if err != nil || n != want.n || p != want.p {
			t.Errorf("ParseRate(%q) = %d, %v, %v; want %d, %v", in, n, p, err, want.n, want.p)
		}
		if n2, p2, err := ParseRate(FormatRate(n, p)); err != nil || n2 != n || p2 != p {
			t.Errorf("FormatRate(%d, %v) = %q does not parse back", n, p, FormatRate(n, p))
		}
	}
	for _, in := range []string{"", "100", "/s", "0/s", "-1/s", "x/s", "1/", "1/d", "1/0s", "1/500us", "1/25h", "1/1500us",
		"1/-1s", "9223372036854775807/s", "1/s/s"} {
		if _, _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}

// FuzzParseRate: ParseRate never panics, and what it accepts is a rate
// ValidateBucket accepts and FormatRate writes back.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100/s", "5/250ms", "1/h", "0/s", "1/1500us", "9999999999999/ms", "/", "1/1h0m0.001s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, p, err := ParseRate(s)
		if err != nil {
			return
		}
		l := &pb.Limit{RateTokens: n, RatePeriod: durationpb.New(p), BurstTokens: 1}
		if err := ValidateBucket(l); err != nil {
			t.Fatalf("ParseRate(%q) = %d, %v, which ValidateBucket refuses: %v", s, n, p, err)
		}
		if n2, p2, err := ParseRate(FormatRate(n, p)); err != nil || n2 != n || p2 != p {
			t.Fatalf("FormatRate(%d, %v) = %q parses as %d, %v, %v", n, p, FormatRate(n, p), n2, p2, err)
		}
	})
}

// TestValidateShadowBucket: a bucket limit may be in shadow mode (tried on
// real traffic, not enforced).
func TestValidateShadowBucket(t *testing.T) {
	l := &pb.Limit{Id: "tenant/a", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 100, BurstTokens: 200,
		Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, Shadow: true}
	v, err := ValidateLimit(l, []string{"eu"})
	if err != nil || !v.GetShadow() {
		t.Fatalf("a shadow bucket limit: %v (shadow %v)", err, v.GetShadow())
	}
}
