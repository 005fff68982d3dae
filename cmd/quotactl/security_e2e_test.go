package main

import (
	"crypto/tls"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"leasehold/allocator"
	"leasehold/allocator/auth"
	"leasehold/allocator/auth/devca"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
)

// tlsAllocator is a real allocator served over TLS with authentication on:
// client certificates from its dev CA, and bearer tokens.
type tlsAllocator struct {
	addr string
	dir  string // ca.pem, alice.pem, alice-key.pem, other-ca.pem, bob.token
	// tokens by user: bob (editor of tenant/*), carol (viewer)
	bob, carol string
}

func startTLSAllocator(t *testing.T) *tlsAllocator {
	t.Helper()
	dir := t.TempDir()
	ca, err := devca.New("test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	alice, err := ca.User("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := devca.New("another CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ta := &tlsAllocator{dir: dir}
	if ta.bob, err = auth.NewToken(); err != nil {
		t.Fatal(err)
	}
	if ta.carol, err = auth.NewToken(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "ca.pem", string(ca.CertPEM()))
	writeFile(t, dir, "other-ca.pem", string(other.CertPEM()))
	writeFile(t, dir, "alice.pem", string(alice.CertPEM))
	writeFile(t, dir, "alice-key.pem", string(alice.KeyPEM))
	writeFile(t, dir, "bob.token", ta.bob+"\n")

	users, err := auth.NewUsers(&auth.Config{Users: []auth.UserConfig{
		{Name: "alice", Role: "admin"},
		{Name: "bob", Role: "editor", Scopes: []string{"tenant/*"}, Tokens: []string{auth.HashToken(ta.bob)}},
		{Name: "carol", Role: "viewer", Tokens: []string{auth.HashToken(ta.carol)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := srv.TLS()
	if err != nil {
		t.Fatal(err)
	}
	lis := allocatortest.Listen(t)
	ta.addr = lis.Addr().String()
	a, err := allocator.New(allocator.Config{
		Client:    etcdtest.Start(t, 1).Client(t),
		Regions:   []string{"eu", "us"},
		Advertise: ta.addr,
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(),
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12})
	guard := auth.NewGuard(users, nil, nil)
	allocatortest.Serve(t, lis, allocator.NewServer(a, allocator.WithAuthRequired(true)),
		append([]grpc.ServerOption{grpc.Creds(creds)}, guard.ServerOptions()...)...)
	allocatortest.WaitLeader(t, a)
	return ta
}

// TestTLSAndCredentials: quotactl talks TLS with --tls-ca, authenticates
// by client certificate or bearer token (flag, file or environment), and
// the allocator's refusals come back as one clear line.
func TestTLSAndCredentials(t *testing.T) {
	ta := startTLSAllocator(t)
	t.Setenv(tokenEnv, "")
	ca := filepath.Join(ta.dir, "ca.pem")
	asAlice := []string{"--allocator", ta.addr, "--tls-ca", ca,
		"--tls-cert", filepath.Join(ta.dir, "alice.pem"), "--tls-key", filepath.Join(ta.dir, "alice-key.pem")}
	asBob := []string{"--allocator", ta.addr, "--tls-ca", ca, "--token-file", filepath.Join(ta.dir, "bob.token")}
	q := func(who []string, args ...string) result {
		return quotactl(append(append([]string{}, who...), args...)...)
	}
	set := func(id string) []string {
		return []string{"limits", "set", id, "--limit", "10", "--window", "1m", "--regions", "eu", "--mode", "strict", "--reason", "tls test"}
	}

	// Plaintext against a TLS listener fails; so does an untrusted CA.
	r := quotactl("--allocator", ta.addr, "--timeout", "2s", "limits", "list").want(t, 1)
	if !strings.Contains(r.stderr, "unavailable") {
		t.Errorf("plaintext to TLS: %s", r.stderr)
	}
	r = quotactl("--allocator", ta.addr, "--timeout", "2s", "--tls-ca", filepath.Join(ta.dir, "other-ca.pem"), "limits", "list").want(t, 1)
	if !strings.Contains(r.stderr, "certificate") {
		t.Errorf("untrusted server certificate: %s", r.stderr)
	}
	// TLS without credentials: unauthenticated.
	r = quotactl("--allocator", ta.addr, "--tls-ca", ca, "limits", "list").want(t, 1)
	if !strings.Contains(r.stderr, "not authenticated") {
		t.Errorf("no credentials: %s", r.stderr)
	}
	r = quotactl("--allocator", ta.addr, "--tls-ca", ca, "--token", "lht_not-a-token", "limits", "list").want(t, 1)
	if !strings.Contains(r.stderr, "not authenticated") {
		t.Errorf("a wrong token: %s", r.stderr)
	}

	// A client certificate: alice, admin.
	r = q(asAlice, "whoami").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"principal": "alice", "role": "admin", "via": "certificate"})
	q(asAlice, set("other/x")...).want(t, 0)

	// A token from a file: bob, editor of tenant/*.
	r = q(asBob, "whoami").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"principal": "bob", "role": "editor", "scopes": "tenant/*", "via": "token"})
	q(asBob, set("tenant/b")...).want(t, 0)
	r = q(asBob, set("other/y")...).want(t, 1)
	if !strings.Contains(r.stderr, "permission denied") || !strings.Contains(r.stderr, "other/y") {
		t.Errorf("editor out of scope: %s", r.stderr)
	}
	q(asBob, "--token", ta.bob, "limits", "get", "tenant/b").want(t, 0) // --token wins over --token-file

	// A token from the environment: carol, viewer.
	t.Setenv(tokenEnv, ta.carol)
	asCarol := []string{"--allocator", ta.addr, "--tls-ca", ca}
	r = q(asCarol, "limits", "list").want(t, 0)
	if !strings.Contains(r.stdout, "tenant/b") || !strings.Contains(r.stdout, "other/x") {
		t.Errorf("viewer list:\n%s", r.stdout)
	}
	r = q(asCarol, set("tenant/c")...).want(t, 1)
	if !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("viewer set: %s", r.stderr)
	}
	q(asCarol, "audit").want(t, 1)
	t.Setenv(tokenEnv, "")

	// The admin sees the refused attempts in the audit log.
	r = q(asAlice, "audit", "--since", "1h").want(t, 0)
	var denied []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Contains(l, " denied ") {
			denied = append(denied, l)
		}
	}
	if len(denied) < 2 || !strings.Contains(strings.Join(denied, "\n"), "bob") || !strings.Contains(strings.Join(denied, "\n"), "carol") {
		t.Fatalf("audit lacks the denied attempts of bob and carol:\n%s", r.stdout)
	}

	// Declarative files work over TLS too.
	dir := t.TempDir()
	file := writeFile(t, dir, "limits.yaml", "manage: [tenant/]\nlimits:\n  - {id: tenant/b, limit: 20, window: 1m, regions: [eu], mode: strict}\n")
	plan := filepath.Join(dir, "plan.json")
	q(asBob, "limits", "plan", "-f", file, "-o", plan).want(t, 0)
	r = q(asBob, "limits", "apply", "--plan", plan, "--reason", "raise b").want(t, 0)
	if !strings.Contains(r.stdout, "updated tenant/b: version 2") {
		t.Fatalf("apply over TLS:\n%s", r.stdout)
	}
}
