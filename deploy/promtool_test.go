package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"leasehold/internal/promtest"
)

// alertTests is the part of a promtool test file this test reads.
type alertTests struct {
	Tests []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRulesWithPromtool runs the rules' unit tests as Prometheus
// runs them (promtool test rules), checks that every alert has a test
// where it fires and one where it stays silent, and that the tests notice
// when an alert could never fire or always fires (each alert's expression
// replaced in turn).
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool := promtest.Need(t, "promtool")
	promtoolRun := func(dir string) (string, error) {
		cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := exec.Command(promtool, "check", "rules", "prometheus/alerts.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtoolRun("prometheus"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}

	rulesRaw, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.UnmarshalStrict(rulesRaw, &rules); err != nil {
		t.Fatal(err)
	}
	testsRaw, err := os.ReadFile("prometheus/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(testsRaw, &tests); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tg := range tests.Tests {
		for _, c := range tg.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				silent[c.Alertname] = true
			}
		}
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if !fires[r.Alert] || !silent[r.Alert] {
				t.Errorf("%s: alerts_test.yaml has no test where it fires (%v) or none where it is silent (%v)", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
	for name := range fires {
		if !slices.Contains(alerts, name) {
			t.Errorf("alerts_test.yaml tests %s, which alerts.yaml does not have", name)
		}
	}

	// Mutants: each alert that never fires, then one that always fires
	// (with its labels and for), must fail the tests.
	for _, alert := range alerts {
		for _, mutant := range []string{"vector(1) < 0", "vector(1)"} {
			dir := t.TempDir()
			mutated, ok := replaceExpr(string(rulesRaw), alert, mutant)
			if !ok {
				t.Fatalf("%s: cannot find its expr in alerts.yaml", alert)
			}
			if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), []byte(mutated), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), testsRaw, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := promtoolRun(dir); err == nil {
				t.Errorf("%s with expr %q: the tests still pass\n%s", alert, mutant, out)
			}
		}
	}
}

// replaceExpr returns the rules file with alert's expr (one line, or a
// "|" block) replaced by expr.
func replaceExpr(rules, alert, expr string) (string, bool) {
	lines := strings.Split(rules, "\n")
	start := slices.Index(lines, "      - alert: "+alert)
	if start < 0 {
		return "", false
	}
	for i := start + 1; i < len(lines) && !strings.HasPrefix(lines[i], "      - "); i++ {
		if !strings.HasPrefix(lines[i], "        expr:") {
			continue
		}
		end := i + 1
		if strings.TrimSpace(lines[i]) == "expr: |" {
			for end < len(lines) && strings.HasPrefix(lines[end], "          ") {
				end++
			}
		}
		out := append(append(slices.Clone(lines[:i]), "        expr: "+expr), lines[end:]...)
		return strings.Join(out, "\n"), true
	}
	return "", false
}
