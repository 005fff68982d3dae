package auth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"leasehold/internal/vocab"
)

// Guard authenticates every call of a server's transports and puts the
// caller's Principal in the request's context. With a nil Authenticator
// authentication is off and every caller is Anonymous. Safe for
// concurrent use.
type Guard struct {
	authn    Authenticator
	log      *slog.Logger
	failures *prometheus.CounterVec
	lastLog  atomic.Int64 // unix ns of the last failure logged
}

// NewGuard returns a guard authenticating with a (nil: authentication
// off). It registers leasehold_auth_failures_total{reason} on reg.
func NewGuard(a Authenticator, log *slog.Logger, reg prometheus.Registerer) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Guard{authn: a, log: log, failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_auth_failures_total",
		Help: "Calls refused because their credentials were missing or invalid, by reason.",
	}, []string{"reason"})}
	if reg != nil {
		reg.MustRegister(g.failures)
	}
	return g
}

// Enabled reports whether authentication is on.
func (g *Guard) Enabled() bool { return g.authn != nil }

// openMethods are callable without credentials: health checks (load
// balancers and probes have none) and reflection (it lists services, not
// data).
var openMethods = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

func isOpen(method string) bool {
	for _, p := range openMethods {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

// ServerOptions returns the unary and stream interceptors.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.Unary), grpc.ChainStreamInterceptor(g.Stream)}
}

// Unary is the unary server interceptor.
func (g *Guard) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := g.grpcContext(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// Stream is the stream server interceptor.
func (g *Guard) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := g.grpcContext(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

func (g *Guard) grpcContext(ctx context.Context, method string) (context.Context, error) {
	if g.authn == nil {
		return NewContext(ctx, Anonymous), nil
	}
	if isOpen(method) {
		return ctx, nil
	}
	var state *tls.ConnectionState
	addr := ""
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			addr = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &ti.State
		}
	}
	var bearer string
	var err error
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		bearer, err = bearerOf(md.Get(vocab.AuthorizationMetadataKey))
	}
	var pr *Principal
	if err == nil {
		pr, err = g.authn.Authenticate(state, bearer)
	}
	if err != nil {
		g.refused("grpc", method, addr, err)
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	return NewContext(ctx, pr), nil
}

// bearerOf reads the token of an Authorization value: "" when there is
// none, an error when it is not one "Bearer TOKEN".
func bearerOf(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fail(ReasonBadToken, "more than one authorization value")
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" {
		return "", fail(ReasonBadToken, "authorization: want \"Bearer TOKEN\"")
	}
	return tok, nil
}

// logEvery: authentication failures are logged at most this often (the
// metric counts every one), so a flood of bad calls cannot flood the log.
const logEvery = time.Second

func (g *Guard) refused(transport, method, addr string, err error) {
	reason := FailureReason(err)
	g.failures.WithLabelValues(reason).Inc()
	now := time.Now().UnixNano()
	last := g.lastLog.Load()
	if now-last < int64(logEvery) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.log.Warn("authentication failed", "transport", transport, "method", method, "peer", addr, "reason", reason, "err", err)
}

// AuthenticateRequest authenticates an HTTP request from its verified
// client certificate (r.TLS) and its "Authorization: Bearer" header. With
// authentication off it returns Anonymous. Failures are counted and
// logged; the error wraps ErrUnauthenticated.
func (g *Guard) AuthenticateRequest(r *http.Request) (*Principal, error) {
	if g.authn == nil {
		return Anonymous, nil
	}
	bearer, err := bearerOf(r.Header.Values("Authorization"))
	var p *Principal
	if err == nil {
		p, err = g.authn.Authenticate(r.TLS, bearer)
	}
	if err != nil {
		g.refused("http", r.Method+" "+r.URL.Path, r.RemoteAddr, err)
		return nil, err
	}
	return p, nil
}

// Middleware authenticates each request before next sees it, with the
// principal in its context; an unauthenticated one gets 401 with
// WWW-Authenticate: Bearer and an RFC 9457 problem.
func (g *Guard) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := g.AuthenticateRequest(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:leasehold:problem:unauthenticated",
				"title": "Unauthorized", "status": http.StatusUnauthorized, "detail": err.Error()})
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), p)))
	})
}

// Authenticator returns g's Authenticator with every failure counted and
// logged as the interceptors do (for a transport that authenticates by
// itself, such as the HTTP admin API); nil when authentication is off.
func (g *Guard) Authenticator() Authenticator {
	if g.authn == nil {
		return nil
	}
	return countedAuthn{g}
}

type countedAuthn struct{ g *Guard }

func (c countedAuthn) Authenticate(state *tls.ConnectionState, bearer string) (*Principal, error) {
	p, err := c.g.authn.Authenticate(state, bearer)
	if err != nil {
		c.g.refused("http", "", "", err)
	}
	return p, err
}

// Require serves next only to callers authenticated (as Middleware does)
// and allowed action; others get 401 or 403 with an RFC 9457 problem.
func (g *Guard) Require(action Action, next http.Handler) http.Handler {
	return g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := FromContext(r.Context()).Allow(action, "", ""); err != nil {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:leasehold:problem:forbidden",
				"title": "Forbidden", "status": http.StatusForbidden, "detail": err.Error()})
			return
		}
		next.ServeHTTP(w, r)
	}))
}
