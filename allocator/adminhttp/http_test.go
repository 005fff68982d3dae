package adminhttp

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"leasehold/allocator"
	"leasehold/allocator/auth"
	"leasehold/allocator/auth/devca"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// tokenAuth is a test Authenticator: the bearer token names the role
// ("admin", "editor" of tenant/*, "viewer"); anything else is refused.
type tokenAuth struct{}

func (tokenAuth) Authenticate(_ *tls.ConnectionState, bearer string) (*auth.Principal, error) {
	switch bearer {
	case "admin":
		return &auth.Principal{Name: "ada", Kind: auth.KindUser, Role: auth.RoleAdmin, Via: auth.ViaToken}, nil
	case "editor":
		return &auth.Principal{Name: "ed", Kind: auth.KindUser, Role: auth.RoleEditor, Scopes: []string{"tenant/*"}, Via: auth.ViaToken}, nil
	case "viewer":
		return &auth.Principal{Name: "vi", Kind: auth.KindUser, Role: auth.RoleViewer, Via: auth.ViaToken}, nil
	case "":
		return nil, fmt.Errorf("%w: no credentials", auth.ErrUnauthenticated)
	}
	return nil, fmt.Errorf("%w: unknown token", auth.ErrUnauthenticated)
}

// startAllocator runs one allocator on c until the test ends.
func startAllocator(t testing.TB, c *etcdtest.Cluster, name string) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(allocator.Config{
		Client: c.Client(t), Regions: []string{"eu", "us"}, Advertise: name,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	return a
}

// serveHTTP serves a's Admin API over loopback and returns its base URL.
func serveHTTP(t *testing.T, a *allocator.Allocator, authn auth.Authenticator) string {
	t.Helper()
	h, err := New(Config{Admin: allocator.NewServer(a), Authenticator: authn})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := httptest.NewServer(h.Mount(mux))
	if r := (api{t: t, base: srv.URL}).do("GET", "/healthz", nil, ""); r.code != 200 || string(r.body) != "ok" {
		t.Fatalf("Mount hid the other routes: %d %s", r.code, r.body)
	}
	t.Cleanup(srv.Close)
	return srv.URL
}

// api is a test's HTTP client for one base URL and bearer token.
type api struct {
	t      *testing.T
	base   string
	token  string
	client *http.Client
}

type reply struct {
	code int
	hdr  http.Header
	body []byte
}

func (r reply) problem(t *testing.T) problem {
	t.Helper()
	var p problem
	if ct := r.hdr.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%d as %q, want a problem: %s", r.code, ct, r.body)
	}
	if err := json.Unmarshal(r.body, &p); err != nil || p.Status != r.code {
		t.Fatalf("problem %s: %v", r.body, err)
	}
	return p
}

// field returns the one field a 400 names.
func (r reply) field(t *testing.T) string {
	t.Helper()
	if r.code != http.StatusBadRequest {
		t.Fatalf("%d %s, want 400", r.code, r.body)
	}
	p := r.problem(t)
	if len(p.InvalidParams) != 1 {
		t.Fatalf("400 names %d fields: %s", len(p.InvalidParams), r.body)
	}
	return p.InvalidParams[0].Name
}

func (c api) do(method, path string, hdr map[string]string, body string) reply {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	cl := c.client
	if cl == nil {
		cl = http.DefaultClient
	}
	resp, err := cl.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func (c api) as(token string) api { c.token = token; return c }

// limitBody is a PUT body for a valid limit of g tokens per minute.
func limitBody(g int64, extra string) string {
	return fmt.Sprintf(`{"limit": {"limit_tokens": %d, "window": "60s", "regions": ["eu", "us"], "mode": "MODE_STRICT"}, "reason": "test"%s}`, g, extra)
}

func newAPI(t *testing.T, authn auth.Authenticator) (api, *allocator.Allocator) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	return api{t: t, base: serveHTTP(t, a, authn)}, a
}

func mustCode(t *testing.T, r reply, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("got %d %s, want %d", r.code, r.body, code)
	}
}

