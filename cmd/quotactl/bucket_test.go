package main

import (
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestBucketFlags: --rate and --burst describe a bucket limit. Bad values
// exit 2 with one line naming the flag; the allocator checks the rest and
// names the field (a burst above the maximum for the period, settings the
// agent does not apply to bucket limits).
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
		{set("--rate", "100/s", "--burst", "200", "--min-chunk", "5"), 1, ": limit.lease.min_chunk: bucket limits are granted as rate shares"},
		{set("--rate", "100/s", "--burst", "200", "--ttl", "100ms"), 1, ": limit.lease.ttl: a bucket limit's share ttl must be"},
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

// TestBucketLimitShown: a bucket limit is shown, exported and compared by
// its rate and burst (limits get, limits export, plans), not by a window.
func TestBucketLimitShown(t *testing.T) {
	l := &pb.Limit{Id: "backend/search", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 100, RatePeriod: durationpb.New(time.Second),
		BurstTokens: 200, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{}, Version: 3}
	var out strings.Builder
	e := &env{stdout: &out}
	if err := e.printLimit(l); err != nil {
		t.Fatal(err)
	}
	got := kv(t, out.String())
	for k, want := range map[string]string{"kind": "bucket", "rate": "100/s", "burst": "200", "regions": "eu,us"} {
		if got[k] != want {
			t.Errorf("limits get: %s = %q, want %q\n%s", k, got[k], want, out.String())
		}
	}
	if _, ok := got["window"]; ok {
		t.Errorf("limits get shows a window for a bucket limit:\n%s", out.String())
	}
	b, err := yaml.Marshal(limitNode(l))
	if err != nil {
		t.Fatal(err)
	}
	if y := string(b); !strings.Contains(y, "rate: 100/s") || !strings.Contains(y, "burst: 200") || strings.Contains(y, "window:") {
		t.Errorf("export:\n%s", y)
	}
	l2 := proto.Clone(l).(*pb.Limit)
	l2.RatePeriod, l2.BurstTokens = durationpb.New(time.Minute), 300
	d := diffLimits(l, l2)
	if len(d) != 2 || d[0] != (fieldDiff{"rate", "100/s", "100/m"}) || d[1] != (fieldDiff{"burst", "200", "300"}) {
		t.Errorf("plan diff: %+v", d)
	}
}

// TestBucketLimitLifecycle: on a real allocator, quotactl creates a bucket
// limit, shows it (limits get, windows: the running interval, no share
// yet), changes it at once (no window to wait for; next-window refused
// naming effective), refuses to turn it into a window limit (naming
// limit.kind) and deletes it.
func TestBucketLimitLifecycle(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(code int, args ...string) result {
		t.Helper()
		return quotactl(append([]string{"--allocator", ta.addr}, args...)...).want(t, code)
	}
	q(0, "limits", "set", "--reason", "test", "backend/search", "--regions", "eu", "--mode", "strict", "--rate", "100/s", "--burst", "200")
	// The leader applies a limit when its watch brings it (windows asks
	// the leader's core).
	for deadline := time.Now().Add(10 * time.Second); ; {
		var ok bool
		_ = ta.a.View(func(_ time.Time, c *allocator.Core) { _, ok = c.Limit("backend/search") })
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the limit never reached the leader")
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	got := kv(t, q(0, "limits", "get", "backend/search").stdout)
	for k, want := range map[string]string{"kind": "bucket", "rate": "100/s", "burst": "200", "ttl": "10s", "version": "1"} {
		if got[k] != want {
			t.Errorf("limits get: %s = %q, want %q (%v)", k, got[k], want, got)
		}
	}
	r := q(0, "windows", "backend/search")
	if !strings.Contains(r.stdout, "INTERVAL_START") || !strings.Contains(r.stdout, "100/s  200") ||
		!strings.Contains(r.stdout, "Z*") || !strings.Contains(r.stdout, "shares in force:") {
		t.Errorf("windows:\n%s", r.stdout)
	}

	// A dry run names the change and no window, pool or window bound.
	r = q(0, "limits", "set", "--reason", "test", "backend/search", "--regions", "eu", "--mode", "strict", "--rate", "150/s", "--burst", "200", "--dry-run")
	if !strings.Contains(r.stdout, "rate: 100/s -> 150/s") || !strings.Contains(r.stdout, "kind:           bucket") ||
		strings.Contains(r.stdout, "window:") || strings.Contains(r.stdout, "new-g") || strings.Contains(r.stdout, "bound") {
		t.Errorf("dry run:\n%s", r.stdout)
	}
	// A change governs at once, with or without --effective now.
	q(0, "limits", "set", "--reason", "test", "backend/search", "--regions", "eu", "--mode", "strict", "--rate", "200/s", "--burst", "200")
	if got := kv(t, q(0, "limits", "get", "backend/search").stdout); got["rate"] != "200/s" || got["version"] != "2" {
		t.Errorf("after the change: %v", got)
	}
	r = q(1, "limits", "set", "--reason", "test", "backend/search", "--regions", "eu", "--mode", "strict", "--rate", "300/s", "--burst", "200",
		"--effective", "next-window")
	if !strings.Contains(r.stderr, "effective: a bucket limit has no windows") {
		t.Errorf("next-window: %q", r.stderr)
	}
	r = q(1, "limits", "set", "--reason", "test", "backend/search", "--regions", "eu", "--mode", "strict", "--limit", "100", "--window", "1m")
	if !strings.Contains(r.stderr, "limit.kind: the kind of an existing limit cannot change (bucket -> window)") {
		t.Errorf("kind change: %q", r.stderr)
	}
	q(0, "limits", "delete", "--reason", "test", "backend/search")
	q(1, "limits", "get", "backend/search")
}
