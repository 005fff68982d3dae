package regionagent

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"leasehold/regionagent/bucket"
)

// TestRenewalLockLastsAsLongAsItsRound: a round whose allocator call takes
// longer than lockLease keeps its limit's renewal lock the whole time
// (this replica extends it), so no other replica could take it meanwhile;
// when the round ends the lock is released at once. A replica that dies
// holding the lock no longer extends it: it is free within lockLease.
func TestRenewalLockLastsAsLongAsItsRound(t *testing.T) {
	release := make(chan struct{})
	var acquires atomic.Int32
	hold := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasSuffix(info.FullMethod, "/AcquireLeases") && acquires.Add(1) == 1 {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return h(ctx, req)
	}
	w := startWorldOpts(t, false, []grpc.ServerOption{grpc.ChainUnaryInterceptor(hold)}, "eu")
	l := w.putLimit(limit("tenant/slow-round", 1000, time.Minute, time.Minute, "eu"))
	// One allocator attempt may last 30 s: the held call is the round's.
	a := w.liveAgentOpts("eu", "r1", WithColdWait(30*time.Second), WithTimeouts(30*time.Second, 30*time.Second, 250*time.Millisecond))
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	t.Cleanup(func() { rdb.Close() })
	key := bucket.LockKey("", l.Id)
	owner := func() string { v, _ := rdb.Get(context.Background(), key).Result(); return v }

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	checked := make(chan Decision, 1)
	go func() {
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil {
			t.Error(err)
		}
		checked <- d
	}()
	for deadline := time.Now().Add(10 * time.Second); owner() != "r1"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first Check's round never took the renewal lock")
		}
	}
	// The round waits on the allocator for 1.5 leases' worth of time: the
	// lock must be r1's throughout.
	taken := time.Now()
	for time.Since(taken) < lockLease*3/2 {
		if o := owner(); o != "r1" {
			t.Fatalf("%v into a round still waiting on the allocator the lock is %q's, want r1's (extended)", time.Since(taken).Round(time.Millisecond), o)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	if d := <-checked; !d.Allowed {
		t.Fatalf("the Check after the slow round: %+v", d)
	}
	for deadline := time.Now().Add(5 * time.Second); owner() != ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the renewal lock outlived its round")
		}
	}
	// Held by a replica that no longer extends it (it died): free within
	// lockLease. Another limit's lock: r1 may start its next round of
	// tenant/slow-round (and take that lock) at any moment.
	dead := bucket.LockKey("", "tenant/no-replica-renews")
	if ok, err := bucket.New(rdb).TryLock(ctx, dead, "dead-replica", lockLease); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ttl := rdb.PTTL(ctx, dead).Val(); ttl <= 0 || ttl > lockLease {
		t.Fatalf("a lock's TTL %v, want at most lockLease %v", ttl, lockLease)
	}
}
