package envoyrls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// badMappings are refused files: the line the error names and a part of
// the reason.
var badMappings = []struct {
	name, yaml string
	line       int
	reason     string
}{
	{"empty file", "", 1, "empty file"},
	{"comment only", "# nothing\n", 1, "empty file"},
	{"not a mapping", "- a\n- b\n", 1, "expected a mapping"},
	{"no domains", "other: 1\n", 1, `unknown field "other"`},
	{"domains missing", "{}\n", 1, `"domains" is required`},
	{"empty domains", "domains: []\n", 1, "at least one domain"},
	{"domains not a list", "domains:\n  api: 1\n", 2, "domains: expected a list"},
	{"unknown field in domain", `
domains:
  - domain: api
    descriptor:
      - key: a
        limit: x
`, 4, `unknown field "descriptor"`},
	{"unknown field in descriptor", `
domains:
  - domain: api
    descriptors:
      - key: a
        limt: x
`, 6, `unknown field "limt"`},
	{"empty domain", `
domains:
  - domain: ""
    descriptors:
      - key: a
        limit: x
`, 3, "domains[0].domain: empty"},
	{"domain missing", `
domains:
  - descriptors:
      - key: a
        limit: x
`, 3, "domains[0].domain is required"},
	{"duplicate domain", `
domains:
  - domain: api
    descriptors:
      - key: a
        limit: x
  - domain: api
    descriptors:
      - key: b
        limit: y
`, 7, `duplicate domain "api" (first at line 3)`},
	{"domain without descriptors", `
domains:
  - domain: api
`, 3, `"descriptors" is required`},
	{"empty descriptors", `
domains:
  - domain: api
    descriptors: []
`, 4, "at least one descriptor"},
	{"key missing", `
domains:
  - domain: api
    descriptors:
      - value: v
        limit: x
`, 5, ".key is required"},
	{"duplicate key and value", `
domains:
  - domain: api
    descriptors:
      - key: tenant
        value: acme
        limit: a
      - key: other
        limit: o
      - key: tenant
        value: acme
        limit: b
`, 10, `duplicate key "tenant" with value "acme" at this level (first at line 5)`},
	{"duplicate wildcard", `
domains:
  - domain: api
    descriptors:
      - key: tenant
        limit: a
      - key: tenant
        value: "*"
        limit: b
`, 7, `duplicate key "tenant" with value "*"`},
	{"nested duplicate", `
domains:
  - domain: api
    descriptors:
      - key: tenant
        descriptors:
          - key: path
            value: /a
            limit: a
          - key: path
            value: /a
            limit: b
`, 10, "descriptors[0].descriptors[1]: duplicate key \"path\""},
	{"template key not on path", `
domains:
  - domain: api
    descriptors:
      - key: tenant_id
        limit: "tenant/{tenant}"
`, 6, "{tenant} is not a key on this descriptor's path (tenant_id)"},
	{"template key of a sibling", `
domains:
  - domain: api
    descriptors:
      - key: a
        descriptors:
          - key: b
            limit: "x/{c}"
      - key: c
        limit: "c/{c}"
`, 8, "{c} is not a key on this descriptor's path (a, b)"},
	{"template bad character", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "tenant:{t}"
`, 6, "use [A-Za-z0-9._-] in segments"},
	{"template empty segment", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "tenant//{t}"
`, 6, "separated by single '/'"},
	{"template unclosed", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "tenant/{t"
`, 6, "'{' without '}'"},
	{"template stray brace", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "tenant/t}"
`, 6, "'}' without '{'"},
	{"template empty placeholder", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "tenant/{}"
`, 6, `bad placeholder "{}"`},
	{"template ambiguous", `
domains:
  - domain: api
    descriptors:
      - key: t
        descriptors:
          - key: t
            limit: "x/{t}"
`, 8, "{t} is ambiguous"},
	{"template too long", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: "` + strings.Repeat("a", 201) + `"
`, 6, "longer than 200 characters"},
	{"neither limit nor descriptors", `
domains:
  - domain: api
    descriptors:
      - key: t
        value: v
`, 5, "neither \"limit\" nor \"descriptors\""},
	{"null value", `
domains:
  - domain: api
    descriptors:
      - key: t
        value: ~
        limit: x
`, 6, "value: null"},
	{"empty value", `
domains:
  - domain: api
    descriptors:
      - key: t
        value: ""
        limit: x
`, 6, "value: empty"},
	{"value is a list", `
domains:
  - domain: api
    descriptors:
      - key: t
        value: [a, b]
        limit: x
`, 6, "value: expected a string"},
	{"descriptors is a mapping", `
domains:
  - domain: api
    descriptors:
      key: t
      limit: x
`, 5, "domains[0].descriptors: expected a list"},
	{"name without limit", `
domains:
  - domain: api
    descriptors:
      - key: t
        name: n
        descriptors:
          - key: u
            limit: x
`, 6, "only a descriptor with a limit has a name"},
	{"name bad characters", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: x
        name: 'a "b"'
`, 7, "use [A-Za-z0-9._/-]"},
	{"alias", `
domains:
  - domain: api
    descriptors: &d
      - key: t
        limit: x
  - domain: web
    descriptors: *d
`, 8, "aliases are not supported"},
	{"merge key", `
domains:
  - domain: api
    descriptors:
      - <<: {key: t}
        limit: x
`, 5, `unknown field "<<"`},
	{"field twice", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: x
        limit: y
`, 7, `"limit"`},
	{"two documents", `
domains:
  - domain: api
    descriptors:
      - key: t
        limit: x
---
domains: []
`, 7, "more than one YAML document"},
	{"bad indentation", `
domains:
  - domain: api
     descriptors:
      - key: t
`, 4, "invalid YAML"},
	{"tab", "domains:\n\t- domain: api\n", 2, "invalid YAML"},
	{"unclosed quote", "domains:\n  - domain: \"api\n", 2, "invalid YAML"},
	{"too deep", deepMapping(17), 0, "nested deeper than 16 levels"},
}

