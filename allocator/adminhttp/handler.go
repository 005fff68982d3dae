// Package adminhttp serves the allocator's Admin API as JSON over HTTP.
//
// Every route turns its request into the Admin service's request message,
// calls the service in process (the same methods the gRPC server calls, so
// validation, authorization and audit are the gRPC ones) and writes the
// response message as JSON: protojson with the proto field names
// ("limit_tokens", not "limitTokens"). Errors are RFC 9457 problem details.
// A limit's version is its entity tag: GET and PUT answer with
// ETag: "<version>", and If-Match: "<version>" makes a PUT or DELETE
// conditional (412 Precondition Failed when the limit moved).
//
// The routes, parameters, schemas and status codes are described by the
// OpenAPI 3.1 document openapi.yaml, embedded and served at
// GET /v1/openapi.yaml; docs/admin-http.md is the guide.
package adminhttp

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"leasehold/allocator"
	"leasehold/allocator/auth"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// OpenAPI is the OpenAPI 3.1 document of the routes, served at
// GET /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// DefaultMaxBodyBytes caps a request body unless WithMaxBodyBytes says
// otherwise; a larger body gets 413.
const DefaultMaxBodyBytes = 1 << 20

// Config is the handler's required wiring.
type Config struct {
	// Admin is the service the routes call, normally
	// allocator.NewServer(a).
	Admin pb.AdminServer
	// Authenticator turns a caller's client certificate (Request.TLS) or
	// bearer token into a principal; auth.Guard.Authenticator counts and
	// logs the refusals. Nil turns authentication off: every caller is
	// auth.Anonymous.
	Authenticator auth.Authenticator
	// Logger receives internal errors (and, at debug level, refused
	// authentications); nil discards.
	Logger *slog.Logger
	// Registerer receives the handler's metrics; nil registers none.
	Registerer prometheus.Registerer
}

type options struct {
	maxBody int64
}

// Option changes an optional setting of the handler.
type Option func(*options)

// WithMaxBodyBytes caps request bodies at n bytes (default
// DefaultMaxBodyBytes).
func WithMaxBodyBytes(n int64) Option { return func(o *options) { o.maxBody = n } }

// Handler serves the Admin API under /v1/ (every method: it answers 405
// itself). Put it in front of the server's other routes with Mount. Safe
// for concurrent use.
type Handler struct {
	cfg      Config
	opt      options
	log      *slog.Logger
	mux      *http.ServeMux
	requests *prometheus.CounterVec
}

// route is one operation: the method and path as the OpenAPI document
// writes them, and its operationId, which is the Admin RPC it calls.
type route struct {
	method, path, op string
}

// routes lists every operation the handler serves; the tests hold it
// against openapi.yaml and against the mux.
var routes = []route{
	{http.MethodGet, "/v1/limits", "ListLimits"},
	{http.MethodPost, "/v1/limits:apply", "ApplyLimits"},
	{http.MethodGet, "/v1/limits/{id}", "GetLimit"},
	{http.MethodPut, "/v1/limits/{id}", "PutLimit"},
	{http.MethodDelete, "/v1/limits/{id}", "DeleteLimit"},
	{http.MethodGet, "/v1/limits/{id}/history", "LimitHistory"},
	{http.MethodGet, "/v1/limits/{id}/windows", "ListWindows"},
	{http.MethodGet, "/v1/audit", "ListAudit"},
	{http.MethodGet, "/v1/whoami", "WhoAmI"},
	{http.MethodGet, "/v1/openapi.yaml", "GetOpenAPI"},
}

