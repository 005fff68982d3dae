package envoyrls

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	yaml "go.yaml.in/yaml/v3"

	"leasehold/internal/vocab"
)

// Bounds on a mapping file.
const (
	maxFileSize = 1 << 20 // bytes
	maxDepth    = 16      // nested descriptor levels (entries of one descriptor)
	maxNameLen  = 64
)

// Mapping is a validated mapping from Envoy descriptors to Leasehold limit
// ids. It is immutable: a reload builds a new one and swaps it whole.
type Mapping struct {
	domains map[string]*level
	hash    [sha256.Size]byte
}

// kv is a descriptor entry matched exactly.
type kv struct{ key, value string }

// level is one depth of a domain's descriptor tree: the nodes an entry at
// that depth can match.
type level struct {
	exact map[kv]*node     // key and value
	wild  map[string]*node // key, any value
}

// node is one matched entry.
type node struct {
	limit *template // nil: a descriptor ending here maps to no limit
	name  string    // policy name in headers; "" is the limit id
	next  *level    // nil: no nested descriptors
}

// template is a limit id with {key} placeholders.
type template struct {
	fixed string  // the id, when there is no placeholder
	parts []tpart // otherwise
}

type tpart struct {
	lit   string
	depth int // -1: lit; else the entry at this depth gives the text
}

// LoadError is a mapping file that was refused: the line (1-based; 0 when
// unknown) and the reason.
type LoadError struct {
	Path   string
	Line   int
	Reason string
}

func (e *LoadError) Error() string {
	var b strings.Builder
	b.WriteString("envoy mapping")
	if e.Path != "" {
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ": line %d", e.Line)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// Load reads and validates a mapping file.
func Load(path string) (*Mapping, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parse(path, data)
}

// Parse validates a mapping given as YAML text.
func Parse(data []byte) (*Mapping, error) { return parse("", data) }

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("envoy mapping: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("envoy mapping %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, &LoadError{Path: path, Reason: fmt.Sprintf("larger than %d bytes", maxFileSize)}
	}
	return data, nil
}

// failure is a validation error at a node, made a LoadError by parse.
type failure struct {
	line   int
	reason string
}

func (f *failure) Error() string { return f.reason }

func failAt(n *yaml.Node, format string, args ...any) error {
	return &failure{line: n.Line, reason: fmt.Sprintf(format, args...)}
}

var yamlLineRe = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

func parse(path string, data []byte) (m *Mapping, err error) {
	defer func() {
		// The YAML parser is third-party code fed operator input: a panic
		// in it refuses the file instead of taking the agent down.
		if r := recover(); r != nil {
			m, err = nil, &LoadError{Path: path, Reason: fmt.Sprintf("cannot parse: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &LoadError{Path: path, Line: 1, Reason: "empty file: expected a mapping with \"domains\""}
		}
		return nil, yamlError(path, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &LoadError{Path: path, Line: extra.Line, Reason: "more than one YAML document"}
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlError(path, err)
	}
	m = &Mapping{domains: map[string]*level{}, hash: sha256.Sum256(data)}
	if err := m.build(&doc); err != nil {
		var f *failure
		if errors.As(err, &f) {
			return nil, &LoadError{Path: path, Line: f.line, Reason: f.reason}
		}
		return nil, &LoadError{Path: path, Reason: err.Error()}
	}
	return m, nil
}

// yamlError restates a parser error ("yaml: line 3: ...") as a LoadError.
func yamlError(path string, err error) error {
	msg := err.Error()
	if sm := yamlLineRe.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		return &LoadError{Path: path, Line: line, Reason: "invalid YAML: " + sm[2]}
	}
	return &LoadError{Path: path, Reason: "invalid YAML: " + msg}
}

func (m *Mapping) build(doc *yaml.Node) error {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return failAt(doc, "expected a mapping with \"domains\"")
	}
	root := doc.Content[0]
	fields, err := fieldsOf(root, "the file", "domains")
	if err != nil {
		return err
	}
	ds := fields["domains"]
	if ds == nil {
		return failAt(root, "\"domains\" is required")
	}
	if err := want(ds, yaml.SequenceNode, "domains", "a list"); err != nil {
		return err
	}
	if len(ds.Content) == 0 {
		return failAt(ds, "domains: at least one domain is required")
	}
	lines := map[string]int{}
	for i, dn := range ds.Content {
		what := fmt.Sprintf("domains[%d]", i)
		f, err := fieldsOf(dn, what, "domain", "descriptors")
		if err != nil {
			return err
		}
		name, err := scalar(f["domain"], dn, what+".domain")
		if err != nil {
			return err
		}
		if at, dup := lines[name]; dup {
			return failAt(f["domain"], "%s.domain: duplicate domain %q (first at line %d)", what, name, at)
		}
		lines[name] = f["domain"].Line
		if f["descriptors"] == nil {
			return failAt(dn, "%s: \"descriptors\" is required", what)
		}
		lv, err := buildLevel(f["descriptors"], what+".descriptors", nil)
		if err != nil {
			return err
		}
		m.domains[name] = lv
	}
	return nil
}

