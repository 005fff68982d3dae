package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// A limits file declares limits (docs/quotactl.md, "Limits files"):
//
//	manage: [tenant/]          # scope: limits under it absent below are deleted
//	limits:
//	  - id: tenant/atlas
//	    limit: 1000            # G
//	    window: 1m
//	    regions: [eu, us]
//	    mode: bounded
//	    fallback: {eu: closed, us: "local:100"}
//	    lease: {ttl: 15s, min_chunk: 1, max_chunk: 0, standing: 0}
//	    owner: finance
//	    description: Atlas contract
//	    tags: {plan: gold}
//	    hash_tag: atlas        # Redis keys: limits checked together share it
//	    settle_grace: 30s      # settle-later Checks: Settle taken this long
//	    debt_policy: carry     # carry (default) or forgive
//	    shadow: true           # tried, not enforced: would-deny counted
//	  - id: plans/pro           # a plan (docs/plans.md): every tenant/X without a limit of its own
//	    binds: ["tenant/{id}"]
//	    limit: 1000
//	    window: 1m
//	    regions: [eu, us]
//	    mode: strict
//	  - id: backend/search      # a bucket limit: rate and burst instead of limit and window
//	    rate: 100/s
//	    burst: 200
//	    regions: [eu, us]
//	    mode: strict
//
// Decoding is strict: unknown keys, duplicate keys, aliases, a second
// document and values of the wrong shape are refused with the file, the
// line and the key. Each limit is then validated as the allocator would
// (except that its regions are not checked against the allocator's).

// Bounds on a limits file.
const (
	maxLimitsFile   = 4 << 20 // bytes
	maxFileLimits   = 10000
	maxManageScopes = 100
)

// Scope "*" in manage: every limit.
const manageAll = "*"

// limitsFile is a decoded, validated limits file.
type limitsFile struct {
	path   string
	manage []string // nil: no "manage" key, so nothing is deleted
	limits []*fileLimit
}

// fileLimit is one limit of a file: normalized as the allocator stores it
// (defaults filled in, regions sorted), and where it was written.
type fileLimit struct {
	limit *pb.Limit
	line  int
}

// fileError is a limits file refused at a line (0: the whole file).
type fileError struct {
	path string
	line int
	msg  string
}

func (e *fileError) Error() string {
	if e.line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.path, e.line, e.msg)
	}
	return fmt.Sprintf("%s: %s", e.path, e.msg)
}

// at is an error at node n, made a fileError by decodeLimitsFile.
type at struct {
	line int
	msg  string
}

func (a *at) Error() string { return a.msg }

func errAt(n *yaml.Node, format string, args ...any) error {
	return &at{line: n.Line, msg: fmt.Sprintf(format, args...)}
}

var yamlLineRe = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// decodeLimitsFile decodes and validates a limits file. Every error is a
// *fileError naming path and, whenever the input has one, the line.
func decodeLimitsFile(path string, data []byte) (lf *limitsFile, err error) {
	defer func() {
		// The YAML parser is third-party code fed user input: a panic
		// in it refuses the file, it does not crash quotactl.
		if r := recover(); r != nil {
			lf, err = nil, &fileError{path: path, line: 1, msg: fmt.Sprintf("cannot parse: %v", r)}
		}
	}()
	if len(data) > maxLimitsFile {
		return nil, &fileError{path: path, line: 1, msg: fmt.Sprintf("larger than %d bytes", maxLimitsFile)}
	}
	if !utf8.Valid(data) {
		return nil, &fileError{path: path, line: invalidUTF8Line(data), msg: "not UTF-8 text"}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &fileError{path: path, line: 1, msg: `empty file: want a mapping with "limits"`}
		}
		return nil, yamlFileError(path, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &fileError{path: path, line: max(extra.Line, 1), msg: "more than one YAML document"}
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlFileError(path, err)
	}
	lf = &limitsFile{path: path}
	if err := lf.build(&doc); err != nil {
		var a *at
		if errors.As(err, &a) {
			return nil, &fileError{path: path, line: max(a.line, 1), msg: a.msg}
		}
		return nil, &fileError{path: path, line: 1, msg: err.Error()}
	}
	return lf, nil
}