// New returns the handler of the Admin API.
func New(cfg Config, opts ...Option) (*Handler, error) {
	if cfg.Admin == nil {
		return nil, errors.New("adminhttp: Config.Admin is required")
	}
	h := &Handler{cfg: cfg, opt: options{maxBody: DefaultMaxBodyBytes}, log: cfg.Logger}
	for _, o := range opts {
		o(&h.opt)
	}
	if h.opt.maxBody < 1 {
		return nil, fmt.Errorf("adminhttp: max body bytes %d: must be >= 1", h.opt.maxBody)
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_admin_http_requests_total",
		Help: "Admin HTTP API requests by operation and status code (401s are refused authentications).",
	}, []string{"operation", "code"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(h.requests); err != nil {
			return nil, fmt.Errorf("adminhttp: register metrics: %w", err)
		}
	}
	// ServeMux patterns: {id...} must end a pattern, so the GET of a
	// limit and of its history and windows share one pattern and
	// getLimitOrPart tells them apart.
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/limits", h.listLimits)
	m.HandleFunc("POST /v1/limits:apply", h.applyLimits)
	m.HandleFunc("GET /v1/limits/{id...}", h.getLimitOrPart)
	m.HandleFunc("PUT /v1/limits/{id...}", h.putLimit)
	m.HandleFunc("DELETE /v1/limits/{id...}", h.deleteLimit)
	// The other methods on these paths: 405 with the Allow of the path
	// (without these the mux would redirect PUT /v1/limits to
	// /v1/limits/, and allow PUT on a limit's history).
	m.HandleFunc("/v1/limits", func(w http.ResponseWriter, r *http.Request) { writeNotAllowed(w, r, "GET, HEAD") })
	m.HandleFunc("/v1/limits/{id...}", h.limitNotAllowed)
	m.HandleFunc("GET /v1/audit", h.listAudit)
	m.HandleFunc("GET /v1/whoami", h.whoAmI)
	m.HandleFunc("GET /v1/openapi.yaml", h.openAPI)
	h.mux = m
	return h, nil
}

// Mount returns a handler that serves /v1/ with h and every other path
// with next. Mount the API this way, not with mux.Handle("/v1/", h): a
// ServeMux cleans paths and redirects, and a client following the
// redirect would turn a DELETE of "tenant/../atlas" into one of "atlas";
// h refuses such paths instead.
func (h *Handler) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w}
	// The handlers name their operation through rec in r's context.
	ctx := context.WithValue(r.Context(), recorderKey{}, rec)
	switch {
	case !utf8.ValidString(r.URL.Path):
		// No name in the API's paths is anything but ASCII; one that is
		// not even UTF-8 could not be echoed back in JSON either.
		writeProblem(rec, r, invalid("path", "not valid UTF-8 once unescaped").(*problem))
	case !isClean(r.URL.Path):
		// The mux would redirect to the cleaned path: a PUT of
		// "tenant//atlas" must not become one of "tenant/atlas".
		if strings.HasPrefix(r.URL.Path, "/v1/limits/") {
			writeProblem(rec, r, invalid("id", "%q: use [A-Za-z0-9._-] in segments separated by single '/' (no empty, '.' or '..' segments over HTTP)",
				strings.TrimPrefix(r.URL.Path, "/v1/limits/")).(*problem))
		} else {
			writeProblem(rec, r, &problem{Status: http.StatusNotFound, Detail: "no such route; the routes are in /v1/openapi.yaml"})
		}
	default:
		h.mux.ServeHTTP(&problemWriter{w: rec, r: r}, r.WithContext(ctx))
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	op := rec.op
	if op == "" {
		op = "none"
	}
	h.requests.WithLabelValues(op, strconv.Itoa(status)).Inc()
}

