package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/internal/vocab"
)

// tokenEnv names the environment variable read for a bearer token when
// neither --token nor --token-file is given.
const tokenEnv = "LEASEHOLD_TOKEN"

// maxTokenFile bounds what --token-file reads.
const maxTokenFile = 64 << 10

// security is how quotactl connects and who it says it is: plaintext by
// default; TLS when a CA, a client certificate or --tls is given; a bearer
// token from --token, --token-file or $LEASEHOLD_TOKEN.
type security struct {
	tls        bool   // --tls: TLS with the system's roots
	ca         string // --tls-ca: PEM file of the CA(s) to trust
	cert, key  string // --tls-cert, --tls-key: client certificate and key
	serverName string // --tls-server-name
	token      string // --token
	tokenFile  string // --token-file
}

func (s *security) register(f *flagSet) {
	f.boolVar(&s.tls, "tls", "use TLS, trusting the system's root CAs (implied by --tls-ca, --tls-cert)")
	f.stringVar(&s.ca, "tls-ca", "`FILE`: PEM CA certificate(s) that sign the allocator's (and agent's) certificate; turns TLS on")
	f.stringVar(&s.cert, "tls-cert", "`FILE`: PEM client certificate, to authenticate by certificate (with --tls-key); turns TLS on")
	f.stringVar(&s.key, "tls-key", "`FILE`: PEM private key of --tls-cert")
	f.stringVar(&s.serverName, "tls-server-name", "`NAME`: name to verify in the server's certificate (default: the host of the address)")
	f.stringVar(&s.token, "token", "`TOKEN`: bearer token (prefer --token-file or $"+tokenEnv+": a flag shows in the process list); needs TLS")
	f.stringVar(&s.tokenFile, "token-file", "`FILE`: file holding the bearer token (surrounding white space ignored); needs TLS")
}

// on reports whether TLS is used.
func (s *security) on() bool { return s.tls || s.ca != "" || s.cert != "" || s.key != "" }

// tlsConfig builds the client TLS configuration. Errors are usage errors
// naming the flag.
func (s *security) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.serverName}
	if s.ca != "" {
		pem, err := readSmall(s.ca, 1<<20)
		if err != nil {
			return nil, usagef("--tls-ca %q: %v", s.ca, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--tls-ca %q: no PEM certificate in the file", s.ca)
		}
		cfg.RootCAs = pool
	}
	switch {
	case s.cert != "" && s.key == "":
		return nil, usagef("--tls-cert needs --tls-key")
	case s.key != "" && s.cert == "":
		return nil, usagef("--tls-key needs --tls-cert")
	case s.cert != "":
		pair, err := tls.LoadX509KeyPair(s.cert, s.key)
		if err != nil {
			return nil, usagef("--tls-cert %q, --tls-key %q: %v", s.cert, s.key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// bearer returns the token to send, "" for none: --token, else
// --token-file, else $LEASEHOLD_TOKEN.
func (s *security) bearer() (token, from string, err error) {
	switch {
	case s.token != "":
		token, from = s.token, "--token"
	case s.tokenFile != "":
		b, err := readSmall(s.tokenFile, maxTokenFile)
		if err != nil {
			return "", "", usagef("--token-file %q: %v", s.tokenFile, err)
		}
		token, from = strings.TrimSpace(string(b)), "--token-file"
		if token == "" {
			return "", "", usagef("--token-file %q: the file is empty", s.tokenFile)
		}
	default:
		token, from = strings.TrimSpace(os.Getenv(tokenEnv)), "$"+tokenEnv
	}
	for _, r := range token {
		if r < 0x21 || r > 0x7e {
			return "", "", usagef("%s: a token is printable ASCII without spaces", from)
		}
	}
	return token, from, nil
}

// dialOptions returns the gRPC dial options: transport credentials and,
// when withToken and a token is configured, the bearer token on every
// call. A token is never sent in plaintext: without TLS it is a usage
// error.
func (s *security) dialOptions(withToken bool) ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if s.on() {
		cfg, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		if s.serverName != "" {
			return nil, usagef("--tls-server-name needs TLS (--tls, --tls-ca or --tls-cert)")
		}
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if !withToken {
		return opts, nil
	}
	token, from, err := s.bearer()
	if err != nil {
		return nil, err
	}
	if token != "" {
		if !s.on() {
			return nil, usagef("%s: a token is only sent over TLS: give --tls-ca (or --tls)", from)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCreds(token)))
	}
	return opts, nil
}

// bearerCreds sends "authorization: Bearer TOKEN" with every call, over TLS
// only.
type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{vocab.AuthorizationMetadataKey: "Bearer " + string(b)}, nil
}

func (bearerCreds) RequireTransportSecurity() bool { return true }

// readSmall reads a file of at most limit bytes.
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, unwrapPath(err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// unwrapPath drops the path from an *os.PathError: callers name the file.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