// invalidUTF8Line is the line of the first invalid UTF-8 byte.
func invalidUTF8Line(data []byte) int {
	line := 1
	for len(data) > 0 {
		r, n := utf8.DecodeRune(data)
		if r == utf8.RuneError && n <= 1 {
			return line
		}
		if r == '\n' {
			line++
		}
		data = data[n:]
	}
	return line
}

// yamlFileError restates a parser error ("yaml: line 3: ...").
func yamlFileError(path string, err error) error {
	msg := oneLine(err.Error())
	if sm := yamlLineRe.FindStringSubmatch(msg); sm != nil {
		line, _ := strconv.Atoi(sm[1])
		return &fileError{path: path, line: max(line, 1), msg: "invalid YAML: " + sm[2]}
	}
	return &fileError{path: path, line: 1, msg: "invalid YAML: " + msg}
}

func (lf *limitsFile) build(doc *yaml.Node) error {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return errAt(doc, `want a mapping with "limits"`)
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return errAt(root, `empty file: want a mapping with "limits"`)
	}
	fields, err := mappingOf(root, "the file", "manage", "limits")
	if err != nil {
		return err
	}
	if m, ok := fields["manage"]; ok {
		if lf.manage, err = decodeManage(m.val); err != nil {
			return err
		}
	}
	ln, ok := fields["limits"]
	if !ok {
		return errAt(root, `"limits" is required (an empty list is "limits: []")`)
	}
	if ln.val.Kind == yaml.ScalarNode && ln.val.Tag == "!!null" {
		return nil // "limits:" with nothing: no limits
	}
	if err := wantKind(ln.val, yaml.SequenceNode, "limits", "a list of limits"); err != nil {
		return err
	}
	if len(ln.val.Content) > maxFileLimits {
		return errAt(ln.val, "limits: more than %d limits", maxFileLimits)
	}
	first := map[string]int{}
	for i, n := range ln.val.Content {
		if err := wantKind(n, yaml.MappingNode, fmt.Sprintf("limits[%d]", i), "a limit (a mapping)"); err != nil {
			return err
		}
		fl, err := decodeFileLimit(n, fmt.Sprintf("limits[%d]", i))
		if err != nil {
			return err
		}
		id := fl.limit.Id
		if line, dup := first[id]; dup {
			return errAt(n, "limits[%d]: %s: declared twice (first at line %d)", i, id, line)
		}
		first[id] = fl.line
		if lf.manage != nil && !lf.inManage(id) {
			return errAt(n, "limits[%d]: %s: outside the file's scope (manage: %s)", i, id, strings.Join(lf.manage, ", "))
		}
		lf.limits = append(lf.limits, fl)
	}
	return nil
}

// inManage reports whether id falls under one of the manage prefixes.
func (lf *limitsFile) inManage(id string) bool { return inScopes(lf.manage, id) }