// isClean reports whether p is its own cleaned form (as the mux cleans
// it: a trailing '/' kept).
func isClean(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

type recorderKey struct{}

// recorder notes the status code written and the operation served.
type recorder struct {
	http.ResponseWriter
	status int
	op     string
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// setOp names the operation a request is served by (for the metrics).
func setOp(r *http.Request, op string) {
	if rec, ok := r.Context().Value(recorderKey{}).(*recorder); ok {
		rec.op = op
	}
}

// problemWriter turns the mux's own plain-text 404 and 405 (with its
// Allow header) into problems; the handlers' problems pass as they are.
type problemWriter struct {
	w        http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (p *problemWriter) Header() http.Header { return p.w.Header() }

func (p *problemWriter) WriteHeader(code int) {
	if (code != http.StatusNotFound && code != http.StatusMethodNotAllowed) ||
		p.w.Header().Get("Content-Type") == "application/problem+json" {
		p.w.WriteHeader(code)
		return
	}
	p.replaced = true
	p.w.Header().Del("X-Content-Type-Options")
	if code == http.StatusNotFound {
		writeProblem(p.w, p.r, &problem{Status: code, Detail: "no such route; the routes are in /v1/openapi.yaml"})
		return
	}
	writeNotAllowed(p.w, p.r, p.w.Header().Get("Allow"))
}

func (p *problemWriter) Write(b []byte) (int, error) {
	if p.replaced {
		return len(b), nil // the mux's text body, already replaced
	}
	return p.w.Write(b)
}

// writeNotAllowed answers 405 naming the methods allowed.
func writeNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeProblem(w, r, &problem{Status: http.StatusMethodNotAllowed,
		Detail: fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow)})
}

// call is one request's way to the Admin service.
type call struct {
	ctx    context.Context
	stream *stream
}

// begin names the operation, authenticates the caller and builds the
// context the Admin service is called with: the principal, the "http"
// transport for the audit, the peer and a stream that keeps the trailers
// the service sets (the leader's address). It answers 401 itself and
// then returns false.
func (h *Handler) begin(w http.ResponseWriter, r *http.Request, op string) (*call, bool) {
	setOp(r, op)
	p, err := h.authenticate(r)
	if err != nil {
		h.log.Debug("admin http: authentication refused", "operation", op, "remote", r.RemoteAddr, "err", err)
		writeProblem(w, r, &problem{Status: http.StatusUnauthorized, Detail: err.Error()})
		return nil, false
	}
	st := &stream{method: "/" + pb.Admin_ServiceDesc.ServiceName + "/" + op}
	ctx := auth.NewContext(r.Context(), p)
	ctx = allocator.WithTransport(ctx, "http")
	ctx = grpc.NewContextWithServerTransportStream(ctx, st)
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap), LocalAddr: localAddr(r)})
	}
	return &call{ctx: ctx, stream: st}, true
}

func localAddr(r *http.Request) net.Addr {
	a, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return a
}

// authenticate returns the caller's principal: auth.Anonymous while
// authentication is off, otherwise what the Authenticator makes of the
// TLS client certificate and the bearer token.
func (h *Handler) authenticate(r *http.Request) (*auth.Principal, error) {
	if h.cfg.Authenticator == nil {
		return auth.Anonymous, nil
	}
	bearer, err := bearerToken(r.Header.Values("Authorization"))
	if err != nil {
		return nil, err
	}
	p, err := h.cfg.Authenticator.Authenticate(r.TLS, bearer)
	if err != nil {
		if !errors.Is(err, auth.ErrUnauthenticated) {
			err = fmt.Errorf("%w: %v", auth.ErrUnauthenticated, err)
		}
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("%w: no credentials accepted", auth.ErrUnauthenticated)
	}
	return p, nil
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header, "" without the header.
func bearerToken(vals []string) (string, error) {
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: more than one Authorization header", auth.ErrUnauthenticated)
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", fmt.Errorf("%w: Authorization: want \"Bearer <token>\"", auth.ErrUnauthenticated)
	}
	return token, nil
}

// stream stands in for the gRPC transport stream so that the service's
// grpc.SetTrailer and grpc.Method work on an in-process call.
type stream struct {
	method  string
	trailer metadata.MD
}

func (s *stream) Method() string               { return s.method }
func (s *stream) SetHeader(metadata.MD) error  { return nil }
func (s *stream) SendHeader(metadata.MD) error { return nil }
func (s *stream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// group is the allocator group (and one of its allocators) that another
// group named as the limit's, "" if none.
func (s *stream) group() (group, allocator string) {
	g, a := s.trailer.Get(vocab.GroupMetadataKey), s.trailer.Get(vocab.GroupAllocatorMetadataKey)
	if len(g) == 0 || len(a) == 0 {
		return "", ""
	}
	return vocab.Cap(g[0], 64), vocab.Cap(a[0], 256)
}

// leader is the leader's address a follower named, "" if none.
func (s *stream) leader() string {
	if v := s.trailer.Get(vocab.LeaderMetadataKey); len(v) > 0 {
		return v[0]
	}
	return ""
}
