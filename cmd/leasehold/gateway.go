package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"leasehold/internal/bounds"
	"leasehold/internal/history"
	"leasehold/internal/vocab"
	"leasehold/regionagent"
	"leasehold/regionagent/client"
	"leasehold/regionagent/httplimit"
)

// gatewayConfig is everything `leasehold gateway` takes.
type gatewayConfig struct {
	listen, upstream, agent string
	metricsAddr             string // "" or "off": no metrics listener
	keyHeader               string
	keyPathSegment          int
	limitTemplate           string
	costHeader              string
	trustedProxies          string
	subLeases               string
	missingKey              string
	unknownLimit            string
	remainingHeader         string
	history                 string
	timeout, jitter         time.Duration
	http                    bounds.HTTP // the server's bounds (-read-timeout and co.)
	tls                     tlsFlags
	log                     logFlags

	// parsed by validate
	upstreamURL *url.URL
	trusted     []netip.Prefix

	// set by leasehold dev: the history's process name and region
	// (default "gateway-<listen>", no region: the reservations name it)
	historyName, historyRegion string
	// ready, if set (leasehold dev), is called once with the bound
	// addresses (metrics "" when off).
	ready func(listen, metrics string)
}

func (c *gatewayConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7430", "HTTP listen address")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "127.0.0.1:7431",
		"HTTP address of the gateway's own /metrics (its decisions: leasehold_gateway_decisions_total) and /healthz, apart from -listen, whose every path goes upstream; off: none")
	fs.StringVar(&c.upstream, "upstream", "", "URL of the service behind the gateway (required), e.g. http://127.0.0.1:8080")
	fs.StringVar(&c.agent, "agent", "127.0.0.1:7410", "region agent gRPC address; several replicas comma-separated: the first that answers, the next when it goes away")
	fs.StringVar(&c.keyHeader, "key-header", "", "take the key from this request header, e.g. X-Tenant (this or -key-path-segment)")
	fs.IntVar(&c.keyPathSegment, "key-path-segment", 0, "take the key from this path segment, 1-based: 1 takes atlas from /atlas/orders")
	fs.StringVar(&c.limitTemplate, "limit-template", "tenant/{key}", "limit id of a request; {key} is replaced by its key")
	fs.StringVar(&c.costHeader, "cost-header", "", "take a request's cost from this header (an integer >= 1; absent: 1)")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", "comma-separated CIDRs of proxies in front of the gateway whose X-Forwarded-For is kept")
	fs.StringVar(&c.subLeases, "sub-leases", "on", "spend hot limits from local sub-leases: on or off")
	fs.StringVar(&c.missingKey, "missing-key", "reject", "a request without a valid key: reject (400) or pass (unlimited)")
	fs.StringVar(&c.unknownLimit, "unknown-limit", "pass", "a key whose limit does not exist: pass (unlimited) or reject (503)")
	fs.StringVar(&c.remainingHeader, "remaining-only-with", "", "send the RateLimit header (remaining quota) only to requests carrying this header, e.g. Authorization")
	fs.StringVar(&c.history, "history", "", "record the decisions the gateway makes itself (from sub-leases, from its denial cache) to `FILE` (*.jsonl, appended; docs/operations.md)")
	fs.DurationVar(&c.timeout, "timeout", 250*time.Millisecond, "deadline of each call to the agent")
	fs.DurationVar(&c.jitter, "jitter", time.Second, "most random delay added to Retry-After before rounding up")
	c.http = bounds.Gateway
	fs.DurationVar(&c.http.ReadTimeout, "read-timeout", bounds.Gateway.ReadTimeout,
		"longest a request's body may take to arrive, after its headers (0: no limit)")
	fs.DurationVar(&c.http.WriteTimeout, "write-timeout", bounds.Gateway.WriteTimeout,
		"longest wait for the start of a response and between two writes of it, so streams run on while a client that stops reading is cut off (0: no limit)")
	fs.DurationVar(&c.http.IdleTimeout, "idle-timeout", bounds.Gateway.IdleTimeout, "keep-alive connections idle this long are closed (0: no limit)")
	fs.Int64Var(&c.http.MaxBodyBytes, "max-body-bytes", bounds.Gateway.MaxBodyBytes, "largest request body passed to the upstream; a larger one is refused 413 (0: no limit)")
	c.tls.registerServe(fs, "-listen and -metrics-addr (HTTPS), also presented to an agent that asks for a client certificate")
	c.tls.registerCA(fs, "the agent (-agent)")
	c.log.register(fs)
}

