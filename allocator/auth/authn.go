package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// Reasons an authentication fails, as counted in
// leasehold_auth_failures_total{reason}.
const (
	ReasonMissing         = "missing"          // neither a client certificate nor a token
	ReasonBadToken        = "bad_token"        // a token no user has, or a malformed Authorization
	ReasonUnverified      = "unverified_cert"  // a certificate the TLS layer did not verify
	ReasonUnknownIdentity = "unknown_identity" // a verified certificate naming no leasehold:// identity
	ReasonUnknownUser     = "unknown_user"     // a user certificate for a user not in the auth file
	ReasonMismatch        = "mismatch"         // a certificate and a token naming different callers
)

// Failure is an authentication failure. It wraps ErrUnauthenticated and
// says why, in a reason fit for a metric label and words fit for a log
// line (and the caller: it gives nothing away the caller does not know).
type Failure struct {
	Reason string
	Msg    string
}

func (f *Failure) Error() string { return ErrUnauthenticated.Error() + ": " + f.Msg }

// Unwrap makes errors.Is(f, ErrUnauthenticated) hold.
func (f *Failure) Unwrap() error { return ErrUnauthenticated }

func fail(reason, format string, args ...any) error {
	return &Failure{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// FailureReason is the reason of an authentication error ("other" when it
// is not a *Failure).
func FailureReason(err error) string {
	var f *Failure
	if errors.As(err, &f) {
		return f.Reason
	}
	return "other"
}

// maxTokenLen bounds a presented token (NewToken makes 47 characters).
const maxTokenLen = 512

// Users authenticates callers against an auth file: a verified client
// certificate naming leasehold://agent/REGION is that region's agent; one
// naming leasehold://user/NAME is that user if the file lists them; a
// bearer token is the user whose token hashes to it. The zero value is not
// usable: create it with NewUsers. It is safe for concurrent use, Reload
// included.
type Users struct {
	cur atomic.Pointer[userTable]
}

type userTable struct {
	byName map[string]*userEntry
	tokens []tokenEntry // every token hash, checked in full on each call
}

type userEntry struct {
	byCert, byToken *Principal
}

type tokenEntry struct {
	hash [sha256.Size]byte
	user *userEntry
}

// NewUsers returns an authenticator of c's users (c must be valid: see
// Config.Validate).
func NewUsers(c *Config) (*Users, error) {
	u := &Users{}
	if err := u.Reload(c); err != nil {
		return nil, err
	}
	return u, nil
}

// Reload replaces the users with c's; calls in flight finish with the old
// ones. An invalid c changes nothing.
func (u *Users) Reload(c *Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	t := &userTable{byName: map[string]*userEntry{}}
	for _, uc := range c.Users {
		role, _ := ParseRole(uc.Role)
		p := Principal{Name: uc.Name, Kind: KindUser, Role: role, Scopes: append([]string(nil), uc.Scopes...)}
		byCert, byToken := p, p
		byCert.Via, byToken.Via = ViaCertificate, ViaToken
		e := &userEntry{byCert: &byCert, byToken: &byToken}
		t.byName[uc.Name] = e
		for _, h := range uc.Tokens {
			var te tokenEntry
			_, _ = hex.Decode(te.hash[:], []byte(strings.TrimPrefix(h, hashPrefix)))
			te.user = e
			t.tokens = append(t.tokens, te)
		}
	}
	u.cur.Store(t)
	return nil
}

// Authenticate implements Authenticator. When a certificate and a token
// both come, both must be valid and name the same user.
func (u *Users) Authenticate(state *tls.ConnectionState, bearer string) (*Principal, error) {
	t := u.cur.Load()
	var byCert *Principal
	if state != nil && len(state.PeerCertificates) > 0 {
		if len(state.VerifiedChains) == 0 {
			return nil, fail(ReasonUnverified, "client certificate not verified")
		}
		id, err := IdentityOf(state.PeerCertificates[0])
		if err != nil {
			return nil, fail(ReasonUnknownIdentity, "%v", err)
		}
		switch id.Kind {
		case KindAgent:
			byCert = &Principal{Name: id.String(), Kind: KindAgent, Region: id.Name, Via: ViaCertificate}
		default:
			e, ok := t.byName[id.Name]
			if !ok {
				return nil, fail(ReasonUnknownUser, "certificate of user %q, who is not in the auth file", id.Name)
			}
			byCert = e.byCert
		}
	}
	if bearer == "" {
		if byCert == nil {
			return nil, fail(ReasonMissing, "no client certificate and no bearer token")
		}
		return byCert, nil
	}
	byToken := t.token(bearer)
	switch {
	case byToken == nil:
		return nil, fail(ReasonBadToken, "bearer token not recognised")
	case byCert == nil:
		return byToken, nil
	case byCert.Kind != KindUser || byCert.Name != byToken.Name:
		return nil, fail(ReasonMismatch, "the client certificate and the bearer token name different callers")
	}
	return byCert, nil
}

// token returns the user whose token hashes to bearer. It compares the
// hash with every stored one in constant time and never stops early, so
// timing tells nothing about which hash came close.
func (t *userTable) token(bearer string) *Principal {
	if len(bearer) > maxTokenLen {
		return nil
	}
	h := sha256.Sum256([]byte(bearer))
	var found *userEntry
	for i := range t.tokens {
		if subtle.ConstantTimeCompare(h[:], t.tokens[i].hash[:]) == 1 {
			found = t.tokens[i].user
		}
	}
	if found == nil {
		return nil
	}
	return found.byToken
}
