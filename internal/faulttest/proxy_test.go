package faulttest

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every byte back and counts what it received.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
	wg       sync.WaitGroup
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.received.Add(int64(n))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back, failing after timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo differs: " + string(buf))
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
}

func TestProxyForwards(t *testing.T) {
	s := startEcho(t)
	p := NewProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	for range 3 {
		if err := roundTrip(c, "hello", 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if p.Forwarded(ToServer) != 15 || p.Forwarded(ToClient) != 15 || p.Accepted() != 1 {
		t.Fatalf("forwarded %d/%d bytes over %d connections, want 15/15 over 1",
			p.Forwarded(ToServer), p.Forwarded(ToClient), p.Accepted())
	}
}

func TestProxyDelay(t *testing.T) {
	s := startEcho(t)
	p := NewProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if err := roundTrip(c, "warm", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// The delay applies to a live connection: 40 ms each way.
	p.SetDelay(40 * time.Millisecond)
	start := time.Now()
	if err := roundTrip(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(start)
	if rtt < 80*time.Millisecond || rtt > 2*time.Second {
		t.Fatalf("round trip %v with 40 ms each way, want >= 80 ms (and loosely below 2 s)", rtt)
	}
	// Delays pipeline: ten messages in flight take about one delay, not ten.
	start = time.Now()
	for range 10 {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Fatalf("10 pipelined messages took %v: delays do not overlap", d)
	}
	p.SetDelay(0)
	start = time.Now()
	if err := roundTrip(c, "fast", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt > 60*time.Millisecond {
		t.Logf("round trip %v after the delay was removed (loaded machine?)", rtt)
	}
}

func TestProxyDropReplies(t *testing.T) {
	s := startEcho(t)
	p := NewProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if err := roundTrip(c, "ok", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.DropReplies(true)
	err := roundTrip(c, "lost", 300*time.Millisecond)
	if !isTimeout(err) {
		t.Fatalf("reply with drops on: %v, want a timeout", err)
	}
	// The server acted on the request: the ambiguous case.
	waitFor(t, 2*time.Second, "the server to receive the request", func() bool { return s.received.Load() == 6 })
	waitFor(t, 2*time.Second, "the reply to be discarded", func() bool { return p.Discarded(ToClient) == 4 })
	// Later requests on the same connection still reach the server.
	if err := roundTrip(c, "again", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("second reply with drops on: %v, want a timeout", err)
	}
	waitFor(t, 2*time.Second, "the server to receive the second request", func() bool { return s.received.Load() == 11 })

	// Turning drops off resets the connection that lost bytes (its stream
	// has a hole) ...
	p.DropReplies(false)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read on a connection that lost replies: %v, want it reset", err)
	}
	// ... and a new connection works.
	if err := roundTrip(dial(t, p), "back", 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestProxyBlackhole(t *testing.T) {
	s := startEcho(t)
	p := NewProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if err := roundTrip(c, "ok", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	if err := roundTrip(c, "void", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip into a blackhole: %v, want a timeout", err)
	}
	// New connections are accepted, and see nothing either.
	c2 := dial(t, p)
	if err := roundTrip(c2, "void", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection into a blackhole: %v, want a timeout", err)
	}
	waitFor(t, 2*time.Second, "the proxy to swallow both requests", func() bool { return p.Discarded(ToServer) == 8 })
	if got := s.received.Load(); got != 2 {
		t.Fatalf("server received %d bytes, want only the 2 sent before the blackhole", got)
	}
	p.Blackhole(false)
	if err := roundTrip(dial(t, p), "back", 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestProxyReset(t *testing.T) {
	s := startEcho(t)
	p := NewProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if err := roundTrip(c, "ok", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after Reset: %v, want connection reset by peer", err)
	}
	if err := roundTrip(dial(t, p), "again", 2*time.Second); err != nil {
		t.Fatalf("new connection after Reset: %v", err)
	}
}

func TestProxyTargetDown(t *testing.T) {
	s := startEcho(t)
	addr := s.ln.Addr().String()
	s.ln.Close()
	p := NewProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return // reset while connecting: the client sees the target down
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read through a proxy whose target is down: %v, want the connection closed", err)
	}
}
