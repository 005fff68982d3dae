// Package auth names the allocator's callers and decides what each may do.
//
// Authentication (who is calling) turns a TLS client certificate or a
// bearer token into a Principal; the transports (gRPC interceptors, the
// HTTP admin API) put it in the request's context with NewContext.
// Authorization (may they) is Principal.Allow, called by the service
// methods themselves so that every transport shares one decision, and one
// audit record of each refusal.
//
// Roles:
//
//	viewer  reads limits, their history and window reports
//	editor  what a viewer does, and changes limits whose ids match one of
//	        its scopes ("tenant/*", "tenant/atlas")
//	admin   everything, including the audit log
//
// Agents are principals of their own kind: they may only call the
// Allocator service, and only for the region their certificate names.
package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
)

// Errors of authentication and authorization. Transports map
// ErrUnauthenticated to gRPC Unauthenticated / HTTP 401 and ErrDenied to
// PermissionDenied / 403.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrDenied          = errors.New("permission denied")
)

// Role is an admin caller's role.
type Role int

// Roles, least to most powerful.
const (
	RoleNone Role = iota
	RoleViewer
	RoleEditor
	RoleAdmin
)

// String returns the role's name as written in configuration.
func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleEditor:
		return "editor"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole parses "viewer", "editor" or "admin".
func ParseRole(s string) (Role, error) {
	switch s {
	case "viewer":
		return RoleViewer, nil
	case "editor":
		return RoleEditor, nil
	case "admin":
		return RoleAdmin, nil
	}
	return RoleNone, fmt.Errorf("role %q: want viewer, editor or admin", s)
}

// Kind is what sort of caller a principal is.
type Kind int

// Kinds of principal.
const (
	// KindAnonymous is the caller when authentication is off: it may do
	// everything (development and tests only; the allocator warns).
	KindAnonymous Kind = iota
	// KindUser is a person or automation calling the Admin API.
	KindUser
	// KindAgent is a region agent calling the Allocator service.
	KindAgent
)

// Via says how a principal was authenticated.
type Via string

// Ways of authenticating.
const (
	ViaNone        Via = "none"
	ViaCertificate Via = "certificate"
	ViaToken       Via = "token"
)

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Kind Kind
	Role Role
	// Scopes are the limit-id patterns an editor may change (MatchScope).
	Scopes []string
	// Region is an agent's region, from its certificate.
	Region string
	Via    Via
}

// Anonymous is the principal of every caller while authentication is off.
var Anonymous = &Principal{Name: "anonymous", Kind: KindAnonymous, Role: RoleAdmin, Via: ViaNone}

// Action is something a caller asks to do.
type Action string

// Actions the allocator authorizes.
const (
	// ActionRead reads limits, their history and window reports.
	ActionRead Action = "read"
	// ActionWrite creates, changes or deletes one limit (dry runs too).
	ActionWrite Action = "write"
	// ActionAudit reads the audit log.
	ActionAudit Action = "audit"
	// ActionGroups changes the map of allocator groups.
	ActionGroups Action = "groups"
	// ActionLease acquires and returns leases and reports usage for a
	// region; only agents of that region may.
	ActionLease Action = "lease"
)

// Allow says whether p may do action. limitID is the limit written
// (ActionWrite); region the region leased for (ActionLease). The error
// wraps ErrDenied and says why in words fit for the caller and the audit
// log.
func (p *Principal) Allow(action Action, limitID, region string) error {
	if p == nil {
		return ErrUnauthenticated
	}
	if p.Kind == KindAnonymous {
		return nil
	}
	if action == ActionLease {
		switch {
		case p.Kind != KindAgent:
			return fmt.Errorf("%w: %s is not a region agent", ErrDenied, p.Name)
		case p.Region != region:
			return fmt.Errorf("%w: agent certificate is for region %q, not %q", ErrDenied, p.Region, region)
		}
		return nil
	}
	if p.Kind != KindUser {
		return fmt.Errorf("%w: %s may only call the Allocator service", ErrDenied, p.Name)
	}
	switch action {
	case ActionRead:
		if p.Role >= RoleViewer {
			return nil
		}
	case ActionWrite:
		if p.Role == RoleAdmin {
			return nil
		}
		if p.Role == RoleEditor {
			for _, s := range p.Scopes {
				if MatchScope(s, limitID) {
					return nil
				}
			}
			return fmt.Errorf("%w: %s (editor of %s) may not change %q", ErrDenied, p.Name, strings.Join(p.Scopes, ", "), limitID)
		}
	case ActionAudit, ActionGroups:
		if p.Role == RoleAdmin {
			return nil
		}
	}
	return fmt.Errorf("%w: %s (%s) may not %s", ErrDenied, p.Name, p.Role, action)
}

// ValidScope reports whether s is a scope pattern: a limit id, or a prefix
// ending in "/*" ("tenant/*"), or "*" for every limit.
func ValidScope(s string) error {
	if s == "" {
		return errors.New("empty scope")
	}
	if i := strings.IndexByte(s, '*'); i >= 0 && (i != len(s)-1 || (s != "*" && !strings.HasSuffix(s, "/*"))) {
		return fmt.Errorf("scope %q: '*' may only end it, after a '/'", s)
	}
	return nil
}

// MatchScope reports whether the limit id matches the scope pattern:
// "tenant/*" matches every id under "tenant/" (at any depth), "*" every id,
// anything else only itself.
func MatchScope(pattern, id string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, "/*"):
		return strings.HasPrefix(id, pattern[:len(pattern)-1]) && len(id) > len(pattern)-1
	}
	return pattern == id
}

type ctxKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal in ctx, or nil.
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(ctxKey{}).(*Principal)
	return p
}

// Authenticator turns a caller's credentials into a principal: the
// verified client certificate chain in state (nil without TLS or without
// a client certificate) or a bearer token ("" when none was sent). Both
// transports call it: gRPC from the peer and the "authorization" metadata,
// HTTP from Request.TLS and the Authorization header. Its errors wrap
// ErrUnauthenticated.
type Authenticator interface {
	Authenticate(state *tls.ConnectionState, bearer string) (*Principal, error)
}
