package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestBucketPlansCLI: plans set takes --rate and --burst as limits set
// does (the same flags and parsing) and makes a bucket plan; plans get
// and list show its kind, rate and burst; a contract field a bucket
// limit does not have is the allocator's refusal naming the contract's
// field; a dry run counts the tenants with shares and names those over
// the new numbers; a limits file holds a bucket plan with rate: and
// burst:, exported as written.
func TestBucketPlansCLI(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	set := []string{"plans", "set", "free", "--rate", "10/s", "--burst", "50", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--ttl", "10s", "--reason", "every free tenant: 10 a second, bursts of 50"}
	r := q(set...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "plans/free", "kind": "bucket", "rate": "10/s", "burst": "50", "binds": "tenant/{id}", "version": "1"})
	checkKV(t, kv(t, q("plans", "get", "free").want(t, 0).stdout), map[string]string{"kind": "bucket", "rate": "10/s", "burst": "50", "ttl": "10s"})
	r = q("plans", "list").want(t, 0)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.Contains(lines[0], "KIND") ||
		!strings.HasPrefix(lines[1], "free ") || !strings.Contains(lines[1], "bucket") || !strings.Contains(lines[1], "10/s burst 50") {
		t.Fatalf("plans list:\n%s", r.stdout)
	}
	// Contracts: what a bucket limit has is taken (its own rate and
	// burst too); a G is not.
	r = q(append(append([]string{}, set...), "--contract", "tenant/euco=regions=eu", "--contract", "tenant/big=burst=200 rate=40")...).want(t, 0)
	if c := kv(t, r.stdout)["contracts"]; !strings.Contains(c, "tenant/big=rate=40 burst=200") || !strings.Contains(c, "tenant/euco=regions=eu") {
		t.Fatalf("a bucket plan's contracts: %q", c)
	}
	r = q(append(append([]string{}, set...), "--contract", "tenant/atlas=limit=3000")...).want(t, 1)
	if !strings.Contains(r.stderr, "limit.contracts[tenant/atlas].limit_tokens") {
		t.Fatalf("a G in a bucket plan's contract: %q", r.stderr)
	}
	// Usage: --rate without --burst, with --limit.
	q("plans", "set", "free", "--rate", "10/s", "--regions", "eu", "--mode", "strict", "--bind", "tenant/{id}", "--reason", "x").want(t, 2)
	q("plans", "set", "free", "--rate", "10/s", "--burst", "5", "--limit", "5", "--regions", "eu", "--mode", "strict", "--bind", "tenant/{id}", "--reason", "x").want(t, 2)

	// A tenant with shares is counted by a dry run; a lower rate names it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := ta.a.AcquireShares(context.Background(), "eu", []*pb.ShareRequest{{RequestId: "r1", LimitId: "tenant/newco", DemandPerSecond: 20, AdmittedTokens: 0}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Code == pb.ItemCode_ITEM_CODE_OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a share of tenant/newco: %v", res)
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's effect
	}
	res, err := ta.a.AcquireShares(context.Background(), "eu", []*pb.ShareRequest{{RequestId: "r2", LimitId: "tenant/newco", DemandPerSecond: 20, AdmittedTokens: 200}})
	if err != nil || res[0].Code != pb.ItemCode_ITEM_CODE_OK {
		t.Fatalf("a renewal reporting 200 admitted: %v %v", res, err)
	}
	r = q("windows", "tenant/newco").want(t, 0)
	if !strings.Contains(r.stdout, "limit of plan plans/free") || !strings.Contains(r.stdout, "eu=200") {
		t.Fatalf("windows of a tenant of a bucket plan:\n%s", r.stdout)
	}
	if r = q("--json", "windows", "tenant/newco").want(t, 0); !strings.Contains(r.stdout, `"plan": "plans/free"`) {
		t.Fatalf("windows --json of a tenant of a bucket plan:\n%s", r.stdout)
	}
	dry := []string{"plans", "set", "free", "--rate", "2/s", "--burst", "10", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--ttl", "10s", "--contract", "tenant/euco=regions=eu", "--contract", "tenant/big=burst=200 rate=40",
		"--reason", "cheaper", "--dry-run"}
	r = q(dry...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"limit": "plans/free", "tenants": "3 (used the plan in the shares the allocator keeps)",
		"denying": "1: tenant/newco (admitted more in their last minute than the new burst + rate x 1 min)"})
	if !strings.Contains(r.stdout, "rate:         10/s -> 2/s") {
		t.Fatalf("a dry run of a bucket plan's rate:\n%s", r.stdout)
	}

	// A limits file holds a bucket plan.
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("manage: [plans/]\nlimits:\n  - id: plans/free\n    binds: [\"tenant/{id}\"]\n"+
		"    rate: 20/s\n    burst: 60\n    regions: [eu, us]\n    mode: strict\n    lease: {ttl: 10s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "free from the file", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("plans", "get", "free").want(t, 0).stdout), map[string]string{"kind": "bucket", "rate": "20/s", "burst": "60"})
	r = q("limits", "export", "--prefix", "plans/").want(t, 0)
	if !strings.Contains(r.stdout, "rate: 20/s") || !strings.Contains(r.stdout, "burst: 60") || !strings.Contains(r.stdout, "tenant/{id}") {
		t.Fatalf("export of a bucket plan:\n%s", r.stdout)
	}
}

