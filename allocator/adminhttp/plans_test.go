package adminhttp

import (
	"strings"
	"testing"
)

// TestPlansOverHTTP: a plan is written and listed through the limit
// routes; refusals are problems naming the field.
func TestPlansOverHTTP(t *testing.T) {
	c, _ := newAPI(t, nil)
	plan := func(g int64, binds, extra string) string {
		return limitBody(g, extra)[:len(`{"limit": {`)] + `"binds": ` + binds + ", " + limitBody(g, extra)[len(`{"limit": {`):]
	}
	mustCode(t, c.do("PUT", "/v1/limits/plans/pro", nil, plan(1000, `["tenant/{id}"]`, "")), 200)
	r := c.do("GET", "/v1/limits?prefix=plans/", nil, "")
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"binds":["tenant/{id}"]`) {
		t.Fatalf("plans listed as %s", r.body)
	}
	r = c.do("PUT", "/v1/limits/plans/pro", nil, plan(2000, `["tenant/{id}"]`, `, "dry_run": true`))
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"limit_id":"plans/pro"`) || strings.Contains(string(r.body), `"window_start"`) {
		t.Fatalf("a dry run of a plan change: %s", r.body)
	}
	// A bucket plan: rate and burst for every tenant, through the same
	// route; a contract field a bucket limit has not is refused naming it.
	bucket := func(contracts string) string {
		return `{"limit": {"binds": ["free/{id}"], "kind": "LIMIT_KIND_BUCKET", "rate_tokens": "10", "burst_tokens": "50", ` +
			`"rate_period": "1s", "regions": ["eu"], "mode": "MODE_STRICT"` + contracts + `}, "reason": "free tier"}`
	}
	mustCode(t, c.do("PUT", "/v1/limits/plans/free", nil, bucket("")), 200)
	r = c.do("GET", "/v1/limits/plans/free", nil, "")
	mustCode(t, r, 200)
	if !strings.Contains(string(r.body), `"kind":"LIMIT_KIND_BUCKET"`) || !strings.Contains(string(r.body), `"binds":["free/{id}"]`) {
		t.Fatalf("a bucket plan read back as %s", r.body)
	}
	if got := c.do("PUT", "/v1/limits/plans/free", nil, bucket(`, "contracts": {"free/atlas": {"limit_tokens": "3000"}}`)).field(t); got != "limit.contracts[free/atlas].limit_tokens" {
		t.Errorf("a G in a bucket plan's contract: names %q", got)
	}
	conc := `{"limit": {"binds": ["jobs/{id}"], "kind": "LIMIT_KIND_CONCURRENCY", "limit_tokens": "3", "regions": ["eu"], ` +
		`"mode": "MODE_STRICT", "contracts": {"jobs/big": {"limit_tokens": "20"}}}, "reason": "jobs"}`
	mustCode(t, c.do("PUT", "/v1/limits/plans/jobs", nil, conc), 200)
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/limits/plans/free", plan(10, `["tenant/{id}"]`, ""), "limit.binds[0]"},
		{"/v1/limits/plans/free", plan(10, `["tenant/"]`, ""), "limit.binds[0]"},
		{"/v1/limits/tenant/atlas", plan(10, `["a/{id}"]`, ""), "limit.binds"},
	} {
		if got := c.do("PUT", tc.path, nil, tc.body).field(t); got != tc.field {
			t.Errorf("PUT %s %s: names %q, want %q", tc.path, tc.body, got, tc.field)
		}
	}
}