// isHostPort: s is HOST:PORT with a numeric port (the host may be empty:
// every interface).
func isHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}

// headerNameRe is an HTTP field name (RFC 9110 token).
var headerNameRe = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func (c *gatewayConfig) validate() error {
	if c.upstream == "" {
		return usagef("-upstream is required, e.g. -upstream http://127.0.0.1:8080")
	}
	u, err := url.Parse(c.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("-upstream %q: want an absolute http:// or https:// URL", c.upstream)
	}
	c.upstreamURL = u
	switch {
	case c.keyHeader != "" && c.keyPathSegment != 0:
		return usagef("-key-header and -key-path-segment: give one, not both")
	case c.keyHeader == "" && c.keyPathSegment == 0:
		return usagef("name where the key is: -key-header NAME or -key-path-segment N")
	case c.keyHeader != "" && !headerNameRe.MatchString(c.keyHeader):
		return usagef("-key-header %q: not a header name", c.keyHeader)
	case c.keyPathSegment < 0:
		return usagef("-key-path-segment %d: must be >= 1", c.keyPathSegment)
	case c.costHeader != "" && !headerNameRe.MatchString(c.costHeader):
		return usagef("-cost-header %q: not a header name", c.costHeader)
	case c.remainingHeader != "" && !headerNameRe.MatchString(c.remainingHeader):
		return usagef("-remaining-only-with %q: not a header name", c.remainingHeader)
	case !strings.Contains(c.limitTemplate, "{key}"):
		return usagef("-limit-template %q: must contain {key}", c.limitTemplate)
	case c.agent == "":
		return usagef("-agent is required")
	case c.metricsAddr != "" && c.metricsAddr != "off" && c.metricsAddr == c.listen:
		return usagef("-metrics-addr %s: must differ from -listen", c.metricsAddr)
	case c.metricsAddr != "" && c.metricsAddr != "off" && !isHostPort(c.metricsAddr):
		return usagef("-metrics-addr %q: want HOST:PORT, or off", c.metricsAddr)
	case c.timeout <= 0 || c.jitter < 0:
		return usagef("-timeout must be > 0 and -jitter >= 0")
	case c.http.ReadTimeout < 0 || c.http.WriteTimeout < 0 || c.http.IdleTimeout < 0 || c.http.MaxBodyBytes < 0:
		return usagef("-read-timeout, -write-timeout, -idle-timeout and -max-body-bytes must be >= 0")
	}
	if addrs := splitList(c.agent); len(addrs) > 1 {
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return usagef("-agent %q: several agents are HOST:PORT each", a)
			}
		}
	}
	if err := vocab.ValidateLimitID("-limit-template", strings.ReplaceAll(c.limitTemplate, "{key}", "key")); err != nil {
		return usagef("%v", err)
	}
	for _, f := range [...]struct{ name, v, a, b string }{{"sub-leases", c.subLeases, "on", "off"},
		{"missing-key", c.missingKey, "reject", "pass"}, {"unknown-limit", c.unknownLimit, "pass", "reject"}} {
		if f.v != f.a && f.v != f.b {
			return usagef("-%s %q: want %s or %s", f.name, f.v, f.a, f.b)
		}
	}
	c.trusted, err = httplimit.ParsePrefixes(c.trustedProxies)
	if err != nil {
		return usagef("-trusted-proxies: %v", err)
	}
	if err := checkHistoryFlag("history", c.history); err != nil {
		return err
	}
	return c.tls.validate()
}

func runGatewayCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c gatewayConfig
	log, err := setup("gateway", c.register, &c.log, c.validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	return runGateway(ctx, &c, log)
}

