// Package deploy holds the Grafana dashboard and the Prometheus alerting
// rules. This test keeps them honest: every metric they name is one the
// leasehold binaries register, every label they match on is one the
// metric has, and every runbook link lands on a section of
// docs/operations.md.
package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"leasehold/allocator"
	"leasehold/internal/doclinks"
	"leasehold/internal/etcdtest"
	"leasehold/regionagent"
	"leasehold/regionagent/client"
	"leasehold/regionagent/httplimit"
)

// metricInfo is what a registered metric family is known by.
type metricInfo struct {
	labels map[string]bool
	kind   string // "histogram", "summary", "counter", "gauge", "untyped" or "" (not collected)
}

// recorder is a prometheus.Registerer that keeps the name and labels of
// every Desc of every collector registered on it.
type recorder struct {
	mu      sync.Mutex
	metrics map[string]*metricInfo
}

var (
	fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)
	labelsRe = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	constRe  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
)

func (r *recorder) Register(c prometheus.Collector) error {
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	var all []*prometheus.Desc
	for d := range descs {
		all = append(all, d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.metrics == nil {
		r.metrics = map[string]*metricInfo{}
	}
	for _, d := range all {
		s := d.String()
		m := fqNameRe.FindStringSubmatch(s)
		if m == nil {
			return fmt.Errorf("no fqName in %s", s)
		}
		info := &metricInfo{labels: map[string]bool{}}
		if l := labelsRe.FindStringSubmatch(s); l != nil {
			for _, name := range strings.Split(l[1], ",") {
				if name = strings.TrimSpace(name); name != "" {
					info.labels[name] = true
				}
			}
		}
		if l := constRe.FindStringSubmatch(s); l != nil {
			for _, kv := range strings.Split(l[1], ",") {
				if k, _, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
					info.labels[k] = true
				}
			}
		}
		r.metrics[m[1]] = info
	}
	// The kind, where the collector already has a sample (plain
	// histograms and counters do; vectors without children do not).
	ms := make(chan prometheus.Metric)
	go func() { c.Collect(ms); close(ms) }()
	var collected []prometheus.Metric
	for m := range ms {
		collected = append(collected, m)
	}
	for _, m := range collected {
		var pm dto.Metric
		if err := m.Write(&pm); err != nil {
			continue
		}
		name := fqNameRe.FindStringSubmatch(m.Desc().String())
		if name == nil || r.metrics[name[1]] == nil {
			continue
		}
		info := r.metrics[name[1]]
		switch {
		case pm.Histogram != nil:
			info.kind = "histogram"
		case pm.Summary != nil:
			info.kind = "summary"
		case pm.Counter != nil:
			info.kind = "counter"
		case pm.Gauge != nil:
			info.kind = "gauge"
		default:
			info.kind = "untyped"
		}
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return true }

// exported builds the allocator's and an agent's registries as the
// binaries do (cmd/leasehold: newRegistry plus the package's own metrics)
// and returns every metric name with its labels.
func exported(t *testing.T) map[string]*metricInfo {
	t.Helper()
	rec := &recorder{}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cluster := etcdtest.Start(t, 1)
	if _, err := allocator.New(allocator.Config{Client: cluster.Client(t), Regions: []string{"eu", "us"}, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	// The agent's Redis need not be up: New does not connect.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { rdb.Close() })
	if _, err := regionagent.New(regionagent.Config{Region: "eu", Allocators: []string{"127.0.0.1:1"}, Redis: rdb, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	// A gateway's (leasehold gateway --metrics-addr), and a Go client's
	// collector (New does not connect either).
	if _, err := httplimit.NewMetrics(rec); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	rec.MustRegister(client.NewCollector(cl))
	return rec.metrics
}

// Targets add these labels to every series at scrape time.
var targetLabels = map[string]bool{"job": true, "instance": true}

// selector is one metric named in an expression, with the labels it
// matches on.
type selector struct {
	name   string
	labels []string
}

var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
}

// aggregations may be followed by "by (...)" or "without (...)" before
// their "(".
var aggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true}

// groupingWords take a parenthesised label list.
var groupingWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// parsePromQL lists the metric selectors of a PromQL expression. It
// tokenises: string literals, numbers and durations, Grafana variables
// ($x, ${x}, [[x]]), label lists after by/without/on/ignoring/group_*,
// label matchers in {...} (kept for the metric before them), functions
// (an identifier followed by "("), keywords; every other identifier is a
// metric name.
func parsePromQL(expr string) ([]selector, error) {
	var out []selector
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
		return i
	}
	// matchers parses {a="x", b=~"y"} at i and returns the label names and
	// the index after "}".
	matchers := func(i int) ([]string, int, error) {
		var labels []string
		i++ // {
		for {
			i = skipSpace(i)
			if i >= len(expr) {
				return nil, i, fmt.Errorf("unclosed {")
			}
			switch c := expr[i]; {
			case c == '}':
				return labels, i + 1, nil
			case c == ',':
				i++
			case isIdentStart(c):
				j := i
				for j < len(expr) && isIdent(expr[j]) {
					j++
				}
				labels = append(labels, expr[i:j])
				j = skipSpace(j)
				op := j
				for j < len(expr) && strings.ContainsRune("=!~", rune(expr[j])) {
					j++
				}
				if j == op {
					return nil, j, fmt.Errorf("label %s without a match operator", expr[i:j])
				}
				j = skipSpace(j)
				if j >= len(expr) || !strings.ContainsRune("\"'`", rune(expr[j])) {
					return nil, j, fmt.Errorf("label %s: value is not a string", labels[len(labels)-1])
				}
				end := strings.IndexByte(expr[j+1:], expr[j])
				if end < 0 {
					return nil, j, fmt.Errorf("unclosed string")
				}
				i = j + 1 + end + 1
			default:
				return nil, i, fmt.Errorf("unexpected %q in label matchers", c)
			}
		}
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case strings.ContainsRune(" \t\r\n", rune(c)):
			i++
		case c == '"' || c == '\'' || c == '`':
			end := strings.IndexByte(expr[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unclosed string at %d", i)
			}
			i += end + 2
		case c == '$': // Grafana variable: $name or ${name}
			i++
			if i < len(expr) && expr[i] == '{' {
				end := strings.IndexByte(expr[i:], '}')
				if end < 0 {
					return nil, fmt.Errorf("unclosed ${ at %d", i)
				}
				i += end + 1
			}
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
		case c == '[' && strings.HasPrefix(expr[i:], "[["): // Grafana [[name]]
			end := strings.Index(expr[i:], "]]")
			if end < 0 {
				return nil, fmt.Errorf("unclosed [[ at %d", i)
			}
			i += end + 2
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			// A number or a duration (5m, 1h30m, 0.5, 1e3).
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '{':
			// Matchers without a metric name ({__name__=...}) are refused:
			// they would hide the name from this check.
			return nil, fmt.Errorf("label matchers without a metric name at %d", i)
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := skipSpace(j)
			switch {
			case groupingWords[strings.ToLower(word)]:
				if k < len(expr) && expr[k] == '(' {
					end := strings.IndexByte(expr[k:], ')')
					if end < 0 {
						return nil, fmt.Errorf("unclosed %s( at %d", word, k)
					}
					k += end + 1
				}
				i = k
			case promqlKeywords[strings.ToLower(word)]:
				i = j
			case aggregations[strings.ToLower(word)] && k < len(expr) && (expr[k] == '(' || isIdentStart(expr[k])):
				i = j // sum (...), sum by (...) (...)
			case k < len(expr) && expr[k] == '(':
				if strings.HasPrefix(word, "leasehold_") {
					return nil, fmt.Errorf("%s is called like a function", word)
				}
				i = j // a function or an aggregation
			default:
				sel := selector{name: word}
				if k < len(expr) && expr[k] == '{' {
					labels, next, err := matchers(k)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", word, err)
					}
					sel.labels, k = labels, next
				} else {
					k = j
				}
				out = append(out, sel)
				i = k
			}
		default:
			i++ // operators, parentheses, brackets, commas
		}
	}
	return out, nil
}

// histogramSuffixes are the series a histogram or summary family exposes
// besides its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// check returns the problems of one expression against the exported
// metrics.
func check(where, expr string, metrics map[string]*metricInfo) []string {
	sels, err := parsePromQL(expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: cannot parse %q: %v", where, expr, err)}
	}
	if len(sels) == 0 {
		return []string{fmt.Sprintf("%s: %q names no metric", where, expr)}
	}
	var bad []string
	for _, s := range sels {
		info, extra := metrics[s.name], map[string]bool{}
		if info == nil {
			for _, suf := range histogramSuffixes {
				base, ok := strings.CutSuffix(s.name, suf)
				if b := metrics[base]; ok && b != nil && (b.kind == "histogram" || b.kind == "summary") {
					if suf == "_bucket" && b.kind == "summary" {
						break
					}
					info = b
					if suf == "_bucket" {
						extra["le"] = true
					}
				}
			}
		}
		if info == nil {
			bad = append(bad, fmt.Sprintf("%s: unknown metric %s in %q", where, s.name, expr))
			continue
		}
		for _, l := range s.labels {
			if !info.labels[l] && !targetLabels[l] && !extra[l] {
				bad = append(bad, fmt.Sprintf("%s: metric %s has no label %q in %q", where, s.name, l, expr))
			}
		}
	}
	return bad
}

// dashboardExprs walks the dashboard and returns every PromQL expression
// ("expr" anywhere, and the template variables' queries) by where it is.
func dashboardExprs(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if title, ok := x["title"].(string); ok {
				path += " > " + title
			}
			for k, c := range x {
				if s, ok := c.(string); ok && k == "expr" {
					out[path+" ["+fmt.Sprint(x["refId"])+"]"] = s
					continue
				}
				walk(path, c)
			}
		case []any:
			for i, c := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	walk("dashboard", dash["panels"])
	labelValues := regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)
	tmpl, _ := dash["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	for _, v := range list {
		vr, _ := v.(map[string]any)
		if vr["type"] != "query" {
			continue
		}
		q, ok := vr["query"].(string)
		if obj, isObj := vr["query"].(map[string]any); isObj {
			q, ok = obj["query"].(string)
		}
		if !ok {
			t.Errorf("variable %v: no query", vr["name"])
			continue
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			// label_values(selector, label): the label must be the metric's.
			out[fmt.Sprintf("variable %v", vr["name"])] = m[1] + `{` + m[2] + `=~".+"}`
		} else {
			out[fmt.Sprintf("variable %v", vr["name"])] = q
		}
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

var runbookRe = regexp.MustCompile(`docs/operations\.md#([a-z0-9_-]+)`)

func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	metrics := exported(t)
	// The window metrics the dashboard is about must be there at all.
	for _, name := range []string{"leasehold_window_limit_tokens", "leasehold_window_admitted_tokens", "leasehold_overshoot_bound_tokens",
		"leasehold_overshoot_observed_tokens", "leasehold_stranded_tokens", "leasehold_region_fallback_mode",
		"leasehold_lease_grants_total", "leasehold_agent_checks_total", "leasehold_agent_renewals_total",
		"leasehold_agent_fallback_mode", "leasehold_agent_info", "leasehold_agent_synced", "leasehold_agent_redis_up",
		"leasehold_agent_limits_snapshot_age_seconds", "leasehold_gateway_decisions_total", "leasehold_client_decisions_total"} {
		if metrics[name] == nil {
			t.Errorf("the binaries do not register %s", name)
		}
	}
	docs, err := doclinks.FileAnchors("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string

	// The dashboard.
	raw, err := os.ReadFile("grafana/leasehold.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana/leasehold.json: %v", err)
	}
	exprs := dashboardExprs(t, dash)
	if len(exprs) < 20 {
		t.Errorf("only %d expressions found in the dashboard", len(exprs))
	}
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		bad = append(bad, check(k, exprs[k], metrics)...)
	}
	for _, a := range runbookRe.FindAllStringSubmatch(string(raw), -1) {
		if !docs[a[1]] {
			bad = append(bad, fmt.Sprintf("dashboard: docs/operations.md has no section #%s", a[1]))
		}
	}
	checkDashboardShape(t, dash)

	// The alerting rules.
	raw, err = os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.UnmarshalStrict(raw, &rules); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert + r.Record
			alerts = append(alerts, r.Alert)
			bad = append(bad, check(where, r.Expr, metrics)...)
			if sev := r.Labels["severity"]; sev != "page" && sev != "ticket" {
				bad = append(bad, fmt.Sprintf("%s: severity %q, want page or ticket", where, sev))
			}
			m := runbookRe.FindStringSubmatch(r.Annotations["runbook_url"])
			if m == nil || !docs[m[1]] {
				bad = append(bad, fmt.Sprintf("%s: runbook_url %q is not a section of docs/operations.md", where, r.Annotations["runbook_url"]))
			}
			if r.Annotations["summary"] == "" {
				bad = append(bad, where+": no summary")
			}
		}
	}
	slices.Sort(alerts)
	want := []string{"LeaseholdAgentNotSynced", "LeaseholdCheckLatencyHigh", "LeaseholdChunkTokensLost", "LeaseholdGatewayUnavailable", "LeaseholdLimitsSnapshotStale",
		"LeaseholdNoAllocatorLeader", "LeaseholdObservedOverBound", "LeaseholdRedisDown", "LeaseholdRegionFallback", "LeaseholdRegionOpen",
		"LeaseholdRenewalsFailing", "LeaseholdStrandedTokens"}
	if !slices.Equal(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}
	if len(bad) > 0 {
		t.Errorf("%d problems:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// checkDashboardShape checks what Grafana needs to import the dashboard:
// a uid, unique panel ids, a grid position, and every query on the
// datasource variable.
func checkDashboardShape(t *testing.T, dash map[string]any) {
	t.Helper()
	if dash["uid"] == "" || dash["title"] == "" {
		t.Error("dashboard without uid or title")
	}
	panels, _ := dash["panels"].([]any)
	ids := map[float64]bool{}
	for _, p := range panels {
		pm := p.(map[string]any)
		id, _ := pm["id"].(float64)
		if ids[id] {
			t.Errorf("panel id %v twice", id)
		}
		ids[id] = true
		if _, ok := pm["gridPos"].(map[string]any); !ok {
			t.Errorf("panel %v has no gridPos", pm["title"])
		}
		targets, _ := pm["targets"].([]any)
		if pm["type"] != "row" && len(targets) == 0 {
			t.Errorf("panel %v has no query", pm["title"])
		}
		for _, tg := range targets {
			ds, _ := tg.(map[string]any)["datasource"].(map[string]any)
			if ds["uid"] != "${datasource}" {
				t.Errorf("panel %v: datasource %v, want ${datasource}", pm["title"], ds)
			}
		}
	}
}

// The tokenizer itself, on the shapes the files use.
func TestParsePromQL(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string // name{labels} ...
	}{
		{`sum by (region) (leasehold_window_admitted_tokens{limit="$limit"})`, `leasehold_window_admitted_tokens{limit}`},
		{`histogram_quantile(0.99, sum by (le) (rate(leasehold_lease_acquire_duration_seconds_bucket[$__rate_interval])))`, `leasehold_lease_acquire_duration_seconds_bucket{}`},
		{`a_total > b or on () (sum(increase(c_total[10m])) > 0)`, `a_total{} b{} c_total{}`},
		{`(sum(leasehold_allocator_leader) or vector(0)) < 1`, `leasehold_allocator_leader{}`},
		{`x{result=~"fallback|unavailable", le!="1"} / ignoring(result) group_left y offset 5m`, `x{result,le} y{}`},
		{`0.1 * max(g{limit='a,b}'}) + 1e3 - .5`, `g{limit}`},
		{`sum without (instance) (rate(m[1h30m])) * on (job) group_right (limit) n`, `m{} n{}`},
	} {
		sels, err := parsePromQL(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		var got []string
		for _, s := range sels {
			got = append(got, s.name+"{"+strings.Join(s.labels, ",")+"}")
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: got %v, want %s", tc.expr, got, tc.want)
		}
	}
	for _, expr := range []string{`{__name__="x"}`, `x{a="b"`, `leasehold_x(1)`, `x{a=b}`} {
		if _, err := parsePromQL(expr); err == nil {
			t.Errorf("%s: no error", expr)
		}
	}
	// Unknown metrics and labels are reported.
	metrics := map[string]*metricInfo{"h": {labels: map[string]bool{}, kind: "histogram"}, "c_total": {labels: map[string]bool{"result": true}}}
	for expr, n := range map[string]int{`rate(h_bucket{le="1"}[5m])`: 0, `h_sum / h_count`: 0, `c_total{result="x", instance="i"}`: 0,
		`c_total{region="eu"}`: 1, `nope_total`: 1, `c_total_bucket`: 1, `vector(0)`: 1} {
		if got := check("t", expr, metrics); len(got) != n {
			t.Errorf("%s: %v, want %d problems", expr, got, n)
		}
	}
}
