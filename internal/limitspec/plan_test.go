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

// TestValidateContractFields: a contract replacing every field a deal
// changes is accepted and stored normalized (regions sorted; a window of
// its own without lease settings gets the ttl default of its window).
func TestValidateContractFields(t *testing.T) {
	yes := true
	l := &pb.Limit{Id: "plans/pro", LimitTokens: 1000, Window: durationpb.New(time.Hour), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Binds: []string{"tenant/{id}"}, Contracts: map[string]*pb.Contract{
			"tenant/atlas": {LimitTokens: 3000, Mode: pb.Mode_MODE_BOUNDED, Regions: []string{"us", "eu"},
				Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 50}},
				Shadow:   &yes, Window: durationpb.New(time.Minute)},
			"tenant/lease": {Lease: &pb.LeaseSettings{MinChunk: 3}},
		}}
	v, err := ValidateLimit(l, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	a := v.Contracts["tenant/atlas"]
	if a.Regions[0] != "eu" || a.GetLease().GetTtl().AsDuration() != 15*time.Second || a.GetLease().GetMinChunk() != 1 {
		t.Fatalf("atlas's contract as stored: %v", a)
	}
	if v.Lease.Ttl.AsDuration() != 15*time.Minute {
		t.Fatalf("the plan's ttl: %v", v.Lease.Ttl.AsDuration())
	}
	if c := v.Contracts["tenant/lease"]; c.Lease.Ttl.AsDuration() != 15*time.Minute || c.Lease.MinChunk != 3 || c.Window != nil {
		t.Fatalf("a lease contract as stored: %v", c)
	}
}

