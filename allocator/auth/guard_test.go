package auth_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"leasehold/allocator/auth"
	"leasehold/allocator/auth/devca"
	pb "leasehold/proto/leasehold/v1"
)

// whoami is a hand-written Admin server answering WhoAmI from the
// context's principal, the way the allocator does.
type whoami struct{ pb.UnimplementedAdminServer }

func (whoami) WhoAmI(ctx context.Context, _ *pb.WhoAmIRequest) (*pb.WhoAmIResponse, error) {
	p := auth.FromContext(ctx)
	if p == nil {
		return nil, status.Error(codes.Internal, "no principal in the context")
	}
	return &pb.WhoAmIResponse{Principal: p.Name, Role: p.Role.String(), Scopes: p.Scopes, Via: string(p.Via), Region: p.Region}, nil
}

// streamDesc is a one-method streaming service that sends the caller's
// name: it checks the stream interceptor.
var streamDesc = grpc.ServiceDesc{
	ServiceName: "test.Who", HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(_ any, s grpc.ServerStream) error {
		name := "<none>"
		if p := auth.FromContext(s.Context()); p != nil {
			name = p.Name
		}
		return s.SendMsg(wrapperspb.String(name))
	}}},
}

type fixture struct {
	ca       *devca.CA
	addr     string
	reg      *prometheus.Registry
	users    *auth.Users
	tokens   map[string]string
	serverKP devca.Pair
}

