package regionagent

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestBreakerProbesOnReconnect: an open breaker in its cooldown refuses
// calls; probeNow (the connection became READY) lets the next call probe
// at once, and only one.
func TestBreakerProbesOnReconnect(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var b breaker
	for range breakerTrip {
		b.allow(t0)
		b.done(t0, false)
	}
	at := t0.Add(100 * time.Millisecond) // inside the 250 ms cooldown
	if b.allow(at) {
		t.Fatal("an open breaker allowed a call in its cooldown")
	}
	b.probeNow(at)
	if !b.allow(at) {
		t.Fatal("after probeNow the next call was refused")
	}
	if b.allow(at) {
		t.Fatal("two probes at once")
	}
	if changed, up := b.done(at, true); !changed || !up {
		t.Fatalf("the probe succeeded: changed %v up %v, want the allocator up", changed, up)
	}
	var closed breaker
	closed.probeNow(at) // a closed breaker is unchanged
	if !closed.allow(at) || closed.open(at) {
		t.Fatal("probeNow changed a closed breaker")
	}
}

// TestReconnectedOnReady: when a connection to the allocator becomes
// READY, the client says so once on reconnected (the sync loop syncs on
// it), and the watcher ends when the client closes.
func TestReconnectedOnReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	go func() { _ = s.Serve(ln) }()
	defer s.Stop()
	c := newAllocClient([]string{ln.Addr().String()}, time.Second, time.Second, time.Now, nil,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer c.close()
	cc, err := c.conn(c.current())
	if err != nil {
		t.Fatal(err)
	}
	cc.Connect()
	select {
	case <-c.reconnected:
	case <-time.After(10 * time.Second):
		t.Fatalf("no reconnected signal; connection %v", cc.GetState())
	}
}

// TestOpenBreakerLogsOnce: calls refused by an open breaker log nothing
// (its opening was logged once), while other failures log at most once a
// second per kind: 1,000 refused returns and 1,000 failed ones in a burst
// log one line.
func TestOpenBreakerLogsOnce(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	var n noteLog
	for range 1000 {
		n.callFailed(l, "lease returns", 1, errBreakerOpen)
		n.callFailed(l, "lease returns", 1, errors.New("connection refused"))
	}
	if lines := strings.Count(buf.String(), "\n"); lines != 1 || strings.Contains(buf.String(), "circuit open") {
		t.Errorf("logged %d lines:\n%s\nwant one, not about the open circuit", lines, buf.String())
	}
}