func inScopes(scopes []string, id string) bool {
	for _, p := range scopes {
		if p == manageAll || strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

func decodeManage(n *yaml.Node) ([]string, error) {
	var items []*yaml.Node
	switch n.Kind {
	case yaml.ScalarNode:
		items = []*yaml.Node{n}
	case yaml.SequenceNode:
		items = n.Content
	default:
		return nil, errAt(n, `manage: want a list of id prefixes, e.g. [tenant/], or "*" for every limit`)
	}
	if len(items) == 0 {
		return nil, errAt(n, `manage: empty: give id prefixes (e.g. [tenant/]) or "*", or leave "manage" out to delete nothing`)
	}
	if len(items) > maxManageScopes {
		return nil, errAt(n, "manage: more than %d prefixes", maxManageScopes)
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		s, err := scalarString(it, fmt.Sprintf("manage[%d]", i))
		if err != nil {
			return nil, err
		}
		switch {
		case s == "":
			return nil, errAt(it, `manage[%d]: empty prefix: write "*" to manage every limit`, i)
		case s != manageAll && strings.Contains(s, "*"):
			return nil, errAt(it, `manage[%d]: %q: a prefix is plain text ("tenant/"); "*" alone means every limit`, i, s)
		case len(s) > 200:
			return nil, errAt(it, "manage[%d]: longer than 200 characters", i)
		}
		out = append(out, s)
	}
	return out, nil
}

// field is one key of a mapping and its value.
type field struct {
	key, val *yaml.Node
}

// mappingOf checks that n is a mapping whose keys are all among allowed,
// none twice, and returns them by key.
func mappingOf(n *yaml.Node, what string, allowed ...string) (map[string]field, error) {
	if err := wantKind(n, yaml.MappingNode, what, "a mapping"); err != nil {
		return nil, err
	}
	out := map[string]field{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, errAt(k, "%s: keys must be plain words", what)
		}
		if v.Kind == yaml.AliasNode {
			return nil, errAt(v, "%s.%s: aliases (*name) are not supported", what, k.Value)
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, errAt(k, "%s: unknown key %q (want %s)", what, k.Value, strings.Join(allowed, ", "))
		}
		if prev, dup := out[k.Value]; dup {
			return nil, errAt(k, "%s: key %q given twice (first at line %d)", what, k.Value, prev.key.Line)
		}
		out[k.Value] = field{k, v}
	}
	return out, nil
}

// kindNames names node kinds in errors.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "a document"
}

func wantKind(n *yaml.Node, kind yaml.Kind, what, want string) error {
	if n.Kind == yaml.AliasNode {
		return errAt(n, "%s: aliases (*name) are not supported", what)
	}
	if n.Kind != kind {
		return errAt(n, "%s: want %s, got %s", what, want, kindName(n))
	}
	return nil
}