func TestValidatePlan(t *testing.T) {
	plan := func() *pb.Limit {
		return &pb.Limit{Id: "plans/pro", LimitTokens: 1000, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, Binds: []string{"tenant/{id}"}}
	}
	if _, err := ValidateLimit(plan(), []string{"eu"}); err != nil {
		t.Fatalf("a valid plan: %v", err)
	}
	contract := plan()
	contract.Contracts = map[string]*pb.Contract{"tenant/atlas": {LimitTokens: 3000}}
	if _, err := ValidateLimit(contract, []string{"eu"}); err != nil {
		t.Fatalf("a plan with a contract: %v", err)
	}
	tagged := plan()
	tagged.HashTag = "{id}"
	if v, err := ValidateLimit(tagged, []string{"eu"}); err != nil || v.HashTag != "{id}" {
		t.Fatalf("a plan tagged {id}: %v %v", v, err)
	}
	mapping := plan()
	mapping.Binds = []string{"tenant/{id}", "team/bigco", "tenant/eu/acme"}
	if _, err := ValidateLimit(mapping, []string{"eu"}); err != nil {
		t.Fatalf("a plan with a tenant mapping: %v", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*pb.Limit)
	}{
		{"limit.binds[0]", func(l *pb.Limit) { l.Binds = []string{"tenant/"} }},
		{"limit.binds[1]", func(l *pb.Limit) { l.Binds = []string{"tenant/a", "tenant/a"} }},
		{"limit.binds[0]", func(l *pb.Limit) { l.Binds = []string{"tenant/{id}x"} }},
		{"limit.binds[1]", func(l *pb.Limit) { l.Binds = []string{"tenant/{id}", "tenant/{id}"} }},
		{"limit.binds[0]", func(l *pb.Limit) { l.Binds = []string{"plans/{id}"} }},
		{"limit.binds", func(l *pb.Limit) { l.Binds = make([]string, 1001) }},
		{"limit.binds", func(l *pb.Limit) { l.Id = "tenant/a" }},
		{"limit.id", func(l *pb.Limit) { l.Id = "plans/a/b" }},
		{"limit.hash_tag", func(l *pb.Limit) { l.HashTag = "x" }},
		{"limit.plan", func(l *pb.Limit) { l.Plan = "plans/pro" }},
		{"limit.contracts[other/a]", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"other/a": {LimitTokens: 5}} }},
		{"limit.contracts[tenant/a]", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {}} }},
		{"limit.contracts[tenant/a].limit_tokens", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {LimitTokens: -1}} }},
		{"limit.contracts[tenant/a].rate_tokens", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {RateTokens: 10}} }},
		{"limit.contracts[tenant/a].burst_tokens", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {BurstTokens: 10}} }},
		// Each field a contract replaces is checked with the tenant's
		// resolved limit, as a limit's.
		{"limit.contracts[tenant/a].mode", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {Mode: 7}} }},
		{"limit.contracts[tenant/a].regions[0]", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Regions: []string{"mars"}}}
		}},
		{"limit.contracts[tenant/a].fallback[eu]", func(l *pb.Limit) { // strict takes closed fallbacks only
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}}}}
		}},
		{"limit.contracts[tenant/a].fallback[us]", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Mode: pb.Mode_MODE_BOUNDED,
				Fallback: map[string]*pb.Fallback{"us": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}}}}
		}},
		{"limit.contracts[tenant/a].window", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Window: durationpb.New(time.Millisecond)}}
		}},
		{"limit.contracts[tenant/a].window_phase", func(l *pb.Limit) {
			l.WindowPhase = durationpb.New(30 * time.Second)
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Window: durationpb.New(10 * time.Second)}}
		}},
		{"limit.contracts[tenant/a].lease.ttl", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Lease: &pb.LeaseSettings{Ttl: durationpb.New(time.Hour)}}}
		}},
		{"limit.contracts[tenant/a].lease.ttl", func(l *pb.Limit) { // the plan's explicit ttl, longer than the tenant's window
			l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(30 * time.Second)}
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Window: durationpb.New(10 * time.Second)}}
		}},
		{"limit.contracts[tenant/a].lease.min_chunk", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {LimitTokens: 5, Lease: &pb.LeaseSettings{MinChunk: 6}}}
		}},
		{"limit.contracts[tenant/a].regions", func(l *pb.Limit) {
			l.Contracts = map[string]*pb.Contract{"tenant/a": {Regions: make([]string, 65)}}
		}},
		{"limit.contracts[tenant/a].limit_tokens", func(l *pb.Limit) {
			l.Lease = &pb.LeaseSettings{MinChunk: 10}
			l.Contracts = map[string]*pb.Contract{"tenant/a": {LimitTokens: 5}}
		}},
		{"limit.contracts", func(l *pb.Limit) {
			l.Id, l.Binds, l.Contracts = "tenant/a", nil, map[string]*pb.Contract{"tenant/a": {LimitTokens: 5}}
		}},
		{"limit.plan", func(l *pb.Limit) { l.Id, l.Binds, l.Plan = "tenant/a", nil, "plans/pro" }},
		{"limit.binds[0]", func(l *pb.Limit) { l.Binds = []string{strings.Repeat("x", 201)} }},
	} {
		l := plan()
		tc.edit(l)
		_, err := ValidateLimit(l, []string{"eu"})
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
}

