package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"leasehold/internal/ports"
	"leasehold/regionagent/client/clienttest"
)

// upstream is a real HTTP service behind the gateway; it records what
// reached it.
type upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []*http.Request
}

func startUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Clone(context.Background()))
		u.mu.Unlock()
		w.Header().Set("X-Upstream", "yes")
		_, _ = io.WriteString(w, "hello from "+r.URL.Path)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.seen...)
}

// startGateway runs `leasehold gateway` in the test process with args and
// waits until it serves.
func startGateway(t *testing.T, args ...string) string {
	t.Helper()
	gw, _ := startGatewayMetrics(t, args...)
	return gw
}

// startGatewayMetrics is startGateway, also returning the gateway's
// metrics URL.
func startGatewayMetrics(t *testing.T, args ...string) (gw, metrics string) {
	t.Helper()
	addr, maddr := ports.Addr(t), ports.Addr(t)
	s := startCmd(t, append([]string{"gateway", "--listen", addr, "--metrics-addr", maddr}, args...)...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return "http://" + addr, "http://" + maddr + "/metrics"
			}
		}
		select {
		case <-s.done:
			t.Fatalf("gateway exited %d: %s", s.exit, s.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling readiness
	}
}

type gwResp struct {
	code   int
	header http.Header
	body   string
}

func gwDo(t *testing.T, url string, hdr map[string]string) gwResp {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return gwResp{resp.StatusCode, resp.Header, string(b)}
}

var delaySeconds = regexp.MustCompile(`^[1-9][0-9]*$`)

func problemOf(t *testing.T, r gwResp) map[string]any {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q on a %d: %s", ct, r.code, r.body)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if int(p["status"].(float64)) != r.code {
		t.Fatalf("problem status %v on a %d", p["status"], r.code)
	}
	return p
}

// TestGatewayLimitsAndProxies: a real upstream behind `leasehold gateway`
// and a fake agent: requests pass with the rate limit headers until the
// limit is spent, then 429 with Retry-After and a problem body; the
// upstream sees none of the denied requests, and a spoofed X-Forwarded-For
// from an untrusted client does not reach it.
func TestGatewayLimitsAndProxies(t *testing.T) {
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", 3, time.Hour, time.Hour)
	ag.SetLimit("tenant/heavy", 5, time.Hour, time.Hour)
	up := startUpstream(t)
	gw := startGateway(t, "--upstream", up.srv.URL, "--agent", ag.ServeTCP(t), "--key-header", "X-Tenant",
		"--cost-header", "X-Cost", "--trusted-proxies", "10.0.0.0/8", "--remaining-only-with", "Authorization")

	auth := map[string]string{"X-Tenant": "atlas", "Authorization": "Bearer t", "X-Forwarded-For": "6.6.6.6"}
	for i := range 3 {
		r := gwDo(t, gw+"/orders/7", auth)
		if r.code != 200 || r.body != "hello from /orders/7" || r.header.Get("X-Upstream") != "yes" {
			t.Fatalf("request %d: %d %q", i, r.code, r.body)
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"tenant/atlas";q=3;w=3600` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"tenant/atlas";r=`) {
			t.Fatalf("RateLimit %q for an authenticated caller", got)
		}
	}
	for _, req := range up.requests() {
		if got := req.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
			t.Fatalf("upstream saw X-Forwarded-For %q: the client's own value must not pass", got)
		}
	}
	r := gwDo(t, gw+"/orders/7", map[string]string{"X-Tenant": "atlas"})
	if r.code != http.StatusTooManyRequests || !delaySeconds.MatchString(r.header.Get("Retry-After")) {
		t.Fatalf("over the limit: %d Retry-After %q", r.code, r.header.Get("Retry-After"))
	}
	if r.header.Get("RateLimit") != "" || r.header.Get("RateLimit-Policy") == "" {
		t.Fatalf("anonymous 429: RateLimit %q, policy %q", r.header.Get("RateLimit"), r.header.Get("RateLimit-Policy"))
	}
	p := problemOf(t, r)
	if p["limit"] != "tenant/atlas" || p["reason"] != "OVER_LIMIT" || len(p["decision_id"].(string)) != 32 {
		t.Fatalf("problem %v", p)
	}
	if n := len(up.requests()); n != 3 {
		t.Fatalf("upstream saw %d requests, want the 3 admitted", n)
	}

	// Costs from a header.
	if r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "heavy", "X-Cost": "4"}); r.code != 200 {
		t.Fatalf("cost 4 of 5: %d", r.code)
	}
	if r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "heavy", "X-Cost": "2"}); r.code != 429 {
		t.Fatalf("cost 2 of the 1 left: %d", r.code)
	}
	if r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "heavy", "X-Cost": "two"}); r.code != 400 {
		t.Fatalf("bad cost: %d", r.code)
	}
	// No key, or a key that is not one segment: 400 (-missing-key reject).
	for _, h := range []map[string]string{{}, {"X-Tenant": "a/b"}, {"X-Tenant": "a b"}, {"X-Tenant": "."}, {"X-Tenant": ".."}} {
		if r := gwDo(t, gw+"/x", h); r.code != 400 || problemOf(t, r)["type"] != "urn:leasehold:problem:no-key" {
			t.Fatalf("key %v: %d %s", h, r.code, r.body)
		}
	}
	// A tenant without a limit passes (-unknown-limit pass).
	if r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "nobody"}); r.code != 200 {
		t.Fatalf("unknown limit: %d", r.code)
	}
}

