package auth

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
)

// Certificate identities are URI subject alternative names:
//
//	leasehold://agent/REGION   a region agent of REGION
//	leasehold://user/NAME      an admin user named in the auth config
//
// The subject's common name is for people reading the certificate; it is
// never trusted. A certificate with no leasehold:// URI, or with more than
// one, names nobody and is refused.
const (
	IdentityScheme = "leasehold"
	agentHost      = "agent"
	userHost       = "user"
)

var (
	nameRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)
	regionRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidUserName reports whether s may name a user: 1-64 of [A-Za-z0-9._@-],
// starting with a letter or digit.
func ValidUserName(s string) error {
	if !nameRe.MatchString(s) {
		return fmt.Errorf("user name %q: want 1-64 of [A-Za-z0-9._@-], starting with a letter or digit", s)
	}
	return nil
}

// ValidRegion reports whether s may name a region in a certificate (the
// allocator's own rule: [a-z0-9-], starting and ending with a letter or digit).
func ValidRegion(s string) error {
	if !regionRe.MatchString(s) {
		return fmt.Errorf("region %q: use [a-z0-9-], starting and ending with a letter or digit", s)
	}
	return nil
}

// AgentURI is the URI SAN of region's agent certificate.
func AgentURI(region string) *url.URL {
	return &url.URL{Scheme: IdentityScheme, Host: agentHost, Path: "/" + region}
}

// UserURI is the URI SAN of a user's client certificate.
func UserURI(name string) *url.URL {
	return &url.URL{Scheme: IdentityScheme, Host: userHost, Path: "/" + name}
}

// Identity is what a certificate names.
type Identity struct {
	Kind Kind   // KindAgent or KindUser
	Name string // the region of an agent, the name of a user
}

func (id Identity) String() string {
	if id.Kind == KindAgent {
		return "agent/" + id.Name
	}
	return "user/" + id.Name
}

// errNoIdentity: the certificate carries no leasehold:// URI.
var errNoIdentity = errors.New("certificate names no leasehold:// identity")

// IdentityOf reads the identity a certificate names. It does not verify
// the certificate: the TLS handshake did.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var ids []Identity
	for _, u := range cert.URIs {
		if u.Scheme != IdentityScheme {
			continue
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || len(u.Path) < 2 {
			return Identity{}, fmt.Errorf("certificate identity %q: want leasehold://agent/REGION or leasehold://user/NAME", u)
		}
		name := u.Path[1:]
		switch u.Host {
		case agentHost:
			if err := ValidRegion(name); err != nil {
				return Identity{}, fmt.Errorf("certificate identity %q: %w", u, err)
			}
			ids = append(ids, Identity{Kind: KindAgent, Name: name})
		case userHost:
			if err := ValidUserName(name); err != nil {
				return Identity{}, fmt.Errorf("certificate identity %q: %w", u, err)
			}
			ids = append(ids, Identity{Kind: KindUser, Name: name})
		default:
			return Identity{}, fmt.Errorf("certificate identity %q: want leasehold://agent/REGION or leasehold://user/NAME", u)
		}
	}
	switch len(ids) {
	case 0:
		return Identity{}, errNoIdentity
	case 1:
		return ids[0], nil
	}
	return Identity{}, fmt.Errorf("certificate names %d leasehold:// identities; want one", len(ids))
}
