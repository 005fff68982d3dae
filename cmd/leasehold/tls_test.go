package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"leasehold/allocator/auth/devca"
)

// Certificate rotation: after Reload new handshakes get the new files; a
// file that does not load keeps the old configuration. SIGHUP runs the
// reloads.
func TestServerTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.New("ca", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	issue := func() []byte {
		p, err := ca.Server([]string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeFile(keyFile, p.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := writeFile(certFile, p.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		leaf, _ := p.Leaf()
		return leaf.Raw
	}
	first := issue()
	st, err := newServerTLS(tlsFlags{cert: certFile, key: keyFile}, false)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, st.Config())
	defer tl.Close()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	served := func() []byte {
		c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: ca.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	if string(served()) != string(first) {
		t.Fatal("not the first certificate")
	}
	second := issue()
	if string(served()) != string(first) {
		t.Fatal("changed before a reload")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reloaded := make(chan error, 1)
	onHangup(ctx, slog.New(slog.DiscardHandler), map[string]func() error{"test": func() error {
		err := st.Reload()
		reloaded <- err
		return err
	}})
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reloaded:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not reload")
	}
	if string(served()) != string(second) {
		t.Fatal("the reload did not take the new certificate")
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.Reload(); err == nil {
		t.Fatal("a broken key was accepted")
	}
	if string(served()) != string(second) {
		t.Fatal("a failed reload changed the certificate")
	}
}
