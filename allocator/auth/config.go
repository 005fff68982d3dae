package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is the auth file (`leasehold allocator --auth-file`): the admin
// users, their roles and scopes, and the hashes of their bearer tokens.
// Agents are not listed: a certificate of the trusted client CA naming
// leasehold://agent/REGION is enough.
//
//	users:
//	  - name: alice
//	    role: admin
//	    tokens: [sha256:9f86d0...]
//	  - name: bob
//	    role: editor
//	    scopes: [tenant/*]
//	    tokens: [sha256:...]
//
// A user may have several tokens (rotation: add the new hash, move the
// callers, remove the old one) or none (client certificate only).
type Config struct {
	Users []UserConfig `yaml:"users"`
}

// UserConfig is one admin user.
type UserConfig struct {
	Name   string   `yaml:"name"`
	Role   string   `yaml:"role"`
	Scopes []string `yaml:"scopes,omitempty"`
	// Tokens are "sha256:" and the hex SHA-256 of each bearer token.
	Tokens []string `yaml:"tokens,omitempty"`
}

// Limits of an auth file.
const (
	maxConfigBytes = 1 << 20
	maxUsers       = 10000
	maxPerUser     = 100 // scopes, tokens
)

// TokenPrefix starts every token NewToken makes, so a leaked token is
// easy to recognise (and to scan for).
const TokenPrefix = "lht_"

const hashPrefix = "sha256:"

// NewToken returns a new bearer token: TokenPrefix and 256 random bits,
// base64url.
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// HashToken returns the form a token is stored in: "sha256:" and the hex
// SHA-256 of the token. A plain hash is enough because tokens are 256
// random bits, not passwords: there is no dictionary to try, and a slow
// hash would only slow every request (docs/security.md).
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hashPrefix + hex.EncodeToString(h[:])
}

// LoadConfig reads and checks the auth file at path.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes and checks an auth file. Unknown fields, a second
// YAML document, duplicate users or tokens, and bad roles, scopes or
// hashes are errors naming the field (users[1].role).
func ParseConfig(data []byte) (*Config, error) {
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxConfigBytes)
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("yaml: want one document")
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks c; its errors name the field.
func (c *Config) Validate() error {
	if len(c.Users) > maxUsers {
		return fmt.Errorf("users: more than %d", maxUsers)
	}
	names := map[string]bool{}
	tokens := map[string]string{}
	for i, u := range c.Users {
		f := fmt.Sprintf("users[%d]", i)
		if err := ValidUserName(u.Name); err != nil {
			return fmt.Errorf("%s.name: %w", f, err)
		}
		if names[u.Name] {
			return fmt.Errorf("%s.name: %q appears twice", f, u.Name)
		}
		names[u.Name] = true
		role, err := ParseRole(u.Role)
		if err != nil {
			return fmt.Errorf("%s.role: %w", f, err)
		}
		if len(u.Scopes) > maxPerUser || len(u.Tokens) > maxPerUser {
			return fmt.Errorf("%s: more than %d scopes or tokens", f, maxPerUser)
		}
		switch {
		case role == RoleEditor && len(u.Scopes) == 0:
			return fmt.Errorf("%s.scopes: an editor needs at least one scope, e.g. tenant/*", f)
		case role != RoleEditor && len(u.Scopes) > 0:
			return fmt.Errorf("%s.scopes: only editors have scopes (a %s reads everything it may)", f, role)
		}
		for j, s := range u.Scopes {
			if err := ValidScope(s); err != nil {
				return fmt.Errorf("%s.scopes[%d]: %w", f, j, err)
			}
		}
		for j, t := range u.Tokens {
			tf := fmt.Sprintf("%s.tokens[%d]", f, j)
			if err := validHash(t); err != nil {
				return fmt.Errorf("%s: %w", tf, err)
			}
			if other, ok := tokens[t]; ok {
				return fmt.Errorf("%s: the same token hash as %s", tf, other)
			}
			tokens[t] = tf
		}
	}
	return nil
}

func validHash(s string) error {
	h, ok := strings.CutPrefix(s, hashPrefix)
	if !ok || len(h) != 2*sha256.Size || strings.ToLower(h) != h {
		return errors.New(`want "sha256:" and 64 lowercase hex digits (the hash, never the token)`)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return errors.New(`want "sha256:" and 64 lowercase hex digits (the hash, never the token)`)
	}
	return nil
}

// Marshal encodes c as an auth file.
func (c *Config) Marshal() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# Leasehold auth file (docs/security.md). Tokens are stored as SHA-256\n# hashes: the tokens themselves are never written.\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
