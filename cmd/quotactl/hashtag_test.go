package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"leasehold/internal/etcdtest"
)

// TestHashTag: --hash-tag sets a limit's Redis hash tag, get and export
// show it, and changing it (by set or by a limits file) is refused with a
// message naming the field and saying what to do.
func TestHashTag(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	set := []string{"limits", "set", "--reason", "test", "tenant/atlas/api", "--limit", "100", "--window", "1m",
		"--regions", "eu", "--mode", "strict"}

	r := q(append(set, "--hash-tag", "atlas")...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "tenant/atlas/api", "hash-tag": "atlas", "version": "1"})
	checkKV(t, kv(t, q("limits", "get", "tenant/atlas/api").want(t, 0).stdout), map[string]string{"hash-tag": "atlas"})
	if out := q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout; !strings.Contains(out, "    hash_tag: atlas\n") {
		t.Fatalf("export lacks the hash tag:\n%s", out)
	}

	r = q(append(set, "--hash-tag", "other")...).want(t, 1)
	if !strings.Contains(r.stderr, "limit.hash_tag") || !strings.Contains(r.stderr, "delete the limit and create it again") {
		t.Fatalf("changing the tag: %q", r.stderr)
	}
	r = q(append(set, "--hash-tag", "{x}")...).want(t, 1)
	if !strings.Contains(r.stderr, "limit.hash_tag") {
		t.Fatalf("a tag with braces: %q", r.stderr)
	}

	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("limits:\n  - id: tenant/atlas/api\n    limit: 100\n    window: 1m\n"+
		"    regions: [eu]\n    mode: strict\n    hash_tag: moved\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = q("limits", "apply", "--reason", "test", "-f", file)
	if r.code == 0 || !strings.Contains(r.stderr, "hash_tag") {
		t.Fatalf("a file moving the tag: exit %d, stderr %q", r.code, r.stderr)
	}
	checkKV(t, kv(t, q("limits", "get", "tenant/atlas/api").want(t, 0).stdout), map[string]string{"hash-tag": "atlas", "version": "1"})
}
