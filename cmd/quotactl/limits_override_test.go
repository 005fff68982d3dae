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
