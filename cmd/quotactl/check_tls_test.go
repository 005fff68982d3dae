package main

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"leasehold/allocator/auth/devca"
)

// TestCheckAgentRequiresClientCertificate: an agent that verifies its
// callers (--tls-client-ca) drops a TLS client without a certificate;
// check says what to give it, and works once given one.
func TestCheckAgentRequiresClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.New("test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := ca.User("gateway", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "ca.pem", string(ca.CertPEM()))
	writeFile(t, dir, "gw.pem", string(gw.CertPEM))
	writeFile(t, dir, "gw-key.pem", string(gw.KeyPEM))
	cert, err := srv.TLS()
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{}
	addr := startFake(t, f, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))

	r := quotactl("--tls-ca", dir+"/ca.pem", "check", "--agent", addr, "--limit", fakeLimit).want(t, 1)
	if !strings.Contains(r.stderr, "unavailable") || !strings.Contains(r.stderr, "--tls-cert, --tls-key") {
		t.Fatalf("check without a client certificate: %q", r.stderr)
	}
	r = quotactl("--tls-ca", dir+"/ca.pem", "--tls-cert", dir+"/gw.pem", "--tls-key", dir+"/gw-key.pem",
		"check", "--agent", addr, "--limit", fakeLimit, "--count", "3").want(t, 0)
	if calls, _, _ := f.stats(); calls != 3 {
		t.Fatalf("the agent saw %d calls, want 3:\n%s", calls, r.stdout)
	}
}