// buildLevel builds the nodes of one depth; path holds the keys of the
// entries above it.
func buildLevel(n *yaml.Node, what string, path []string) (*level, error) {
	if err := want(n, yaml.SequenceNode, what, "a list"); err != nil {
		return nil, err
	}
	if len(n.Content) == 0 {
		return nil, failAt(n, "%s: at least one descriptor is required", what)
	}
	if len(path) >= maxDepth {
		return nil, failAt(n, "%s: nested deeper than %d levels", what, maxDepth)
	}
	lv := &level{exact: map[kv]*node{}, wild: map[string]*node{}}
	lines := map[kv]int{}
	for i, dn := range n.Content {
		w := fmt.Sprintf("%s[%d]", what, i)
		f, err := fieldsOf(dn, w, "key", "value", "limit", "name", "descriptors")
		if err != nil {
			return nil, err
		}
		key, err := scalar(f["key"], dn, w+".key")
		if err != nil {
			return nil, err
		}
		value := "*"
		if f["value"] != nil {
			if value, err = scalar(f["value"], dn, w+".value"); err != nil {
				return nil, err
			}
		}
		id := kv{key, value}
		if at, dup := lines[id]; dup {
			return nil, failAt(dn, "%s: duplicate key %q with value %q at this level (first at line %d)", w, key, value, at)
		}
		lines[id] = dn.Line
		nd := &node{}
		sub := append(slices.Clip(path), key)
		if f["limit"] != nil {
			raw, err := scalar(f["limit"], dn, w+".limit")
			if err != nil {
				return nil, err
			}
			if nd.limit, err = parseTemplate(raw, sub); err != nil {
				return nil, failAt(f["limit"], "%s.limit %q: %v", w, raw, err)
			}
		}
		if f["name"] != nil {
			if f["limit"] == nil {
				return nil, failAt(f["name"], "%s.name: only a descriptor with a limit has a name", w)
			}
			if nd.name, err = scalar(f["name"], dn, w+".name"); err != nil {
				return nil, err
			}
			if err := validName(nd.name); err != nil {
				return nil, failAt(f["name"], "%s.name %q: %v", w, nd.name, err)
			}
		}
		if f["descriptors"] != nil {
			if nd.next, err = buildLevel(f["descriptors"], w+".descriptors", sub); err != nil {
				return nil, err
			}
		}
		if nd.limit == nil && nd.next == nil {
			return nil, failAt(dn, "%s: neither \"limit\" nor \"descriptors\": it would match nothing", w)
		}
		if value == "*" {
			lv.wild[key] = nd
		} else {
			lv.exact[id] = nd
		}
	}
	return lv, nil
}