// deepMapping nests n levels of descriptors.
func deepMapping(n int) string {
	var b strings.Builder
	b.WriteString("domains:\n  - domain: api\n    descriptors:\n")
	ind := "      "
	for i := range n {
		fmt.Fprintf(&b, "%s- key: k%d\n", ind, i)
		if i == n-1 {
			fmt.Fprintf(&b, "%s  limit: x\n", ind)
		} else {
			fmt.Fprintf(&b, "%s  descriptors:\n", ind)
		}
		ind += "    "
	}
	return b.String()
}

func TestBadMappingsRefusedWithLineAndReason(t *testing.T) {
	dir := t.TempDir()
	for i, c := range badMappings {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("m%d.yaml", i))
			if err := os.WriteFile(path, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Load(path)
			if err == nil {
				t.Fatalf("accepted: %v", m)
			}
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("%T %v, want a *LoadError", err, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.reason) {
				t.Errorf("error %q does not contain %q", msg, c.reason)
			}
			if !strings.HasPrefix(msg, "envoy mapping "+path+": ") {
				t.Errorf("error %q does not name the file", msg)
			}
			if c.line > 0 {
				if le.Line != c.line || !strings.Contains(msg, fmt.Sprintf(": line %d: ", c.line)) {
					t.Errorf("error %q (line %d), want line %d", msg, le.Line, c.line)
				}
			} else if le.Line == 0 {
				t.Errorf("error %q names no line", msg)
			}
		})
	}
}

func TestLoadMissingAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "nope.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, maxFileSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("huge file: %v", err)
	}
}

