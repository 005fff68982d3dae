package allocator

import (
	"context"
	"strings"
	"testing"
	"time"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// A limit's hash tag is stored, handed to agents by SyncLimits, shown in
// a change's diff, and cannot change on an existing limit (InvalidArgument
// naming limit.hash_tag, dry runs and applies alike, audited as invalid,
// nothing written): it names the limit's Redis keys. Deleting the limit
// and creating it again with another tag works; the id itself as the tag
// is the default and no change.
func TestHashTagSetOnceAndSynced(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	ctx := as(admin)

	l := simpleLimit("tenant/atlas/api", 100, time.Minute)
	l.HashTag = "atlas"
	put, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: l, Reason: "create"})
	if err != nil {
		t.Fatal(err)
	}
	if put.Limit.HashTag != "atlas" {
		t.Fatalf("stored hash tag %q", put.Limit.HashTag)
	}
	if ch := put.Effect.GetChanges(); !hasChange(ch, "hash_tag", "", "atlas") {
		t.Fatalf("create's diff %v lacks hash_tag", ch)
	}
	plain := simpleLimit("tenant/plain", 100, time.Minute)
	plain.HashTag = "tenant/plain" // the id: the default, stored empty
	if p, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: plain, Reason: "create"}); err != nil || p.Limit.HashTag != "" {
		t.Fatalf("a tag equal to the id: %v, %v", p.GetLimit().GetHashTag(), err)
	}
	waitLimit(t, a.Allocator, l.Id, 1)
	sync, err := srv.SyncLimits(context.Background(), &pb.SyncLimitsRequest{Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]string{}
	for _, x := range sync.Limits {
		tags[x.Id] = x.HashTag
	}
	if tags[l.Id] != "atlas" || tags[plain.Id] != "" {
		t.Fatalf("synced hash tags %v", tags)
	}

	// Changing it is refused, with and without dry run, for a limit that
	// had a tag and for one that had none; other changes go on.
	for _, tc := range []struct {
		id, tag string
		dry     bool
	}{{l.Id, "other", false}, {l.Id, "", true}, {plain.Id, "atlas", false}} {
		x := simpleLimit(tc.id, 200, time.Minute)
		x.HashTag = tc.tag
		_, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: x, Reason: "move", DryRun: tc.dry})
		wantInvalid(t, err, "limit.hash_tag")
		if !strings.Contains(err.Error(), "delete the limit and create it again") {
			t.Errorf("%s: %v does not say how to fix it", tc.id, err)
		}
	}
	_, err = srv.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "move", Changes: []*pb.LimitChange{
		{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/new", 5, time.Minute)}},
		{Change: &pb.LimitChange_Put{Put: simpleLimit(l.Id, 100, time.Minute)}, ExpectedVersion: 1}}})
	wantInvalid(t, err, "changes[1].put.hash_tag")
	if g, err := srv.GetLimit(ctx, &pb.GetLimitRequest{Id: l.Id}); err != nil || g.Limit.HashTag != "atlas" || g.Limit.Version != 1 {
		t.Fatalf("after refused changes: %v, %v", g, err)
	}
	if _, err := srv.GetLimit(ctx, &pb.GetLimitRequest{Id: "tenant/new"}); err == nil {
		t.Fatal("the refused apply wrote its other change")
	}
	var invalid int
	for _, e := range allAudit(t, a.Allocator) {
		if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_INVALID && strings.Contains(e.Error, "hash_tag") {
			invalid++
		}
	}
	if invalid != 4 {
		t.Fatalf("%d refusals audited, want 4", invalid)
	}
	same := simpleLimit(l.Id, 300, time.Minute)
	same.HashTag = "atlas"
	if _, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: same, Reason: "more", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatalf("a change keeping the tag: %v", err)
	}

	// Delete and create again: a new tag is a new limit's.
	if _, err := srv.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: l.Id, Reason: "move"}); err != nil {
		t.Fatal(err)
	}
	again := simpleLimit(l.Id, 100, time.Minute)
	again.HashTag = "other"
	if p, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: again, Reason: "re-create"}); err != nil || p.Limit.HashTag != "other" {
		t.Fatalf("re-created: %v, %v", p, err)
	}
}

func hasChange(ch []*pb.FieldChange, field, old, next string) bool {
	for _, c := range ch {
		if c.Field == field && c.Old == old && c.New == next {
			return true
		}
	}
	return false
}
