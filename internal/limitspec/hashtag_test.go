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

func TestValidateLimitHashTag(t *testing.T) {
	valid := func(tag string) *pb.Limit {
		return &pb.Limit{Id: "tenant/atlas/api", LimitTokens: 100, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, HashTag: tag}
	}
	for _, tc := range []struct {
		tag, stored string
		ok          bool
	}{
		{"", "", true},
		{"atlas", "atlas", true},
		{"tenant/atlas", "tenant/atlas", true},
		{"tenant/atlas/api", "", true}, // the id itself: the default, stored empty
		{"{atlas}", "", false},
		{"a:b", "", false},
		{strings.Repeat("a", vocab.MaxHashTagLen+1), "", false},
	} {
		got, err := ValidateLimit(valid(tc.tag), []string{"eu"})
		if !tc.ok {
			var fe *vocab.FieldError
			if !errors.As(err, &fe) || fe.Field != "limit.hash_tag" {
				t.Errorf("%q: %v, want a FieldError naming limit.hash_tag", tc.tag, err)
			}
			continue
		}
		if err != nil || got.HashTag != tc.stored {
			t.Errorf("%q: %v, %v; want stored %q", tc.tag, got.GetHashTag(), err, tc.stored)
		}
	}
}