// scalarString returns a scalar's text; null is "".
func scalarString(n *yaml.Node, what string) (string, error) {
	if err := wantKind(n, yaml.ScalarNode, what, "a text value"); err != nil {
		return "", err
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

// scalarBool is true or false (YAML 1.2's, as the file says them).
func scalarBool(n *yaml.Node, what string) (bool, error) {
	s, err := scalarString(n, what)
	if err != nil {
		return false, err
	}
	switch s {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errAt(n, "%s: %q: want true or false", what, s)
}

func scalarInt(n *yaml.Node, what string) (int64, error) {
	s, err := scalarString(n, what)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errAt(n, "%s: %q: want a whole number", what, s)
	}
	return v, nil
}

func scalarDuration(n *yaml.Node, what string) (*durationpb.Duration, error) {
	s, err := scalarString(n, what)
	if err != nil {
		return nil, err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, errAt(n, "%s: %q: want a duration with a unit, such as 30s, 1m or 1h30m", what, s)
	}
	return durationpb.New(d), nil
}

// decodeCalendar reads a limit's calendar windows, {unit: month, zone:
// Europe/Berlin}; the allocator checks the unit and the zone.
func decodeCalendar(n *yaml.Node, what string, lines map[string]int) (*pb.CalendarWindows, error) {
	f, err := mappingOf(n, what, "unit", "zone")
	if err != nil {
		return nil, err
	}
	c := &pb.CalendarWindows{}
	lines["calendar"] = n.Line
	for _, key := range []string{"unit", "zone"} {
		fv, ok := f[key]
		if !ok {
			return nil, errAt(n, "%s: %q is required", what, key)
		}
		s, err := scalarString(fv.val, what+"."+key)
		if err != nil {
			return nil, err
		}
		lines["calendar."+key] = fv.val.Line
		if key == "unit" {
			c.Unit = s
		} else {
			c.Zone = s
		}
	}
	return c, nil
}

// limitKeys are the keys of one limit, in the order export writes them.
var limitKeys = []string{"id", "limit", "window", "window_phase", "calendar", "rate", "burst", "concurrency", "regions", "mode", "fallback", "lease", "owner", "description", "tags", "hash_tag",
	"settle_grace", "debt_policy", "shadow", "binds", "contracts"}

// decodeFileLimit decodes one limit and validates it. lines maps the
// allocator's field names (limit_tokens, lease.ttl, ...) to lines, so a
// validation error points at the value it refuses.
func decodeFileLimit(n *yaml.Node, what string) (*fileLimit, error) {
	f, err := mappingOf(n, what, limitKeys...)
	if err != nil {
		return nil, err
	}
	l := &pb.Limit{}
	lines := map[string]int{}
	req := func(key string) (*yaml.Node, error) {
		fv, ok := f[key]
		if !ok || (fv.val.Kind == yaml.ScalarNode && fv.val.Tag == "!!null") {
			return nil, errAt(n, "%s: %q is required", what, key)
		}
		return fv.val, nil
	}
	idn, err := req("id")
	if err != nil {
		return nil, err
	}
	if l.Id, err = scalarString(idn, what+".id"); err != nil {
		return nil, err
	}
	if err := vocab.ValidateLimitID("id", l.Id); err != nil {
		return nil, errAt(idn, "%s: %v", what, err)
	}
	what = l.Id // later messages name the limit
	lines["id"] = idn.Line
	required := []string{"limit", "window", "regions", "mode"}
	if cv, ok := f["concurrency"]; ok {
		// A concurrency limit: N slots instead of limit and window.
		for _, key := range []string{"limit", "window", "window_phase", "calendar", "rate", "burst"} {
			if fv, ok := f[key]; ok {
				return nil, errAt(fv.val, "%s: %q: a limit with concurrency is a concurrency limit: give concurrency alone, not limit, window, window_phase, calendar, rate or burst", l.Id, key)
			}
		}
		var err error
		if l.LimitTokens, err = scalarInt(cv.val, what+": concurrency"); err != nil {
			return nil, err
		}
		l.Kind = pb.LimitKind_LIMIT_KIND_CONCURRENCY
		lines["limit_tokens"], lines["kind"] = cv.val.Line, cv.val.Line
		required = []string{"regions", "mode"}
	} else if rv, ok := f["rate"]; ok {
		// A bucket limit: rate and burst instead of limit and window.
		for _, key := range []string{"limit", "window", "window_phase", "calendar"} {
			if fv, ok := f[key]; ok {
				return nil, errAt(fv.val, "%s: %q: a limit with a rate is a bucket limit: give rate and burst, not limit and window", l.Id, key)
			}
		}
		s, err := scalarString(rv.val, what+": rate")
		if err != nil {
			return nil, err
		}
		n, p, err := limitspec.ParseRate(s)
		if err != nil {
			return nil, errAt(rv.val, "%s: rate: %q: %v", l.Id, s, err)
		}
		l.Kind, l.RateTokens, l.RatePeriod = pb.LimitKind_LIMIT_KIND_BUCKET, n, durationpb.New(p)
		lines["rate_tokens"], lines["rate_period"], lines["kind"] = rv.val.Line, rv.val.Line, rv.val.Line
		bv, err := req("burst")
		if err != nil {
			return nil, errAt(rv.val, "%s: %q is required with rate", l.Id, "burst")
		}
		if l.BurstTokens, err = scalarInt(bv, what+": burst"); err != nil {
			return nil, err
		}
		lines["burst_tokens"] = bv.Line
		required = []string{"regions", "mode"}
	} else if fv, ok := f["burst"]; ok {
		return nil, errAt(fv.val, "%s: \"burst\": only a bucket limit has a burst: give rate too", l.Id)
	} else if cv, ok := f["calendar"]; ok {
		// Calendar windows instead of a fixed window:
		// calendar: {unit: month, zone: Europe/Berlin}.
		for _, key := range []string{"window", "window_phase"} {
			if fv, ok := f[key]; ok {
				return nil, errAt(fv.val, "%s: %q: a limit with calendar windows has no fixed window: give calendar or window, not both", l.Id, key)
			}
		}
		if l.Calendar, err = decodeCalendar(cv.val, what+": calendar", lines); err != nil {
			return nil, err
		}
		required = []string{"limit", "regions", "mode"}
	}
	for _, key := range required {
		v, err := req(key)
		if err != nil {
			return nil, errAt(n, "%s: %q is required", l.Id, key)
		}
		w := what + ": " + key
		switch key {
		case "limit":
			l.LimitTokens, err = scalarInt(v, w)
			lines["limit_tokens"] = v.Line
		case "window":
			l.Window, err = scalarDuration(v, w)
			lines["window"] = v.Line
		case "regions":
			l.Regions, err = decodeRegions(v, w)
			lines["regions"] = v.Line
			for i, r := range v.Content {
				lines[fmt.Sprintf("regions[%d]", i)] = r.Line
			}
		case "mode":
			var s string
			if s, err = scalarString(v, w); err == nil {
				if l.Mode, err = parseMode(s); err != nil {
					err = errAt(v, "%s: %q: want strict or bounded", w, s)
				}
			}
			lines["mode"] = v.Line
		}
		if err != nil {
			return nil, err
		}
	}
	if fv, ok := f["fallback"]; ok {
		lines["fallback"] = fv.val.Line
		if l.Fallback, err = decodeFallback(fv.val, what+": fallback", lines); err != nil {
			return nil, err
		}
	}
	l.Lease = &pb.LeaseSettings{}
	if fv, ok := f["lease"]; ok {
		lines["lease"] = fv.val.Line
		if err := decodeLease(fv.val, what+": lease", l.Lease, lines); err != nil {
			return nil, err
		}
	}
	for _, key := range []string{"owner", "description", "hash_tag"} {
		fv, ok := f[key]
		if !ok {
			continue
		}
		s, err := scalarString(fv.val, what+": "+key)
		if err != nil {
			return nil, err
		}
		lines[key] = fv.val.Line
		switch key {
		case "owner":
			l.Owner = s
		case "description":
			l.Description = s
		default:
			l.HashTag = s
		}
	}
	if fv, ok := f["window_phase"]; ok && l.Calendar == nil {
		lines["window_phase"] = fv.val.Line
		if l.WindowPhase, err = scalarDuration(fv.val, what+": window_phase"); err != nil {
			return nil, err
		}
	}
	if fv, ok := f["settle_grace"]; ok {
		lines["settle_grace"] = fv.val.Line
		if l.SettleGrace, err = scalarDuration(fv.val, what+": settle_grace"); err != nil {
			return nil, err
		}
	}
	if fv, ok := f["debt_policy"]; ok {
		lines["debt_policy"] = fv.val.Line
		s, err := scalarString(fv.val, what+": debt_policy")
		if err != nil {
			return nil, err
		}
		if l.DebtPolicy, err = parseDebtPolicy(s); err != nil {
			return nil, errAt(fv.val, "%s: debt_policy: %q: want carry or forgive", what, s)
		}
	}
	if fv, ok := f["binds"]; ok {
		lines["binds"] = fv.val.Line
		if l.Binds, err = decodeRegions(fv.val, what+": binds"); err != nil {
			return nil, err
		}
		for i, b := range fv.val.Content {
			lines[fmt.Sprintf("binds[%d]", i)] = b.Line
		}
	}
	if fv, ok := f["contracts"]; ok {
		lines["contracts"] = fv.val.Line
		if l.Contracts, err = decodeContracts(fv.val, what+": contracts", lines); err != nil {
			return nil, err
		}
	}
	if fv, ok := f["shadow"]; ok {
		lines["shadow"] = fv.val.Line
		if l.Shadow, err = scalarBool(fv.val, what+": shadow"); err != nil {
			return nil, err
		}
	}
	if fv, ok := f["tags"]; ok {
		lines["tags"] = fv.val.Line
		if l.Tags, err = decodeTags(fv.val, what+": tags", lines); err != nil {
			return nil, err
		}
	}
	norm, err := normalizeLimit(l)
	if err != nil {
		var fe *vocab.FieldError
		if errors.As(err, &fe) {
			name := strings.TrimPrefix(fe.Field, "limit.")
			return nil, &at{line: lineOf(lines, name, n.Line), msg: fmt.Sprintf("%s: %s: %s", l.Id, fileFieldName(name), fe.Reason)}
		}
		return nil, errAt(n, "%s: %v", l.Id, err)
	}
	return &fileLimit{limit: norm, line: n.Line}, nil
}

// normalizeLimit validates l as the allocator does, except for knowing the
// allocator's regions, and returns it as it would be stored: defaults
// filled in, regions sorted, explicit fallback for every region.
func normalizeLimit(l *pb.Limit) (*pb.Limit, error) {
	norm, err := limitspec.ValidateLimit(l, l.GetRegions())
	if err != nil {
		return nil, err
	}
	norm.Version, norm.EffectiveFrom, norm.Previous = 0, nil, nil
	return norm, nil
}

// lineOf is the line of the most specific recorded field that name
// starts with ("fallback[eu].local_tokens" -> "fallback[eu]").
func lineOf(lines map[string]int, name string, def int) int {
	for name != "" {
		if l, ok := lines[name]; ok {
			return l
		}
		i := strings.LastIndexAny(name, ".[")
		if i < 0 {
			break
		}
		name = name[:i]
	}
	return def
}

// fileFieldName turns the allocator's field name into the file's:
// limit_tokens -> limit, fallback[eu] -> fallback.eu.
func fileFieldName(name string) string {
	name = strings.Replace(name, "limit_tokens", "limit", 1)
	switch name {
	case "rate_tokens", "rate_period":
		return "rate"
	case "burst_tokens":
		return "burst"
	}
	if rest, ok := strings.CutPrefix(name, "fallback["); ok {
		if region, tail, ok := strings.Cut(rest, "]"); ok {
			name = "fallback." + region + tail
		}
	}
	if rest, ok := strings.CutPrefix(name, "tags["); ok {
		if key, tail, ok := strings.Cut(rest, "]"); ok {
			name = "tags." + key + tail
		}
	}
	return name
}

func decodeRegions(n *yaml.Node, what string) ([]string, error) {
	if err := wantKind(n, yaml.SequenceNode, what, "a list, e.g. [eu, us]"); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(n.Content))
	for i, r := range n.Content {
		s, err := scalarString(r, fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func decodeFallback(n *yaml.Node, what string, lines map[string]int) (map[string]*pb.Fallback, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if err := wantKind(n, yaml.MappingNode, what, `a mapping of region to closed, open or "local:A", e.g. {eu: closed, us: "local:100"}`); err != nil {
		return nil, err
	}
	out := map[string]*pb.Fallback{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		region, err := scalarString(k, what+" key")
		if err != nil {
			return nil, err
		}
		w := what + "." + region
		if _, dup := out[region]; dup {
			return nil, errAt(k, "%s: given twice", w)
		}
		s, err := scalarString(v, w)
		if err != nil {
			return nil, err
		}
		fb, err := parseFallbackKind(s)
		if err != nil && strings.HasPrefix(s, "local:") {
			return nil, errAt(v, "%s: %q: %v", w, s, err)
		}
		if err != nil {
			return nil, errAt(v, "%s: %q: want closed, open or local:A (A a whole number)", w, s)
		}
		out[region] = fb
		lines["fallback["+region+"]"] = v.Line
	}
	return out, nil
}

func decodeLease(n *yaml.Node, what string, ls *pb.LeaseSettings, lines map[string]int) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	f, err := mappingOf(n, what, "ttl", "min_chunk", "max_chunk", "standing")
	if err != nil {
		return err
	}
	if fv, ok := f["ttl"]; ok {
		if ls.Ttl, err = scalarDuration(fv.val, what+".ttl"); err != nil {
			return err
		}
		lines["lease.ttl"] = fv.val.Line
	}
	if fv, ok := f["min_chunk"]; ok {
		if ls.MinChunk, err = scalarInt(fv.val, what+".min_chunk"); err != nil {
			return err
		}
		lines["lease.min_chunk"] = fv.val.Line
	}
	if fv, ok := f["max_chunk"]; ok {
		if ls.MaxChunk, err = scalarInt(fv.val, what+".max_chunk"); err != nil {
			return err
		}
		lines["lease.max_chunk"] = fv.val.Line
	}
	if fv, ok := f["standing"]; ok {
		if ls.Standing, err = scalarInt(fv.val, what+".standing"); err != nil {
			return err
		}
		lines["lease.standing"] = fv.val.Line
	}
	return nil
}

// decodeContracts decodes a plan's contracts: tenant id to its G, or to
// the fields its contract replaces as quotactl plans set --contract
// takes them ("limit=3000 window=1h", limitspec.ParseContract).
func decodeContracts(n *yaml.Node, what string, lines map[string]int) (map[string]*pb.Contract, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if err := wantKind(n, yaml.MappingNode, what, "a mapping of tenant id to its contract, e.g. {tenant/atlas: 3000} or {tenant/atlas: \"limit=3000 mode=bounded\"}"); err != nil {
		return nil, err
	}
	out := map[string]*pb.Contract{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		id, err := scalarString(k, what+" key")
		if err != nil {
			return nil, err
		}
		if _, dup := out[id]; dup {
			return nil, errAt(k, "%s.%s: given twice", what, id)
		}
		spec, err := scalarString(v, what+"."+id)
		if err != nil {
			return nil, err
		}
		c, err := limitspec.ParseContract(spec)
		if err != nil {
			return nil, errAt(v, "%s.%s: %v", what, id, err)
		}
		out[id] = c
		lines["contracts["+id+"]"] = v.Line
	}
	return out, nil
}

func decodeTags(n *yaml.Node, what string, lines map[string]int) (map[string]string, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if err := wantKind(n, yaml.MappingNode, what, "a mapping of key to value, e.g. {plan: gold}"); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key, err := scalarString(k, what+" key")
		if err != nil {
			return nil, err
		}
		if _, dup := out[key]; dup {
			return nil, errAt(k, "%s.%s: given twice", what, key)
		}
		val, err := scalarString(v, what+"."+key)
		if err != nil {
			return nil, err
		}
		out[key] = val
		lines["tags["+key+"]"] = v.Line
	}
	return out, nil
}

// encodeLimitsFile writes limits (sorted by id) as a limits file that
// decodes back to the same limits. manage is written when not nil.
func encodeLimitsFile(w io.Writer, manage []string, limits []*pb.Limit) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	if manage != nil {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, m := range manage {
			seq.Content = append(seq.Content, str(m))
		}
		root.Content = append(root.Content, str("manage"), seq)
	}
	ls := &yaml.Node{Kind: yaml.SequenceNode}
	sorted := slices.Clone(limits)
	slices.SortFunc(sorted, func(a, b *pb.Limit) int { return strings.Compare(a.GetId(), b.GetId()) })
	for _, l := range sorted {
		ls.Content = append(ls.Content, limitNode(l))
	}
	root.Content = append(root.Content, str("limits"), ls)
	root.HeadComment = "Leasehold limits, as written by quotactl limits export.\n" +
		"Review changes with: quotactl limits plan -f FILE -o plan.json"
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return fmt.Errorf("encode YAML: %v", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("encode YAML: %v", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// str is a string scalar, quoted when YAML would read it as anything else.
func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if strings.Contains(s, ":") {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

func intNode(v int64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v, 10)}
}

func flowMap(kv ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle, Content: kv}
}

// limitNode is one limit as export writes it: every setting explicit
// (fallback for every region, lease settings), empty texts and tags left
// out.
func limitNode(l *pb.Limit) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v *yaml.Node) { n.Content = append(n.Content, str(k), v) }
	add("id", str(l.GetId()))
	if l.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY {
		add("concurrency", intNode(l.GetLimitTokens()))
	} else if l.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET {
		add("rate", str(formatRate(l)))
		add("burst", intNode(l.GetBurstTokens()))
	} else {
		add("limit", intNode(l.GetLimitTokens()))
		if c := l.GetCalendar(); c != nil {
			cal := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
			cal.Content = append(cal.Content, str("unit"), str(c.GetUnit()), str("zone"), str(c.GetZone()))
			add("calendar", cal)
		} else {
			add("window", str(formatDuration(l.GetWindow())))
		}
		if l.GetWindowPhase().AsDuration() != 0 {
			add("window_phase", str(formatDuration(l.GetWindowPhase())))
		}
	}
	regions := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, r := range slices.Sorted(slices.Values(l.GetRegions())) {
		regions.Content = append(regions.Content, str(r))
	}
	add("regions", regions)
	add("mode", str(limitspec.ModeName(l.GetMode())))
	fb := flowMap()
	for _, r := range slices.Sorted(slices.Values(l.GetRegions())) {
		kind := "closed"
		if f, ok := l.GetFallback()[r]; ok {
			kind = limitspec.FallbackName(f)
		}
		fb.Content = append(fb.Content, str(r), str(kind))
	}
	add("fallback", fb)
	ls := flowMap(
		str("ttl"), str(formatDuration(l.GetLease().GetTtl())),
		str("min_chunk"), intNode(l.GetLease().GetMinChunk()),
		str("max_chunk"), intNode(l.GetLease().GetMaxChunk()))
	if n := l.GetLease().GetStanding(); n != 0 {
		ls.Content = append(ls.Content, str("standing"), intNode(n))
	}
	add("lease", ls)
	if l.GetOwner() != "" {
		add("owner", str(l.GetOwner()))
	}
	if l.GetDescription() != "" {
		add("description", str(l.GetDescription()))
	}
	if len(l.GetTags()) > 0 {
		tags := flowMap()
		for _, k := range slices.Sorted(maps.Keys(l.GetTags())) {
			tags.Content = append(tags.Content, str(k), str(l.GetTags()[k]))
		}
		add("tags", tags)
	}
	if l.GetHashTag() != "" {
		add("hash_tag", str(l.GetHashTag()))
	}
	if l.GetSettleGrace() != nil {
		add("settle_grace", str(formatDuration(l.GetSettleGrace())))
	}
	if l.GetDebtPolicy() != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED {
		add("debt_policy", str(debtPolicyName(l.GetDebtPolicy())))
	}
	if l.GetShadow() {
		add("shadow", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
	if len(l.GetContracts()) > 0 {
		cs := flowMap()
		for _, id := range slices.Sorted(maps.Keys(l.GetContracts())) {
			c := l.GetContracts()[id]
			v := str(limitspec.FormatContract(c))
			if !strings.Contains(v.Value, "=") {
				v = intNode(c.GetLimitTokens()) // G only
			}
			cs.Content = append(cs.Content, str(id), v)
		}
		add("contracts", cs)
	}
	if len(l.GetBinds()) > 0 {
		binds := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, b := range l.GetBinds() {
			binds.Content = append(binds.Content, str(b))
		}
		add("binds", binds)
	}
	return n
}
