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
		{"limit.kind", func(l *pb.Limit) { l.Kind = pb.LimitKind_LIMIT_KIND_BUCKET }},
		{"limit.plan", func(l *pb.Limit) { l.Plan = "plans/pro" }},
		{"limit.contracts[other/a]", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"other/a": {LimitTokens: 5}} }},
		{"limit.contracts[tenant/a].limit_tokens", func(l *pb.Limit) { l.Contracts = map[string]*pb.Contract{"tenant/a": {}} }},
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