// fieldsOf checks that n is a mapping of known, unique, scalar keys.
func fieldsOf(n *yaml.Node, what string, known ...string) (map[string]*yaml.Node, error) {
	if err := want(n, yaml.MappingNode, what, "a mapping"); err != nil {
		return nil, err
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, failAt(k, "%s: keys must be plain strings", what)
		}
		if !slices.Contains(known, k.Value) {
			return nil, failAt(k, "%s: unknown field %q (known: %s)", what, k.Value, strings.Join(known, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, failAt(k, "%s: field %q given twice", what, k.Value)
		}
		if v.Kind == yaml.AliasNode {
			return nil, failAt(v, "%s.%s: YAML aliases are not supported", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

func want(n *yaml.Node, kind yaml.Kind, what, desc string) error {
	if n.Kind == yaml.AliasNode {
		return failAt(n, "%s: YAML aliases are not supported", what)
	}
	if n.Kind != kind {
		return failAt(n, "%s: expected %s", what, desc)
	}
	return nil
}

// scalar is the non-empty text of a required scalar field (parent is
// where a missing field is reported).
func scalar(n, parent *yaml.Node, what string) (string, error) {
	if n == nil {
		return "", failAt(parent, "%s is required", what)
	}
	if n.Kind != yaml.ScalarNode {
		return "", failAt(n, "%s: expected a string", what)
	}
	if n.Tag == "!!null" {
		return "", failAt(n, "%s: null (quote it, or leave the field out)", what)
	}
	if n.Value == "" {
		return "", failAt(n, "%s: empty", what)
	}
	return n.Value, nil
}

// parseTemplate parses a limit id template; path are the keys of the
// entries from the top of the descriptor to this one.
func parseTemplate(raw string, path []string) (*template, error) {
	t := &template{}
	var probe strings.Builder // the template with each placeholder as "x"
	rest := raw
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		if strings.IndexByte(lit, '}') >= 0 {
			return nil, errors.New("'}' without '{'")
		}
		if lit != "" {
			t.parts = append(t.parts, tpart{lit: lit, depth: -1})
			probe.WriteString(lit)
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, errors.New("'{' without '}'")
		}
		key := rest[open+1 : open+end]
		if key == "" || strings.ContainsAny(key, "{") {
			return nil, fmt.Errorf("bad placeholder %q", rest[open:open+end+1])
		}
		depth := -1
		for d, k := range path {
			if k == key {
				if depth >= 0 {
					return nil, fmt.Errorf("{%s} is ambiguous: key %q occurs twice on this descriptor's path", key, key)
				}
				depth = d
			}
		}
		if depth < 0 {
			return nil, fmt.Errorf("{%s} is not a key on this descriptor's path (%s)", key, strings.Join(path, ", "))
		}
		t.parts = append(t.parts, tpart{depth: depth})
		probe.WriteString("x")
		rest = rest[open+end+1:]
	}
	if err := vocab.ValidateLimitID("limit", probe.String()); err != nil {
		msg := strings.TrimPrefix(err.Error(), "limit: ")
		return nil, errors.New(strings.TrimPrefix(msg, strconv.Quote(probe.String())+": "))
	}
	if len(t.parts) == 1 && t.parts[0].depth < 0 {
		t.fixed, t.parts = t.parts[0].lit, nil
	}
	return t, nil
}

// validName: a policy name is quoted in RateLimit headers; keep it to
// limit-id characters.
func validName(s string) error {
	if len(s) > maxNameLen {
		return fmt.Errorf("longer than %d characters", maxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if !idChar(s[i]) && s[i] != '/' {
			return errors.New("use [A-Za-z0-9._/-]")
		}
	}
	return nil
}

func idChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// segment reports whether v can stand in a limit id as (part of) one
// segment.
func segment(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		if !idChar(v[i]) {
			return false
		}
	}
	return true
}

// expand builds the limit id from the descriptor's entry values; false
// when a substituted value is not one limit-id segment, makes a segment
// "." or "..", or the id is too long.
func (t *template) expand(entries []*rlv3.RateLimitDescriptor_Entry) (string, bool) {
	if t.parts == nil {
		return t.fixed, true
	}
	n := 0
	for _, p := range t.parts {
		if p.depth < 0 {
			n += len(p.lit)
			continue
		}
		v := entries[p.depth].GetValue()
		if !segment(v) {
			return "", false
		}
		n += len(v)
	}
	if n > vocab.MaxLimitIDLen {
		return "", false
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range t.parts {
		if p.depth < 0 {
			b.WriteString(p.lit)
		} else {
			b.WriteString(entries[p.depth].GetValue())
		}
	}
	id := b.String()
	if vocab.DotSegment(id) != "" {
		return "", false // e.g. tenant_id "..": no limit id has such a segment
	}
	return id, true
}

// Why a descriptor maps to no limit (the reason label of
// leasehold_envoy_unmapped_descriptors_total).
const (
	unmappedNoMatch       = "no_match"       // no path of the domain's tree matches it
	unmappedUnknownDomain = "unknown_domain" // the mapping has no such domain
	unmappedInvalidValue  = "invalid_value"  // a substituted value is not a limit-id segment
	unmappedUnknownLimit  = "unknown_limit"  // the agent has no such limit
	unmappedNegativeHits  = "negative_hits"  // a refund, which Leasehold does not take here
)

// resolve maps a descriptor to a limit id and policy name, or says why it
// maps to none. Every entry must be matched, in order, and the node the
// last one matches must have a limit (as envoyproxy/ratelimit does); an
// exact value is preferred to the wildcard.
func (m *Mapping) resolve(domain string, entries []*rlv3.RateLimitDescriptor_Entry) (id, name, why string) {
	lv := m.domains[domain]
	if lv == nil {
		return "", "", unmappedUnknownDomain
	}
	var n *node
	for _, e := range entries {
		if lv == nil {
			return "", "", unmappedNoMatch
		}
		n = lv.exact[kv{e.GetKey(), e.GetValue()}]
		if n == nil {
			n = lv.wild[e.GetKey()]
		}
		if n == nil {
			return "", "", unmappedNoMatch
		}
		lv = n.next
	}
	if n == nil || n.limit == nil {
		return "", "", unmappedNoMatch
	}
	id, ok := n.limit.expand(entries)
	if !ok {
		return "", "", unmappedInvalidValue
	}
	if n.name != "" {
		return id, n.name, ""
	}
	return id, id, ""
}

// Domains returns the mapping's domains, sorted.
func (m *Mapping) Domains() []string {
	out := make([]string, 0, len(m.domains))
	for d := range m.domains {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// Resolve returns the limit id a descriptor of domain maps to, or "" and
// the reason it maps to none (no_match, unknown_domain, invalid_value).
func (m *Mapping) Resolve(domain string, d *rlv3.RateLimitDescriptor) (limitID, reason string) {
	id, _, why := m.resolve(domain, d.GetEntries())
	return id, why
}