// serve runs a gRPC server over TLS on loopback that verifies client
// certificates if given (as the allocator does), with the guard.
func serve(t *testing.T, authOn bool) *fixture {
	t.Helper()
	ca, err := devca.New("test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca, reg: prometheus.NewRegistry(), tokens: map[string]string{}}
	cfg := &auth.Config{}
	for _, u := range []auth.UserConfig{{Name: "alice", Role: "admin"}, {Name: "bob", Role: "editor", Scopes: []string{"tenant/*"}}} {
		tok, _ := auth.NewToken()
		f.tokens[u.Name] = tok
		u.Tokens = []string{auth.HashToken(tok)}
		cfg.Users = append(cfg.Users, u)
	}
	if f.users, err = auth.NewUsers(cfg); err != nil {
		t.Fatal(err)
	}
	var a auth.Authenticator
	if authOn {
		a = f.users
	}
	g := auth.NewGuard(a, nil, f.reg)
	if f.serverKP, err = ca.Server([]string{"127.0.0.1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	cert, _ := f.serverKP.TLS()
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}
	s := grpc.NewServer(append(g.ServerOptions(), grpc.Creds(credentials.NewTLS(tc)))...)
	pb.RegisterAdminServer(s, whoami{})
	s.RegisterService(&streamDesc, nil)
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	f.addr = l.Addr().String()
	return f
}

// conn dials the fixture trusting its CA and presenting kp if given.
func (f *fixture) conn(t *testing.T, kp *devca.Pair) *grpc.ClientConn {
	t.Helper()
	tc := &tls.Config{RootCAs: f.ca.Pool()}
	if kp != nil {
		c, err := kp.TLS()
		if err != nil {
			t.Fatal(err)
		}
		// Sent whatever CAs the server names as acceptable (a Go client
		// given Certificates would send nothing for another CA's).
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// withToken is a context of t sending "authorization: tok" ("" sends none).
func withToken(t *testing.T, tok string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", tok)
}

func TestGuardAuthenticatesOverTLS(t *testing.T) {
	f := serve(t, true)
	agentEU, _ := f.ca.Agent("eu", time.Hour)
	alice, _ := f.ca.User("alice", time.Hour)
	mallory, _ := f.ca.User("mallory", time.Hour)
	other, _ := devca.New("other CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	untrusted, _ := other.Agent("eu", time.Hour)
	now := time.Now()
	expired, err := f.ca.Issue(devca.Request{CommonName: "old", URIs: []*url.URL{auth.AgentURI("eu")},
		NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour), Client: true})
	if err != nil {
		t.Fatal(err)
	}

	type want struct {
		code              codes.Code
		name, via, region string
		msg               string
	}
	for _, tc := range []struct {
		name  string
		cert  *devca.Pair
		token string
		want  want
	}{
		{"agent certificate", &agentEU, "", want{code: codes.OK, name: "agent/eu", via: "certificate", region: "eu"}},
		{"user certificate", &alice, "", want{code: codes.OK, name: "alice", via: "certificate"}},
		{"user token", nil, "Bearer " + f.tokens["bob"], want{code: codes.OK, name: "bob", via: "token"}},
		{"token, scheme in lower case", nil, "bearer " + f.tokens["alice"], want{code: codes.OK, name: "alice", via: "token"}},
		{"certificate and token of the same user", &alice, "Bearer " + f.tokens["alice"], want{code: codes.OK, name: "alice", via: "certificate"}},
		{"no credentials", nil, "", want{code: codes.Unauthenticated, msg: "no client certificate and no bearer token"}},
		{"wrong token", nil, "Bearer lht_wrong", want{code: codes.Unauthenticated, msg: "bearer token not recognised"}},
		{"not a bearer", nil, "Basic YWxpY2U6eA==", want{code: codes.Unauthenticated, msg: "want \"Bearer TOKEN\""}},
		{"user certificate not in the auth file", &mallory, "", want{code: codes.Unauthenticated, msg: `user "mallory"`}},
		{"certificate naming nobody", &f.serverKP, "", want{code: codes.Unauthenticated, msg: "names no leasehold:// identity"}},
		{"certificate and token of different callers", &alice, "Bearer " + f.tokens["bob"], want{code: codes.Unauthenticated, msg: "different callers"}},
		{"agent certificate with a user token", &agentEU, "Bearer " + f.tokens["bob"], want{code: codes.Unauthenticated, msg: "different callers"}},
		// Refused at the TLS handshake: the call never reaches the guard.
		{"certificate of another CA", &untrusted, "", want{code: codes.Unavailable}},
		{"expired certificate", &expired, "", want{code: codes.Unavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := withToken(t, tc.token)
			resp, err := pb.NewAdminClient(f.conn(t, tc.cert)).WhoAmI(ctx, &pb.WhoAmIRequest{})
			if status.Code(err) != tc.want.code || !strings.Contains(status.Convert(err).Message(), tc.want.msg) {
				t.Fatalf("err %v, want %v containing %q", err, tc.want.code, tc.want.msg)
			}
			if err == nil && (resp.Principal != tc.want.name || resp.Via != tc.want.via || resp.Region != tc.want.region) {
				t.Fatalf("principal %v, want %+v", resp, tc.want)
			}
		})
	}
	// Each refusal the guard saw is counted by reason.
	for reason, n := range map[string]float64{auth.ReasonMissing: 1, auth.ReasonBadToken: 2, auth.ReasonUnknownUser: 1,
		auth.ReasonUnknownIdentity: 1, auth.ReasonMismatch: 2} {
		if got := testutil.ToFloat64(failures(t, f.reg, reason)); got != n {
			t.Errorf("leasehold_auth_failures_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}

	// Health answers without credentials; the stream interceptor puts
	// the principal in the stream's context and refuses the same way.
	hr, err := healthpb.NewHealthClient(f.conn(t, nil)).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without credentials: %v %v", hr, err)
	}
	if name, err := streamWho(f.conn(t, &agentEU), context.Background()); err != nil || name != "agent/eu" {
		t.Fatalf("stream as agent/eu: %q %v", name, err)
	}
	if _, err := streamWho(f.conn(t, nil), context.Background()); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream without credentials: %v", err)
	}

	// Reload: a token removed from the file stops working at once.
	tok := f.tokens["bob"]
	if err := f.users.Reload(&auth.Config{Users: []auth.UserConfig{{Name: "alice", Role: "admin"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewAdminClient(f.conn(t, nil)).WhoAmI(withToken(t, "Bearer "+tok), &pb.WhoAmIRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("removed token: %v", err)
	}
	if err := f.users.Reload(&auth.Config{Users: []auth.UserConfig{{Name: "x", Role: "nobody"}}}); err == nil {
		t.Fatal("reload of an invalid config accepted")
	}
	if resp, err := pb.NewAdminClient(f.conn(t, &alice)).WhoAmI(context.Background(), &pb.WhoAmIRequest{}); err != nil || resp.Principal != "alice" {
		t.Fatalf("after a refused reload: %v %v", resp, err)
	}
}

func failures(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "leasehold_auth_failures_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					v = m.Counter.GetValue()
				}
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	c.Add(v)
	return c
}

func streamWho(cc *grpc.ClientConn, ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := cc.NewStream(ctx, &streamDesc.Streams[0], "/test.Who/Stream")
	if err != nil {
		return "", err
	}
	if err := s.CloseSend(); err != nil {
		return "", err
	}
	var m wrapperspb.StringValue
	if err := s.RecvMsg(&m); err != nil {
		return "", err
	}
	return m.Value, nil
}

func TestGuardOffIsAnonymous(t *testing.T) {
	f := serve(t, false)
	resp, err := pb.NewAdminClient(f.conn(t, nil)).WhoAmI(context.Background(), &pb.WhoAmIRequest{})
	if err != nil || resp.Principal != "anonymous" || resp.Via != "none" {
		t.Fatalf("auth off: %v %v", resp, err)
	}
	if name, err := streamWho(f.conn(t, nil), context.Background()); err != nil || name != "anonymous" {
		t.Fatalf("stream, auth off: %q %v", name, err)
	}
	// Plaintext callers of a TLS server are refused at the handshake.
	cc, _ := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pb.NewAdminClient(cc).WhoAmI(ctx, &pb.WhoAmIRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext caller: %v", err)
	}
}

func TestGuardHTTP(t *testing.T) {
	ca, _ := devca.New("test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	tok, _ := auth.NewToken()
	viewerTok, _ := auth.NewToken()
	users, err := auth.NewUsers(&auth.Config{Users: []auth.UserConfig{
		{Name: "alice", Role: "admin", Tokens: []string{auth.HashToken(tok)}},
		{Name: "vic", Role: "viewer", Tokens: []string{auth.HashToken(viewerTok)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g := auth.NewGuard(users, nil, reg)
	srv := httptest.NewUnstartedServer(g.Require(auth.ActionAudit, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(auth.FromContext(r.Context()).Name))
	})))
	kp, _ := ca.Server([]string{"127.0.0.1"}, time.Hour)
	cert, _ := kp.TLS()
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}
	srv.StartTLS()
	defer srv.Close()
	agent, _ := ca.Agent("eu", time.Hour)
	agentCert, _ := agent.TLS()
	for _, tc := range []struct {
		name   string
		header string
		cert   bool
		code   int
		body   string
	}{
		{"admin token", "Bearer " + tok, false, 200, "alice"},
		{"viewer token: not allowed to audit", "Bearer " + viewerTok, false, 403, "may not audit"},
		{"agent certificate", "", true, 403, "may only call the Allocator service"},
		{"no credentials", "", false, 401, "no client certificate"},
		{"wrong token", "Bearer nope", false, 401, "not recognised"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tcfg := &tls.Config{RootCAs: ca.Pool()}
			if tc.cert {
				tcfg.Certificates = []tls.Certificate{agentCert}
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tcfg}, Timeout: 5 * time.Second}
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			_, _ = io.Copy(&b, resp.Body)
			if resp.StatusCode != tc.code || !strings.Contains(b.String(), tc.body) {
				t.Fatalf("%d %q, want %d containing %q", resp.StatusCode, b.String(), tc.code, tc.body)
			}
			if tc.code == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
}
