package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	stdlog "log"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// tlsFlags are the TLS flags a command shares: its own certificate, the
// CA it trusts for outgoing calls and the CA its callers' certificates
// must chain to. A command registers the ones it uses.
type tlsFlags struct {
	cert, key string // this process's certificate and key (PEM files)
	ca        string // trust for outgoing calls (PEM bundle)
	clientCA  string // callers' certificates must chain to this (PEM bundle)
}

func (t *tlsFlags) registerServe(fs *flag.FlagSet, what string) {
	fs.StringVar(&t.cert, "tls-cert", "", "`FILE`: PEM certificate served on "+what+" (with -tls-key); empty serves plaintext")
	fs.StringVar(&t.key, "tls-key", "", "`FILE`: PEM private key of -tls-cert")
}

func (t *tlsFlags) registerCA(fs *flag.FlagSet, what string) {
	fs.StringVar(&t.ca, "tls-ca", "", "`FILE`: PEM CA bundle trusted for "+what+"; empty dials plaintext")
}

func (t *tlsFlags) registerClientCA(fs *flag.FlagSet, what string) {
	fs.StringVar(&t.clientCA, "tls-client-ca", "", "`FILE`: PEM CA bundle that "+what)
}

// validate checks that the flags go together (the files are read when
// the command starts).
func (t *tlsFlags) validate() error {
	switch {
	case (t.cert == "") != (t.key == ""):
		return usagef("-tls-cert and -tls-key: give both or neither")
	case t.clientCA != "" && t.cert == "":
		return usagef("-tls-client-ca needs -tls-cert and -tls-key (client certificates only travel over TLS)")
	}
	return nil
}

// readPool reads a PEM CA bundle.
func readPool(flagName, file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("-%s: %w", flagName, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("-%s %s: no PEM certificate in it", flagName, file)
	}
	return p, nil
}

// keyPair loads a certificate and its key, naming the flags in the error.
func keyPair(certFlag, cert, keyFlag, key string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("-%s %s / -%s %s: %w", certFlag, cert, keyFlag, key, err)
	}
	return &c, nil
}

// serverTLS is a server's TLS configuration, read from files and read
// again by Reload (certificate rotation without a restart: new
// handshakes use the new files, connections already up keep theirs).
type serverTLS struct {
	certFile, keyFile, clientCAFile string
	clientAuth                      tls.ClientAuthType
	cur                             atomic.Pointer[tls.Config]
}

// newServerTLS reads the files. With a client CA, callers' certificates
// are verified against it: required when requireClient, else verified if
// given (the allocator: users may come with a token only).
func newServerTLS(f tlsFlags, requireClient bool) (*serverTLS, error) {
	s := &serverTLS{certFile: f.cert, keyFile: f.key, clientCAFile: f.clientCA, clientAuth: tls.NoClientCert}
	if f.clientCA != "" {
		s.clientAuth = tls.VerifyClientCertIfGiven
		if requireClient {
			s.clientAuth = tls.RequireAndVerifyClientCert
		}
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the files again; on an error the old configuration stays.
func (s *serverTLS) Reload() error {
	cert, err := keyPair("tls-cert", s.certFile, "tls-key", s.keyFile)
	if err != nil {
		return err
	}
	c := &tls.Config{Certificates: []tls.Certificate{*cert}, ClientAuth: s.clientAuth, MinVersion: tls.VersionTLS12}
	if s.clientCAFile != "" {
		if c.ClientCAs, err = readPool("tls-client-ca", s.clientCAFile); err != nil {
			return err
		}
	}
	s.cur.Store(c)
	return nil
}

// Config is the configuration to serve with: every handshake takes the
// files as last (re)loaded.
func (s *serverTLS) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return s.cur.Load(), nil
	}}
}

// clientTLS is the configuration of outgoing calls: trust caFile (empty:
// the system's roots) and present cert/key when the server asks (empty:
// none). The certificate is read again by the returned reload function.
func clientTLS(caFlag, caFile, certFlag, certFile, keyFlag, keyFile string) (*tls.Config, func() error, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		p, err := readPool(caFlag, caFile)
		if err != nil {
			return nil, nil, err
		}
		c.RootCAs = p
	}
	reload := func() error { return nil }
	if certFile != "" {
		var cur atomic.Pointer[tls.Certificate]
		reload = func() error {
			kp, err := keyPair(certFlag, certFile, keyFlag, keyFile)
			if err != nil {
				return err
			}
			cur.Store(kp)
			return nil
		}
		if err := reload(); err != nil {
			return nil, nil, err
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cur.Load(), nil }
	}
	return c, reload, nil
}

// dialCreds is the dial option of cfg: TLS, or plaintext when cfg is nil.
func dialCreds(cfg *tls.Config) grpc.DialOption {
	if cfg == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// onHangup runs each reload on SIGHUP until ctx ends, logging the outcome.
func onHangup(ctx context.Context, log *slog.Logger, reloads map[string]func() error) {
	if len(reloads) == 0 {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
			for what, f := range reloads {
				if err := f(); err != nil {
					log.Error("reload failed; keeping the previous "+what, "err", err)
				} else {
					log.Info("reloaded " + what)
				}
			}
		}
	}()
}

// httpErrorLog sends an HTTP server's own errors (failed TLS handshakes:
// untrusted or expired client certificates, plaintext requests) to log at
// info level.
func httpErrorLog(log *slog.Logger) *stdlog.Logger {
	return slog.NewLogLogger(log.Handler(), slog.LevelInfo)
}
