package bounds_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"leasehold/internal/bounds"
)

// shortGRPC are gRPC bounds small enough to hit in a test.
var shortGRPC = bounds.GRPC{
	MaxConcurrentStreams: 16,
	MaxRecvMsgSize:       64 << 10,
	MaxSendMsgSize:       64 << 10,
	MaxHeaderListSize:    16 << 10,
	ConnectionTimeout:    time.Second,
	KeepaliveMinTime:     5 * time.Second,
	PermitWithoutStream:  true,
	MaxConnectionIdle:    time.Minute,
	KeepaliveTime:        time.Minute,
	KeepaliveTimeout:     10 * time.Second,
}

// echo is a gRPC server of g's bounds whose every method receives a
// BytesValue, calls onCall, and answers a BytesValue of reply bytes.
func echo(t *testing.T, g bounds.GRPC, reply int, onCall func()) *grpc.ClientConn {
	t.Helper()
	opts := append(g.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		if err := st.RecvMsg(&wrapperspb.BytesValue{}); err != nil {
			return err
		}
		if onCall != nil {
			onCall()
		}
		return st.SendMsg(wrapperspb.Bytes(make([]byte, reply)))
	}))
	s := grpc.NewServer(opts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func call(ctx context.Context, cc *grpc.ClientConn, size int) error {
	return cc.Invoke(ctx, "/leasehold.test.Echo/Echo", wrapperspb.Bytes(make([]byte, size)), &wrapperspb.BytesValue{})
}

// TestMaxConcurrentStreams: 3,000 calls at once on one connection to a
// server of 16 streams: the server never runs more than 16 at a time, and
// every call is served (the others wait for a stream, none is refused).
// The first 16 are held until all 16 run, so the cap is reached.
func TestMaxConcurrentStreams(t *testing.T) {
	const calls = 3000
	var inFlight, peak, served atomic.Int64
	entered := make(chan struct{}, calls)
	release := make(chan struct{})
	cc := echo(t, shortGRPC, 1, func() {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		entered <- struct{}{}
		<-release
		served.Add(1)
		inFlight.Add(-1)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := call(ctx, cc, 1); err != nil {
				failed.Add(1)
			}
		}()
	}
	for range shortGRPC.MaxConcurrentStreams {
		<-entered
	}
	close(release)
	wg.Wait()
	t.Logf("%d calls: %d served, %d failed, at most %d at a time", calls, served.Load(), failed.Load(), peak.Load())
	if served.Load() != calls || failed.Load() != 0 {
		t.Errorf("%d served, %d failed of %d: want every call served", served.Load(), failed.Load(), calls)
	}
	if p := peak.Load(); p != int64(shortGRPC.MaxConcurrentStreams) {
		t.Errorf("at most %d calls at a time, want exactly MaxConcurrentStreams = %d", p, shortGRPC.MaxConcurrentStreams)
	}
}

// TestMessageCaps: a request over MaxRecvMsgSize and an answer over
// MaxSendMsgSize fail with RESOURCE_EXHAUSTED; at the caps they pass.
func TestMessageCaps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A BytesValue of n bytes is n + 3 or 4 bytes of message.
	under := shortGRPC.MaxRecvMsgSize - 8
	var handled atomic.Int64
	cc := echo(t, shortGRPC, 1, func() { handled.Add(1) })
	if err := call(ctx, cc, under); err != nil {
		t.Errorf("a request under the cap: %v", err)
	}
	err := call(ctx, cc, shortGRPC.MaxRecvMsgSize+1)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a request over MaxRecvMsgSize: %v, want ResourceExhausted", err)
	}
	if handled.Load() != 1 {
		t.Errorf("%d requests reached the handler, want only the one under the cap", handled.Load())
	}
	big := echo(t, shortGRPC, shortGRPC.MaxSendMsgSize+1, nil)
	if err := call(ctx, big, 1); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("an answer over MaxSendMsgSize: %v, want ResourceExhausted", err)
	}
	t.Logf("over the receive cap: %v", err)
}

// TestKeepaliveEnforcement: a client that pings more often than
// KeepaliveMinTime (here one ping after another) is sent GOAWAY
// ENHANCE_YOUR_CALM ("too_many_pings") and its connection closed: grpc-go
// takes the first ping and two too soon, not a third.
func TestKeepaliveEnforcement(t *testing.T) {
	s := grpc.NewServer(shortGRPC.ServerOptions()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var wmu sync.Mutex // the framer's writes: the reader acks settings, the test pings
	goaway := make(chan *http2.GoAwayFrame, 1)
	go func() {
		defer close(goaway)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					wmu.Lock()
					_ = fr.WriteSettingsAck()
					wmu.Unlock()
				}
			case *http2.GoAwayFrame:
				goaway <- f
				return
			}
		}
	}()
	pings := 0
	var got *http2.GoAwayFrame
	for got == nil && pings < 100 { // bounded: the server answers the fourth
		pings++
		wmu.Lock()
		err := fr.WritePing(false, [8]byte{byte(pings)})
		wmu.Unlock()
		if err != nil {
			break
		}
		select {
		case got = <-goaway:
		case <-time.After(50 * time.Millisecond): // the next ping, too soon
		}
	}
	if got == nil {
		got = <-goaway
	}
	if got == nil {
		t.Fatalf("after %d pings: the connection closed without GOAWAY", pings)
	}
	t.Logf("%d pings, then GOAWAY %v %q", pings, got.ErrCode, got.DebugData())
	if got.ErrCode != http2.ErrCodeEnhanceYourCalm || pings > 4 {
		t.Errorf("after %d pings: GOAWAY %v; want ENHANCE_YOUR_CALM after at most 4", pings, got.ErrCode)
	}
}