// TestConditionalPut: If-None-Match: * creates; If-Match with the current
// version writes and answers the new ETag; a stale one is 412 naming the
// current version.
func TestConditionalPut(t *testing.T) {
	c, _ := newAPI(t, nil)
	r := c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-None-Match": "*"}, limitBody(100, ""))
	mustCode(t, r, 200)
	if et := r.hdr.Get("ETag"); et != `"1"` {
		t.Fatalf("ETag %q after create", et)
	}
	r = c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-None-Match": "*"}, limitBody(100, ""))
	mustCode(t, r, http.StatusPreconditionFailed)
	if p := r.problem(t); p.CurrentVersion == nil || *p.CurrentVersion != 1 {
		t.Fatalf("412 without the current version: %s", r.body)
	}
	r = c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(200, ""))
	mustCode(t, r, 200)
	if et := r.hdr.Get("ETag"); et != `"2"` {
		t.Fatalf("ETag %q after a fresh If-Match, want \"2\"", et)
	}
	r = c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(300, ""))
	mustCode(t, r, http.StatusPreconditionFailed)
	if p := r.problem(t); p.CurrentVersion == nil || *p.CurrentVersion != 2 || r.hdr.Get("ETag") != `"2"` {
		t.Fatalf("stale If-Match: %s (ETag %q), want current version 2", r.body, r.hdr.Get("ETag"))
	}
	r = c.do("GET", "/v1/limits/tenant/atlas", nil, "")
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"limit_tokens":"200"`) {
		t.Fatalf("the stale write landed: %s", r.body)
	}
	// A stale If-Match on a limit that no longer exists names version 0.
	r = c.do("PUT", "/v1/limits/tenant/nobody", map[string]string{"If-Match": `"4"`}, limitBody(300, ""))
	mustCode(t, r, http.StatusPreconditionFailed)
	if p := r.problem(t); p.CurrentVersion == nil || *p.CurrentVersion != 0 {
		t.Fatalf("412 on a missing limit: %s", r.body)
	}
	// Without a precondition the same race is 409: see TestApplyConflict.
}

// TestRacingPuts: two PUTs with the same If-Match, started together: one
// 200, one 412, and the history shows exactly one change after the
// creation.
func TestRacingPuts(t *testing.T) {
	c, _ := newAPI(t, nil)
	mustCode(t, c.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(100, "")), 200)
	for round := range 5 {
		cur := c.do("GET", "/v1/limits/tenant/atlas", nil, "")
		mustCode(t, cur, 200)
		etag := cur.hdr.Get("ETag")
		start := make(chan struct{})
		codes := make([]int, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				<-start
				r := c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": etag}, limitBody(int64(1000*(round+1)+i), ""))
				codes[i] = r.code
			})
		}
		close(start)
		wg.Wait()
		if !(codes[0] == 200 && codes[1] == 412 || codes[0] == 412 && codes[1] == 200) {
			t.Fatalf("round %d: %v, want one 200 and one 412", round, codes)
		}
	}
	r := c.do("GET", "/v1/limits/tenant/atlas/history", nil, "")
	mustCode(t, r, 200)
	var h pb.LimitHistoryResponse
	if err := protojson.Unmarshal(r.body, &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Events) != 6 {
		t.Fatalf("history has %d events, want the creation and one change per round (6): %s", len(h.Events), r.body)
	}
	for i, e := range h.Events {
		if e.NewVersion != int64(i+1) || e.Outcome != pb.AuditOutcome_AUDIT_OUTCOME_APPLIED || e.Transport != "http" {
			t.Errorf("event %d: %v", i, e)
		}
	}
}

// TestBadRequestsNameTheField: an invalid limit, malformed JSON, an
// unknown field, a bad query parameter and a bad If-Match are 400s naming
// the field or parameter.
func TestBadRequestsNameTheField(t *testing.T) {
	c, _ := newAPI(t, nil)
	for _, tc := range []struct {
		method, path string
		hdr          map[string]string
		body, field  string
	}{
		{"PUT", "/v1/limits/tenant/atlas", nil, limitBody(0, ""), "limit.limit_tokens"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "1.5ms", "regions": ["eu"], "mode": "MODE_STRICT"}, "reason": "r"}`, "limit.window"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu", "mars"], "mode": "MODE_STRICT"}, "reason": "r"}`, "limit.regions[1]"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5,`, "body"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "windw": "60s"}}`, "limit.windw"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": "lots"}}`, "limit.limit_tokens"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"id": "tenant/other"}, "reason": "r"}`, "limit.id"},
		{"PUT", "/v1/limits/tenant/atlas", nil, limitBody(5, `, "expected_version": "3"`), "expected_version"},
		{"PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": "3"}, limitBody(5, ""), "If-Match"},
		{"PUT", "/v1/limits/tenant/atlas", map[string]string{"If-None-Match": `"3"`}, limitBody(5, ""), "If-None-Match"},
		{"PUT", "/v1/limits/tenant/atlas?dry_run=true", nil, limitBody(5, ""), "dry_run"},
		{"PUT", "/v1/limits/tenant//atlas", nil, limitBody(5, ""), "id"},
		{"DELETE", "/v1/limits/tenant/../atlas?reason=r", nil, "", "id"},
		{"GET", "/v1/limits/tenant!atlas", nil, "", "id"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT"}}`, "reason"},
		{"DELETE", "/v1/limits/tenant/atlas", nil, "", "reason"},
		{"GET", "/v1/limits?page_size=lots", nil, "", "page_size"},
		{"GET", "/v1/limits?page_size=5000", nil, "", "page_size"},
		{"GET", "/v1/limits?pagesize=5", nil, "", "pagesize"},
		{"GET", "/v1/limits/tenant/atlas/windows?last=-1", nil, "", "last"},
		{"GET", "/v1/audit?since=yesterday", nil, "", "since"},
		{"DELETE", "/v1/limits/tenant/atlas?reason=r&dryrun=true", nil, "", "dryrun"},
		{"DELETE", "/v1/limits/tenant/atlas?reason=r&dry_run=maybe", nil, "", "dry_run"},
		{"POST", "/v1/limits:apply", nil, `{"changes": [{"delete": "tenant/x"}, {"put": {"limit_tokens": "x"}}], "reason": "r"}`, "changes[1].put.limit_tokens"},
		// Length caps (allocator.maxReasonLen, limitspec's), checked before anything else.
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT"}, "reason": "` + strings.Repeat("r", 1001) + `"}`, "reason"},
		{"DELETE", "/v1/limits/tenant/atlas?reason=" + strings.Repeat("r", 1001), nil, "", "reason"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT", "description": "` + strings.Repeat("d", 2001) + `"}, "reason": "r"}`, "limit.description"},
		{"PUT", "/v1/limits/tenant/atlas", nil, `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT", "tags": {"t": "` + strings.Repeat("v", 201) + `"}}, "reason": "r"}`, "limit.tags[t]"},
		{"GET", "/v1/limits?prefix=" + strings.Repeat("p", 201), nil, "", "prefix"},
		// A contract that makes its tenant's limit invalid names its field.
		{"PUT", "/v1/limits/plans/pro", nil, `{"limit": {"binds": ["tenant/{id}"], "limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT",
			"contracts": {"tenant/atlas": {"fallback": {"eu": {"kind": "FALLBACK_KIND_OPEN"}}}}}, "reason": "r"}`, "limit.contracts[tenant/atlas].fallback[eu]"},
		{"PUT", "/v1/limits/plans/pro", nil, `{"limit": {"binds": ["tenant/{id}"], "limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT",
			"contracts": {"tenant/atlas": {"window": "0.5s"}}}, "reason": "r"}`, "limit.contracts[tenant/atlas].window"},
	} {
		r := c.do(tc.method, tc.path, tc.hdr, tc.body)
		if r.code != 400 {
			t.Errorf("%s %s %s: %d %s, want 400 naming %s", tc.method, tc.path, tc.body, r.code, r.body, tc.field)
			continue
		}
		if got := r.field(t); got != tc.field {
			t.Errorf("%s %s %s: names %q, want %q (%s)", tc.method, tc.path, tc.body, got, tc.field, r.body)
		}
	}
	// Nothing was stored by any of them.
	mustCode(t, c.do("GET", "/v1/limits/tenant/atlas", nil, ""), 404)
}

