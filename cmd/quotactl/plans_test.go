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

// TestPlansLifecycle: plans set, get and list against a real allocator;
// bad input exits 2 (usage) or 1 naming the field (the allocator's
// refusal); a limits file holds a plan; a tenant with no limit of its
// own reads as unknown until it is checked (nothing is created for it).
func TestPlansLifecycle(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }

	r := q("plans", "set", "pro", "--limit", "1000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--owner", "product", "--reason", "the pro plan").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "plans/pro", "limit": "1000", "binds": "tenant/{id}", "version": "1"})
	checkKV(t, kv(t, q("plans", "get", "pro").want(t, 0).stdout), map[string]string{"id": "plans/pro", "binds": "tenant/{id}"})
	checkKV(t, kv(t, q("plans", "get", "plans/pro").want(t, 0).stdout), map[string]string{"id": "plans/pro"})

	// A second plan cannot bind the same pattern; a shadow plan can bind another.
	r = q("plans", "set", "free", "--limit", "10", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--bind", "tenant/{id}", "--reason", "free").want(t, 1)
	if !strings.Contains(r.stderr, "limit.binds[0]") || !strings.Contains(r.stderr, "plans/pro") {
		t.Fatalf("a pattern bound twice: %q", r.stderr)
	}
	q("plans", "set", "free", "--limit", "10", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--bind", "free/{id}", "--shadow", "--reason", "free, tried first").want(t, 0)
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--reason", "BigCo on Enterprise").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "plans/ent", "binds": "tenant/bigco"})
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--contract", "tenant/bigco=12000", "--reason", "BigCo's contract", "--effective", "now").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"contracts": "tenant/bigco=12000", "version": "2"})
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--contract", "tenant/nobody=5", "--reason", "typo").want(t, 1)
	if !strings.Contains(r.stderr, "limit.contracts[tenant/nobody]") {
		t.Fatalf("a contract for a tenant the plan does not bind: %q", r.stderr)
	}
	q("plans", "set", "ent", "--contract", "tenant/bigco").want(t, 2)
	// A contract replaces any field of the plan: checked as the tenant's
	// limit, shown in the syntax it was given in, diffed in dry runs.
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--contract", "tenant/bigco=limit=12000 mode=bounded fallback=eu=local:50", "--reason", "BigCo may go on locally",
		"--effective", "now").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"contracts": "tenant/bigco=limit=12000 mode=bounded fallback=eu=local:50", "version": "3"})
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--contract", "tenant/bigco=limit=12000 window=5m regions=eu", "--reason", "try", "--dry-run").want(t, 0)
	if !strings.Contains(r.stdout, `contracts.tenant/bigco: "limit=12000 mode=bounded fallback=eu=local:50" -> "limit=12000 regions=eu window=5m ttl=1m15s min-chunk=1 max-chunk=0"`) {
		t.Fatalf("a dry run changing a contract:\n%s", r.stdout)
	}
	r = q("plans", "set", "ent", "--limit", "9000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/bigco", "--contract", "tenant/bigco=fallback=eu=local:50", "--reason", "strict with a local fallback").want(t, 1)
	if !strings.Contains(r.stderr, "limit.contracts[tenant/bigco].fallback[eu]") {
		t.Fatalf("a contract making the tenant's limit invalid: %q", r.stderr)
	}
	r = q("plans", "set", "ent", "--contract", "tenant/bigco=colour=red")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "unknown field") {
		t.Fatalf("a contract with an unknown field: %q", r.stderr)
	}
	// A plan's hash tag is {id} (each tenant's own) or none.
	q("plans", "set", "tagged", "--limit", "10", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--bind", "tagged/{id}", "--hash-tag", "{id}", "--reason", "tagged per tenant").want(t, 0)
	r = q("plans", "set", "tagged2", "--limit", "10", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--bind", "tagged2/{id}", "--hash-tag", "atlas", "--reason", "one tag for all").want(t, 1)
	if !strings.Contains(r.stderr, "limit.hash_tag") {
		t.Fatalf("a plan with a fixed hash tag: %q", r.stderr)
	}
	q("limits", "delete", "plans/tagged", "--reason", "done").want(t, 0)
	// An emergency override of a plan, shown in force, ended by hand.
	r = q("limits", "override", "plans/ent", "--limit", "20000", "--for", "2h", "--reason", "incident 7: Enterprise surge").want(t, 0)
	if got := kv(t, r.stdout); got["limit"] != "20000" || !strings.Contains(got["override"], "(incident 7: Enterprise surge); then limit 9000") ||
		got["contracts"] != "tenant/bigco=limit=12000 mode=bounded fallback=eu=local:50" {
		t.Fatalf("override of a plan:\n%s", r.stdout)
	}
	if !strings.Contains(kv(t, q("plans", "get", "ent").want(t, 0).stdout)["override"], "in force until ") {
		t.Fatalf("plans get shows no override")
	}
	r = q("limits", "override", "plans/ent", "--end", "--reason", "surge over").want(t, 0)
	if got := kv(t, r.stdout); got["limit"] != "9000" || got["override"] != "" {
		t.Fatalf("the override of a plan ended:\n%s", r.stdout)
	}
	r = q("plans", "list").want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "ent ") || !strings.HasPrefix(lines[2], "free ") || !strings.Contains(lines[2], "yes") ||
		!strings.HasPrefix(lines[3], "pro ") || !strings.Contains(lines[3], "tenant/{id}") {
		t.Fatalf("plans list:\n%s", r.stdout)
	}

	// Usage errors: exit 2, one line.
	for _, args := range [][]string{
		{"plans", "set", "a/b", "--limit", "1", "--window", "1m", "--regions", "eu", "--mode", "strict", "--reason", "x"},
		{"plans", "get", "bad name"},
		{"plans", "get"},
		{"plans", "list", "extra"},
		{"plans", "set", "pro", "--rate", "1/s"},
	} {
		q(args...).want(t, 2)
	}
	// The allocator's refusals name the field.
	r = q("plans", "set", "pro", "--limit", "1000", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/", "--reason", "typo").want(t, 1)
	if !strings.Contains(r.stderr, "limit.binds[0]") {
		t.Fatalf("a bad pattern: %q", r.stderr)
	}
	r = q("limits", "set", "tenant/atlas", "--limit", "1", "--window", "1m", "--regions", "eu", "--mode", "strict", "--reason", "x",
		"--bind", "a/{id}")
	if r.code != 2 {
		t.Fatalf("--bind on limits set: exit %d", r.code)
	}

	// A tenant's windows name its plan once it is used.
	var res []*pb.LeaseResult
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) { // the leader learns of the plan through its watch
		var err error
		res, err = ta.a.AcquireLeases(context.Background(), "eu", []*pb.LeaseRequest{{RequestId: "r1", LimitId: "tenant/newco", WantTokens: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Code == pb.ItemCode_ITEM_CODE_OK {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the watch's effect
	}
	if res[0].GetLease().GetTokens() != 10 {
		t.Fatalf("a grant for tenant/newco: %v", res)
	}
	r = q("windows", "tenant/newco").want(t, 0)
	if !strings.Contains(r.stdout, "limit of plan plans/pro") {
		t.Fatalf("windows of tenant/newco:\n%s", r.stdout)
	}
	r = q("--json", "windows", "tenant/newco").want(t, 0)
	if !strings.Contains(r.stdout, `"plan": "plans/pro"`) {
		t.Fatalf("windows --json of tenant/newco:\n%s", r.stdout)
	}

	// A dry run counts the tenants on the plan; nothing is written.
	r = q("plans", "set", "pro", "--limit", "5", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--reason", "try", "--dry-run").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"limit": "plans/pro", "new-g": "5",
		"tenants": "1 (used the plan in the windows the allocator keeps)"})
	checkKV(t, kv(t, q("plans", "get", "pro").want(t, 0).stdout), map[string]string{"limit": "1000", "version": "1"})

	// A limits file holds plans: applied, then exported as it was written.
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("manage: [plans/]\nlimits:\n  - id: plans/pro\n    binds: [\"tenant/{id}\", \"team/{id}\"]\n"+
		"    limit: 3000\n    window: 1m\n    regions: [eu, us]\n    mode: strict\n  - id: plans/free\n    binds: [\"free/{id}\"]\n"+
		"    limit: 10\n    window: 1m\n    regions: [eu]\n    mode: strict\n    shadow: true\n    contracts: {free/big: 100, free/eu: \"regions=eu window=10s\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "plans from the file", "--effective", "now", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("plans", "get", "pro").want(t, 0).stdout), map[string]string{"limit": "3000", "binds": "tenant/{id},team/{id}"})
	// A file changing a plan's binds alone is a change.
	if err := os.WriteFile(file, []byte("limits:\n  - id: plans/pro\n    binds: [\"tenant/{id}\"]\n"+
		"    limit: 3000\n    window: 1m\n    regions: [eu, us]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "teams off pro", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("plans", "get", "pro").want(t, 0).stdout), map[string]string{"binds": "tenant/{id}"})
	r = q("limits", "export", "--prefix", "plans/").want(t, 0)
	if !strings.Contains(r.stdout, "binds: [") || !strings.Contains(r.stdout, "free/{id}") || !strings.Contains(r.stdout, "contracts: {free/big: 100, free/eu: regions=eu window=10s ttl=2.5s min-chunk=1 max-chunk=0}") {
		t.Fatalf("export of plans:\n%s", r.stdout)
	}
}