// runGateway serves the gateway until ctx ends.
func runGateway(ctx context.Context, c *gatewayConfig, log *slog.Logger) error {
	l, err := listen("listen", c.listen)
	if err != nil {
		return err
	}
	opts := []client.Option{client.WithTimeout(c.timeout)}
	reloads := map[string]func() error{}
	var srvTLS *tls.Config // nil: plaintext
	if c.tls.ca != "" {
		cfg, reload, err := clientTLS("tls-ca", c.tls.ca, "tls-cert", c.tls.cert, "tls-key", c.tls.key)
		if err != nil {
			l.Close()
			return err
		}
		opts = append(opts, client.WithTLS(cfg))
		reloads["client certificate"] = reload
	} else {
		log.Warn("TLS to the agent is off: the gateway calls it in plaintext (give -tls-ca)")
	}
	if c.tls.cert != "" {
		st, err := newServerTLS(tlsFlags{cert: c.tls.cert, key: c.tls.key}, false)
		if err != nil {
			l.Close()
			return err
		}
		srvTLS = st.Config()
		l = tls.NewListener(l, srvTLS)
		reloads["TLS certificates"] = st.Reload
	} else {
		log.Warn("TLS is off: the gateway serves plaintext HTTP (give -tls-cert and -tls-key)")
	}
	if c.subLeases == "on" {
		opts = append(opts, client.WithSubLeases(client.SubLeaseConfig{}))
	}
	name := c.historyName
	if name == "" {
		name = "gateway-" + c.listen
	}
	hf, err := openHistory(c.history, history.Process{Name: name, Role: history.RoleGateway, Region: c.historyRegion})
	if err != nil {
		l.Close()
		return err
	}
	defer closeHistory(hf, log.Warn)
	if hf.rec != nil {
		opts = append(opts, client.WithLocalDecisionObserver(
			regionagent.ClientDecisionRecorder(hf.rec, name, c.historyRegion, history.PathSubLease)))
	}
	var ml net.Listener
	if c.metricsAddr != "" && c.metricsAddr != "off" {
		if ml, err = listen("metrics-addr", c.metricsAddr); err != nil {
			l.Close()
			return err
		}
		if srvTLS != nil {
			ml = tls.NewListener(ml, srvTLS) // the same certificate as -listen
		}
	}
	target, dial := agentTarget(c.agent)
	opts = append(opts, client.WithDialOptions(dial...))
	cl, err := client.New(target, opts...)
	if err != nil {
		l.Close()
		if ml != nil {
			ml.Close()
		}
		return fmt.Errorf("-agent %s: %w", c.agent, err)
	}
	reg := newRegistry()
	gm, err := httplimit.NewMetrics(reg)
	if err != nil { // a fresh registry: cannot happen
		l.Close()
		if ml != nil {
			ml.Close()
		}
		return fmt.Errorf("gateway metrics: %w", err)
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leasehold_gateway_sublease_tokens",
		Help: "Tokens of the region's balance the gateway holds in sub-leases: reserved, neither spent nor given back yet."},
		func() float64 { return float64(cl.HeldTokens()) }))
	srv := c.http.ProxyServer(gatewayHandler(c, cl, gm, log), httpErrorLog(log))
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	onHangup(hctx, log, reloads)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(l) }()
	var msrv *http.Server
	metricsAt := ""
	if ml != nil {
		metricsAt = ml.Addr().String()
		healthy := func() (bool, string) {
			return true, fmt.Sprintf("ok: gateway %s, upstream %s, agent %s (%s)", l.Addr(), c.upstreamURL.Redacted(), c.agent,
				strings.ToLower(cl.Conn().GetState().String()))
		}
		msrv = bounds.Service.Server(metricsMux(reg, healthy), httpErrorLog(log))
		go func() { errc <- msrv.Serve(ml) }()
	} else {
		log.Warn("the gateway's metrics are off (-metrics-addr off): its decisions are in no metric")
	}
	log.Info("gateway serving", "listen", l.Addr().String(), "metrics", metricsAt, "upstream", c.upstreamURL.String(), "agent", c.agent,
		"sub_leases", c.subLeases)
	if c.ready != nil {
		c.ready(l.Addr().String(), metricsAt)
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if msrv != nil {
		_ = msrv.Shutdown(sctx)
	}
	if cerr := cl.Close(sctx); cerr != nil {
		log.Warn("closing the agent client", "err", cerr)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}

// agentTarget is -agent as a gRPC target: one address as it is; several
// (the region's agent replicas) through a resolver of their own, which
// gRPC's default policy (pick first) tries in order, moving to the next
// when the agent in use goes away. Each address keeps its host as the
// name its TLS certificate is checked against.
func agentTarget(agent string) (string, []grpc.DialOption) {
	addrs := splitList(agent)
	if len(addrs) <= 1 {
		return agent, nil
	}
	var st resolver.State
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: host}}})
	}
	r := manual.NewBuilderWithScheme("leasehold-agents")
	r.InitialState(st)
	return r.Scheme() + ":///agents", []grpc.DialOption{grpc.WithResolvers(r)}
}