// TestStatusCodes: 404, 405 with Allow, 413, 415, all as problems.
func TestStatusCodes(t *testing.T) {
	c, _ := newAPI(t, nil)
	r := c.do("GET", "/v1/limits/tenant/nobody", nil, "")
	mustCode(t, r, 404)
	r.problem(t)
	r = c.do("POST", "/v1/limits", nil, "{}")
	mustCode(t, r, 405)
	if r.hdr.Get("Allow") != "GET, HEAD" {
		t.Errorf("Allow %q", r.hdr.Get("Allow"))
	}
	r.problem(t)
	r = c.do("GET", "/v1/nothing", nil, "")
	mustCode(t, r, 404)
	r.problem(t)
	big := `{"reason": "` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`
	r = c.do("PUT", "/v1/limits/tenant/atlas", nil, big)
	mustCode(t, r, http.StatusRequestEntityTooLarge)
	r.problem(t)
	r = c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "limit_tokens=5")
	mustCode(t, r, http.StatusUnsupportedMediaType)
	r.problem(t)
}

// TestRoundTrip: PUT, GET with the same ETag, a dry run that changes
// nothing, history, DELETE with a stale then a fresh If-Match.
func TestRoundTrip(t *testing.T) {
	c, _ := newAPI(t, nil)
	put := c.do("PUT", "/v1/limits/tenant/atlas", nil,
		`{"limit": {"limit_tokens": 100, "window": "60s", "regions": ["eu", "us"], "mode": "MODE_BOUNDED",
		  "fallback": {"eu": {"kind": "FALLBACK_KIND_LOCAL", "local_tokens": 10}}, "owner": "finance",
		  "tags": {"plan": "gold"}}, "reason": "new contract"}`)
	mustCode(t, put, 200)
	var pr pb.PutLimitResponse
	if err := protojson.Unmarshal(put.body, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Limit.Version != 1 || pr.Limit.Owner != "finance" || put.hdr.Get("ETag") != `"1"` {
		t.Fatalf("PUT: %s (ETag %q)", put.body, put.hdr.Get("ETag"))
	}
	if !strings.Contains(string(put.body), `"limit_tokens"`) || strings.Contains(string(put.body), `"limitTokens"`) {
		t.Errorf("not proto names: %s", put.body)
	}
	get := c.do("GET", "/v1/limits/tenant/atlas", nil, "")
	mustCode(t, get, 200)
	if get.hdr.Get("ETag") != put.hdr.Get("ETag") {
		t.Fatalf("GET ETag %q, PUT %q", get.hdr.Get("ETag"), put.hdr.Get("ETag"))
	}
	var gr pb.GetLimitResponse
	if err := protojson.Unmarshal(get.body, &gr); err != nil || gr.Limit.LimitTokens != 100 || gr.Limit.Tags["plan"] != "gold" {
		t.Fatalf("GET: %s %v", get.body, err)
	}
	mustCode(t, c.do("GET", "/v1/limits/tenant/atlas", map[string]string{"If-None-Match": `"1"`}, ""), http.StatusNotModified)

	dry := c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(5, `, "dry_run": true, "effective": "EFFECTIVE_NOW"`))
	mustCode(t, dry, 200)
	if dry.hdr.Get("ETag") != "" {
		t.Errorf("a dry run answered ETag %q", dry.hdr.Get("ETag"))
	}
	var dr pb.PutLimitResponse
	if err := protojson.Unmarshal(dry.body, &dr); err != nil || dr.GetEffect().GetNewLimitTokens() != 5 || dr.GetEffect().GetAction() != "update" {
		t.Errorf("dry run effect: %s %v", dry.body, err)
	}
	mustCode(t, c.do("DELETE", "/v1/limits/tenant/atlas?reason=cleanup&dry_run=true", nil, ""), 200)
	get2 := c.do("GET", "/v1/limits/tenant/atlas", nil, "")
	mustCode(t, get2, 200)
	if string(get2.body) != string(get.body) || get2.hdr.Get("ETag") != `"1"` {
		t.Fatalf("dry runs changed the limit: %s", get2.body)
	}

	mustCode(t, c.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(200, "")), 200)
	hist := c.do("GET", "/v1/limits/tenant/atlas/history", nil, "")
	mustCode(t, hist, 200)
	var hr pb.LimitHistoryResponse
	if err := protojson.Unmarshal(hist.body, &hr); err != nil {
		t.Fatal(err)
	}
	if len(hr.Events) != 2 || hr.Events[0].Reason != "new contract" || hr.Events[1].OldVersion != 1 || hr.Events[1].NewVersion != 2 {
		t.Fatalf("history: %s", hist.body)
	}

	r := c.do("DELETE", "/v1/limits/tenant/atlas?reason=cleanup", map[string]string{"If-Match": `"1"`}, "")
	mustCode(t, r, http.StatusPreconditionFailed)
	if p := r.problem(t); p.CurrentVersion == nil || *p.CurrentVersion != 2 {
		t.Fatalf("stale DELETE: %s", r.body)
	}
	mustCode(t, c.do("DELETE", "/v1/limits/tenant/atlas?reason=cleanup", map[string]string{"If-Match": `"2"`}, ""), 200)
	mustCode(t, c.do("GET", "/v1/limits/tenant/atlas", nil, ""), 404)

	// The windows of a limit (leader) and the list.
	mustCode(t, c.do("PUT", "/v1/limits/tenant/zeta", nil, limitBody(50, "")), 200)
	var wr reply
	for range 500 { // the leader's core learns the new limit from etcd's watch
		if wr = c.do("GET", "/v1/limits/tenant/zeta/windows?last=2", nil, ""); wr.code != 404 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not ordering
	}
	mustCode(t, wr, 200)
	var lw pb.ListWindowsResponse
	if err := protojson.Unmarshal(wr.body, &lw); err != nil || !strings.Contains(string(wr.body), `"windows":`) {
		t.Errorf("windows: %s %v", wr.body, err)
	}
	l := c.do("GET", "/v1/limits?prefix=tenant/&page_size=10", nil, "")
	mustCode(t, l, 200)
	if !strings.Contains(string(l.body), `"id":"tenant/zeta"`) {
		t.Fatalf("list: %s", l.body)
	}
	w := c.do("GET", "/v1/whoami", nil, "")
	mustCode(t, w, 200)
	if !strings.Contains(string(w.body), `"via":"none"`) {
		t.Errorf("whoami with authentication off: %s", w.body)
	}
}

// TestApplyConflict: ApplyLimits with a stale expected_version is 409 and
// changes nothing; with the right versions it applies.
func TestApplyConflict(t *testing.T) {
	c, _ := newAPI(t, nil)
	mustCode(t, c.do("PUT", "/v1/limits/tenant/a", nil, limitBody(10, "")), 200)
	body := func(v int64) string {
		return fmt.Sprintf(`{"changes": [{"put": {"id": "tenant/a", "limit_tokens": 20, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT"}, "expected_version": %d},
		  {"put": {"id": "tenant/b", "limit_tokens": 30, "window": "60s", "regions": ["us"], "mode": "MODE_STRICT"}, "expected_version": 0}], "reason": "plan 7"}`, v)
	}
	r := c.do("POST", "/v1/limits:apply", nil, body(7))
	mustCode(t, r, http.StatusConflict)
	r.problem(t)
	mustCode(t, c.do("GET", "/v1/limits/tenant/b", nil, ""), 404)
	mustCode(t, c.do("POST", "/v1/limits:apply", nil, body(1)), 200)
	mustCode(t, c.do("GET", "/v1/limits/tenant/b", nil, ""), 200)
}

// TestAuthorization: with authentication on, 401 without or with bad
// credentials, 403 for a viewer writing and an editor out of its scope,
// and the refusals are in the audit log with the transport "http".
func TestAuthorization(t *testing.T) {
	c, _ := newAPI(t, tokenAuth{})
	r := c.do("GET", "/v1/limits", nil, "")
	mustCode(t, r, http.StatusUnauthorized)
	if r.hdr.Get("WWW-Authenticate") != `Bearer realm="leasehold"` {
		t.Errorf("WWW-Authenticate %q", r.hdr.Get("WWW-Authenticate"))
	}
	r.problem(t)
	r = c.as("forged").do("GET", "/v1/limits", nil, "")
	mustCode(t, r, http.StatusUnauthorized)
	if !strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Bearer ") {
		t.Errorf("WWW-Authenticate %q", r.hdr.Get("WWW-Authenticate"))
	}
	mustCode(t, c.do("GET", "/v1/limits", map[string]string{"Authorization": "Basic YTpi"}, ""), http.StatusUnauthorized)
	// Unauthenticated requests learn nothing about their input either.
	mustCode(t, c.do("PUT", "/v1/limits/tenant/atlas", nil, "{"), http.StatusUnauthorized)
	// The document needs no credentials.
	mustCode(t, c.do("GET", "/v1/openapi.yaml", nil, ""), 200)

	admin, editor, viewer := c.as("admin"), c.as("editor"), c.as("viewer")
	mustCode(t, admin.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(100, "")), 200)
	mustCode(t, admin.do("PUT", "/v1/limits/global/all", nil, limitBody(100, "")), 200)

	r = viewer.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(5, ""))
	mustCode(t, r, http.StatusForbidden)
	r.problem(t)
	mustCode(t, viewer.do("GET", "/v1/limits/tenant/atlas", nil, ""), 200)
	mustCode(t, viewer.do("DELETE", "/v1/limits/tenant/atlas?reason=x", nil, ""), http.StatusForbidden)
	mustCode(t, viewer.do("GET", "/v1/audit", nil, ""), http.StatusForbidden)

	mustCode(t, editor.do("PUT", "/v1/limits/global/all", nil, limitBody(5, "")), http.StatusForbidden)
	mustCode(t, editor.do("PUT", "/v1/limits/global/all", nil, limitBody(5, `, "dry_run": true`)), http.StatusForbidden)
	mustCode(t, editor.do("POST", "/v1/limits:apply", nil, `{"changes": [{"delete": "global/all", "expected_version": 1}], "reason": "r"}`), http.StatusForbidden)
	put := editor.do("PUT", "/v1/limits/tenant/atlas", map[string]string{"If-Match": `"1"`}, limitBody(7, ""))
	mustCode(t, put, 200)
	if put.hdr.Get("ETag") != `"2"` {
		t.Errorf("editor's write: ETag %q", put.hdr.Get("ETag"))
	}
	w := editor.do("GET", "/v1/whoami", nil, "")
	mustCode(t, w, 200)
	var who pb.WhoAmIResponse
	if err := protojson.Unmarshal(w.body, &who); err != nil || who.Principal != "ed" || who.Role != "editor" || who.Via != "token" {
		t.Errorf("whoami: %s %v", w.body, err)
	}

	a := admin.do("GET", "/v1/audit?limit_prefix=global/", nil, "")
	mustCode(t, a, 200)
	var al pb.ListAuditResponse
	if err := protojson.Unmarshal(a.body, &al); err != nil {
		t.Fatal(err)
	}
	denied := 0
	for _, e := range al.Events {
		if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_DENIED {
			denied++
			if e.Principal != "ed" || e.Transport != "http" {
				t.Errorf("denied event %v", e)
			}
		}
	}
	if denied != 3 {
		t.Errorf("%d denied events of global/all, want 3 (put, dry-run put, apply): %s", denied, a.body)
	}
	since := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	a = admin.do("GET", "/v1/audit?since="+since, nil, "")
	mustCode(t, a, 200)
	if err := protojson.Unmarshal(a.body, &al); err != nil || len(al.Events) != 0 {
		t.Errorf("audit since the future: %s", a.body)
	}
}

// TestFollowerNamesLeader: a follower's 503 for the leader's reports
// carries Retry-After and the leader's address.
func TestFollowerNamesLeader(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "leader-addr:7400")
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "follower-addr:7400")
	f := api{t: t, base: serveHTTP(t, b, nil)}
	var r reply
	for range 200 { // the follower learns who leads from etcd
		r = f.do("GET", "/v1/limits/tenant/atlas/windows", nil, "")
		if r.code == 503 && r.hdr.Get(LeaderHeader) != "" {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not ordering
	}
	mustCode(t, r, 503)
	if r.hdr.Get(LeaderHeader) != "leader-addr:7400" || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("follower's 503: %v %s", r.hdr, r.body)
	}
	if p := r.problem(t); p.Leader != "leader-addr:7400" {
		t.Fatalf("problem: %s", r.body)
	}
	// Writes too, if the follower does not serve them.
	if r = f.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(10, "")); r.code == 503 && r.hdr.Get(LeaderHeader) != "leader-addr:7400" {
		t.Fatalf("follower's 503 on PUT: %v %s", r.hdr, r.body)
	}
}

// TestLimitIDsEndingInPartNames: GET .../history is the history of the
// limit before it; the limit whose id ends in /history is reached with
// %2F.
func TestLimitIDsEndingInPartNames(t *testing.T) {
	c, _ := newAPI(t, nil)
	mustCode(t, c.do("PUT", "/v1/limits/tenant/history", nil, limitBody(10, "")), http.StatusMethodNotAllowed)
	mustCode(t, c.do("PUT", "/v1/limits/tenant%2Fhistory", nil, limitBody(10, "")), 200)
	r := c.do("GET", "/v1/limits/tenant%2Fhistory", nil, "")
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"id":"tenant/history"`) {
		t.Fatalf("got %s", r.body)
	}
	// "tenant/history" is the history of the limit "tenant", which does
	// not exist.
	r = c.do("GET", "/v1/limits/tenant/history", nil, "")
	if r.code == 200 && strings.Contains(string(r.body), `"id":"tenant/history"`) {
		t.Fatalf("GET .../history read the limit: %s", r.body)
	}
	mustCode(t, c.do("GET", "/v1/limits/history", nil, ""), 404) // the limit "history"
}

// TestRealAuthenticatorOverTLS: the allocator's own Authenticator (an
// auth file with a hashed token, a client certificate of the dev CA) over
// HTTPS.
func TestRealAuthenticatorOverTLS(t *testing.T) {
	ca, err := devca.New("test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	token, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	users, err := auth.NewUsers(&auth.Config{Users: []auth.UserConfig{
		{Name: "alice", Role: "admin", Tokens: []string{auth.HashToken(token)}},
		{Name: "bob", Role: "editor", Scopes: []string{"tenant/*"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	guard := auth.NewGuard(users, nil, nil)

	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	h, err := New(Config{Admin: allocator.NewServer(a, allocator.WithAuthRequired(true)), Authenticator: guard.Authenticator()})
	if err != nil {
		t.Fatal(err)
	}
	srvPair, err := ca.Server([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := srvPair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h.Mount(http.NotFoundHandler()))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	client := func(certs ...tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: certs, MinVersion: tls.VersionTLS12}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	anon := api{t: t, base: srv.URL, client: client()}
	r := anon.do("GET", "/v1/whoami", nil, "")
	mustCode(t, r, http.StatusUnauthorized)
	if r.hdr.Get("WWW-Authenticate") != `Bearer realm="leasehold"` {
		t.Errorf("WWW-Authenticate %q", r.hdr.Get("WWW-Authenticate"))
	}
	r = anon.as(token+"x").do("GET", "/v1/whoami", nil, "")
	mustCode(t, r, http.StatusUnauthorized)
	if r.hdr.Get("WWW-Authenticate") != `Bearer realm="leasehold", error="invalid_token"` {
		t.Errorf("WWW-Authenticate %q", r.hdr.Get("WWW-Authenticate"))
	}

	alice := anon.as(token)
	r = alice.do("GET", "/v1/whoami", nil, "")
	mustCode(t, r, 200)
	var who pb.WhoAmIResponse
	if err := protojson.Unmarshal(r.body, &who); err != nil || who.Principal != "alice" || who.Via != "token" || who.Role != "admin" {
		t.Fatalf("alice: %s %v", r.body, err)
	}
	mustCode(t, alice.do("PUT", "/v1/limits/global/all", nil, limitBody(10, "")), 200)

	bobPair, err := ca.User("bob", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bobCert, err := bobPair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	bob := api{t: t, base: srv.URL, client: client(bobCert)}
	r = bob.do("GET", "/v1/whoami", nil, "")
	mustCode(t, r, 200)
	if err := protojson.Unmarshal(r.body, &who); err != nil || who.Principal != "bob" || who.Via != "certificate" || who.Role != "editor" {
		t.Fatalf("bob: %s %v", r.body, err)
	}
	mustCode(t, bob.do("PUT", "/v1/limits/global/all", map[string]string{"If-Match": `"1"`}, limitBody(5, "")), http.StatusForbidden)
	mustCode(t, bob.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(5, "")), 200)
	// A certificate and a token of different users is refused.
	mustCode(t, bob.as(token).do("GET", "/v1/whoami", nil, ""), http.StatusUnauthorized)
	// A certificate of another CA is not verified: refused.
	other, err := devca.New("other CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	evePair, err := other.User("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eveCert, err := evePair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	eve := api{t: t, base: srv.URL, client: client(eveCert)}
	req, _ := http.NewRequest("GET", srv.URL+"/v1/whoami", nil)
	if resp, err := eve.client.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a certificate of an unknown CA: %d", resp.StatusCode)
		}
	} // else the TLS handshake refused it: as good
}

// BenchmarkGetLimit measures GET /v1/limits/{id} over loopback against a
// real allocator (one etcd read per call).
func BenchmarkGetLimit(b *testing.B) {
	a := startAllocator(b, etcdtest.Start(b, 1), "a")
	allocatortest.WaitLeader(b, a)
	ctx := context.Background()
	h, err := New(Config{Admin: allocator.NewServer(a)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	req, _ := http.NewRequest("PUT", srv.URL+"/v1/limits/tenant/atlas", strings.NewReader(limitBody(100, "")))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		b.Fatalf("put: %v", err)
	}
	b.Run("service", func(b *testing.B) { // the same call without HTTP, for comparison
		s := allocator.NewServer(a)
		b.RunParallel(func(p *testing.PB) {
			for p.Next() {
				if _, err := s.GetLimit(ctx, &pb.GetLimitRequest{Id: "tenant/atlas"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("http", func(b *testing.B) { benchGet(b, srv.URL+"/v1/limits/tenant/atlas") })
}

func benchGet(b *testing.B, url string) {
	b.RunParallel(func(p *testing.PB) {
		for p.Next() {
			resp, err := http.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// TestOverrideOverHTTP: PUT with override_for stores an override that
// ends by itself (its end and the version it returns to in the answer);
// a body carrying limit.override, or an override for the next window, is
// a 400 naming the field.
func TestOverrideOverHTTP(t *testing.T) {
	c, _ := newAPI(t, nil)
	mustCode(t, c.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(100, "")), 200)
	r := c.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(300, `, "override_for": "7200s"`))
	mustCode(t, r, 200)
	for _, want := range []string{`"override":{"reason":"test","ends_at":`, `"after":{"id":"tenant/atlas","limit_tokens":"100"`} {
		if !strings.Contains(string(r.body), want) {
			t.Fatalf("override answer lacks %s: %s", want, r.body)
		}
	}
	for _, s := range []struct{ body, field string }{
		{`{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu", "us"], "mode": "MODE_STRICT", "override": {"reason": "x"}}, "reason": "test", "effective": "EFFECTIVE_NOW"}`, "limit.override"},
		{limitBody(300, `, "override_for": "3600s", "effective": "EFFECTIVE_NEXT_WINDOW"`), "effective"},
		{limitBody(300, `, "override_for": "0.5s"`), "override_for"},
		{limitBody(50, ""), "effective"}, // next window, during the override
	} {
		if got := c.do("PUT", "/v1/limits/tenant/atlas", nil, s.body).field(t); got != s.field {
			t.Errorf("%s: 400 names %q, want %q", s.body, got, s.field)
		}
	}
}

// TestBucketOverrideOverHTTP: override_for on a bucket limit stores an
// override of R and B with the version it returns to; one that changes
// the rate period is a 400 naming limit.rate_period.
func TestBucketOverrideOverHTTP(t *testing.T) {
	c, _ := newAPI(t, nil)
	body := func(rate, period, extra string) string {
		return `{"limit": {"kind": "LIMIT_KIND_BUCKET", "rate_tokens": ` + rate + `, "rate_period": "` + period +
			`", "burst_tokens": 200, "regions": ["eu", "us"], "mode": "MODE_STRICT"}, "reason": "test"` + extra + `}`
	}
	mustCode(t, c.do("PUT", "/v1/limits/b/api", nil, body("100", "1s", "")), 200)
	r := c.do("PUT", "/v1/limits/b/api", nil, body("300", "1s", `, "override_for": "7200s"`))
	mustCode(t, r, 200)
	for _, want := range []string{`"rate_tokens":"300"`, `"override":{"reason":"test","ends_at":`, `"rate_tokens":"100"`} {
		if !strings.Contains(string(r.body), want) {
			t.Fatalf("override answer lacks %s: %s", want, r.body)
		}
	}
	if got := c.do("PUT", "/v1/limits/b/api", nil, body("300", "60s", `, "override_for": "7200s"`)).field(t); got != "limit.rate_period" {
		t.Errorf("an override of the rate period: 400 names %q, want limit.rate_period", got)
	}
	// ListWindows carries the version in force while it is an override
	// (bounded poll: the leader's core takes the change from its watch).
	for i := 0; ; i++ {
		w := c.do("GET", "/v1/limits/b/api/windows", nil, "")
		mustCode(t, w, 200)
		if strings.Contains(string(w.body), `"overridden":{"id":"b/api"`) {
			if !strings.Contains(string(w.body), `"override":{"reason":"test","ends_at":`) {
				t.Fatalf("overridden lacks its override: %s", w.body)
			}
			break
		}
		if i == 200 {
			t.Fatalf("windows never carried overridden: %s", w.body)
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's effect
	}
	mustCode(t, c.do("PUT", "/v1/limits/b/api", nil, body("100", "1s", `, "effective": "EFFECTIVE_NOW"`)), 200) // ends it
	for i := 0; ; i++ {
		w := c.do("GET", "/v1/limits/b/api/windows", nil, "")
		mustCode(t, w, 200)
		if !strings.Contains(string(w.body), `"overridden"`) {
			break
		}
		if i == 200 {
			t.Fatalf("windows still carry overridden after a change made now: %s", w.body)
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's effect
	}
}

// TestCalendarOverHTTP: a limit with calendar windows is stored and read
// back over HTTP; a bad unit or zone, or a window beside them, is 400
// naming the field; a change of zone for the next window that never
// starts a window with the running one is 400 naming limit.calendar.
func TestCalendarOverHTTP(t *testing.T) {
	c, _ := newAPI(t, nil)
	body := func(cal string) string {
		return `{"limit": {"limit_tokens": "5000000", ` + cal + `"regions": ["eu"], "mode": "MODE_STRICT"}, "reason": "r"}`
	}
	r := c.do("PUT", "/v1/limits/tenant/atlas", nil, body(`"calendar": {"unit": "month", "zone": "Europe/Berlin"}, `))
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"calendar":{"unit":"month","zone":"Europe/Berlin"}`) {
		t.Fatalf("answer lacks the calendar: %s", r.body)
	}
	r = c.do("GET", "/v1/limits/tenant/atlas", nil, "")
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"calendar":{"unit":"month","zone":"Europe/Berlin"}`) || strings.Contains(string(r.body), `"window"`) {
		t.Fatalf("read back: %s", r.body)
	}
	for _, tc := range []struct{ cal, field string }{
		{`"calendar": {"unit": "fortnight", "zone": "UTC"}, `, "limit.calendar.unit"},
		{`"calendar": {"unit": "month", "zone": "Mars/Olympus"}, `, "limit.calendar.zone"},
		{`"calendar": {"unit": "month", "zone": "Europe/Berlin"}, "window": "60s", `, "limit.window"},
		{`"calendar": {"unit": "month", "zone": "America/New_York"}, `, "limit.calendar"},
	} {
		if got := c.do("PUT", "/v1/limits/tenant/atlas", nil, body(tc.cal)).field(t); got != tc.field {
			t.Errorf("%s: 400 names %q, want %q", tc.cal, got, tc.field)
		}
	}
}
