package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// TestDevTLS runs `leasehold dev --tls`: every listener speaks TLS,
// agents need a client certificate, the allocator a certificate or the
// printed token, and plaintext callers are refused.
func TestDevTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	args, alloc, eu, _, euHTTP := devArgs(t, dir)
	args = append(args, "--tls")
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncbuf.Buffer{}
	s := &started{cancel: cancel, done: make(chan struct{}), stderr: &syncbuf.Buffer{}}
	go func() { defer close(s.done); s.exit = run(ctx, args, out, s.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Error("dev did not stop")
		}
	})
	// The certificates exist once dev says it serves.
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "leasehold dev: serving"); {
		select {
		case <-s.done:
			t.Fatalf("dev exited %d: %s\n%s", s.exit, s.stderr, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev not serving: %s", s.stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling the output
	}
	tlsDir := filepath.Join(dir, "tls")
	// The gateway's certificate is the server's: agents accept it as a
	// client certificate (they ask for one of the dev CA).
	asServer := tlsConfigFor(t, tlsDir, serverCertFile, serverKeyFile)
	euConn := dialTLS(t, eu, asServer)
	waitServing(t, euConn, pb.RegionAgent_ServiceDesc.ServiceName, s)

	// Check over TLS: the agent got the demo limit from the allocator
	// over mutual TLS with its region's certificate.
	agent := pb.NewRegionAgentClient(euConn)
	var resp *pb.CheckResponse
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err = agent.Check(bearer(t, ""), &pb.CheckRequest{LimitId: demoLimit, Cost: 1})
		if err == nil && resp.Allowed || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the agent syncs limits and leases in the background
	}
	if err != nil || !resp.Allowed {
		t.Fatalf("Check over TLS: %v %v", resp, err)
	}

	// The token dev printed names the dev admin.
	m := regexp.MustCompile(`token of dev \(new every run, shown once\): (lht_\S+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no token in the output:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "--tls-ca "+filepath.Join(tlsDir, caCertFile)) {
		t.Errorf("no quotactl line with --tls-ca:\n%s", out.String())
	}
	allocConn := dialTLS(t, alloc, tlsConfigFor(t, tlsDir, "", ""))
	who, err := pb.NewAdminClient(allocConn).WhoAmI(bearer(t, m[1]), &pb.WhoAmIRequest{})
	if err != nil || who.Principal != devUser || who.Role != "admin" {
		t.Fatalf("WhoAmI with the printed token: %v %v", who, err)
	}
	_, err = pb.NewAdminClient(allocConn).ListLimits(bearer(t, ""), &pb.ListLimitsRequest{})
	wantCode(t, "allocator without credentials", err, codes.Unauthenticated)

	// Plaintext clients are refused, the allocator's and the agent's.
	for name, addr := range map[string]string{"allocator": alloc, "agent": eu} {
		_, err := pb.NewAdminClient(dial(t, addr)).WhoAmI(bearer(t, ""), &pb.WhoAmIRequest{})
		wantCode(t, "plaintext client of the "+name, err, codes.Unavailable)
	}
	// A TLS client without a certificate is refused by the agent.
	_, err = pb.NewRegionAgentClient(dialTLS(t, eu, tlsConfigFor(t, tlsDir, "", ""))).Check(bearer(t, ""), &pb.CheckRequest{LimitId: demoLimit, Cost: 1})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("agent client without a certificate: %v", err)
	}

	// HTTPS: the agent's /metrics and the eu gateway, which calls its
	// agent with the Go client over mutual TLS.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: asServer.RootCAs}}}
	resp2, err := hc.Get("https://" + euHTTP + "/metrics")
	if err != nil || resp2.StatusCode != http.StatusOK {
		t.Fatalf("agent /metrics over TLS: %v %v", resp2, err)
	}
	resp2.Body.Close()
	req, _ := http.NewRequest(http.MethodGet, "https://"+argValue(args, "--eu-gateway")+"/orders", nil)
	req.Header.Set("X-Tenant", "tenant")
	resp2, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusOK || !strings.Contains(string(body), "hello from the upstream") {
		t.Fatalf("through the gateway over TLS: %d %s", resp2.StatusCode, body)
	}
	cancel()
	if code := s.wait(); code != 0 {
		t.Fatalf("dev exit %d: %s", code, s.stderr)
	}
}
