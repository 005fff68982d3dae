package main

import (
	"context"
	"crypto/tls"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
	"leasehold/regionagent"
)

// An agent's rediss:// Redis is called over TLS, trusting -tls-ca: a
// real redis-server serving TLS only.
func TestRedisTLS(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	dir, _ := writeTestCerts(t, "--users", "", "--regions", "eu", "--hosts", "127.0.0.1")
	addr := ports.Addr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, serverCertFile), "--tls-key-file", filepath.Join(dir, serverKeyFile),
		"--tls-ca-cert-file", filepath.Join(dir, caCertFile), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	cfg, _, err := clientTLS("tls-ca", filepath.Join(dir, caCertFile), "", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := regionagent.ParseRedisTLS("rediss://"+addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PING over TLS: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond) // redis-server starting
	}
	// Without the CA the server's certificate is not trusted; in
	// plaintext the server does not answer.
	for name, spec := range map[string]string{"system roots": "rediss://" + addr, "plaintext": "redis://" + addr} {
		var c *tls.Config
		if name == "plaintext" {
			c = cfg
		}
		r, err := regionagent.ParseRedisTLS(spec, c)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := r.Ping(ctx).Err(); err == nil {
			t.Errorf("%s: PING answered", name)
		}
		cancel()
		r.Close()
	}
}