// TestConcurrencyPlansCLI: plans set --concurrency N makes a concurrency
// plan (limits set's flag); plans get and list show its kind and N; a
// contract's limit= is a tenant's own N; a dry run of a lower N says so;
// a limits file holds it with concurrency:.
func TestConcurrencyPlansCLI(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	set := []string{"plans", "set", "jobs", "--concurrency", "3", "--regions", "eu,us", "--mode", "strict",
		"--bind", "jobs/{id}", "--contract", "jobs/big=20", "--reason", "every tenant: 3 jobs at once"}
	r := q(set...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "plans/jobs", "kind": "concurrency", "slots": "3", "version": "1"})
	r = q("plans", "list").want(t, 0)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "concurrency") ||
		!strings.Contains(lines[1], "3 slots") {
		t.Fatalf("plans list:\n%s", r.stdout)
	}
	q("plans", "set", "jobs", "--concurrency", "3", "--limit", "5", "--regions", "eu", "--mode", "strict", "--bind", "jobs/{id}", "--reason", "x").want(t, 2)
	r = q(append(append([]string{}, set[:3]...), append([]string{"--concurrency", "2"}, append(set[5:], "--dry-run")...)...)...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"new-n": "2", "tenants": "1 (used the plan in the shares the allocator keeps)"})
	if !strings.Contains(r.stdout, "kind:           concurrency") {
		t.Fatalf("a dry run of a concurrency plan:\n%s", r.stdout)
	}
	// A tenant's slot shares name its plan.
	for deadline := time.Now().Add(10 * time.Second); ; {
		res, err := ta.a.AcquireShares(context.Background(), "eu", []*pb.ShareRequest{{RequestId: "s1", LimitId: "jobs/newco", DemandPerSecond: 1, HeldSlots: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Code == pb.ItemCode_ITEM_CODE_OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a slot share of jobs/newco: %v", res)
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's effect
	}
	if r = q("windows", "jobs/newco").want(t, 0); !strings.Contains(r.stdout, "limit of plan plans/jobs") || !strings.Contains(r.stdout, "N 3") {
		t.Fatalf("windows of a tenant of a concurrency plan:\n%s", r.stdout)
	}
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("manage: [plans/]\nlimits:\n  - id: plans/jobs\n    binds: [\"jobs/{id}\"]\n"+
		"    concurrency: 5\n    regions: [eu, us]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "jobs from the file", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("plans", "get", "jobs").want(t, 0).stdout), map[string]string{"kind": "concurrency", "slots": "5"})
	if r = q("limits", "export", "--prefix", "plans/").want(t, 0); !strings.Contains(r.stdout, "concurrency: 5") {
		t.Fatalf("export of a concurrency plan:\n%s", r.stdout)
	}
}
