// Package allocatortest is the one way tests run allocators: Run starts an
// allocator's Run loop for the length of a test (Stop ends it earlier, as
// a crash or a shutdown would), WaitLeader waits until it leads, and Serve
// puts its gRPC services on a loopback port. The allocator's own tests,
// the agent's, the Envoy service's, quotactl's and the admin HTTP API's
// all use it, on etcd from leasehold/internal/etcdtest.
//
// It does not import leasehold/allocator, and takes the allocator through
// the small interfaces below (*allocator.Allocator and *allocator.Server
// satisfy them). That is deliberate: the allocator's in-package tests use
// this package too, and a package they import may not import the
// allocator back (an import cycle). Moving those tests to an external
// allocator_test package instead would have meant exporting the internals
// they check (terms and fences, sweeps, store keys). Each caller therefore
// builds its allocator itself with allocator.New and its own Config: the
// regions, the advertised address, the clock and the registry are what
// the tests differ in.
package allocatortest

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"leasehold/internal/bounds"
)

// Allocator is what the harness runs: *allocator.Allocator.
type Allocator interface {
	Run(ctx context.Context) error
	WaitLeader(ctx context.Context) error
	Leader() string // the leader's address as this replica sees it
}

// Services is what Serve serves: *allocator.Server (the Allocator and
// Admin services).
type Services interface {
	Register(grpc.ServiceRegistrar)
}

// LeaderTimeout is how long WaitLeader waits.
const LeaderTimeout = 15 * time.Second

// Running is an allocator whose Run loop the harness started.
type Running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
}

// Run runs a.Run in the background until Stop or the end of the test
// (t.Cleanup), whichever comes first. Run's error is dropped: it only
// says why the loop ended.
func Run(t testing.TB, a Allocator) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = a.Run(ctx) }()
	t.Cleanup(r.Stop)
	return r
}

// Stop ends Run and waits until it returned. Stopping a stopped allocator
// does nothing.
func (r *Running) Stop() {
	r.cancel()
	<-r.done
}

// WaitLeader waits until a leads (LeaderTimeout at most) and fails the
// test if it does not.
func WaitLeader(t testing.TB, a Allocator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), LeaderTimeout)
	defer cancel()
	if err := a.WaitLeader(ctx); err != nil {
		t.Fatalf("allocatortest: never led within %v (the leader it sees: %q): %v", LeaderTimeout, a.Leader(), err)
	}
}

// Listen returns a loopback listener on a port the kernel picks: the
// address to advertise before the allocator is built. Serve closes it.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("allocatortest: listen: %v", err)
	}
	return lis
}

// Serve serves svc over gRPC on lis (nil: a new Listen) with the given
// server options until the test ends, and returns the address. Call it
// after Run: cleanups run last first, so the server stops before the
// allocator does and no call reaches a stopped allocator.
func Serve(t testing.TB, lis net.Listener, svc Services, opts ...grpc.ServerOption) string {
	t.Helper()
	if lis == nil {
		lis = Listen(t)
	}
	gs := grpc.NewServer(append(bounds.Allocator.ServerOptions(), opts...)...)
	svc.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}
