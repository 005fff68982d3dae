package allocator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// History and audit are in etcd: after the leader stops, the new leader
// (and any replica) answers the same history and log, and changes go on
// from there.
func TestHistoryAndAuditSurviveFailover(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "b")
	sa := NewServer(a.Allocator)
	for i, g := range []int64{10, 20, 30} {
		l := simpleLimit("tenant/h", g, time.Minute)
		if _, err := sa.PutLimit(as(editor), &pb.PutLimitRequest{Limit: l, Reason: fmt.Sprintf("step %d", i), Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := sa.DeleteLimit(as(viewer), &pb.DeleteLimitRequest{Id: "tenant/h", Reason: "not mine"})
	wantCode(t, err, codes.PermissionDenied, "viewer delete")
	before := allAudit(t, a.Allocator)
	hist := history(t, a.Allocator, "tenant/h")
	if len(before) != 4 || len(hist) != 3 {
		t.Fatalf("before failover: %d audit events, %d history entries", len(before), len(hist))
	}
	a.Stop()
	allocatortest.WaitLeader(t, b)
	sb := NewServer(b.Allocator)
	la, err := sb.ListAudit(as(admin), &pb.ListAuditRequest{})
	if err != nil || len(la.Events) != len(before) {
		t.Fatalf("audit after failover: %v %v", la, err)
	}
	for i := range before {
		if !proto.Equal(before[i], la.Events[i]) {
			t.Fatalf("audit event %d changed over failover: %v vs %v", i, before[i], la.Events[i])
		}
	}
	lh, err := sb.LimitHistory(as(viewer), &pb.LimitHistoryRequest{Id: "tenant/h"})
	if err != nil || len(lh.Events) != 3 || lh.Events[2].Reason != "step 2" || lh.Events[2].New.GetLimitTokens() != 30 ||
		lh.Events[2].Old.GetLimitTokens() != 20 || lh.Events[0].Old != nil || lh.Events[0].Principal != "eddie" {
		t.Fatalf("history after failover: %v %v", lh, err)
	}
	// The new leader goes on: version 4 after 3.
	l := simpleLimit("tenant/h", 40, time.Minute)
	three := int64(3)
	put, err := sb.PutLimit(as(admin), &pb.PutLimitRequest{Limit: l, Reason: "after failover", ExpectedVersion: &three})
	if err != nil || put.Limit.Version != 4 {
		t.Fatalf("change after failover: %v %v", put, err)
	}
	if h := history(t, b.Allocator, "tenant/h"); len(h) != 4 || h[3].Id <= h[2].Id {
		t.Fatalf("history after a change on the new leader: %v", h)
	}
}

// ListAudit pages through the log oldest first, from a time, filtered by
// limit prefix; LimitHistory pages too.
func TestListAuditSinceAndPages(t *testing.T) {
	c := etcdtest.Start(t, 1)
	t0 := time.Unix(1_800_000_000, 0)
	clk := newFakeClock(t0)
	a := startAllocator(t, c, "a", clk.opt())
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	// 12 changes of tenant/x and 12 of plan/y, one a second, then an
	// apply of both at once.
	for i := range 12 {
		clk.Set(t0.Add(time.Duration(i) * time.Second))
		for _, id := range []string{"tenant/x", "plan/y"} {
			if _, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: simpleLimit(id, int64(100+i), time.Minute),
				Reason: fmt.Sprintf("%s %d", id, i), Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk.Set(t0.Add(20 * time.Second))
	x, y := int64(12), int64(12)
	if _, err := srv.ApplyLimits(as(admin), &pb.ApplyLimitsRequest{Reason: "both", Effective: pb.Effective_EFFECTIVE_NOW, Changes: []*pb.LimitChange{
		{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/x", 1, time.Minute)}, ExpectedVersion: x},
		{Change: &pb.LimitChange_Put{Put: simpleLimit("plan/y", 1, time.Minute)}, ExpectedVersion: y},
	}}); err != nil {
		t.Fatal(err)
	}
	collect := func(req *pb.ListAuditRequest) ([]*pb.AuditEvent, int) {
		var out []*pb.AuditEvent
		pages := 0
		for range 100 {
			resp, err := srv.ListAudit(as(admin), req)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			out = append(out, resp.Events...)
			if resp.NextPageToken == "" {
				return out, pages
			}
			req.PageToken = resp.NextPageToken
		}
		t.Fatal("paging never ended")
		return nil, 0
	}
	all, pages := collect(&pb.ListAuditRequest{PageSize: 5})
	if len(all) != 26 || pages != 6 {
		t.Fatalf("all: %d events in %d pages, want 26 in 6", len(all), pages)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Id <= all[i-1].Id || all[i].Time.AsTime().Before(all[i-1].Time.AsTime()) {
			t.Fatalf("events out of order at %d: %s after %s", i, all[i].Id, all[i-1].Id)
		}
	}
	// Since t0+10s: changes 10 and 11 of each, and the apply (its two
	// events paged apart with a page size of 1).
	since, _ := collect(&pb.ListAuditRequest{Since: timestamppb.New(t0.Add(10 * time.Second)), PageSize: 1})
	if len(since) != 6 || since[0].Reason != "tenant/x 10" || since[4].ChangeId == "" || since[4].ChangeId != since[5].ChangeId {
		t.Fatalf("since t0+10s: %v", since)
	}
	tenant, _ := collect(&pb.ListAuditRequest{LimitPrefix: "tenant/", PageSize: 4})
	if len(tenant) != 13 {
		t.Fatalf("tenant/ events: %d, want 13", len(tenant))
	}
	for _, e := range tenant {
		if e.LimitId != "tenant/x" {
			t.Fatalf("prefix filter let through %v", e)
		}
	}
	// Bad input names the field.
	_, err := srv.ListAudit(as(admin), &pb.ListAuditRequest{PageToken: "nonsense"})
	wantInvalid(t, err, "page_token")
	_, err = srv.ListAudit(as(admin), &pb.ListAuditRequest{PageSize: 1001})
	wantInvalid(t, err, "page_size")
	_, err = srv.ListAudit(as(admin), &pb.ListAuditRequest{Since: &timestamppb.Timestamp{Nanos: -1}})
	wantInvalid(t, err, "since")
	// History pages.
	var hist []*pb.AuditEvent
	req := &pb.LimitHistoryRequest{Id: "plan/y", PageSize: 5}
	for range 10 {
		resp, err := srv.LimitHistory(as(viewer), req)
		if err != nil {
			t.Fatal(err)
		}
		hist = append(hist, resp.Events...)
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	if len(hist) != 13 || hist[0].NewVersion != 1 || hist[12].NewVersion != 13 || hist[12].Reason != "both" {
		t.Fatalf("history of plan/y: %d entries", len(hist))
	}
	_, err = srv.LimitHistory(as(viewer), &pb.LimitHistoryRequest{Id: "plan/y", PageToken: "x"})
	wantInvalid(t, err, "page_token")
}

// The leader removes audit records older than the retention, with the
// history entries they name; newer ones stay.
func TestAuditRetention(t *testing.T) {
	c := etcdtest.Start(t, 1)
	t0 := time.Unix(1_800_000_000, 0)
	clk := newFakeClock(t0)
	a := startAllocator(t, c, "a", clk.opt(), WithAuditRetention(time.Hour, 20*time.Millisecond))
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	put := func(g int64) {
		if _, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: simpleLimit("tenant/old", g, time.Minute), Reason: "r",
			Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
			t.Fatal(err)
		}
	}
	put(1)
	put(2)
	_, err := srv.ListAudit(as(viewer), &pb.ListAuditRequest{}) // a refusal, recorded
	wantCode(t, err, codes.PermissionDenied, "viewer audit")
	clk.Set(t0.Add(90 * time.Minute))
	put(3)
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := allAudit(t, a.Allocator)
		h := history(t, a.Allocator, "tenant/old")
		if len(evs) == 1 && len(h) == 1 && h[0].NewVersion == 3 && evs[0].NewVersion == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention: %d events, %d history entries left, want 1 and 1", len(evs), len(h))
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not ordering
	}
	if _, err := a.store.GetLimit(context.Background(), "tenant/old"); err != nil {
		t.Fatalf("the sweep touched the limit: %v", err)
	}
}
