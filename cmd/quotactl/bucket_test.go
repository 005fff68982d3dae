package main

import (
	"strings"
	"testing"

	"leasehold/internal/etcdtest"
)

// TestBucketFlags: --rate and --burst describe a bucket limit. Bad values
// exit 2 with one line naming the flag; the allocator checks the rest and
// names the field (a burst above the maximum for the period); and until
// bucket limits are enforced it refuses them, naming limit.kind.
func TestBucketFlags(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	set := func(extra ...string) []string {
		return append([]string{"--allocator", ta.addr, "limits", "set", "--reason", "test", "tenant/b", "--regions", "eu",
			"--mode", "strict"}, extra...)
	}
	for _, tc := range []struct {
		args []string
		code int
		text string
	}{
		{set("--rate", "100/s", "--burst", "200"), 1, ": limit.kind: bucket limits are not enforced"},
		{set("--rate", "100/s", "--burst", "99999999999999"), 1, ": limit.burst_tokens: must be <= 4503599627 for a rate period of 1s"},
		{set("--rate", "0/s", "--burst", "200"), 2, `--rate "0/s"`},
		{set("--rate", "100/d", "--burst", "200"), 2, `--rate "100/d"`},
		{set("--rate", "100", "--burst", "200"), 2, `--rate "100"`},
		{set("--rate", "100/s", "--burst", "0"), 2, `--burst "0"`},
		{set("--rate", "100/s"), 2, "--burst is required"},
		{set("--rate", "100/s", "--burst", "5", "--limit", "5", "--window", "1m"), 2, "instead of --limit and --window"},
		{set("--limit", "5", "--window", "1m", "--burst", "5"), 2, "--burst is for a bucket limit"},
	} {
		t.Run(strings.Join(tc.args[2:], " "), func(t *testing.T) {
			r := quotactl(tc.args...).want(t, tc.code)
			if !strings.Contains(r.stderr, tc.text) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || r.stdout != "" {
				t.Fatalf("stderr %q: want one line saying %q", r.stderr, tc.text)
			}
		})
	}
	// Nothing was written.
	quotactl("--allocator", ta.addr, "limits", "get", "tenant/b").want(t, 1)
}
