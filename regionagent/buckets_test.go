package regionagent

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

// putBucketLimit creates a bucket limit through the Admin API (PutLimit,
// validated like quotactl's) and waits for the allocator's leader to
// apply it.
func (w *world) putBucketLimit(id string, rate, burst int64, ttl time.Duration, regions ...string) {
	w.t.Helper()
	_, err := allocator.NewServer(w.alloc).PutLimit(context.Background(), &pb.PutLimitRequest{Reason: "test",
		Limit: &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: burst,
			RatePeriod: durationpb.New(time.Second), Regions: regions, Mode: pb.Mode_MODE_STRICT,
			Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}})
	if err != nil {
		w.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = w.alloc.View(func(_ time.Time, c *allocator.Core) { _, ok = c.Limit(id) })
		if ok {
			return
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	w.t.Fatalf("limit %s never reached the leader", id)
}

// TestBucketLimitEndToEnd: a bucket limit (10 per second, burst 5),
// created through the Admin API and spent
// by agents of two regions through real redis-servers and a real
// allocator on etcd: a region's first share starts empty and refills at
// its rate up to its burst; a denial says when a token comes; the other
// region gets nothing while the first holds the whole rate, and its part
// once that share expired; a cost above the burst is invalid input naming
// the field; a sub-lease of a bucket limit is refused.
func TestBucketLimitEndToEnd(t *testing.T) {
	w := newWorld(t, "eu", "us")
	w.putBucketLimit("b/e2e", 10, 5, 10*time.Second, "eu", "us")
	ctx := context.Background()
	eu, us := w.agent("eu", "eu-1"), w.agent("us", "us-1")

	eu.evaluate(ctx, "b/e2e") // eu's first share: the whole rate (only eu asked)
	d, err := eu.Check(ctx, "b/e2e", 1)
	if err != nil || d.Reason != pb.Reason_REASON_OVER_LIMIT || d.RetryAfter < 100*time.Millisecond || d.RetryAfter > 110*time.Millisecond ||
		d.Limit != 10 || d.Window != time.Second {
		t.Fatalf("eu's first check (an empty bucket): %+v, %v", d, err)
	}
	w.clock.Add(time.Second) // refilled to the burst
	for i := range 5 {
		if d, err := eu.Check(ctx, "b/e2e", 1); err != nil || d.Reason != pb.Reason_REASON_OK || d.Remaining != int64(4-i) {
			t.Fatalf("eu check %d: %+v, %v", i, d, err)
		}
	}
	if d, err := eu.Check(ctx, "b/e2e", 1); err != nil || d.Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("eu's sixth check: %+v, %v", d, err)
	}

	us.evaluate(ctx, "b/e2e") // nothing free: eu holds the whole rate
	if d, err := us.Check(ctx, "b/e2e", 1); err != nil || d.Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("us while eu holds everything: %+v, %v", d, err)
	}
	// eu's share expires (10 s); then us's renewal gets its part.
	w.clock.Add(10 * time.Second)
	us.evaluate(ctx, "b/e2e")
	w.clock.Add(time.Second)
	admitted := 0
	for range 10 {
		if d, err := us.Check(ctx, "b/e2e", 1); err != nil {
			t.Fatal(err)
		} else if d.Reason == pb.Reason_REASON_OK {
			admitted++
		}
	}
	if admitted == 0 || admitted > 5 {
		t.Fatalf("us admitted %d in its first second with a share (burst 5)", admitted)
	}

	if _, err := eu.Check(ctx, "b/e2e", 6); err == nil || !errorsAs(err, new(*FieldError)) {
		t.Fatalf("a cost above the burst: %v", err)
	}
	if _, err := eu.Reserve(ctx, "b/e2e", 1, 1, "r1"); err == nil {
		t.Fatal("a sub-lease of a bucket limit was granted")
	}
}

// BenchmarkCheckBucketBesideWindow measures in-process Checks of a bucket
// limit beside a window limit, in the same run against the same
// redis-server and allocator (wall clock): 1 and 64 callers. Both limits
// are far from their limits, so every Check is admitted and does the
// full work. Concurrent Checks of either kind share one pipeline per
// batch (spender.go): one spend.lua call for the window limit's, one
// rate.lua 'takes' call for the bucket limit's.
func BenchmarkCheckBucketBesideWindow(b *testing.B) {
	w := startWorld(b, false, "eu")
	win := w.putLimit(limit("bench/window", 1<<40, time.Hour, time.Hour, "eu"))
	w.putBucketLimit("bench/bucket", 1_000_000_000, 4_000_000_000, 10*time.Minute, "eu")
	a, ctx, _ := runningBenchAgent(b, w, []string{win.Id, "bench/bucket"})
	for _, kind := range []struct{ name, id string }{{"window", win.Id}, {"bucket", "bench/bucket"}} {
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("kind=%s/callers=%d", kind.name, callers), func(b *testing.B) {
				var denied atomic.Int64
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if d, err := a.Check(ctx, kind.id, 1); err != nil || !d.Allowed {
							denied.Add(1)
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
				if n := denied.Load(); n > 0 {
					b.Fatalf("%d of %d checks not admitted", n, b.N)
				}
			})
		}
	}
}
