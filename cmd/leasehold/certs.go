package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"leasehold/allocator/auth"
	"leasehold/allocator/auth/devca"
)

// certsConfig is everything `leasehold certs` takes.
type certsConfig struct {
	dir, regions, users, hosts string
	valid                      time.Duration
	force                      bool
}

func (c *certsConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "`DIR` to write the CA, certificates, keys and auth.yaml into (required)")
	fs.StringVar(&c.regions, "regions", "eu,us", "comma-separated regions: one agent client certificate each (leasehold://agent/REGION)")
	fs.StringVar(&c.users, "users", "admin:admin", "comma-separated `NAME:ROLE[:SCOPE...]` (roles viewer, editor, admin; editors need scopes, e.g. bob:editor:tenant/*): a client certificate and a bearer token each")
	fs.StringVar(&c.hosts, "hosts", "localhost,127.0.0.1,::1", "comma-separated DNS names and IP addresses of the server certificate")
	fs.DurationVar(&c.valid, "valid", 720*time.Hour, "how long the certificates are valid")
	fs.BoolVar(&c.force, "force", false, "replace existing files (a new CA: every certificate it signed stops being trusted)")
}

// certSpec is what to issue.
type certSpec struct {
	regions []string
	users   []auth.UserConfig // without tokens
	hosts   []string
	valid   time.Duration
}

