package adminhttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	pb "leasehold/proto/leasehold/v1"
)

// TestDecodeNamesTheField: a body protojson refuses is a 400 naming the
// field as the service names fields.
func TestDecodeNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		body, field string
	}{
		{``, "body"},
		{`   `, "body"},
		{`{`, "body"},
		{`[]`, "body"},
		{`{"limit": {"limit_tokens": "many"}}`, "limit.limit_tokens"},
		{`{"limit": {"limitTokens": "many"}}`, "limit.limit_tokens"},
		{`{"limit": {"bogus": 1}}`, "limit.bogus"},
		{`{"bogus": 1}`, "bogus"},
		{"{\n  \"reason\": \"r\",\n  \"limit\": {\n    \"window\": 60\n  }\n}", "limit.window"},
		{`{"limit": {"mode": "MODE_LOOSE"}}`, "limit.mode"},
		{`{"limit": {"regions": ["eu", 5]}}`, "limit.regions[1]"},
		{`{"limit": {"fallback": {"eu": {"kind": "FALLBACK_KIND_LOCAL", "local_tokens": "x"}}}}`, "limit.fallback[eu].local_tokens"},
		{`{"limit": {"fallback": {"eu": {"kind": "SIDEWAYS"}}}}`, "limit.fallback[eu].kind"},
		{`{"limit": {"tags": {"plan": 5}}}`, "limit.tags[plan]"},
		{`{"limit": {"lease": {"ttl": "soon"}}}`, "limit.lease.ttl"},
		{`{"dry_run": "yes"}`, "dry_run"},
		{`{"effective": "EFFECTIVE_LATER"}`, "effective"},
		{`{"reason": "a", "reason": "b"}`, "reason"},
		{`{"limit": {"previous": {"previous": {"limit_tokens": []}}}}`, "limit.previous.previous.limit_tokens"},
		{`{"limit": {"limit_tokens": 5}} trailing`, "body"},
	} {
		err := decodeJSON([]byte(tc.body), &pb.PutLimitRequest{})
		var p *problem
		if !errors.As(err, &p) || p.Status != http.StatusBadRequest || len(p.InvalidParams) != 1 {
			t.Errorf("%s: got %v, want a 400 naming %s", tc.body, err, tc.field)
			continue
		}
		if got := p.InvalidParams[0].Name; got != tc.field {
			t.Errorf("%s: names %q, want %q (%s)", tc.body, got, tc.field, p.Detail)
		}
	}
	// ApplyLimits: list indexes and the oneof.
	for _, tc := range []struct{ body, field string }{
		{`{"changes": [{"delete": "a"}, {"put": {"window": 1}}]}`, "changes[1].put.window"},
		{`{"changes": [{"delete": "a", "put": {}}]}`, "changes[0].put"},
		{`{"changes": [{"expected_version": "x"}]}`, "changes[0].expected_version"},
	} {
		err := decodeJSON([]byte(tc.body), &pb.ApplyLimitsRequest{})
		var p *problem
		if !errors.As(err, &p) || len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != tc.field {
			t.Errorf("%s: got %v, want a 400 naming %s", tc.body, err, tc.field)
		}
	}
	req := &pb.PutLimitRequest{}
	if err := decodeJSON([]byte(`{"limit": {"limitTokens": "7", "window": "60s"}, "reason": "r", "dry_run": true}`), req); err != nil {
		t.Fatal(err)
	}
	if req.Limit.LimitTokens != 7 || req.Limit.Window.AsDuration().Seconds() != 60 || !req.DryRun || req.Reason != "r" {
		t.Errorf("decoded %v", req)
	}
}

// TestPathNotUTF8: a path that is not UTF-8 once unescaped is a 400
// naming it, on every route (a fake Admin that echoes the id would make
// the answer unencodable: FuzzRequest found it as a 500).
func TestPathNotUTF8(t *testing.T) {
	h, err := New(Config{Admin: &fakeAdmin{}, Authenticator: tokenAuth{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/limits/0\xc6", "/v1/limits/a/\xff/history", "/v1/limits/\xc3"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = path
		req.Header.Set("Authorization", "Bearer admin")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var p problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != http.StatusBadRequest ||
			len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != "path" {
			t.Errorf("GET %q: %d %s, want a 400 naming path", path, rec.Code, rec.Body)
		}
	}
}

func TestParseEntityTag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{`"7"`, 7, true}, {` "12" `, 12, true},
		{`7`, 0, false}, {`"0"`, 0, false}, {`"-1"`, 0, false}, {`"+3"`, 0, false},
		{`W/"7"`, 0, false}, {`*`, 0, false}, {`"1", "2"`, 0, false}, {`""`, 0, false},
		{`"99999999999999999999"`, 0, false}, {`"`, 0, false},
	} {
		v, err := parseEntityTag(tc.in)
		if tc.ok != (err == nil) || v != tc.want {
			t.Errorf("%q: %d %v", tc.in, v, err)
		}
		if err != nil {
			var p *problem
			if !errors.As(err, &p) || p.InvalidParams[0].Name != "If-Match" {
				t.Errorf("%q: %v does not name If-Match", tc.in, err)
			}
		}
	}
}

