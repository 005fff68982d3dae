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
	"leasehold/internal/groupmap"
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

// BenchmarkGroupGrants measures lease grants per second with the limits
// sharded over 1, 2 and 4 allocator groups, each group one leader on its
// own single-member embedded etcd (the map in the first's), 64 callers
// asking 16 leases of one group's limits per call, spread over the groups.
// On one machine the groups share its cores; what scales here is etcd's
// commit path, one per group.
//
//	go test -run '^$' -bench BenchmarkGroupGrants -benchtime 20000x ./allocator/
func BenchmarkGroupGrants(b *testing.B) {
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("groups=%d", n), func(b *testing.B) {
			ctx := context.Background()
			mapEtcd := etcdtest.Start(b, 1)
			store := NewMapStore(mapEtcd.Client(b), "", 0)
			var groups []groupmap.Group
			allocs := map[string]*Allocator{}
			var views []*MapView
			for i := range n {
				name := fmt.Sprintf("g%d", i+1)
				c := mapEtcd
				if i > 0 {
					c = etcdtest.Start(b, 1)
				}
				view, err := NewMapView(ctx, store, time.Now)
				if err != nil {
					b.Fatal(err)
				}
				a, err := New(Config{Client: c.Client(b), Prefix: "/leasehold/g/" + name + "/", Regions: []string{"eu", "us"},
					Advertise: name, Logger: slog.New(slog.DiscardHandler)}, WithGroupCommit(128, 4), WithGroup(name, view))
				if err != nil {
					b.Fatal(err)
				}
				allocatortest.Run(b, a)
				allocatortest.WaitLeader(b, a)
				allocs[name], views = a, append(views, view)
				groups = append(groups, groupmap.Group{Name: name, Allocators: []string{name + ":1"}})
			}
			m, rev, err := store.Change(ctx, 0, groupmap.Map{}, time.Now(), groupmap.Change{Groups: groups})
			if err != nil {
				b.Fatal(err)
			}
			for _, v := range views {
				if err := v.Wait(ctx, rev); err != nil {
					b.Fatal(err)
				}
			}
			byGroup := map[string][]string{}
			for i := range 100 * n {
				l := validLimit()
				l.Id = fmt.Sprintf("tenant/b%d", i)
				l.LimitTokens = 1 << 50
				l.Lease.MinChunk, l.Lease.MaxChunk = 1, 1
				owner, _, _ := m.Owner(l.Id, time.Now())
				if _, err := allocs[owner].PutLimit(ctx, l, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
					b.Fatal(err)
				}
				byGroup[owner] = append(byGroup[owner], l.Id)
			}
			for name, a := range allocs {
				for {
					var k int
					_ = a.View(func(_ time.Time, c *Core) { k = len(c.limits) })
					if k == len(byGroup[name]) {
						break
					}
					time.Sleep(time.Millisecond) // polling the leader's watch
				}
			}
			const items = 16
			var seq atomic.Int64
			b.SetParallelism(32) // 64 callers on 2 cores
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb_ *testing.PB) {
				reqs := make([]*pb.LeaseRequest, items)
				for pb_.Next() {
					k := seq.Add(1)
					g := groups[int(k)%n].Name
					ids := byGroup[g]
					for i := range reqs {
						reqs[i] = &pb.LeaseRequest{RequestId: fmt.Sprint("r", k, "-", i), LimitId: ids[(int(k)+i)%len(ids)], DemandPerSecond: 1}
					}
					res, err := allocs[g].AcquireLeases(ctx, "eu", reqs)
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
