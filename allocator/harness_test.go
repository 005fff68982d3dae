package allocator

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *fakeClock) Add(d time.Duration)     { c.ns.Add(int64(d)) }
func (c *fakeClock) opt() Option             { return WithClock(c.Now) }
func (c *fakeClock) String() string          { return c.Now().String() }
func (c *fakeClock) Since(t time.Time) int64 { return c.ns.Load() - t.UnixNano() }

// runningAllocator is an allocator whose Run loop a test can stop.
type runningAllocator struct {
	*Allocator
	*allocatortest.Running
}

func startAllocator(t *testing.T, c *etcdtest.Cluster, name string, opts ...Option) *runningAllocator {
	t.Helper()
	return startAllocatorReg(t, c, name, nil, opts...)
}

func startAllocatorReg(t *testing.T, c *etcdtest.Cluster, name string, reg prometheus.Registerer, opts ...Option) *runningAllocator {
	t.Helper()
	a, err := New(Config{
		Client:     c.Client(t),
		Regions:    []string{"eu", "us", "ap"},
		Advertise:  name,
		Logger:     testLog(),
		Registerer: reg,
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &runningAllocator{Allocator: a, Running: allocatortest.Run(t, a)}
}

func putLimit(t *testing.T, a *Allocator, id string, g int64, w, ttl time.Duration, maxChunk int64) *pb.Limit {
	t.Helper()
	l, err := a.PutLimit(context.Background(), &pb.Limit{
		Id: id, LimitTokens: g, Window: durationpb.New(w), Regions: []string{"eu", "us", "ap"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl), MaxChunk: maxChunk},
	}, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitLimit waits until the leader's core has seen version v of a limit.
func waitLimit(t *testing.T, a *Allocator, id string, v int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = a.View(func(_ time.Time, c *Core) {
			l, found := c.Limit(id)
			ok = found && l.Version >= v
		})
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not ordering
	}
	t.Fatalf("limit %s v%d never reached the leader", id, v)
}

// ledger is the test's own record of every lease it was given.
type ledger struct {
	mu       sync.Mutex
	byReq    map[string]*pb.Lease // region/request id -> lease
	credited map[string]int64     // lease id -> credited on return
}

func newLedger() *ledger {
	return &ledger{byReq: map[string]*pb.Lease{}, credited: map[string]int64{}}
}

// record notes a lease; it fails the test if a request id ever maps to
// two different leases.
func (l *ledger) record(t *testing.T, region string, res *pb.LeaseResult) {
	if res.Lease == nil || res.Lease.Tokens == 0 {
		return // nothing granted (an empty answer names only the window)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := region + "/" + res.RequestId
	if old, ok := l.byReq[k]; ok {
		if old.LeaseId != res.Lease.LeaseId || old.Tokens != res.Lease.Tokens || old.WindowIndex != res.Lease.WindowIndex {
			t.Errorf("request %s got two leases: %v and %v", k, old, res.Lease)
		}
		return
	}
	l.byReq[k] = res.Lease
}

type poolKey struct {
	limit  string
	window int64
}

// net returns granted - credited per (limit, window) from the ledger.
func (l *ledger) net() map[poolKey]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[poolKey]int64{}
	for _, ls := range l.byReq {
		out[poolKey{ls.LimitId, ls.WindowIndex}] += ls.Tokens - l.credited[ls.LeaseId]
	}
	return out
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func testLog() *slog.Logger {
	if os.Getenv("ALLOC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}
