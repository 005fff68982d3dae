package limitspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// TestValidateConcurrency: a concurrency limit is N slots (limit_tokens)
// with regions, a mode and closed or local fallbacks; its share ttl defaults to
// 10 s. What the agent does not apply to slots is refused naming the
// field.
func TestValidateConcurrency(t *testing.T) {
	conc := func(edit func(*pb.Limit)) *pb.Limit {
		l := &pb.Limit{Id: "tenant/a", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3,
			Regions: []string{"us", "eu"}, Mode: pb.Mode_MODE_STRICT}
		edit(l)
		return l
	}
	got, err := ValidateLimit(conc(func(*pb.Limit) {}), []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	if got.LimitTokens != 3 || got.Lease.GetTtl().AsDuration() != DefaultShareTTL || got.Window != nil {
		t.Fatalf("got %v, want N 3, ttl %v, no window", got, DefaultShareTTL)
	}
	if _, err := ValidateLimit(conc(func(l *pb.Limit) {
		l.Mode, l.Fallback = pb.Mode_MODE_BOUNDED, map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED},
			"us": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 2}} // local:A: at most A slots while cut off
		l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(2 * time.Second)}
		l.HashTag = "atlas"
	}), []string{"eu", "us"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, field, text string
		l                 *pb.Limit
	}{
		{"N = 0", "limit.limit_tokens", "", conc(func(l *pb.Limit) { l.LimitTokens = 0 })},
		{"N < 0", "limit.limit_tokens", "", conc(func(l *pb.Limit) { l.LimitTokens = -1 })},
		{"window", "limit.window", "no window", conc(func(l *pb.Limit) { l.Window = durationpb.New(time.Minute) })},
		{"window phase", "limit.window_phase", "no windows to shift", conc(func(l *pb.Limit) { l.WindowPhase = durationpb.New(time.Second) })},
		{"rate", "limit.rate_tokens", "only bucket", conc(func(l *pb.Limit) { l.RateTokens = 5 })},
		{"burst", "limit.burst_tokens", "only bucket", conc(func(l *pb.Limit) { l.BurstTokens = 5 })},
		{"shadow", "limit.shadow", "held state, not a count", conc(func(l *pb.Limit) { l.Shadow = true })},
		{"settle grace", "limit.settle_grace", "window limits only", conc(func(l *pb.Limit) { l.SettleGrace = durationpb.New(time.Second) })},
		{"debt policy", "limit.debt_policy", "window limits only", conc(func(l *pb.Limit) { l.DebtPolicy = pb.DebtPolicy_DEBT_POLICY_CARRY })},
		{"local fallback in strict mode", "limit.fallback[eu]", "use mode bounded", conc(func(l *pb.Limit) {
			l.Mode, l.Fallback = pb.Mode_MODE_STRICT, map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 1}}
		})},
		{"open fallback", "limit.fallback[us]", "not open", conc(func(l *pb.Limit) {
			l.Mode, l.Fallback = pb.Mode_MODE_BOUNDED, map[string]*pb.Fallback{"us": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}}
		})},
		{"min chunk", "limit.lease.min_chunk", "concurrency limits are granted as slot shares", conc(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{MinChunk: 1} })},
		{"max chunk", "limit.lease.max_chunk", "concurrency limits are granted as slot shares", conc(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{MaxChunk: 1} })},
		{"ttl too short", "limit.lease.ttl", "concurrency limit's share ttl", conc(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(time.Millisecond)} })},
		{"ttl too long", "limit.lease.ttl", "1s..10m0s", conc(func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(time.Hour)} })},
		{"no regions", "limit.regions", "", conc(func(l *pb.Limit) { l.Regions = nil })},
		{"no mode", "limit.mode", "", conc(func(l *pb.Limit) { l.Mode = 0 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ValidateLimit(tc.l, []string{"eu", "us"})
			var fe *vocab.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("got %v, want an error on %s saying %q", err, tc.field, tc.text)
			}
		})
	}
}
