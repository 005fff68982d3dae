// Package promtest runs Prometheus's own tools in tests: promtool, and a
// real prometheus server on loopback scraping the test's targets, queried
// through its HTTP API.
//
// A test that needs one calls Need: outside CI a missing binary skips the
// test with what to install; in CI (CI=true) it fails, so that CI never
// passes without running it.
package promtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
)

// Need returns the path of the binary name (prometheus or promtool). When
// it is missing it fails the test in CI and skips it elsewhere, saying how
// to install it.
func Need(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	const how = "Debian's prometheus package has both prometheus and promtool: apt-get install prometheus, or .ci/install-deps --ci"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found, and CI must run this test: %s", name, how)
	}
	t.Skipf("%s not found (%s); CI runs this test", name, how)
	return ""
}

// Server is a prometheus server the test started.
type Server struct {
	URL string // http://127.0.0.1:PORT
	hc  *http.Client
}

// Target is a scrape job: its name and its host:port targets.
type Target struct {
	Job   string
	Addrs []string
}

// Start runs prometheus on a free loopback port with its own data
// directory, scraping targets every second and evaluating ruleFiles
// (absolute paths) every second, and waits until it answers. It is
// stopped (SIGTERM, then killed after 10 s) when the test ends.
func Start(t testing.TB, ruleFiles []string, targets []Target) *Server {
	t.Helper()
	bin := Need(t, "prometheus")
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n")
	cfg.WriteString("rule_files:\n")
	for _, f := range ruleFiles {
		fmt.Fprintf(&cfg, "  - %q\n", f)
	}
	cfg.WriteString("scrape_configs:\n")
	for _, tg := range targets {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [", tg.Job)
		for i, a := range tg.Addrs {
			if i > 0 {
				cfg.WriteString(", ")
			}
			fmt.Fprintf(&cfg, "%q", a)
		}
		cfg.WriteString("]\n")
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := ports.Addr(t)
	var out syncbuf.Buffer
	cmd := exec.Command(bin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	s := &Server{URL: "http://" + addr, hc: &http.Client{Timeout: 5 * time.Second}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := s.hc.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond) // polling readiness
	}
}

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Query evaluates expr now through the HTTP API (/api/v1/query). An error
// is the API's (a bad expression, a failed evaluation) or the request's.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var res struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &res); err != nil {
		return nil, err
	}
	switch res.ResultType {
	case "vector":
		var v []Sample
		return v, json.Unmarshal(res.Result, &v)
	case "scalar":
		var v [2]any
		return []Sample{{Value: v}}, json.Unmarshal(res.Result, &v)
	}
	return nil, fmt.Errorf("result type %q", res.ResultType)
}

// Targets returns the health of every active target by its scrape URL
// ("up", "down", "unknown") and the last scrape errors.
func (s *Server) Targets(ctx context.Context) (map[string]string, map[string]string, error) {
	var res struct {
		ActiveTargets []struct {
			ScrapeURL string `json:"scrapeUrl"`
			Health    string `json:"health"`
			LastError string `json:"lastError"`
		} `json:"activeTargets"`
	}
	if err := s.get(ctx, "/api/v1/targets", &res); err != nil {
		return nil, nil, err
	}
	health, errs := map[string]string{}, map[string]string{}
	for _, tg := range res.ActiveTargets {
		health[tg.ScrapeURL] = tg.Health
		if tg.LastError != "" {
			errs[tg.ScrapeURL] = tg.LastError
		}
	}
	return health, errs, nil
}

// Rule is one rule's state as the rules API reports it.
type Rule struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"` // alerting rules: inactive, pending, firing
	Type      string `json:"type"`
}

// Rules returns every loaded rule.
func (s *Server) Rules(ctx context.Context) ([]Rule, error) {
	var res struct {
		Groups []struct {
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := s.get(ctx, "/api/v1/rules", &res); err != nil {
		return nil, err
	}
	var out []Rule
	for _, g := range res.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// get calls the API and decodes its data, or returns its error.
func (s *Server) get(ctx context.Context, path string, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return err
	}
	var env struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %d %.200s", path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}