// keyRe is what a key may be: one limit id segment.
var keyRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// gatewayHandler is the gateway: /healthz, and everything else through
// the limiter to the upstream. m (nil: none) counts the decisions.
func gatewayHandler(c *gatewayConfig, lim httplimit.Limiter, m *httplimit.Metrics, log *slog.Logger) http.Handler {
	key := func(r *http.Request) (string, bool) {
		var k string
		if c.keyHeader != "" {
			k = r.Header.Get(c.keyHeader)
		} else {
			segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
			if c.keyPathSegment <= len(segs) {
				k = segs[c.keyPathSegment-1]
			}
		}
		if !keyRe.MatchString(k) {
			return "", false
		}
		id := strings.ReplaceAll(c.limitTemplate, "{key}", k)
		if vocab.DotSegment(id) != "" {
			return "", false // a key "." or ".." standing as a segment of its own: no limit id
		}
		return id, true
	}
	cost := func(r *http.Request) (int64, bool) {
		if c.costHeader == "" {
			return 1, true
		}
		v := r.Header.Get(c.costHeader)
		if v == "" {
			return 1, true
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil && n >= 1
	}
	opts := []httplimit.Option{
		httplimit.Key(key),
		httplimit.Cost(func(r *http.Request) int64 { n, _ := cost(r); return n }),
		httplimit.Jitter(c.jitter),
		httplimit.Observe(func(r *http.Request, o httplimit.Outcome, d client.Decision) {
			if m != nil {
				m.Observe(r, o, d)
			}
			if o != httplimit.Allowed {
				log.Debug("limited", "outcome", o.String(), "path", r.URL.Path, "decision", d.ID.String(), "source", d.Source.String())
			}
		}),
	}
	if c.unknownLimit == "pass" {
		opts = append(opts, httplimit.PassUnknownLimits())
	}
	if h := c.remainingHeader; h != "" {
		opts = append(opts, httplimit.ShowRemaining(func(r *http.Request) bool { return r.Header.Get(h) != "" }))
	}
	up := c.upstreamURL
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the X-Forwarded-For chain only from a trusted proxy;
			// from anyone else it is whatever the client wrote.
			if peerIn(httplimit.ClientIP(pr.In, nil), c.trusted) { // nil: the peer itself
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
				writeBodyTooLarge(w, tooLarge.Limit)
				return
			}
			if bounds.BodyTimedOut(r.Context()) {
				w.Header().Set("Connection", "close")
				writeProblem(w, http.StatusRequestTimeout, "urn:leasehold:problem:body-timeout", "Request Timeout",
					"The request body did not arrive within -read-timeout.")
				return
			}
			log.Warn("upstream failed", "path", r.URL.Path, "err", err)
			writeProblem(w, http.StatusBadGateway, "urn:leasehold:problem:upstream", "Bad Gateway", "The upstream service did not answer.")
		},
	}
	limited := httplimit.Middleware(lim, opts...)(proxy)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		state := "unknown"
		if cl, ok := lim.(*client.Client); ok {
			state = strings.ToLower(cl.Conn().GetState().String())
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "ok: upstream %s, agent %s (%s)\n", up.Redacted(), c.agent, state)
	})
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := key(r); !ok && c.missingKey == "reject" {
			where := "header " + c.keyHeader
			if c.keyHeader == "" {
				where = "path segment " + strconv.Itoa(c.keyPathSegment)
			}
			writeProblem(w, http.StatusBadRequest, "urn:leasehold:problem:no-key", "Bad Request",
				"The request names no limit: "+where+" must be 1-100 of [A-Za-z0-9._-].")
			return
		}
		if max := c.http.MaxBodyBytes; max > 0 && r.ContentLength > max {
			writeBodyTooLarge(w, max) // before the limiter: it costs no tokens
			return
		}
		if _, ok := cost(r); !ok {
			writeProblem(w, http.StatusBadRequest, "urn:leasehold:problem:bad-cost", "Bad Request",
				"Header "+c.costHeader+" must be an integer >= 1.")
			return
		}
		limited.ServeHTTP(w, r)
	}))
	return mux
}

func peerIn(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if a.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// writeBodyTooLarge answers a request whose body is over -max-body-bytes.
func writeBodyTooLarge(w http.ResponseWriter, max int64) {
	w.Header().Set("Connection", "close")
	writeProblem(w, http.StatusRequestEntityTooLarge, "urn:leasehold:problem:body-too-large", "Content Too Large",
		"The request body is larger than "+strconv.FormatInt(max, 10)+" bytes (-max-body-bytes).")
}

// writeProblem answers an RFC 9457 problem of the gateway itself.
func writeProblem(w http.ResponseWriter, code int, typ, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": typ, "title": title, "status": code, "detail": detail})
}