// From a trusted proxy the X-Forwarded-For chain is kept and extended.
func TestGatewayTrustedProxyKeepsForwardedFor(t *testing.T) {
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", 100, time.Hour, time.Hour)
	up := startUpstream(t)
	gw := startGateway(t, "--upstream", up.srv.URL, "--agent", ag.ServeTCP(t), "--key-path-segment", "2",
		"--trusted-proxies", "127.0.0.0/8")
	r := gwDo(t, gw+"/v1/atlas/orders", map[string]string{"X-Forwarded-For": "203.0.113.9"})
	if r.code != 200 || r.body != "hello from /v1/atlas/orders" {
		t.Fatalf("%d %q", r.code, r.body)
	}
	if got := up.requests()[0].Header.Get("X-Forwarded-For"); got != "203.0.113.9, 127.0.0.1" {
		t.Fatalf("upstream saw X-Forwarded-For %q", got)
	}
	if w := ag.Window("tenant/atlas", time.Now().UnixNano()/int64(time.Hour)); w.CheckAdmitted != 1 {
		t.Fatalf("tenant/atlas admitted %d: the key comes from path segment 2", w.CheckAdmitted)
	}
	if r := gwDo(t, gw+"/v1", nil); r.code != 400 {
		t.Fatalf("no segment 2: %d", r.code)
	}
}

// When the agent cannot be reached the gateway answers 503 with
// Retry-After, and the upstream sees nothing.
func TestGatewayAgentDown(t *testing.T) {
	up := startUpstream(t)
	gw := startGateway(t, "--upstream", up.srv.URL, "--agent", ports.Addr(t), "--key-header", "X-Tenant", "--timeout", "100ms")
	r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "atlas"})
	if r.code != http.StatusServiceUnavailable || !delaySeconds.MatchString(r.header.Get("Retry-After")) {
		t.Fatalf("%d Retry-After %q", r.code, r.header.Get("Retry-After"))
	}
	if p := problemOf(t, r); p["reason"] != "UNAVAILABLE" || p["limit"] != "tenant/atlas" {
		t.Fatalf("problem %v", p)
	}
	if len(up.requests()) != 0 {
		t.Fatal("the upstream was called")
	}
}

func TestGatewayUpstreamDown(t *testing.T) {
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", 100, time.Hour, time.Hour)
	gw := startGateway(t, "--upstream", "http://"+ports.Addr(t), "--agent", ag.ServeTCP(t), "--key-header", "X-Tenant")
	if r := gwDo(t, gw+"/x", map[string]string{"X-Tenant": "atlas"}); r.code != http.StatusBadGateway {
		t.Fatalf("%d %s", r.code, r.body)
	}
}

