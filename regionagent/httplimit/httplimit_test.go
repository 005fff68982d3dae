package httplimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
	"leasehold/regionagent/client/clienttest"
)

// fakeLimiter answers every request with d and err, recording the asks.
type fakeLimiter struct {
	d     client.Decision
	err   error
	asked []string // "limit cost"
}

func (f *fakeLimiter) Allow(_ context.Context, limit string, cost int64) (client.Decision, error) {
	f.asked = append(f.asked, fmt.Sprintf("%s %d", limit, cost))
	return f.d, f.err
}

var testID = client.DecisionID{1, 2, 3}

func keyHeader(r *http.Request) (string, bool) {
	k := r.Header.Get("X-Tenant")
	return "tenant/" + k, k != ""
}

// serve runs one request through the middleware around a handler that
// answers 200 "upstream".
func serve(t *testing.T, l Limiter, req *http.Request, opts ...Option) (*http.Response, string, bool) {
	t.Helper()
	called := false
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called = true
		_, _ = io.WriteString(w, "upstream")
	})
	rec := httptest.NewRecorder()
	Middleware(l, append([]Option{Key(keyHeader), Jitter(0)}, opts...)...)(next).ServeHTTP(rec, req)
	resp := rec.Result()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body), called
}

func tenantReq(tenant string) *http.Request {
	r := httptest.NewRequest("GET", "/orders", nil)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	return r
}

var retryAfterRe = regexp.MustCompile(`^[0-9]+$`) // RFC 9110 delay-seconds

func decodeProblem(t *testing.T, resp *http.Response, body string) Problem {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var p Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if p.Status != resp.StatusCode {
		t.Fatalf("problem status %d on a %d", p.Status, resp.StatusCode)
	}
	return p
}

func TestAllowedHasRateLimitHeaders(t *testing.T) {
	for _, reason := range []pb.Reason{pb.Reason_REASON_OK, pb.Reason_REASON_FALLBACK} {
		l := &fakeLimiter{d: client.Decision{Allowed: true, Reason: reason, Remaining: 42, Limit: 100,
			Window: time.Minute, ResetAfter: 17200 * time.Millisecond, ID: testID}}
		resp, body, called := serve(t, l, tenantReq("atlas"))
		if resp.StatusCode != 200 || body != "upstream" || !called {
			t.Fatalf("%v: %d %q", reason, resp.StatusCode, body)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"tenant/atlas";q=100;w=60` {
			t.Errorf("RateLimit-Policy %q", got)
		}
		if got := resp.Header.Get("RateLimit"); got != `"tenant/atlas";r=42;t=18` {
			t.Errorf("RateLimit %q", got)
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Error("Retry-After on an allowed request")
		}
		if len(l.asked) != 1 || l.asked[0] != "tenant/atlas 1" {
			t.Errorf("asked %v", l.asked)
		}
	}
}

func TestOverLimit429(t *testing.T) {
	l := &fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_OVER_LIMIT, RetryAfter: 2100 * time.Millisecond,
		Limit: 100, Window: 10 * time.Second, ResetAfter: 2100 * time.Millisecond, ID: testID}}
	resp, body, called := serve(t, l, tenantReq("atlas"))
	if resp.StatusCode != http.StatusTooManyRequests || called {
		t.Fatalf("%d, handler called %v", resp.StatusCode, called)
	}
	if got := resp.Header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After %q, want 3 (2.1s rounded up)", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"tenant/atlas";r=0;t=3` {
		t.Errorf("RateLimit %q", got)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"tenant/atlas";q=100;w=10` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	p := decodeProblem(t, resp, body)
	if p.Type != TypeOverLimit || p.Title != "Too Many Requests" || p.Limit != "tenant/atlas" ||
		p.Reason != "OVER_LIMIT" || p.DecisionID != testID.String() || p.Detail == "" {
		t.Errorf("problem %+v", p)
	}
}

func TestCannotDecide503(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     *fakeLimiter
		retry string
	}{
		{"unavailable", &fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_UNAVAILABLE, RetryAfter: 1500 * time.Millisecond, ID: testID}}, "2"},
		{"client error", &fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_UNAVAILABLE, ID: testID},
			err: fmt.Errorf("%w: check: %w", client.ErrUnavailable, status.Error(codes.DeadlineExceeded, "timeout"))}, "1"},
		{"unknown limit", &fakeLimiter{err: client.ErrUnknownLimit}, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, called := serve(t, tc.l, tenantReq("atlas"))
			if resp.StatusCode != http.StatusServiceUnavailable || called {
				t.Fatalf("%d, handler called %v", resp.StatusCode, called)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.retry {
				t.Errorf("Retry-After %q, want %s", got, tc.retry)
			}
			p := decodeProblem(t, resp, body)
			if p.Type != TypeUnavailable || p.Reason != "UNAVAILABLE" || p.Limit != "tenant/atlas" {
				t.Errorf("problem %+v", p)
			}
			if (p.DecisionID != "") != !tc.l.d.ID.IsZero() {
				t.Errorf("decision id %q", p.DecisionID)
			}
		})
	}
}

func TestPassUnknownLimits(t *testing.T) {
	var got []Outcome
	l := &fakeLimiter{err: fmt.Errorf("%w: check", client.ErrUnknownLimit)}
	resp, _, called := serve(t, l, tenantReq("nobody"), PassUnknownLimits(),
		Observe(func(_ *http.Request, o Outcome, _ client.Decision) { got = append(got, o) }))
	if resp.StatusCode != 200 || !called || len(got) != 1 || got[0] != UnknownLimit {
		t.Fatalf("%d called=%v outcomes %v", resp.StatusCode, called, got)
	}
}

func TestNoKeyPasses(t *testing.T) {
	var got []Outcome
	l := &fakeLimiter{}
	resp, _, called := serve(t, l, tenantReq(""), Observe(func(_ *http.Request, o Outcome, _ client.Decision) { got = append(got, o) }))
	if resp.StatusCode != 200 || !called || len(l.asked) != 0 || len(got) != 1 || got[0] != NoKey {
		t.Fatalf("%d called=%v asked %v outcomes %v", resp.StatusCode, called, l.asked, got)
	}
}

func TestCostFunction(t *testing.T) {
	l := &fakeLimiter{d: client.Decision{Allowed: true, Reason: pb.Reason_REASON_OK}}
	for _, c := range []int64{5, 0, -3} {
		serve(t, l, tenantReq("atlas"), Cost(func(*http.Request) int64 { return c }))
	}
	if want := []string{"tenant/atlas 5", "tenant/atlas 1", "tenant/atlas 1"}; fmt.Sprint(l.asked) != fmt.Sprint(want) {
		t.Fatalf("asked %v, want %v", l.asked, want)
	}
}

func TestShowRemainingOnlyToAuthenticated(t *testing.T) {
	authed := ShowRemaining(func(r *http.Request) bool { return r.Header.Get("Authorization") != "" })
	for _, d := range []client.Decision{
		{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 7, Limit: 10, Window: time.Minute},
		{Reason: pb.Reason_REASON_OVER_LIMIT, Limit: 10, Window: time.Minute, RetryAfter: time.Second},
	} {
		l := &fakeLimiter{d: d}
		resp, _, _ := serve(t, l, tenantReq("atlas"), authed)
		if resp.Header.Get("RateLimit") != "" || resp.Header.Get("RateLimit-Policy") == "" {
			t.Errorf("anonymous: RateLimit %q, policy %q", resp.Header.Get("RateLimit"), resp.Header.Get("RateLimit-Policy"))
		}
		req := tenantReq("atlas")
		req.Header.Set("Authorization", "Bearer x")
		resp, _, _ = serve(t, l, req, authed)
		if resp.Header.Get("RateLimit") == "" {
			t.Errorf("authenticated: no RateLimit header")
		}
	}
}

func TestRetryAfterRounding(t *testing.T) {
	zero := func(int64) int64 { return 0 }
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 1}, {0, 1}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1}, {time.Second, 1},
		{time.Second + time.Nanosecond, 2}, {59500 * time.Millisecond, 60}, {time.Hour, 3600},
	} {
		if got := RetryAfter(tc.d, 0, zero); got != tc.want {
			t.Errorf("RetryAfter(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	// The jitter's extremes: nothing added, and the whole jitter.
	top := func(n int64) int64 { return n - 1 }
	if got := RetryAfter(2*time.Second, 1500*time.Millisecond, zero); got != 2 {
		t.Errorf("no jitter drawn: %d", got)
	}
	if got := RetryAfter(2*time.Second, 1500*time.Millisecond, top); got != 4 {
		t.Errorf("full jitter: %d", got)
	}
}

// Through the middleware with its real jitter: Retry-After stays within
// [ceil(d), ceil(d + jitter)] and spreads over that range.
func TestRetryAfterJitterBounds(t *testing.T) {
	l := &fakeLimiter{d: client.Decision{Reason: pb.Reason_REASON_OVER_LIMIT, RetryAfter: 2500 * time.Millisecond}}
	seen := map[string]int{}
	for range 400 {
		resp, _, _ := serve(t, l, tenantReq("atlas"), Jitter(2*time.Second))
		ra := resp.Header.Get("Retry-After")
		if !retryAfterRe.MatchString(ra) {
			t.Fatalf("Retry-After %q is not delay-seconds", ra)
		}
		seen[ra]++
	}
	for v := range seen {
		if v != "3" && v != "4" && v != "5" {
			t.Fatalf("Retry-After values %v: want 3..5 (2.5s + 0..2s, rounded up)", seen)
		}
	}
	if len(seen) < 3 {
		t.Fatalf("Retry-After values %v: the jitter does not spread", seen)
	}
}

func TestStructuredFieldString(t *testing.T) {
	for in, want := range map[string]string{
		"tenant/atlas": `"tenant/atlas"`,
		`a"b\c`:        `"a\"b\\c"`,
		"x\ny\u00e9":   `"x?y??"`,
	} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestKeyRequired(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic without Key")
		}
	}()
	Middleware(&fakeLimiter{})
}

// TestThroughTheClient runs the middleware with the real client against
// the fake agent over httptest.Server: 200, 200, then 429 from the agent
// and 429 from the denial cache, each with its own decision id.
func TestThroughTheClient(t *testing.T) {
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", 2, time.Hour, time.Hour)
	target, dialer := ag.Serve(t)
	c, err := client.New(target, client.WithDialOptions(dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	h := Middleware(c, Key(keyHeader))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	ids := map[string]bool{}
	for i, want := range []int{200, 200, 429, 429} {
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		req.Header.Set("X-Tenant", "atlas")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if want == 429 {
			p := decodeProblem(t, resp, string(body))
			if ids[p.DecisionID] || len(p.DecisionID) != 32 {
				t.Fatalf("decision id %q reused or malformed", p.DecisionID)
			}
			ids[p.DecisionID] = true
			if ra := resp.Header.Get("Retry-After"); !retryAfterRe.MatchString(ra) || ra == "0" {
				t.Fatalf("Retry-After %q", ra)
			}
		}
	}
	if checks, _, _ := ag.Calls(); checks != 3 {
		t.Fatalf("%d Checks: the second 429 should come from the denial cache", checks)
	}
}

// TestShadowWouldDenyHeader: a request admitted by a limit in shadow mode
// that enforcement would have denied passes, with Leasehold-Would-Deny
// naming the limit and the reason; an ordinary admission has none.
func TestShadowWouldDenyHeader(t *testing.T) {
	for _, c := range []struct {
		would pb.Reason
		want  string
	}{
		{pb.Reason_REASON_OVER_LIMIT, `"tenant/atlas";reason=over_limit`},
		{pb.Reason_REASON_UNAVAILABLE, `"tenant/atlas";reason=unavailable`},
		{pb.Reason_REASON_UNSPECIFIED, ""},
	} {
		l := &fakeLimiter{d: client.Decision{Allowed: true, Reason: pb.Reason_REASON_OK, WouldDeny: c.would, Limit: 100,
			Window: time.Minute, ID: testID}}
		resp, body, called := serve(t, l, tenantReq("atlas"))
		if resp.StatusCode != 200 || body != "upstream" || !called {
			t.Fatalf("%v: %d %q", c.would, resp.StatusCode, body)
		}
		if got := resp.Header.Get(HeaderWouldDeny); got != c.want {
			t.Errorf("%v: %s %q, want %q", c.would, HeaderWouldDeny, got, c.want)
		}
	}
}
