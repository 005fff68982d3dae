package adminhttp

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "leasehold/proto/leasehold/v1"
)

// openapiDoc parses the embedded document.
func openapiDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi: %v, want 3.1.0", doc["openapi"])
	}
	return doc
}

func object(t *testing.T, v any, where string) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: not an object: %T", where, v)
	}
	return m
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

// documented lists the document's operations as routes.
func documented(t *testing.T) []route {
	t.Helper()
	var out []route
	for path, item := range object(t, openapiDoc(t)["paths"], "paths") {
		for m, op := range object(t, item, path) {
			if !slices.Contains(httpMethods, m) {
				continue
			}
			id, _ := object(t, op, path+" "+m)["operationId"].(string)
			out = append(out, route{strings.ToUpper(m), path, id})
		}
	}
	return out
}

func sortRoutes(rs []route) []route {
	rs = slices.Clone(rs)
	sort.Slice(rs, func(i, j int) bool { return fmt.Sprint(rs[i]) < fmt.Sprint(rs[j]) })
	return rs
}

// TestOpenAPIDescribesEveryRoute: the handler's route table and the
// document's operations are the same set.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc, served := sortRoutes(documented(t)), sortRoutes(routes)
	for _, r := range served {
		if !slices.Contains(doc, r) {
			t.Errorf("served but not documented: %v", r)
		}
	}
	for _, r := range doc {
		if !slices.Contains(served, r) {
			t.Errorf("documented but not served: %v", r)
		}
	}
}

// requestFor builds a request the route accepts, for limit tenant/atlas.
func requestFor(r route) *http.Request {
	path := strings.ReplaceAll(r.path, "{id}", "tenant/atlas")
	var body string
	switch r.op {
	case "PutLimit":
		body = `{"limit": {"limit_tokens": 5}, "reason": "r"}`
	case "ApplyLimits":
		body = `{"changes": [{"delete": "tenant/atlas"}], "reason": "r"}`
	case "DeleteLimit":
		path += "?reason=r"
	}
	req := httptest.NewRequest(r.method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// TestMuxServesEveryDocumentedRoute sends each documented operation
// through the handler and checks it reaches that RPC (the operationId),
// for the limit in the path; and that the other methods on each
// documented path are 405 naming exactly the documented ones.
func TestMuxServesEveryDocumentedRoute(t *testing.T) {
	fake := &fakeAdmin{}
	h, err := New(Config{Admin: fake})
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string][]string{}
	for _, r := range documented(t) {
		byPath[r.path] = append(byPath[r.path], r.method)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, requestFor(r))
		if rec.Code != http.StatusOK {
			t.Errorf("%v: %d %s", r, rec.Code, rec.Body)
			continue
		}
		if r.op == "GetOpenAPI" {
			if !bytes.Equal(rec.Body.Bytes(), OpenAPI) || rec.Header().Get("Content-Type") != "application/yaml" {
				t.Errorf("%v: did not serve the document (%s)", r, rec.Header().Get("Content-Type"))
			}
			continue
		}
		c := fake.last()
		if want := "/leasehold.v1.Admin/" + r.op; c.method != want {
			t.Errorf("%v reached %q, want %q", r, c.method, want)
			continue
		}
		if strings.Contains(r.path, "{id}") {
			var id string
			switch req := c.req.(type) {
			case *pb.GetLimitRequest:
				id = req.Id
			case *pb.PutLimitRequest:
				id = req.GetLimit().GetId()
			case *pb.DeleteLimitRequest:
				id = req.Id
			case *pb.LimitHistoryRequest:
				id = req.Id
			case *pb.ListWindowsRequest:
				id = req.LimitId
			}
			if id != "tenant/atlas" {
				t.Errorf("%v: called for id %q, want tenant/atlas", r, id)
			}
		}
	}
	for path, methods := range byPath {
		allowed := slices.Clone(methods)
		if slices.Contains(allowed, http.MethodGet) {
			allowed = append(allowed, http.MethodHead)
		}
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodPatch} {
			if slices.Contains(allowed, m) {
				continue
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(m, strings.ReplaceAll(path, "{id}", "tenant/atlas"), nil))
			if rec.Code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, path, rec.Code)
				continue
			}
			got := strings.Split(rec.Header().Get("Allow"), ", ")
			slices.Sort(got)
			slices.Sort(allowed)
			if !slices.Equal(got, allowed) {
				t.Errorf("%s %s: Allow %v, want %v", m, path, got, allowed)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s %s: 405 as %q, want a problem", m, path, ct)
			}
		}
	}
}

// messages are the proto messages the document's schemas describe, by
// schema name.
func messages() map[string]protoreflect.MessageDescriptor {
	out := map[string]protoreflect.MessageDescriptor{}
	for _, f := range []protoreflect.FileDescriptor{pb.File_leasehold_v1_admin_proto, pb.File_leasehold_v1_limits_proto} {
		for i := range f.Messages().Len() {
			m := f.Messages().Get(i)
			out[string(m.Name())] = m
		}
	}
	return out
}