func TestGatewayUsageErrors(t *testing.T) {
	up := "--upstream=http://127.0.0.1:1"
	for _, args := range [][]string{
		{"gateway"},
		{"gateway", "--key-header", "X-Tenant"},
		{"gateway", "--upstream", "localhost:80", "--key-header", "X-Tenant"},
		{"gateway", "--upstream", "ftp://x", "--key-header", "X-Tenant"},
		{"gateway", up},
		{"gateway", up, "--key-header", "X-Tenant", "--key-path-segment", "1"},
		{"gateway", up, "--key-header", "X Tenant"},
		{"gateway", up, "--key-path-segment", "-1"},
		{"gateway", up, "--key-header", "X-Tenant", "--limit-template", "tenant"},
		{"gateway", up, "--key-header", "X-Tenant", "--limit-template", "bad id/{key}"},
		{"gateway", up, "--key-header", "X-Tenant", "--trusted-proxies", "10.0.0.0/33"},
		{"gateway", up, "--key-header", "X-Tenant", "--sub-leases", "maybe"},
		{"gateway", up, "--key-header", "X-Tenant", "--missing-key", "ignore"},
		{"gateway", up, "--key-header", "X-Tenant", "--timeout", "0s"},
		{"gateway", up, "--key-header", "X-Tenant", "extra"},
		{"gateway", up, "--key-header", "X-Tenant", "--no-such-flag"},
		{"gateway", up, "--key-header", "X-Tenant", "--listen", "127.0.0.1:7", "--metrics-addr", "127.0.0.1:7"},
		{"gateway", up, "--key-header", "X-Tenant", "--metrics-addr", "7431"},
		{"gateway", up, "--key-header", "X-Tenant", "--metrics-addr", "127.0.0.1:http"},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), args, io.Discard, &stderr)
		if code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 || stderr.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 with one line", args, code, stderr.String())
		}
	}
	// Two bad choices: the reason names the same one every time.
	for range 5 {
		var stderr bytes.Buffer
		run(context.Background(), []string{"gateway", up, "--key-header", "X-Tenant", "--unknown-limit", "nope", "--sub-leases", "maybe"}, io.Discard, &stderr)
		if !strings.Contains(stderr.String(), `-sub-leases "maybe": want on or off`) {
			t.Fatalf("-sub-leases and -unknown-limit both bad: %q, want -sub-leases named (the first checked)", stderr.String())
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"gateway", "-h"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "-upstream") {
		t.Errorf("-h: exit %d, %q", code, out.String())
	}
}

// TestGatewayMetricsCountEveryDecision: N requests through a gateway with
// sub-leases; its leasehold_gateway_decisions_total equals the test's own
// counts of 200s and 429s exactly, some from sub-leases and the denial
// cache, and
// the gateway's /metrics is its own: the same path on -listen goes to the
// upstream.
func TestGatewayMetricsCountEveryDecision(t *testing.T) {
	const n, g = 4000, 3000
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit("tenant/atlas", g, time.Hour, time.Hour)
	up := startUpstream(t)
	gw, metrics := startGatewayMetrics(t, "--upstream", up.srv.URL, "--agent", ag.ServeTCP(t), "--key-header", "X-Tenant",
		"--timeout", "5s") // no 503 from a Check late on a busy machine
	if m := scrape(t, metrics); m[`leasehold_gateway_decisions_total{result="ok",source="sublease"}`] != 0 ||
		len(m) == 0 {
		t.Fatalf("before any request: %v", m)
	} else if held, ok := m["leasehold_gateway_sublease_tokens"]; !ok || held != 0 {
		t.Fatalf("before any request: leasehold_gateway_sublease_tokens %v (exported: %v), want 0", held, ok)
	}
	codes := map[int]int{}
	hc := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		req, _ := http.NewRequest("GET", gw+"/orders", nil)
		req.Header.Set("X-Tenant", "atlas")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200]+codes[429] != n || codes[200] > g || codes[429] == 0 {
		t.Fatalf("status codes %v of %d requests (limit %d)", codes, n, g)
	}
	m := scrape(t, metrics)
	sum := func(result string) (total float64) {
		for k, v := range m {
			if strings.HasPrefix(k, `leasehold_gateway_decisions_total{result="`+result+`",`) {
				total += v
			}
		}
		return total
	}
	if sum("ok") != float64(codes[200]) || sum("429") != float64(codes[429]) {
		t.Fatalf("gateway counted ok %v and 429 %v; the test saw %v", sum("ok"), sum("429"), codes)
	}
	for _, r := range []string{"fallback", "503", "error", "unknown_limit", "no_key"} {
		if sum(r) != 0 {
			t.Errorf("result %s: %v, want 0", r, sum(r))
		}
	}
	// What the gateway's sub-leases hold is of what G had left.
	if held, ok := m["leasehold_gateway_sublease_tokens"]; !ok || held < 0 || held > float64(g-codes[200]) {
		t.Errorf("leasehold_gateway_sublease_tokens %v (exported: %v), want 0 to the %d tokens G had left", held, ok, g-codes[200])
	}
	if m[`leasehold_gateway_decisions_total{result="ok",source="sublease"}`] == 0 ||
		m[`leasehold_gateway_decisions_total{result="429",source="denial_cache"}`] == 0 {
		t.Errorf("no sub-lease or denial-cache decision: %v", m)
	}
	t.Logf("%d requests: %v; series %v", n, codes, m)
	// /metrics on -listen is the upstream's path.
	if r := gwDo(t, gw+"/metrics", map[string]string{"X-Tenant": "other"}); r.code != 200 || r.body != "hello from /metrics" {
		t.Fatalf("/metrics on -listen: %d %q", r.code, r.body)
	}
}

// scrape reads the leasehold_gateway_ series of a /metrics page: each
// series (name{labels}, as written) and its value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, b)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "leasehold_gateway_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q", url, line)
		}
		out[line[:i]] = v
	}
	return out
}
