package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/internal/bounds"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client/clienttest"
)

// TestServersAreBounded: every server `leasehold dev` runs (the
// allocator's, an agent's, a gateway's) is built with internal/bounds: a
// message over a gRPC server's cap fails RESOURCE_EXHAUSTED, and a header
// block over 64 KiB is answered 431 on every HTTP server.
func TestServersAreBounded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	args, alloc, eu, _, euHTTP := devArgs(t, dir)
	s := startCmd(t, args...)
	agentConn := dial(t, eu)
	waitServing(t, agentConn, pb.RegionAgent_ServiceDesc.ServiceName, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, err := pb.NewAdminClient(dial(t, alloc)).ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: strings.Repeat("r", bounds.AllocatorMaxRecv)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("allocator: an ApplyLimits over %d bytes: %v, want ResourceExhausted", bounds.AllocatorMaxRecv, err)
	}
	_, err = pb.NewRegionAgentClient(agentConn).Check(ctx, &pb.CheckRequest{LimitId: strings.Repeat("l", bounds.AgentMaxMsg), Cost: 1})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("agent: a Check over %d bytes: %v, want ResourceExhausted", bounds.AgentMaxMsg, err)
	}
	for name, url := range map[string]string{
		"allocator": "http://" + argValue(args, "--allocator-http") + "/healthz",
		"agent":     "http://" + euHTTP + "/healthz",
		"gateway":   "http://" + argValue(args, "--eu-gateway") + "/healthz",
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("X-Big", strings.Repeat("h", bounds.Service.MaxHeaderBytes+8<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: a 72 KiB header block: %s, want 431", name, resp.Status)
		}
	}
}

// TestGatewayBodyBounds: `leasehold gateway --read-timeout 300ms
// --max-body-bytes 1000`: a body sent at a byte every 20 ms is cut off
// before it is all sent, a 2,000-byte body is answered 413 whether its
// length is declared or chunked, and the upstream gets neither body.
func TestGatewayBodyBounds(t *testing.T) {
	up := startUpstream(t)
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", 1000, time.Hour, time.Hour)
	gw := startGateway(t, "--upstream", up.srv.URL, "--agent", ag.ServeTCP(t), "--key-header", "X-Tenant",
		"--read-timeout", "300ms", "--max-body-bytes", "1000")
	addr := strings.TrimPrefix(gw, "http://")

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	closed := make(chan string)
	go func() { b, _ := io.ReadAll(c); closed <- string(b) }()
	if _, err := io.WriteString(c, "PUT /orders HTTP/1.1\r\nHost: x\r\nX-Tenant: atlas\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	sent := 0
	var answer string
	for sent < 100 && answer == "" { // bounded: 100 bytes at most
		select {
		case answer = <-closed:
			continue
		case <-time.After(20 * time.Millisecond): // pacing the slow client
		}
		if _, err := c.Write([]byte{'x'}); err != nil {
			break
		}
		sent++
	}
	if answer == "" {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		answer = <-closed
	}
	t.Logf("slow body: %d of 100 bytes sent before the gateway closed the connection; answer %q", sent, strings.SplitN(answer, "\r\n", 2)[0])
	if sent >= 100 || !strings.HasPrefix(answer, "HTTP/1.1 408 ") {
		t.Errorf("slow body: %d of 100 bytes read, answer %q: want -read-timeout to cut it off with 408", sent, answer)
	}

	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("b", 2000))
		if chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPut, gw+"/orders", body)
		req.Header.Set("X-Tenant", "atlas")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("a 2,000-byte body (chunked %v): %s, want 413", chunked, resp.Status)
		}
	}
	// The slow and the chunked body's headers reach the upstream before
	// the gateway learns the body is too slow or too long (it streams);
	// a declared length over the cap never does.
	for _, r := range up.requests() {
		if r.Method == http.MethodPut && r.ContentLength > 1000 {
			t.Errorf("the upstream got a PUT %s of %d bytes", r.URL.Path, r.ContentLength)
		}
	}
}
