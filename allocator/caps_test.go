package allocator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/limitspec"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// sizeCapCases are one call per length cap of what the Admin API stores
// or logs, each one byte (or one item) over its cap, with the field the
// refusal must name.
func sizeCapCases() []struct {
	field string
	call  func(ctx context.Context, s *Server) error
} {
	over := func(n int) string { return strings.Repeat("x", n+1) }
	put := func(edit func(l *pb.Limit)) func(ctx context.Context, s *Server) error {
		return func(ctx context.Context, s *Server) error {
			l := validLimit()
			edit(l)
			_, err := s.PutLimit(ctx, &pb.PutLimitRequest{Reason: "caps", Limit: l})
			return err
		}
	}
	tags := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	regions := func(n int) []string {
		var rs []string
		for i := range n {
			rs = append(rs, fmt.Sprintf("r%d", i))
		}
		return rs
	}
	return []struct {
		field string
		call  func(ctx context.Context, s *Server) error
	}{
		{"reason", func(ctx context.Context, s *Server) error {
			_, err := s.PutLimit(ctx, &pb.PutLimitRequest{Reason: over(maxReasonLen), Limit: validLimit()})
			return err
		}},
		{"reason", func(ctx context.Context, s *Server) error {
			_, err := s.DeleteLimit(ctx, &pb.DeleteLimitRequest{Reason: over(maxReasonLen), Id: "tenant/atlas"})
			return err
		}},
		{"reason", func(ctx context.Context, s *Server) error {
			_, err := s.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: over(maxReasonLen),
				Changes: []*pb.LimitChange{{Change: &pb.LimitChange_Put{Put: validLimit()}}}})
			return err
		}},
		{"id", func(ctx context.Context, s *Server) error {
			_, err := s.DeleteLimit(ctx, &pb.DeleteLimitRequest{Reason: "caps", Id: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"changes", func(ctx context.Context, s *Server) error {
			var cs []*pb.LimitChange
			for i := range limitspec.MaxApplyChanges + 1 {
				l := validLimit()
				l.Id = fmt.Sprintf("tenant/c%d", i)
				cs = append(cs, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: l}})
			}
			_, err := s.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "caps", Changes: cs})
			return err
		}},
		{"changes[1].put.description", func(ctx context.Context, s *Server) error {
			l := validLimit()
			l.Id, l.Description = "tenant/d", over(limitspec.MaxDescriptionLen)
			_, err := s.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "caps", Changes: []*pb.LimitChange{
				{Change: &pb.LimitChange_Put{Put: validLimit()}}, {Change: &pb.LimitChange_Put{Put: l}}}})
			return err
		}},
		{"changes[0].delete", func(ctx context.Context, s *Server) error {
			_, err := s.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "caps", Changes: []*pb.LimitChange{
				{Change: &pb.LimitChange_Delete{Delete: over(vocab.MaxLimitIDLen)}}}})
			return err
		}},
		{"limit.id", put(func(l *pb.Limit) { l.Id = over(vocab.MaxLimitIDLen) })},
		{"limit.owner", put(func(l *pb.Limit) { l.Owner = over(limitspec.MaxOwnerLen) })},
		{"limit.description", put(func(l *pb.Limit) { l.Description = over(limitspec.MaxDescriptionLen) })},
		{"limit.tags", put(func(l *pb.Limit) { l.Tags = tags(limitspec.MaxTags + 1) })},
		{"limit.tags", put(func(l *pb.Limit) { l.Tags = map[string]string{over(limitspec.MaxTagLen): "v"} })},
		{"limit.tags[k]", put(func(l *pb.Limit) { l.Tags = map[string]string{"k": over(limitspec.MaxTagLen)} })},
		{"limit.regions", put(func(l *pb.Limit) { l.Regions = regions(limitspec.MaxRegions + 1) })},
		{"limit.regions[1]", put(func(l *pb.Limit) { l.Regions = []string{"eu", over(vocab.MaxRegionLen)} })},
		{"limit.fallback", put(func(l *pb.Limit) {
			for _, r := range regions(limitspec.MaxRegions + 1) {
				l.Fallback[r] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}
			}
		})},
		{"limit.fallback", put(func(l *pb.Limit) {
			l.Fallback[over(vocab.MaxRegionLen)] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}
		})},
		{"id", func(ctx context.Context, s *Server) error {
			_, err := s.GetLimit(ctx, &pb.GetLimitRequest{Id: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"prefix", func(ctx context.Context, s *Server) error {
			_, err := s.ListLimits(ctx, &pb.ListLimitsRequest{Prefix: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"page_token", func(ctx context.Context, s *Server) error {
			_, err := s.ListLimits(ctx, &pb.ListLimitsRequest{PageToken: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"limit_id", func(ctx context.Context, s *Server) error {
			_, err := s.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"id", func(ctx context.Context, s *Server) error {
			_, err := s.LimitHistory(ctx, &pb.LimitHistoryRequest{Id: over(vocab.MaxLimitIDLen)})
			return err
		}},
		{"limit_prefix", func(ctx context.Context, s *Server) error {
			_, err := s.ListAudit(ctx, &pb.ListAuditRequest{LimitPrefix: over(vocab.MaxLimitIDLen)})
			return err
		}},
	}
}

// TestEachSizeCapIsCheckedFirst: every length cap of the Admin API is hit
// once, by an admin (who may do everything) and by a viewer (who may write
// nothing and read no audit log): both get InvalidArgument naming the
// field, because sizes are checked before anything is authorized, written
// or audited; the refused writes are audited with their strings capped.
func TestEachSizeCapIsCheckedFirst(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a", WithRefusalAudit(1000, 1000, time.Second, time.Minute)) // record every refusal
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	for _, p := range []*struct {
		name string
		ctx  context.Context
	}{{"admin", as(admin)}, {"viewer", as(viewer)}} {
		for i, tc := range sizeCapCases() {
			err := tc.call(p.ctx, srv)
			if err == nil {
				t.Errorf("%s, case %d (%s): accepted", p.name, i, tc.field)
				continue
			}
			t.Run(fmt.Sprintf("%s/%d/%s", p.name, i, tc.field), func(t *testing.T) { wantInvalid(t, err, tc.field) })
		}
	}
	events := allAudit(t, a.Allocator)
	if len(events) == 0 {
		t.Fatal("no refused write was audited")
	}
	for _, e := range events {
		if size := proto.Size(e); size > 4<<10 {
			t.Errorf("audit event %s of %d bytes (reason %d, limit id %d): not capped", e.Action, size, len(e.Reason), len(e.LimitId))
		}
	}
}