// TestOpenAPISchemasMatchProto: every schema named after a message lists
// exactly the message's fields by proto name; every enum schema lists the
// enum's value names; every response message of a served RPC has a
// schema.
func TestOpenAPISchemasMatchProto(t *testing.T) {
	schemas := object(t, object(t, openapiDoc(t)["components"], "components")["schemas"], "schemas")
	msgs := messages()
	fieldsOf := func(m protoreflect.MessageDescriptor, skip ...string) []string {
		var out []string
		for i := range m.Fields().Len() {
			if n := string(m.Fields().Get(i).Name()); !slices.Contains(skip, n) {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	check := func(schema string, want []string) {
		s := object(t, schemas[schema], schema)
		var got []string
		for k := range object(t, s["properties"], schema+".properties") {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("schema %s has %v, the message has %v", schema, got, want)
		}
	}
	n := 0
	for name := range schemas {
		if m, ok := msgs[name]; ok {
			check(name, fieldsOf(m))
			n++
		}
	}
	check("PutLimitBody", fieldsOf(msgs["PutLimitRequest"], "expected_version"))
	for _, r := range routes {
		if r.op == "GetOpenAPI" {
			continue
		}
		if _, ok := schemas[r.op+"Response"]; !ok {
			t.Errorf("no schema %sResponse", r.op)
		}
	}
	for _, name := range []string{"Limit", "Fallback", "LeaseSettings", "ChangeEffect", "FieldChange", "AuditEvent", "WindowReport", "BoundTerms", "LimitChange", "ApplyLimitsRequest"} {
		if _, ok := schemas[name]; !ok {
			t.Errorf("no schema %s", name)
		}
	}
	if n < 15 {
		t.Errorf("only %d schemas matched proto messages", n)
	}
	enums := map[string]protoreflect.EnumDescriptor{}
	for _, f := range []protoreflect.FileDescriptor{pb.File_leasehold_v1_admin_proto, pb.File_leasehold_v1_limits_proto} {
		for i := range f.Enums().Len() {
			enums[string(f.Enums().Get(i).Name())] = f.Enums().Get(i)
		}
	}
	for name, e := range enums {
		s, ok := schemas[name]
		if !ok {
			t.Errorf("no schema for enum %s", name)
			continue
		}
		var got, want []string
		for _, v := range object(t, s, name)["enum"].([]any) {
			got = append(got, v.(string))
		}
		for i := range e.Values().Len() {
			want = append(want, string(e.Values().Get(i).Name()))
		}
		if !slices.Equal(got, want) {
			t.Errorf("enum %s: %v, want %v", name, got, want)
		}
	}
}

// TestOpenAPIRefsResolve: every $ref names a component that exists.
func TestOpenAPIRefsResolve(t *testing.T) {
	doc := openapiDoc(t)
	var walk func(v any, where string)
	n := 0
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "$ref" {
					n++
					ref, _ := x.(string)
					var cur any = doc
					for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
						m, ok := cur.(map[string]any)
						if !ok {
							cur = nil
							break
						}
						cur = m[p]
					}
					if !strings.HasPrefix(ref, "#/") || cur == nil {
						t.Errorf("%s: $ref %q does not resolve", where, ref)
					}
					continue
				}
				walk(x, where+"/"+k)
			}
		case []any:
			for i, x := range v {
				walk(x, fmt.Sprintf("%s[%d]", where, i))
			}
		}
	}
	walk(doc, "")
	if n < 50 {
		t.Errorf("only %d $refs: the walk is broken", n)
	}
	sec := object(t, object(t, doc["components"], "components")["securitySchemes"], "securitySchemes")
	if object(t, sec["bearer"], "bearer")["scheme"] != "bearer" || object(t, sec["mutualTLS"], "mutualTLS")["type"] != "mutualTLS" {
		t.Errorf("security schemes: %v", sec)
	}
}

// TestOpenAPIDocumentsErrors: every operation that calls the service
// documents 401 and 400; the conditional writes document 412.
func TestOpenAPIDocumentsErrors(t *testing.T) {
	doc := openapiDoc(t)
	paths := object(t, doc["paths"], "paths")
	for _, r := range routes {
		op := object(t, object(t, paths[r.path], r.path)[strings.ToLower(r.method)], r.op)
		resp := object(t, op["responses"], r.op+".responses")
		want := []string{"200", "405"}
		if r.op != "GetOpenAPI" {
			want = append(want, "400", "401")
		}
		if r.op == "PutLimit" || r.op == "DeleteLimit" {
			want = append(want, "409", "412")
		}
		if r.op == "PutLimit" || r.op == "ApplyLimits" {
			want = append(want, "413", "415")
		}
		for _, c := range want {
			if _, ok := resp[c]; !ok {
				t.Errorf("%s does not document %s", r.op, c)
			}
		}
	}
}

// BenchmarkHandler measures the handler's own cost (routing,
// authentication, decoding, encoding) around a service that does nothing.
func BenchmarkHandler(b *testing.B) {
	h, err := New(Config{Admin: &fakeAdmin{}, Authenticator: nil})
	if err != nil {
		b.Fatal(err)
	}
	body := `{"limit": {"limit_tokens": 5, "window": "60s", "regions": ["eu"], "mode": "MODE_STRICT"}, "reason": "r"}`
	for _, r := range []route{{http.MethodGet, "/v1/limits/{id}", "GetLimit"}, {http.MethodPut, "/v1/limits/{id}", "PutLimit"}} {
		b.Run(r.op, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(r.method, "/v1/limits/tenant/atlas", strings.NewReader(body))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(rec.Code, rec.Body)
				}
			}
		})
	}
}
