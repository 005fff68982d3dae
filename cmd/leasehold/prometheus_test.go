package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	"leasehold/internal/promtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestPrometheusScrapesDev runs a real prometheus against `leasehold dev
// --traffic` (in this process, on free loopback ports; the demo limit at
// 100 per 5 s so that windows close during the test) with the rules in
// deploy/, and evaluates through Prometheus's query API every dashboard
// expression and every alert expression: none may fail, every query of
// every panel must have data, and on this healthy system every rule
// evaluates cleanly and no alert fires.
func TestPrometheusScrapesDev(t *testing.T) {
	promtest.Need(t, "prometheus")
	start := time.Now()
	args, alloc, eu, us, euHTTP := devArgs(t, filepath.Join(t.TempDir(), "dev"))
	args = append(args, "--no-demo", "--traffic", "--traffic-eu", "3000", "--traffic-us", "1500", "--traffic-for", "5m")
	s := startCmd(t, args...)
	for _, addr := range []string{eu, us} {
		waitServing(t, dial(t, addr), pb.RegionAgent_ServiceDesc.ServiceName, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := pb.NewAdminClient(dial(t, alloc)).PutLimit(ctx, &pb.PutLimitRequest{Reason: "prometheus test", Limit: &pb.Limit{
		Id: demoLimit, LimitTokens: 100, Window: durationpb.New(5 * time.Second), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(5 * time.Second)}}}); err != nil {
		t.Fatal(err)
	}
	// An expiring override that puts the limit in shadow mode for the
	// test's life: the shadow-mode and override panels have data too.
	if _, err := pb.NewAdminClient(dial(t, alloc)).PutLimit(ctx, &pb.PutLimitRequest{Reason: "prometheus test: try shadow mode",
		OverrideFor: durationpb.New(time.Hour), Limit: &pb.Limit{
			Id: demoLimit, LimitTokens: 100, Window: durationpb.New(5 * time.Second), Regions: []string{"eu", "us"},
			Mode: pb.Mode_MODE_STRICT, Shadow: true, Lease: &pb.LeaseSettings{Ttl: durationpb.New(5 * time.Second)}}}); err != nil {
		t.Fatal(err)
	}

	rules, err := filepath.Abs("../../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	prom := promtest.Start(t, []string{rules}, []promtest.Target{
		{Job: "leasehold-allocator", Addrs: []string{argValue(args, "--allocator-http")}},
		{Job: "leasehold-agent", Addrs: []string{euHTTP, argValue(args, "--us-http")}},
		{Job: "leasehold-gateway", Addrs: []string{argValue(args, "--eu-gateway-metrics"), argValue(args, "--us-gateway-metrics")}},
	})
	panels, variables := dashboardQueries(t, "../../deploy/grafana/leasehold.json")
	alerts := alertExprs(t, rules)
	// Grafana's variables, as the dashboard would have them.
	expand := strings.NewReplacer("$__rate_interval", "10s", "$__range", "1m", "$limit", demoLimit).Replace

	// Poll until every target is up, every panel has data, every rule
	// was evaluated, and what a healthy run should show is there; then
	// hold the result against the checks below.
	var (
		missing  []string // panel queries without data, and what else is not there yet
		problems []string // expressions that fail
		ruleList []promtest.Rule
	)
	deadline := time.Now().Add(90 * time.Second)
	for {
		missing, problems = nil, nil
		health, scrapeErrs, err := prom.Targets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for u, h := range health {
			if h != "up" {
				missing = append(missing, fmt.Sprintf("target %s: %s %s", u, h, scrapeErrs[u]))
			}
		}
		if len(health) != 5 {
			missing = append(missing, fmt.Sprintf("%d targets, want 5", len(health)))
		}
		for _, p := range panels {
			for _, e := range p.exprs {
				res, err := prom.Query(ctx, expand(e))
				if err != nil {
					problems = append(problems, fmt.Sprintf("panel %q: %s: %v", p.title, e, err))
				}
				if len(res) == 0 {
					missing = append(missing, fmt.Sprintf("panel %q: no data for %s", p.title, e))
				}
			}
		}
		for name, q := range variables {
			res, err := prom.Query(ctx, q)
			if err != nil {
				problems = append(problems, fmt.Sprintf("variable %s: %s: %v", name, q, err))
			}
			if !slices.ContainsFunc(res, func(s promtest.Sample) bool { return s.Metric["limit"] == demoLimit }) {
				missing = append(missing, fmt.Sprintf("variable %s lists no %s: %v", name, demoLimit, res))
			}
		}
		for name, e := range alerts {
			if _, err := prom.Query(ctx, e); err != nil {
				problems = append(problems, fmt.Sprintf("alert %s: %v", name, err))
			}
		}
		if ruleList, err = prom.Rules(ctx); err != nil {
			t.Fatal(err)
		}
		for _, r := range ruleList {
			if r.Health != "ok" {
				missing = append(missing, fmt.Sprintf("rule %s: health %q %s", r.Name, r.Health, r.LastError))
			}
		}
		if len(ruleList) != len(alerts) {
			missing = append(missing, fmt.Sprintf("%d rules loaded, want %d", len(ruleList), len(alerts)))
		}
		if len(problems) > 0 {
			t.Fatalf("%d expressions fail:\n%s", len(problems), strings.Join(problems, "\n"))
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-s.done:
			t.Fatalf("leasehold dev exited %d: %s", s.exit, s.stderr)
		case <-time.After(time.Second): // the next scrapes
		}
	}
	if len(missing) > 0 {
		t.Fatalf("after %v, on a healthy system:\n%s", time.Since(start).Round(time.Second), strings.Join(missing, "\n"))
	}
	var firing []string
	for _, r := range ruleList {
		if r.State != "inactive" {
			firing = append(firing, r.Name+" "+r.State)
		}
	}
	if slices.ContainsFunc(firing, func(s string) bool { return strings.HasSuffix(s, " firing") }) {
		t.Errorf("alerts firing on a healthy system: %v", firing)
	} else if len(firing) > 0 {
		t.Logf("pending on a healthy system (within their for): %v", firing)
	}
	t.Logf("%d panels, every query with data; %d alert expressions and %d rules evaluated cleanly; in %v",
		len(panels), len(alerts), len(ruleList), time.Since(start).Round(time.Second))
}

// panelQueries is one dashboard panel's expressions.
type panelQueries struct {
	title string
	exprs []string
}

// dashboardQueries returns every panel's expressions (rows have none)
// and each query variable as a PromQL query listing its values.
func dashboardQueries(t *testing.T, path string) ([]panelQueries, map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	var out []panelQueries
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		pq := panelQueries{title: p.Title}
		for _, tg := range p.Targets {
			pq.exprs = append(pq.exprs, tg.Expr)
		}
		out = append(out, pq)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		// label_values(METRIC, LABEL) is Grafana's; Prometheus lists them
		// with group by.
		inner, ok := strings.CutPrefix(q.Query, "label_values(")
		metric, label, ok2 := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
		if !ok || !ok2 {
			t.Fatalf("variable %s: query %q is not label_values(METRIC, LABEL)", v.Name, q.Query)
		}
		vars[v.Name] = "group by (" + strings.TrimSpace(label) + ") (" + strings.TrimSpace(metric) + ")"
	}
	return out, vars
}

// alertExprs returns every alert's expression by name.
func alertExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}