func TestParseQuery(t *testing.T) {
	for _, tc := range []struct {
		raw, field string
	}{
		{"page_size=abc", "page_size"},
		{"page_size=99999999999", "page_size"},
		{"pagesize=5", "pagesize"},
		{"prefix=a&prefix=b", "prefix"},
		{"prefix=%zz", "query"},
		{"prefix=%C6", "query"},            // a value that is not UTF-8 once unescaped
		{"pre%FFfix=a", "query"},           // a name that is not
		{"=0", "query"},                    // no name
		{"prefix=%C3&prefix=%A9", "query"}, // two halves of one character, in two values
	} {
		q, err := parseQuery(tc.raw, "prefix", "page_size")
		if err == nil {
			_, err = queryInt32(q, "page_size")
		}
		var p *problem
		if !errors.As(err, &p) || p.InvalidParams[0].Name != tc.field {
			t.Errorf("%s: %v, want a 400 naming %s", tc.raw, err, tc.field)
		}
	}
	q, err := parseQuery("since=2026-01-02T03:04:05Z&dry_run=true", "since", "dry_run")
	if err != nil {
		t.Fatal(err)
	}
	if ts, err := queryTime(q, "since"); err != nil || ts.AsTime().Hour() != 3 {
		t.Errorf("since: %v %v", ts, err)
	}
	if b, err := queryBool(q, "dry_run"); err != nil || !b {
		t.Errorf("dry_run: %v %v", b, err)
	}
	if _, err := queryBool(map[string]string{"dry_run": "yes"}, "dry_run"); err == nil {
		t.Error("dry_run=yes accepted")
	}
	if _, err := queryTime(map[string]string{"since": "yesterday"}, "since"); err == nil {
		t.Error("since=yesterday accepted")
	}
}

// FuzzRequest sends arbitrary requests through the handler (authentication
// on, a fake service behind it): it must never panic, and must answer
// every request with a status it documents, errors as problems.
func FuzzRequest(f *testing.F) {
	f.Add(uint8(0), "/v1/limits/tenant/atlas", "", "", `{"limit": {"limit_tokens": 5}, "reason": "r"}`, "admin")
	f.Add(uint8(1), "/v1/limits/tenant/atlas", "", `"3"`, `{"limit": {"limit_tokens": "5", "fallback": {"eu": {"kind": 2}}}}`, "admin")
	f.Add(uint8(2), "/v1/limits/tenant/atlas", "reason=x&dry_run=1", `W/"1"`, "", "editor")
	f.Add(uint8(3), "/v1/limits:apply", "", "", `{"changes": [{"put": {"id": "a"}}, {"delete": "b"}], "reason": "r"}`, "admin")
	f.Add(uint8(0), "/v1/limits/a/history", "page_size=5&page_token=x", "", "", "viewer")
	f.Add(uint8(0), "/v1/limits/a%2Fwindows", "last=-1", "", "", "")
	f.Add(uint8(0), "/v1/audit", "since=2026-01-01T00:00:00Z&limit_prefix=tenant/", "*", "", "admin")
	f.Add(uint8(4), "/v1/whoami", "x=1", "", "{", "nobody")
	f.Add(uint8(1), "/v1/limits/", ";", `"1"`, `{"limit": {"previous": {"previous": {"tags": {"a": 1}}}}}`, "admin")
	f.Fuzz(func(t *testing.T, method uint8, path, query, ifMatch, body, token string) {
		h, err := New(Config{Admin: &fakeAdmin{}, Authenticator: tokenAuth{}}, WithMaxBodyBytes(4096))
		if err != nil {
			t.Fatal(err)
		}
		methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPost, http.MethodHead, http.MethodPatch}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Method = methods[int(method)%len(methods)]
		req.URL.Path, req.URL.RawQuery = path, query
		req.Body = http.NoBody
		if body != "" {
			req.Body = readCloser{strings.NewReader(body)}
		}
		req.Header = http.Header{}
		if ifMatch != "" {
			req.Header.Set("If-Match", ifMatch)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 301, 304, 307, 308, 400, 401, 403, 404, 405, 412, 413, 415:
		default:
			t.Fatalf("%s %s?%s: status %d", req.Method, path, query, rec.Code)
		}
		if rec.Code >= 400 && req.Method != http.MethodHead {
			var p problem
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%d as %q", rec.Code, ct)
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code {
				t.Fatalf("problem %q: %v", rec.Body, err)
			}
			if rec.Code == 400 && (len(p.InvalidParams) != 1 || p.InvalidParams[0].Name == "") {
				t.Fatalf("400 without the field: %s", rec.Body)
			}
		}
	})
}

// FuzzDecodeJSON: decoding and naming the field never panic, and every
// refusal names a field.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"limit": {"limit_tokens": "many"}}`,
		`{"changes": [{"delete": "a"}, {"put": {"window": 1}}]}`,
		"{\n\"limit\": {\"fallback\": {\"é\": {\"kind\": 9}}}}",
		`{"limit": {"tags": {"a": {}}}}`,
		`[[[[`,
		`{"limit":{"previous":{"previous":{"previous":null}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []interface {
			Reset()
			String() string
		}{&pb.PutLimitRequest{}, &pb.ApplyLimitsRequest{}} {
			var err error
			switch m := m.(type) {
			case *pb.PutLimitRequest:
				err = decodeJSON(data, m)
			case *pb.ApplyLimitsRequest:
				err = decodeJSON(data, m)
			}
			if err == nil {
				continue
			}
			var p *problem
			if !errors.As(err, &p) || p.Status != 400 || len(p.InvalidParams) != 1 || p.InvalidParams[0].Name == "" {
				t.Fatalf("%q: %v", data, err)
			}
		}
	})
}

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }
