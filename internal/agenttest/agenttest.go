// Package agenttest runs one real region agent for a test: region "eu",
// on a real redis-server (leasehold/internal/redistest), fed by an
// allocator on embedded etcd serving gRPC on loopback, the given limits
// put and seen by the leader before the agent starts. The Envoy service's
// and the HTTP middleware's tests use it to drive the real decision path.
package agenttest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/allocator"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// Agent is a running region agent and its Redis.
type Agent struct {
	Agent *regionagent.Agent
	Redis *redistest.Server
}

// Start starts the allocator, puts limits (effective now), waits until
// the leader holds each, and starts an agent of region "eu" that is
// ready when Start returns. Everything stops at the test's end.
func Start(t testing.TB, limits ...*pb.Limit) *Agent {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	c := etcdtest.Start(t, 1)
	al, err := allocator.New(allocator.Config{Client: c.Client(t), Regions: []string{"eu"}, Advertise: "alloc", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, al)
	allocatortest.WaitLeader(t, al)
	allocAddr := allocatortest.Serve(t, nil, allocator.NewServer(al))
	ctx := context.Background()
	for _, l := range limits {
		got, err := al.PutLimit(ctx, l, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			var ok bool
			_ = al.View(func(_ time.Time, c *allocator.Core) {
				v, found := c.Limit(got.Id)
				ok = found && v.Version == got.Version
			})
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("limit %s never reached the leader", got.Id)
			}
			time.Sleep(5 * time.Millisecond) // polling the watch's effect
		}
	}
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 64})
	t.Cleanup(func() { rdb.Close() })
	a, err := regionagent.New(regionagent.Config{Region: "eu", Allocators: []string{allocAddr}, Redis: rdb,
		ReplicaID: "agenttest", Logger: logger,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}},
		regionagent.WithColdWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() { defer close(adone); _ = a.Run(actx) }()
	t.Cleanup(func() { acancel(); <-adone; a.Close() })
	select {
	case <-a.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("agent not ready")
	}
	return &Agent{Agent: a, Redis: rs}
}

// Serve serves the agent's RegionAgent gRPC service on a loopback port
// for the length of the test and returns its address.
func (a *Agent) Serve(t testing.TB) string {
	t.Helper()
	lis := allocatortest.Listen(t) // loopback, a free port
	gs := grpc.NewServer()
	regionagent.NewServer(a.Agent).Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return lis.Addr().String()
}
