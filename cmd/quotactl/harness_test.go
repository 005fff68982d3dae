package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"leasehold/allocator"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/vocab"
)

// testAllocator is a real allocator replica served over gRPC on a loopback
// port, its Admin calls counted.
type testAllocator struct {
	addr string
	a    *allocator.Allocator
	gate *gate
}

// startAllocator starts a replica on c, advertising its own address.
// Everything stops in t.Cleanup.
func startAllocator(t *testing.T, c *etcdtest.Cluster) *testAllocator {
	t.Helper()
	lis := allocatortest.Listen(t)
	addr := lis.Addr().String()
	a, err := allocator.New(allocator.Config{
		Client:    c.Client(t),
		Regions:   []string{"eu", "us"},
		Advertise: addr,
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	g := &gate{leader: a.Leader}
	allocatortest.Serve(t, lis, allocator.NewServer(a), grpc.UnaryInterceptor(g.intercept))
	return &testAllocator{addr: addr, a: a, gate: g}
}

// waitLeader waits until ta leads.
func waitLeader(t *testing.T, ta *testAllocator) {
	t.Helper()
	allocatortest.WaitLeader(t, ta.a)
}

// gate counts the Admin calls a replica serves. When refusing is on, it
// answers every Admin call as a follower answers Allocator calls:
// UNAVAILABLE with the leader's address in the leasehold-leader trailer.
// (Admin calls themselves are served by any replica, from etcd.)
type gate struct {
	leader  func() string          // the replica's view of the leader
	claim   atomic.Pointer[string] // when set, named instead of leader()
	refuse  atomic.Bool
	served  atomic.Int32
	refused atomic.Int32
}

func (g *gate) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/leasehold.v1.Admin/") {
		return h(ctx, req)
	}
	if g.refuse.Load() {
		g.refused.Add(1)
		l := g.leader()
		if c := g.claim.Load(); c != nil {
			l = *c
		}
		_ = grpc.SetTrailer(ctx, metadata.Pairs(vocab.LeaderMetadataKey, l))
		return nil, status.Error(codes.Unavailable, (&allocator.NotLeaderError{Leader: l}).Error())
	}
	g.served.Add(1)
	return h(ctx, req)
}

// result is what one quotactl invocation printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// quotactl runs the command line args in process.
func quotactl(args ...string) result {
	var o, e bytes.Buffer
	code := run(context.Background(), args, &o, &e)
	return result{o.String(), e.String(), code}
}

// want checks the exit code and the shape of stderr: empty on success,
// exactly one "quotactl: " line on failure.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	checkStderr(t, r)
	return r
}

func checkStderr(t testing.TB, r result) {
	t.Helper()
	if r.code == 0 {
		if r.stderr != "" {
			t.Fatalf("exit 0 with stderr %q", r.stderr)
		}
		return
	}
	if !strings.HasPrefix(r.stderr, "quotactl: ") || !strings.HasSuffix(r.stderr, "\n") ||
		strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("exit %d: stderr is not one \"quotactl: \" line: %q", r.code, r.stderr)
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentAddr returns an address that accepts TCP connections and never
// answers on them: only a deadline ends a call to it.
func silentAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // protects held
	var held []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

// kv parses "key: value" lines.
func kv(t *testing.T, out string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("not a key: value line: %q", line)
		}
		m[k] = strings.TrimSpace(v)
	}
	return m
}
