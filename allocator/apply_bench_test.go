package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// BenchmarkAuditedChange measures one limit change with its history entry
// and audit record in one fenced etcd transaction (one embedded member,
// default fsync), next to a bare put of the same record: the cost of the
// audit is the difference. apply=N changes N limits in one call.
func BenchmarkAuditedChange(b *testing.B) {
	c := etcdtest.Start(b, 1)
	a, err := New(Config{Client: c.Client(b), Regions: []string{"eu", "us"}, Advertise: "bench", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	allocatortest.Run(b, a)
	allocatortest.WaitLeader(b, a)
	ctx := context.Background()
	srv := NewServer(a)
	b.Run("bare-put", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := c.Client(b).Put(ctx, a.store.limitKey("bench/bare"), fmt.Sprint(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 10, 60} {
		b.Run(fmt.Sprintf("apply=%d", n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				req := &pb.ApplyLimitsRequest{Reason: "bench", Effective: pb.Effective_EFFECTIVE_NOW}
				for j := range n {
					req.Changes = append(req.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{
						Put: simpleLimit(fmt.Sprintf("bench/%d-%d", n, j), int64(1+i), time.Minute)}, ExpectedVersion: int64(i)})
				}
				if _, err := srv.ApplyLimits(as(admin), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