func TestResolve(t *testing.T) {
	m := mustParse(t, apiMapping)
	for _, c := range []struct {
		domain string
		kvs    []string
		id     string
		why    string
	}{
		{"api", []string{"tenant_id", "acme"}, "tenant/acme", ""},
		{"api", []string{"tenant_id", "vip"}, "vip", ""},
		{"api", []string{"tenant_id", "acme", "path", "/search"}, "tenant/acme/search", ""},
		{"api", []string{"tenant_id", "acme", "path", "/other"}, "tenant/acme/other", ""},
		{"api", []string{"tenant_id", "vip", "path", "/search"}, "", unmappedNoMatch}, // vip has no nested descriptors
		{"api", []string{"tenant_id", "Acme_1.x-y"}, "tenant/Acme_1.x-y", ""},
		{"api", []string{"tenant_id", "a b"}, "", unmappedInvalidValue},
		{"api", []string{"tenant_id", ""}, "", unmappedInvalidValue},
		{"api", []string{"tenant_id", strings.Repeat("a", 193)}, "tenant/" + strings.Repeat("a", 193), ""}, // 200 characters
		{"api", []string{"tenant_id", strings.Repeat("a", 194)}, "", unmappedInvalidValue},
		{"api", []string{"remote_address", "2001:db8::1"}, "", unmappedInvalidValue},
		{"api", nil, "", unmappedNoMatch},
		{"api", []string{"plan", "free"}, "", unmappedNoMatch},
		{"api", []string{"plan", "free", "user", "u"}, "free.u", ""},
		{"api", []string{"tenant_id", "."}, "", unmappedInvalidValue},  // tenant/. is no limit id
		{"api", []string{"tenant_id", ".."}, "", unmappedInvalidValue}, // nor tenant/..
		{"api", []string{"plan", "free", "user", "."}, "free..", ""},   // a segment with dots in it is
		{"nope", []string{"tenant_id", "acme"}, "", unmappedUnknownDomain},
	} {
		id, why := m.Resolve(c.domain, desc(c.kvs...))
		if id != c.id || why != c.why {
			t.Errorf("%s %v: (%q, %q), want (%q, %q)", c.domain, c.kvs, id, why, c.id, c.why)
		}
	}
	if got := m.Domains(); len(got) != 1 || got[0] != "api" {
		t.Fatalf("domains %v", got)
	}
}

// The YAML examples in docs/envoy.md load (a block whose first line is
// "# refused" must not).
func TestDocExamples(t *testing.T) {
	data, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1)
	if len(blocks) < 2 {
		t.Fatalf("%d YAML examples in docs/envoy.md", len(blocks))
	}
	for i, b := range blocks {
		text := b[1]
		if !strings.Contains(text, "domains:") {
			continue // an Envoy configuration snippet, not a mapping
		}
		_, err := Parse([]byte(text))
		if refused := strings.HasPrefix(text, "# refused"); refused != (err != nil) {
			t.Errorf("example %d: refused=%v, err %v\n%s", i, refused, err, text)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(apiMapping))
	for _, c := range badMappings {
		f.Add([]byte(c.yaml))
	}
	f.Add([]byte("domains:\n  - domain: a\n    descriptors:\n      - key: k\n        limit: \"{k}/{k}\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("%T: %v", err, err)
			}
			return
		}
		for _, d := range m.Domains() {
			for _, kvs := range [][]string{{"k", "v"}, {"tenant_id", "x"}, {"k", "v", "k2", "v2"}, nil} {
				id, why := m.Resolve(d, desc(kvs...))
				if (id == "") == (why == "") {
					t.Fatalf("resolve gave id %q and reason %q", id, why)
				}
			}
		}
	})
}

// TestSetMappingForgetsResolutions: after a swap, a descriptor the old
// mapping had resolved is charged to the new mapping's limit.
func TestSetMappingForgetsResolutions(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme": {g: 10, left: 10},
		"t2/acme":     {g: 10, left: 10},
	})
	req := request("api", 1, desc("tenant_id", "acme"))
	for range 2 {
		h.call(t, req)
	}
	h.srv.SetMapping(mustParse(t, `
domains:
  - domain: api
    descriptors:
      - key: tenant_id
        limit: "t2/{tenant_id}"
`))
	h.call(t, req)
	if a, b := h.fake.left("tenant/acme"), h.fake.left("t2/acme"); a != 8 || b != 9 {
		t.Fatalf("left: tenant/acme %d, t2/acme %d; want 8 and 9", a, b)
	}
}
