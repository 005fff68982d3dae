package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator/auth"
	"leasehold/allocator/auth/devca"
	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// tokenLineRe is how `leasehold certs` prints a token.
var tokenLineRe = regexp.MustCompile(`(?m)^  ([^ ]+) \([a-z]+\): (lht_[A-Za-z0-9_-]+)$`)

// writeTestCerts runs `leasehold certs` into a new directory and returns
// it and the printed tokens by user.
func writeTestCerts(t *testing.T, args ...string) (string, map[string]string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	var stdout, stderr syncbuf.Buffer
	if code := run(context.Background(), append([]string{"certs", "--dir", dir}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("certs: exit %d: %s", code, stderr.String())
	}
	tokens := map[string]string{}
	for _, m := range tokenLineRe.FindAllStringSubmatch(stdout.String(), -1) {
		tokens[m[1]] = m[2]
	}
	return dir, tokens
}

// tlsConfigFor trusts dir's CA and presents cert (a file name in dir, ""
// for none). The certificate is sent whatever CAs the server names.
func tlsConfigFor(t *testing.T, dir, cert, key string) *tls.Config {
	t.Helper()
	pool, err := readPool("ca", filepath.Join(dir, caCertFile))
	if err != nil {
		t.Fatal(err)
	}
	c := &tls.Config{RootCAs: pool}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
		if err != nil {
			t.Fatal(err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp, nil }
	}
	return c
}

func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// bearer is a context sending tok ("" sends nothing), bounded.
func bearer(t *testing.T, tok string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// TestAllocatorAuthAndRegions runs `leasehold allocator` with TLS, client
// certificates and an auth file, and calls it as agents and users.
func TestAllocatorAuthAndRegions(t *testing.T) {
	dir, tokens := writeTestCerts(t, "--users", "alice:admin,vic:viewer", "--regions", "eu,us")
	if tokens["alice"] == "" || tokens["vic"] == "" {
		t.Fatalf("tokens: %v", tokens)
	}
	grpcAddr, httpAddr := ports.Addr(t), ports.Addr(t)
	s := startCmd(t, "allocator", "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--etcd-client-addr", ports.Addr(t), "--etcd-peer-addr", ports.Addr(t), "--regions", "eu,us",
		"--tls-cert", filepath.Join(dir, serverCertFile), "--tls-key", filepath.Join(dir, serverKeyFile),
		"--tls-client-ca", filepath.Join(dir, caCertFile), "--auth-file", filepath.Join(dir, authFileName))
	anon := dialTLS(t, grpcAddr, tlsConfigFor(t, dir, "", ""))
	// Health answers without credentials.
	waitServing(t, anon, pb.Allocator_ServiceDesc.ServiceName, s)

	admin := pb.NewAdminClient(anon)
	who, err := admin.WhoAmI(bearer(t, tokens["alice"]), &pb.WhoAmIRequest{})
	if err != nil || who.Principal != "alice" || who.Role != "admin" || who.Via != "token" {
		t.Fatalf("WhoAmI with alice's token: %v %v", who, err)
	}
	_, err = admin.WhoAmI(bearer(t, "lht_notatoken"), &pb.WhoAmIRequest{})
	wantCode(t, "wrong token", err, codes.Unauthenticated)
	_, err = admin.WhoAmI(bearer(t, ""), &pb.WhoAmIRequest{})
	wantCode(t, "no credentials", err, codes.Unauthenticated)
	if _, err := admin.PutLimit(bearer(t, tokens["alice"]), &pb.PutLimitRequest{Reason: "auth test", Limit: &pb.Limit{
		Id: "demo/tenant", LimitTokens: 1000, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
	}}); err != nil {
		t.Fatal(err)
	}
	// A viewer reads and may not write: an allowed and a denied call.
	if _, err := admin.GetLimit(bearer(t, tokens["vic"]), &pb.GetLimitRequest{Id: "demo/tenant"}); err != nil {
		t.Errorf("viewer GetLimit: %v", err)
	}
	_, err = admin.PutLimit(bearer(t, tokens["vic"]), &pb.PutLimitRequest{Reason: "x", Limit: &pb.Limit{
		Id: "demo/tenant", LimitTokens: 1, Window: durationpb.New(time.Minute), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT}})
	wantCode(t, "viewer PutLimit", err, codes.PermissionDenied)

	// The eu agent's certificate: everything for eu, nothing for us.
	euConn := dialTLS(t, grpcAddr, tlsConfigFor(t, dir, "agent-eu.pem", "agent-eu-key.pem"))
	eu := pb.NewAllocatorClient(euConn)
	if who, err := pb.NewAdminClient(euConn).WhoAmI(bearer(t, ""), &pb.WhoAmIRequest{}); err != nil || who.Principal != "agent/eu" || who.Region != "eu" {
		t.Fatalf("WhoAmI as the eu agent: %v %v", who, err)
	}
	var lease *pb.Lease
	for deadline := time.Now().Add(10 * time.Second); lease == nil; {
		res, err := eu.AcquireLeases(bearer(t, ""), &pb.AcquireLeasesRequest{Region: "eu",
			Requests: []*pb.LeaseRequest{{RequestId: "r1", LimitId: "demo/tenant", WantTokens: 10}}})
		if err != nil {
			t.Fatalf("eu agent, region eu: %v", err)
		}
		if res.Results[0].Code == pb.ItemCode_ITEM_CODE_OK {
			lease = res.Results[0].Lease
		} else if time.Now().After(deadline) {
			t.Fatalf("no lease: %v", res)
		} else {
			time.Sleep(10 * time.Millisecond) // the leader learns the new limit through its watch
		}
	}
	_, err = eu.AcquireLeases(bearer(t, ""), &pb.AcquireLeasesRequest{Region: "us",
		Requests: []*pb.LeaseRequest{{RequestId: "r2", LimitId: "demo/tenant", WantTokens: 10}}})
	wantCode(t, "eu agent leasing for us", err, codes.PermissionDenied)
	if err != nil && !strings.Contains(err.Error(), `region "eu", not "us"`) {
		t.Errorf("refusal says: %v", err)
	}
	ret := []*pb.LeaseReturn{{LimitId: "demo/tenant", LeaseId: lease.LeaseId, Unspent: 4}}
	_, err = eu.ReturnLeases(bearer(t, ""), &pb.ReturnLeasesRequest{Region: "us", Returns: ret})
	wantCode(t, "eu agent returning for us", err, codes.PermissionDenied)
	if rr, err := eu.ReturnLeases(bearer(t, ""), &pb.ReturnLeasesRequest{Region: "eu", Returns: ret}); err != nil || rr.Results[0].Code != pb.ItemCode_ITEM_CODE_OK {
		t.Errorf("eu agent returning for eu: %v %v", rr, err)
	}
	usage := []*pb.Usage{{LimitId: "demo/tenant", WindowIndex: lease.WindowIndex, Admitted: 6}}
	_, err = eu.ReportUsage(bearer(t, ""), &pb.ReportUsageRequest{Region: "us", Reporter: "eu-1", Usage: usage})
	wantCode(t, "eu agent reporting for us", err, codes.PermissionDenied)
	if _, err := eu.ReportUsage(bearer(t, ""), &pb.ReportUsageRequest{Region: "eu", Reporter: "eu-1", Usage: usage}); err != nil {
		t.Errorf("eu agent reporting for eu: %v", err)
	}
	_, err = eu.SyncLimits(bearer(t, ""), &pb.SyncLimitsRequest{Region: "us"})
	wantCode(t, "eu agent syncing us", err, codes.PermissionDenied)
	if sl, err := eu.SyncLimits(bearer(t, ""), &pb.SyncLimitsRequest{Region: "eu"}); err != nil || len(sl.Limits) != 1 {
		t.Errorf("eu agent syncing eu: %v %v", sl, err)
	}
	// The us agent's certificate is refused for eu; an agent is not an
	// admin, and an admin is not an agent.
	us := pb.NewAllocatorClient(dialTLS(t, grpcAddr, tlsConfigFor(t, dir, "agent-us.pem", "agent-us-key.pem")))
	_, err = us.SyncLimits(bearer(t, ""), &pb.SyncLimitsRequest{Region: "eu"})
	wantCode(t, "us agent syncing eu", err, codes.PermissionDenied)
	_, err = pb.NewAdminClient(euConn).GetLimit(bearer(t, ""), &pb.GetLimitRequest{Id: "demo/tenant"})
	wantCode(t, "agent calling the Admin service", err, codes.PermissionDenied)
	_, err = pb.NewAllocatorClient(anon).SyncLimits(bearer(t, tokens["alice"]), &pb.SyncLimitsRequest{Region: "eu"})
	wantCode(t, "admin calling the Allocator service", err, codes.PermissionDenied)
	_, err = pb.NewAllocatorClient(anon).SyncLimits(bearer(t, ""), &pb.SyncLimitsRequest{Region: "eu"})
	wantCode(t, "Allocator service without credentials", err, codes.Unauthenticated)

	// Certificates refused: another CA's and an expired one at the TLS
	// handshake (Unavailable); a user's not in the auth file by the
	// interceptor (Unauthenticated).
	ca := loadCA(t, dir)
	other, _ := devca.New("other", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	forged, _ := other.Agent("eu", time.Hour)
	now := time.Now()
	expired, err := ca.Issue(devca.Request{CommonName: "old eu agent", URIs: []*url.URL{auth.AgentURI("eu")},
		NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Minute), Client: true})
	if err != nil {
		t.Fatal(err)
	}
	mallory, _ := ca.User("mallory", time.Hour)
	for _, tc := range []struct {
		name string
		kp   devca.Pair
		code codes.Code
	}{{"another CA", forged, codes.Unavailable}, {"expired", expired, codes.Unavailable}, {"user not in the auth file", mallory, codes.Unauthenticated}} {
		cfg := tlsConfigFor(t, dir, "", "")
		kp, err := tc.kp.TLS()
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp, nil }
		_, err = pb.NewAllocatorClient(dialTLS(t, grpcAddr, cfg)).SyncLimits(bearer(t, ""), &pb.SyncLimitsRequest{Region: "eu"})
		wantCode(t, "certificate of "+tc.name, err, tc.code)
	}
	// A plaintext client gets no answer at all.
	plain := dial(t, grpcAddr)
	_, err = pb.NewAdminClient(plain).WhoAmI(bearer(t, ""), &pb.WhoAmIRequest{})
	wantCode(t, "plaintext client", err, codes.Unavailable)

	// HTTP: /metrics and /healthz open over TLS, /status needs a reader.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfigFor(t, dir, "", "")}}
	get := func(path, tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+httpAddr+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/status", ""); code != http.StatusUnauthorized {
		t.Errorf("/status without credentials: %d", code)
	}
	if code, body := get("/status", tokens["vic"]); code != http.StatusOK || !strings.Contains(body, "demo/tenant") {
		t.Errorf("/status as a viewer: %d", code)
	}
	code, body := get("/metrics", "")
	if code != http.StatusOK || !strings.Contains(body, `leasehold_auth_failures_total{reason="bad_token"}`) ||
		!strings.Contains(body, `leasehold_auth_failures_total{reason="unknown_user"} 1`) {
		t.Errorf("/metrics: %d, failures counted: %q", code, regexp.MustCompile(`(?m)^leasehold_auth_failures_total.*$`).FindAllString(body, -1))
	}
	// Plaintext HTTP to the TLS listener is answered 400 by net/http (or
	// not at all), never with the page.
	if resp, err := http.Get("http://" + httpAddr + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plaintext HTTP: %d", resp.StatusCode)
		}
	}
}

