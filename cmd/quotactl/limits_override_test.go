package main

import (
	"strings"
	"testing"

	"leasehold/internal/etcdtest"
)

// TestLimitsOverride: an override raises G for a while and shows its end
// and what it returns to; a second override starts from the same base;
// --end gives the base back; bad uses exit 2 with one line.
func TestLimitsOverride(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	q("limits", "set", "--reason", "contract", "tenant/atlas", "--limit", "1000", "--window", "1m", "--regions", "eu,us",
		"--mode", "strict").want(t, 0)

	r := q("limits", "override", "tenant/atlas", "--limit", "3000", "--for", "2h", "--reason", "launch day").want(t, 0)
	got := kv(t, r.stdout)
	if got["limit"] != "3000" || !strings.Contains(got["override"], "(launch day); then limit 1000") || got["version"] != "2" {
		t.Fatalf("override:\n%s", r.stdout)
	}
	r = q("limits", "override", "tenant/atlas", "--shadow", "--for", "30m", "--reason", "false alarms").want(t, 0)
	got = kv(t, r.stdout)
	if got["limit"] != "1000" || !strings.HasPrefix(got["shadow"], "yes") || !strings.Contains(got["override"], "then limit 1000") {
		t.Fatalf("second override, from the base:\n%s", r.stdout)
	}
	r = q("limits", "get", "tenant/atlas").want(t, 0)
	if !strings.Contains(kv(t, r.stdout)["override"], "in force until ") {
		t.Fatalf("get shows no override:\n%s", r.stdout)
	}
	r = q("limits", "override", "tenant/atlas", "--end", "--reason", "over").want(t, 0)
	got = kv(t, r.stdout)
	if got["limit"] != "1000" || got["override"] != "" || got["shadow"] != "" {
		t.Fatalf("--end:\n%s", r.stdout)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--limit", "5", "--reason", "r"}, "--for is required"},
		{[]string{"--for", "1h", "--reason", "r"}, "say what the override changes"},
		{[]string{"--limit", "5", "--for", "1h", "--end", "--reason", "r"}, "--end takes no"},
		{[]string{"--shadow", "--enforce", "--for", "1h", "--reason", "r"}, "one or the other"},
		{[]string{"--limit", "5", "--for", "800h", "--reason", "r"}, "--for: want 1s to"},
		{[]string{"--end", "--reason", "r"}, "has no override in force"},
	} {
		r := q(append([]string{"limits", "override", "tenant/atlas"}, c.args...)...).want(t, 2)
		if !strings.Contains(r.stderr, c.msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("%v: stderr %q, want one line with %q", c.args, r.stderr, c.msg)
		}
	}
}