// dnsNameRe is a DNS name a certificate may carry (a leading "*." allowed).
var dnsNameRe = regexp.MustCompile(`^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// maxValid is the longest --valid.
const maxValid = 10 * 365 * 24 * time.Hour

func (c *certsConfig) spec() (certSpec, error) {
	var s certSpec
	if c.dir == "" {
		return s, usagef("-dir is required, e.g. -dir ./leasehold-certs")
	}
	if c.valid < time.Minute || c.valid > maxValid {
		return s, usagef("-valid %v: want 1m to %v", c.valid, maxValid)
	}
	s.valid = c.valid
	seen := map[string]bool{}
	for _, r := range splitList(c.regions) {
		if err := auth.ValidRegion(r); err != nil {
			return s, usagef("-regions: %v", err)
		}
		if seen[r] {
			return s, usagef("-regions: %q twice", r)
		}
		seen[r] = true
		s.regions = append(s.regions, r)
	}
	for _, u := range splitList(c.users) {
		parts := strings.Split(u, ":")
		if len(parts) < 2 {
			return s, usagef("-users %q: want NAME:ROLE[:SCOPE...]", u)
		}
		uc := auth.UserConfig{Name: parts[0], Role: parts[1], Scopes: parts[2:]}
		s.users = append(s.users, uc)
	}
	if err := (&auth.Config{Users: s.users}).Validate(); err != nil {
		return s, usagef("-users: %v", strings.ReplaceAll(err.Error(), "users[", "user ["))
	}
	if len(s.regions) == 0 && len(s.users) == 0 {
		return s, usagef("-regions and -users are both empty: nothing to issue but the server certificate")
	}
	for _, h := range splitList(c.hosts) {
		if net.ParseIP(h) == nil && !dnsNameRe.MatchString(h) {
			return s, usagef("-hosts %q: not a DNS name or an IP address", h)
		}
		s.hosts = append(s.hosts, h)
	}
	if len(s.hosts) == 0 {
		return s, usagef("-hosts: at least one name or address is required")
	}
	return s, nil
}

// Files `leasehold certs` writes, under -dir.
const (
	caCertFile     = "ca.pem"
	caKeyFile      = "ca-key.pem"
	serverCertFile = "server.pem"
	serverKeyFile  = "server-key.pem"
	authFileName   = "auth.yaml"
)

func agentFiles(region string) (cert, key string) {
	return "agent-" + region + ".pem", "agent-" + region + "-key.pem"
}

func userFiles(name string) (cert, key string) {
	return "user-" + name + ".pem", "user-" + name + "-key.pem"
}

// files lists every file the spec writes besides the CA's.
func (s certSpec) files() []string {
	out := []string{serverCertFile, serverKeyFile, authFileName}
	for _, r := range s.regions {
		c, k := agentFiles(r)
		out = append(out, c, k)
	}
	for _, u := range s.users {
		c, k := userFiles(u.Name)
		out = append(out, c, k)
	}
	return out
}

func runCertsCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	var c certsConfig
	fset := flag.NewFlagSet("certs", flag.ContinueOnError)
	c.register(fset)
	pos, err := parseFlags(fset, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	spec, err := c.spec()
	if err != nil {
		return err
	}
	if !c.force {
		for _, f := range append([]string{caCertFile, caKeyFile}, spec.files()...) {
			if _, err := os.Lstat(filepath.Join(c.dir, f)); err == nil || !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%s exists: nothing written (-force replaces every file, the CA too)", filepath.Join(c.dir, f))
			}
		}
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	now := time.Now()
	ca, err := devca.New("Leasehold development CA", now.Add(-time.Minute), now.Add(spec.valid))
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c.dir, caKeyFile), ca.KeyPEM(), 0o600); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c.dir, caCertFile), ca.CertPEM(), 0o644); err != nil {
		return err
	}
	tokens, err := issueAll(c.dir, ca, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote a CA, a server certificate for %s, %d agent and %d user certificates, and %s to %s\n",
		strings.Join(spec.hosts, ","), len(spec.regions), len(spec.users), authFileName, c.dir)
	fmt.Fprintf(stdout, "bearer tokens (shown once: %s keeps only their SHA-256):\n", authFileName)
	for _, u := range spec.users {
		fmt.Fprintf(stdout, "  %s (%s): %s\n", u.Name, u.Role, tokens[u.Name])
	}
	return nil
}

// issueAll issues the server, agent and user certificates of spec with ca
// and writes them, their keys (0600) and the auth file (0600, a new token
// per user) into dir. It returns each user's token.
func issueAll(dir string, ca *devca.CA, spec certSpec) (map[string]string, error) {
	write := func(certName, keyName string, p devca.Pair) error {
		if err := writeFile(filepath.Join(dir, keyName), p.KeyPEM, 0o600); err != nil {
			return err
		}
		return writeFile(filepath.Join(dir, certName), p.CertPEM, 0o644)
	}
	p, err := ca.Server(spec.hosts, spec.valid)
	if err != nil {
		return nil, err
	}
	if err := write(serverCertFile, serverKeyFile, p); err != nil {
		return nil, err
	}
	for _, r := range spec.regions {
		if p, err = ca.Agent(r, spec.valid); err != nil {
			return nil, err
		}
		c, k := agentFiles(r)
		if err := write(c, k, p); err != nil {
			return nil, err
		}
	}
	tokens := map[string]string{}
	cfg := &auth.Config{}
	for _, u := range spec.users {
		if p, err = ca.User(u.Name, spec.valid); err != nil {
			return nil, err
		}
		c, k := userFiles(u.Name)
		if err := write(c, k, p); err != nil {
			return nil, err
		}
		tok, err := auth.NewToken()
		if err != nil {
			return nil, err
		}
		tokens[u.Name] = tok
		u.Tokens = []string{auth.HashToken(tok)}
		cfg.Users = append(cfg.Users, u)
	}
	b, err := cfg.Marshal()
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, authFileName), b, 0o600); err != nil {
		return nil, err
	}
	return tokens, nil
}

// writeFile writes data to path with perm, through a temporary file and a
// rename, so a reader never sees half a key.
func writeFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// devCerts prepares dev's TLS state in dir: the CA is made once and
// reused across runs; the server, agent and user certificates, and the
// dev user's token, are new on every run. It returns the token.
func devCerts(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	certPEM, cerr := os.ReadFile(filepath.Join(dir, caCertFile))
	keyPEM, kerr := os.ReadFile(filepath.Join(dir, caKeyFile))
	var ca *devca.CA
	var err error
	switch {
	case cerr == nil && kerr == nil:
		if ca, err = devca.Load(certPEM, keyPEM); err != nil {
			return "", fmt.Errorf("%s: %w", dir, err)
		}
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
		now := time.Now()
		if ca, err = devca.New("Leasehold dev CA", now.Add(-time.Minute), now.Add(maxValid)); err != nil {
			return "", err
		}
		if err := writeFile(filepath.Join(dir, caKeyFile), ca.KeyPEM(), 0o600); err != nil {
			return "", err
		}
		if err := writeFile(filepath.Join(dir, caCertFile), ca.CertPEM(), 0o644); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("%s: the dev CA is incomplete (%v, %v): remove the directory to start afresh", dir, cerr, kerr)
	}
	tokens, err := issueAll(dir, ca, certSpec{
		regions: []string{"eu", "us"},
		users:   []auth.UserConfig{{Name: devUser, Role: "admin"}},
		hosts:   []string{"localhost", "127.0.0.1", "::1"},
		valid:   720 * time.Hour,
	})
	if err != nil {
		return "", err
	}
	return tokens[devUser], nil
}

// devUser is the admin user `leasehold dev --tls` creates, and its files.
const (
	devUser     = "dev"
	devUserCert = "user-" + devUser + ".pem"
	devUserKey  = "user-" + devUser + "-key.pem"
)
