package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// BenchmarkGrants measures lease grants per second through the allocator
// (core, group commit, fenced etcd transactions with fsync) on embedded
// etcd with one and three members, with group commit (up to 128 grants per
// transaction) and without (one grant per transaction). 128 concurrent
// callers each ask for items leases per call (an agent batches the renewals
// of many limits into one call). Embedded etcd here accepts 1024 ops per
// transaction; batch=512 shows what a raised --max-txn-ops buys.
func BenchmarkGrants(b *testing.B) {
	for _, members := range []int{1, 3} {
		for _, bc := range []struct{ batch, items int }{{1, 1}, {128, 1}, {128, 16}, {512, 16}} {
			batch, items := bc.batch, bc.items
			b.Run(fmt.Sprintf("members=%d/batch=%d/items=%d", members, batch, items), func(b *testing.B) {
				c := etcdtest.Start(b, members)
				a, err := New(Config{Client: c.Client(b), Regions: []string{"eu", "us"}, Advertise: "bench", Logger: slog.New(slog.DiscardHandler)},
					WithGroupCommit(batch, 4))
				if err != nil {
					b.Fatal(err)
				}
				allocatortest.Run(b, a)
				allocatortest.WaitLeader(b, a)
				ctx := context.Background()
				const limits = 100
				for i := range limits {
					l := validLimit()
					l.Id = fmt.Sprintf("tenant/b%d", i)
					l.LimitTokens = 1 << 50
					l.Lease.MinChunk, l.Lease.MaxChunk = 1, 1
					if _, err := a.PutLimit(ctx, l, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
						b.Fatal(err)
					}
				}
				for {
					var n int
					_ = a.View(func(_ time.Time, c *Core) { n = len(c.limits) })
					if n == limits {
						break
					}
					time.Sleep(time.Millisecond)
				}
				var seq atomic.Int64
				b.SetParallelism(64)
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb_ *testing.PB) {
					reqs := make([]*pb.LeaseRequest, items)
					for pb_.Next() {
						for i := range reqs {
							n := seq.Add(1)
							reqs[i] = &pb.LeaseRequest{RequestId: fmt.Sprint("r", n), LimitId: fmt.Sprintf("tenant/b%d", n%limits), DemandPerSecond: 1}
						}
						res, err := a.AcquireLeases(ctx, "eu", reqs)
						if err != nil || res[0].Lease == nil {
							b.Errorf("acquire: %v %v", res, err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N*items)/time.Since(start).Seconds(), "grants/s")
			})
		}
	}
}