// loadCA loads the CA `leasehold certs` wrote into dir.
func loadCA(t *testing.T, dir string) *devca.CA {
	t.Helper()
	c, err1 := os.ReadFile(filepath.Join(dir, caCertFile))
	k, err2 := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	ca, err := devca.Load(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestCertsCommand(t *testing.T) {
	dir, tokens := writeTestCerts(t, "--users", "alice:admin,bob:editor:tenant/*:team/x,vic:viewer", "--regions", "eu,us",
		"--hosts", "localhost,127.0.0.1,allocator.internal", "--valid", "48h")
	if len(tokens) != 3 {
		t.Fatalf("tokens printed: %v", tokens)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		info, _ := e.Info()
		perm := info.Mode().Perm()
		switch {
		case strings.HasSuffix(e.Name(), "-key.pem"), e.Name() == authFileName:
			if perm != 0o600 {
				t.Errorf("%s: mode %v, want 0600", e.Name(), perm)
			}
		case perm&0o022 != 0:
			t.Errorf("%s: mode %v is writable by others", e.Name(), perm)
		}
	}
	want := "agent-eu-key.pem agent-eu.pem agent-us-key.pem agent-us.pem auth.yaml ca-key.pem ca.pem server-key.pem server.pem " +
		"user-alice-key.pem user-alice.pem user-bob-key.pem user-bob.pem user-vic-key.pem user-vic.pem"
	if strings.Join(names, " ") != want {
		t.Fatalf("files:\n %s\nwant\n %s", strings.Join(names, " "), want)
	}
	// Every certificate loads with its key and chains to the CA for its
	// use, and names what it should.
	pool, _ := readPool("ca", filepath.Join(dir, caCertFile))
	for _, tc := range []struct {
		name  string
		usage x509.ExtKeyUsage
		uri   string
	}{
		{"server", x509.ExtKeyUsageServerAuth, ""},
		{"agent-eu", x509.ExtKeyUsageClientAuth, "leasehold://agent/eu"},
		{"agent-us", x509.ExtKeyUsageClientAuth, "leasehold://agent/us"},
		{"user-bob", x509.ExtKeyUsageClientAuth, "leasehold://user/bob"},
	} {
		kp, err := tls.LoadX509KeyPair(filepath.Join(dir, tc.name+".pem"), filepath.Join(dir, tc.name+"-key.pem"))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		leaf := kp.Leaf
		opts := x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{tc.usage}}
		if tc.name == "server" {
			opts.DNSName = "allocator.internal"
		}
		if _, err := leaf.Verify(opts); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.uri != "" && (len(leaf.URIs) != 1 || leaf.URIs[0].String() != tc.uri) {
			t.Errorf("%s: URIs %v, want %s", tc.name, leaf.URIs, tc.uri)
		}
		if d := time.Until(leaf.NotAfter); d > 48*time.Hour || d < 47*time.Hour {
			t.Errorf("%s: valid for %v more, want 48h", tc.name, d)
		}
	}
	// The auth file loads, holds hashes of the printed tokens and not
	// the tokens.
	raw, _ := os.ReadFile(filepath.Join(dir, authFileName))
	cfg, err := auth.LoadConfig(filepath.Join(dir, authFileName))
	if err != nil {
		t.Fatal(err)
	}
	users, _ := auth.NewUsers(cfg)
	for name, tok := range tokens {
		if strings.Contains(string(raw), tok) || strings.Contains(string(raw), strings.TrimPrefix(tok, auth.TokenPrefix)) {
			t.Errorf("auth.yaml holds %s's token", name)
		}
		if p, err := users.Authenticate(nil, tok); err != nil || p.Name != name {
			t.Errorf("%s's token: %v %v", name, p, err)
		}
	}
	if cfg.Users[1].Role != "editor" || strings.Join(cfg.Users[1].Scopes, ",") != "tenant/*,team/x" {
		t.Errorf("bob: %+v", cfg.Users[1])
	}

	// A second run refuses and changes nothing; -force replaces all.
	before, _ := os.ReadFile(filepath.Join(dir, caCertFile))
	var stdout, stderr syncbuf.Buffer
	if code := run(context.Background(), []string{"certs", "--dir", dir}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "exists") {
		t.Fatalf("second run: exit %d, %q", code, stderr.String())
	}
	if after, _ := os.ReadFile(filepath.Join(dir, caCertFile)); string(after) != string(before) {
		t.Fatal("a refused run changed ca.pem")
	}
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--force"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--force: exit %d %s", code, stderr.String())
	}
	if after, _ := os.ReadFile(filepath.Join(dir, caCertFile)); string(after) == string(before) {
		t.Fatal("--force kept the CA")
	}

	for _, args := range [][]string{
		{"certs"},
		{"certs", "--dir", dir, "extra"},
		{"certs", "--dir", dir, "--nope"},
		{"certs", "--dir", dir, "--regions", "EU"},
		{"certs", "--dir", dir, "--regions", "eu,eu"},
		{"certs", "--dir", dir, "--users", "alice"},
		{"certs", "--dir", dir, "--users", "alice:root"},
		{"certs", "--dir", dir, "--users", "bob:editor"},
		{"certs", "--dir", dir, "--users", "vic:viewer:tenant/*"},
		{"certs", "--dir", dir, "--users", "a:admin,a:viewer"},
		{"certs", "--dir", dir, "--users", "bad name:admin"},
		{"certs", "--dir", dir, "--hosts", "bad host!"},
		{"certs", "--dir", dir, "--hosts", ""},
		{"certs", "--dir", dir, "--valid", "0s"},
		{"certs", "--dir", dir, "--valid", "200000h"},
		{"certs", "--dir", dir, "--users", "", "--regions", ""},
	} {
		var stderr syncbuf.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

func TestServerTLSUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"allocator", "--tls-cert", "c.pem"},
		{"allocator", "--tls-client-ca", "ca.pem"},
		{"allocator", "--auth-file", "auth.yaml"},
		{"allocator", "--etcd-ca", "ca.pem"},
		{"allocator", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cert", "c.pem"},
		{"agent", "--region", "eu", "--tls-key", "k.pem"},
		{"agent", "--region", "eu", "--allocator-cert", "c.pem", "--allocator-key", "k.pem"},
		{"agent", "--region", "eu", "--tls-ca", "ca.pem", "--allocator-cert", "c.pem"},
		{"gateway", "--upstream", "http://127.0.0.1:1", "--key-header", "X-T", "--tls-cert", "c.pem"},
	} {
		var stderr syncbuf.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// An agent refuses to start with another region's certificate.
func TestAgentCertificateNamesItsRegion(t *testing.T) {
	dir, _ := writeTestCerts(t, "--users", "", "--regions", "eu,us")
	var stderr syncbuf.Buffer
	code := run(context.Background(), []string{"agent", "--region", "eu", "--grpc-addr", ports.Addr(t), "--http-addr", ports.Addr(t),
		"--tls-ca", filepath.Join(dir, caCertFile),
		"--allocator-cert", filepath.Join(dir, "agent-us.pem"), "--allocator-key", filepath.Join(dir, "agent-us-key.pem")}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "names agent/us, not agent/eu") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// devCerts makes the CA once and reuses it; each run has a new token and
// the old one stops working.
func TestDevCertsReuseTheCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	tok1, err := devCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca1, _ := os.ReadFile(filepath.Join(dir, caCertFile))
	tok2, err := devCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca2, _ := os.ReadFile(filepath.Join(dir, caCertFile))
	if string(ca1) != string(ca2) || tok1 == tok2 {
		t.Fatalf("CA reused %v, tokens differ %v", string(ca1) == string(ca2), tok1 != tok2)
	}
	cfg, err := auth.LoadConfig(filepath.Join(dir, authFileName))
	if err != nil {
		t.Fatal(err)
	}
	users, _ := auth.NewUsers(cfg)
	if _, err := users.Authenticate(nil, tok1); err == nil {
		t.Error("the first run's token still works")
	}
	if p, err := users.Authenticate(nil, tok2); err != nil || p.Name != devUser || p.Role != auth.RoleAdmin {
		t.Errorf("token: %v %v", p, err)
	}
}