// TestValidateBucketPlan: a plan of kind bucket is a bucket limit for
// its tenants: accepted with its rate, burst and share ttl; a contract
// replaces only what a bucket limit has (regions, mode, closed
// fallbacks, the share ttl), and anything else is refused naming the
// contract's field, as the tenant's limit would be.
func TestValidateBucketPlan(t *testing.T) {
	plan := func() *pb.Limit {
		return &pb.Limit{Id: "plans/free", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 10, BurstTokens: 50,
			RatePeriod: durationpb.New(time.Second), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
			Binds: []string{"tenant/{id}"}}
	}
	v, err := ValidateLimit(plan(), []string{"eu", "us"})
	if err != nil {
		t.Fatalf("a bucket plan: %v", err)
	}
	if v.GetLease().GetTtl().AsDuration() != DefaultShareTTL {
		t.Fatalf("the plan's share ttl: %v", v.GetLease().GetTtl())
	}
	ok := plan()
	ok.Contracts = map[string]*pb.Contract{
		"tenant/atlas": {RateTokens: 100, BurstTokens: 300},
		"tenant/euco":  {Regions: []string{"eu"}},
		"tenant/ttl":   {Lease: &pb.LeaseSettings{Ttl: durationpb.New(30 * time.Second)}},
		"tenant/loose": {Mode: pb.Mode_MODE_BOUNDED},
		"tenant/try":   {Shadow: new(true)},
	}
	if _, err := ValidateLimit(ok, []string{"eu", "us"}); err != nil {
		t.Fatalf("a bucket plan's contracts of regions, lease ttl, mode and shadow: %v", err)
	}
	for _, tc := range []struct {
		field string
		c     *pb.Contract
	}{
		{"limit.contracts[tenant/a].limit_tokens", &pb.Contract{LimitTokens: 5}},
		{"limit.contracts[tenant/a].rate_tokens", &pb.Contract{RateTokens: -5}},
		{"limit.contracts[tenant/a].burst_tokens", &pb.Contract{BurstTokens: 1 << 60}},
		{"limit.contracts[tenant/a].burst_tokens", &pb.Contract{RateTokens: 5, BurstTokens: 1 << 45}}, // above lease.MaxBurst for 1s
		{"limit.contracts[tenant/a].window", &pb.Contract{Window: durationpb.New(time.Minute)}},
		{"limit.contracts[tenant/a].lease.ttl", &pb.Contract{Lease: &pb.LeaseSettings{Ttl: durationpb.New(time.Hour)}}},
		{"limit.contracts[tenant/a].lease.min_chunk", &pb.Contract{Lease: &pb.LeaseSettings{MinChunk: 2}}},
		{"limit.contracts[tenant/a].fallback[eu]", &pb.Contract{Mode: pb.Mode_MODE_BOUNDED,
			Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 5}}}},
	} {
		l := plan()
		l.Contracts = map[string]*pb.Contract{"tenant/a": tc.c}
		_, err := ValidateLimit(l, []string{"eu", "us"})
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("contract %v: want an error naming %s, got %v", tc.c, tc.field, err)
		}
	}
}

// TestValidateConcurrencyPlan: a plan of kind concurrency is a
// concurrency limit for its tenants; a contract's limit_tokens is the
// tenant's own N; what a concurrency limit has not is refused naming the
// contract's field.
func TestValidateConcurrencyPlan(t *testing.T) {
	plan := func() *pb.Limit {
		return &pb.Limit{Id: "plans/jobs", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3,
			Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Binds: []string{"jobs/{id}"}}
	}
	ok := plan()
	ok.Contracts = map[string]*pb.Contract{"jobs/big": {LimitTokens: 20}, "jobs/eu": {Regions: []string{"eu"}}}
	if _, err := ValidateLimit(ok, []string{"eu", "us"}); err != nil {
		t.Fatalf("a concurrency plan with contracts of N and regions: %v", err)
	}
	for _, tc := range []struct {
		field string
		c     *pb.Contract
	}{
		{"limit.contracts[jobs/a].window", &pb.Contract{Window: durationpb.New(time.Minute)}},
		{"limit.contracts[jobs/a].shadow", &pb.Contract{Shadow: new(true)}},
		{"limit.contracts[jobs/a].lease.min_chunk", &pb.Contract{Lease: &pb.LeaseSettings{MinChunk: 2}}},
		{"limit.contracts[jobs/a].limit_tokens", &pb.Contract{LimitTokens: -1}},
		{"limit.contracts[jobs/a].rate_tokens", &pb.Contract{RateTokens: 5}},
		{"limit.contracts[jobs/a].burst_tokens", &pb.Contract{BurstTokens: 5}},
	} {
		l := plan()
		l.Contracts = map[string]*pb.Contract{"jobs/a": tc.c}
		_, err := ValidateLimit(l, []string{"eu", "us"})
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("contract %v: want an error naming %s, got %v", tc.c, tc.field, err)
		}
	}
}