// TestLimitsOverrideShares: a bucket limit's R and B and a concurrency
// limit's N are overridden for a while, shown with what they return to;
// flags of another kind exit 2 with one line; what the allocator refuses
// (another rate period) exits 1 naming the field.
func TestLimitsOverrideShares(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	q("limits", "set", "--reason", "contract", "b/api", "--rate", "100/s", "--burst", "200", "--regions", "eu,us",
		"--mode", "strict").want(t, 0)
	q("limits", "set", "--reason", "contract", "c/exports", "--concurrency", "2", "--regions", "eu,us",
		"--mode", "strict").want(t, 0)

	r := q("limits", "override", "b/api", "--rate", "300/s", "--for", "2h", "--reason", "launch day", "--dry-run").want(t, 0)
	if !strings.Contains(r.stdout, "100/s -> 300/s") || !strings.Contains(r.stdout, "override: (none) -> ") || !strings.Contains(r.stdout, "nothing was written") {
		t.Fatalf("dry run of an override of R:\n%s", r.stdout)
	}
	r = q("limits", "override", "b/api", "--rate", "300/s", "--for", "2h", "--reason", "launch day").want(t, 0)
	got := kv(t, r.stdout)
	if got["rate"] != "300/s" || got["burst"] != "200" || !strings.Contains(got["override"], "(launch day); then rate 100/s burst 200") || got["version"] != "2" {
		t.Fatalf("override of R:\n%s", r.stdout)
	}
	r = q("limits", "override", "b/api", "--burst", "50", "--for", "30m", "--reason", "cut the burst").want(t, 0)
	got = kv(t, r.stdout)
	if got["rate"] != "100/s" || got["burst"] != "50" || !strings.Contains(got["override"], "then rate 100/s burst 200") {
		t.Fatalf("second override, from the base:\n%s", r.stdout)
	}
	r = q("limits", "get", "b/api").want(t, 0)
	if !strings.Contains(kv(t, r.stdout)["override"], "in force until ") {
		t.Fatalf("get shows no override:\n%s", r.stdout)
	}
	r = q("limits", "override", "b/api", "--rate", "5/m", "--for", "1h", "--reason", "r").want(t, 1)
	if !strings.Contains(r.stderr, "limit.rate_period") {
		t.Fatalf("another rate period: stderr %q, want limit.rate_period", r.stderr)
	}
	r = q("limits", "override", "b/api", "--end", "--reason", "over").want(t, 0)
	if got = kv(t, r.stdout); got["rate"] != "100/s" || got["burst"] != "200" || got["override"] != "" {
		t.Fatalf("--end:\n%s", r.stdout)
	}

	r = q("limits", "override", "c/exports", "--concurrency", "6", "--for", "2h", "--reason", "backlog").want(t, 0)
	got = kv(t, r.stdout)
	if got["slots"] != "6" || !strings.Contains(got["override"], "(backlog); then slots 2") {
		t.Fatalf("override of N:\n%s", r.stdout)
	}

	// A bucket plan: overridden as a limit, shown by plans get.
	q("plans", "set", "free", "--rate", "10/s", "--burst", "50", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--contract", "tenant/atlas=rate=100 burst=300", "--reason", "free").want(t, 0)
	q("limits", "override", "plans/free", "--rate", "50/s", "--for", "2h", "--reason", "free tier launch").want(t, 0)
	r = q("plans", "get", "free").want(t, 0)
	got = kv(t, r.stdout)
	if got["rate"] != "50/s" || !strings.Contains(got["override"], "(free tier launch); then rate 10/s burst 50") ||
		!strings.Contains(got["contracts"], "tenant/atlas=") {
		t.Fatalf("plans get under the override:\n%s", r.stdout)
	}

	q("plans", "set", "jobs", "--concurrency", "3", "--regions", "eu,us", "--mode", "strict",
		"--bind", "jobs/{id}", "--reason", "jobs").want(t, 0)
	q("limits", "override", "plans/jobs", "--concurrency", "8", "--for", "1h", "--reason", "backlog").want(t, 0)
	if got = kv(t, q("plans", "get", "jobs").want(t, 0).stdout); got["slots"] != "8" || !strings.Contains(got["override"], "(backlog); then slots 3") {
		t.Fatalf("plans get of a concurrency plan under the override:\n%v", got)
	}

	for _, c := range []struct {
		id   string
		args []string
		msg  string
	}{
		{"b/api", []string{"--limit", "5", "--for", "1h", "--reason", "r"}, "--limit: b/api is a bucket limit: override --rate and --burst"},
		{"b/api", []string{"--concurrency", "5", "--for", "1h", "--reason", "r"}, "--concurrency: b/api is a bucket limit"},
		{"c/exports", []string{"--rate", "5/s", "--for", "1h", "--reason", "r"}, "--rate: c/exports is a concurrency limit: override --concurrency"},
		{"c/exports", []string{"--limit", "5", "--for", "1h", "--reason", "r"}, "--limit: c/exports is a concurrency limit"},
		{"b/api", []string{"--rate", "5", "--for", "1h", "--reason", "r"}, "--rate"},
		{"b/api", []string{"--rate", "5/s", "--reason", "r"}, "--for is required"},
	} {
		r := q(append([]string{"limits", "override", c.id}, c.args...)...).want(t, 2)
		if !strings.Contains(r.stderr, c.msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("%s %v: stderr %q, want one line with %q", c.id, c.args, r.stderr, c.msg)
		}
	}
}

// TestLimitsOverrideModeFallbackTTL: --mode, --fallback and --ttl change
// the mode, the named regions' fallbacks (the others keep theirs) and the
// lease ttl for a while, of a window limit, a bucket limit and a plan;
// the end returns to the version before; bad values exit 2 with one line
// naming the flag, what the allocator refuses exits 1 naming the field.
func TestLimitsOverrideModeFallbackTTL(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	q("limits", "set", "--reason", "contract", "tenant/atlas", "--limit", "1000", "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--fallback", "us=local:10", "--ttl", "10s").want(t, 0)

	r := q("limits", "override", "tenant/atlas", "--fallback", "eu=local:50", "--ttl", "5s",
		"--for", "2h", "--reason", "etcd maintenance").want(t, 0)
	got := kv(t, r.stdout)
	if got["mode"] != "bounded" || got["fallback"] != "eu=local:50,us=local:10" || got["ttl"] != "5s" || got["limit"] != "1000" ||
		!strings.Contains(got["override"], "(etcd maintenance); then limit 1000") {
		t.Fatalf("override of fallback and ttl:\n%s", r.stdout)
	}
	r = q("limits", "get", "tenant/atlas").want(t, 0)
	if got = kv(t, r.stdout); got["fallback"] != "eu=local:50,us=local:10" || got["ttl"] != "5s" {
		t.Fatalf("get under the override:\n%s", r.stdout)
	}
	// An override of the override starts from the version before both.
	r = q("limits", "override", "tenant/atlas", "--mode", "strict", "--fallback", "us=closed", "--for", "1h", "--reason", "tighten").want(t, 0)
	if got = kv(t, r.stdout); got["mode"] != "strict" || got["fallback"] != "eu=closed,us=closed" || got["ttl"] != "10s" {
		t.Fatalf("override of the mode:\n%s", r.stdout)
	}
	r = q("limits", "override", "tenant/atlas", "--end", "--reason", "done").want(t, 0)
	if got = kv(t, r.stdout); got["mode"] != "bounded" || got["fallback"] != "eu=closed,us=local:10" || got["ttl"] != "10s" || got["override"] != "" {
		t.Fatalf("--end returns to the version before:\n%s", r.stdout)
	}

	// A bucket limit: its share ttl and mode (a fallback other than
	// closed is refused, as by limits set).
	q("limits", "set", "--reason", "contract", "b/api", "--rate", "100/s", "--burst", "200", "--regions", "eu,us",
		"--mode", "strict").want(t, 0)
	r = q("limits", "override", "b/api", "--ttl", "4s", "--mode", "bounded", "--for", "1h", "--reason", "r").want(t, 0)
	if got := kv(t, r.stdout); got["ttl"] != "4s" || got["rate"] != "100/s" || got["mode"] != "bounded" {
		t.Fatalf("override of a bucket limit's ttl and mode:\n%s", r.stdout)
	}
	if r = q("limits", "override", "b/api", "--fallback", "us=open", "--for", "1h", "--reason", "r").want(t, 1); !strings.Contains(r.stderr, "limit.fallback[us]") {
		t.Fatalf("a bucket limit's fallback open: stderr %q", r.stderr)
	}

	// A plan: every tenant on it.
	q("plans", "set", "pro", "--limit", "100", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--reason", "pro").want(t, 0)
	q("limits", "override", "plans/pro", "--mode", "bounded", "--fallback", "eu=local:5", "--for", "1h", "--reason", "incident").want(t, 0)
	if got := kv(t, q("plans", "get", "pro").want(t, 0).stdout); got["mode"] != "bounded" || !strings.Contains(got["fallback"], "eu=local:5") ||
		!strings.Contains(got["override"], "(incident); then limit 100") {
		t.Fatalf("plans get under the override:\n%v", got)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--mode", "lax", "--for", "1h", "--reason", "r"}, `--mode "lax": want strict or bounded`},
		{[]string{"--fallback", "eu", "--for", "1h", "--reason", "r"}, `--fallback "eu"`},
		{[]string{"--fallback", "eu=local:x", "--for", "1h", "--reason", "r"}, `--fallback "eu=local:x"`},
		{[]string{"--ttl", "soon", "--for", "1h", "--reason", "r"}, `--ttl "soon"`},
		{[]string{"--ttl", "0s", "--for", "1h", "--reason", "r"}, "--ttl: want a lease ttl above 0"},
		{[]string{"--mode", "bounded", "--reason", "r"}, "--for is required"},
		{[]string{"--end", "--mode", "bounded", "--reason", "r"}, "--end takes no"},
	} {
		r := q(append([]string{"limits", "override", "tenant/atlas"}, c.args...)...).want(t, 2)
		if !strings.Contains(r.stderr, c.msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("%v: stderr %q, want one line with %q", c.args, r.stderr, c.msg)
		}
	}
	// What only the allocator knows: a ttl above the window, a region the
	// limit does not have.
	for _, c := range []struct {
		args  []string
		field string
	}{
		{[]string{"--ttl", "2m"}, "lease.ttl"},
		{[]string{"--mode", "strict"}, "limit.fallback[us]"},
		{[]string{"--fallback", "ap=open"}, "fallback"},
	} {
		r := q(append([]string{"limits", "override", "tenant/atlas", "--for", "1h", "--reason", "r"}, c.args...)...).want(t, 1)
		if !strings.Contains(r.stderr, c.field) {
			t.Errorf("%v: stderr %q, want the field %s", c.args, r.stderr, c.field)
		}
	}
}
