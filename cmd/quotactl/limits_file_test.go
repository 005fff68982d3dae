package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"leasehold/allocator"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// q runs quotactl against ta.
func (ta *testAllocator) q(args ...string) result {
	return quotactl(append([]string{"--allocator", ta.addr}, args...)...)
}

// set creates or replaces a limit in regions eu,us with a reason.
func (ta *testAllocator) set(t *testing.T, id string, g int, extra ...string) {
	t.Helper()
	args := append([]string{"limits", "set", id, "--limit", fmt.Sprint(g), "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--reason", "setup"}, extra...)
	ta.q(args...).want(t, 0)
}

// version reads a limit's version and G; version 0 when it does not exist.
// waitApplied waits until the leader's state has the limit at version (it
// learns limits from its etcd watch, just after the write returns).
func (ta *testAllocator) waitApplied(t *testing.T, id string, version int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var ok bool
		_ = ta.a.View(func(_ time.Time, c *allocator.Core) {
			l, found := c.Limit(id)
			ok = found && l.Version == version
		})
		if ok {
			return
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	t.Fatalf("the leader never applied %s version %d", id, version)
}

func (ta *testAllocator) version(t *testing.T, id string) (version, g int64) {
	t.Helper()
	r := ta.q("--json", "limits", "get", id)
	if r.code != 0 {
		if strings.Contains(r.stderr, "not found") {
			return 0, 0
		}
		t.Fatalf("get %s: %s", id, r.stderr)
	}
	l := &pb.Limit{}
	if err := protojson.Unmarshal([]byte(r.stdout), l); err != nil {
		t.Fatal(err)
	}
	return l.Version, l.LimitTokens
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// dropBlock removes limit id's block from an exported file.
func dropBlock(t *testing.T, file, id string) string {
	t.Helper()
	start := strings.Index(file, "  - id: "+id+"\n")
	if start < 0 {
		t.Fatalf("no block for %s in:\n%s", id, file)
	}
	end := strings.Index(file[start+1:], "\n  - id: ")
	if end < 0 {
		return file[:start]
	}
	return file[:start] + file[start+1+end+1:]
}

// TestPlanApplyRoundTrip: export -> plan shows no change -> edit -> plan
// shows the diff (and writes nothing) -> apply -> export equals the edit,
// and the limits outside the file's scope are untouched.
func TestPlanApplyRoundTrip(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ta.set(t, "tenant/atlas", 1000, "--fallback", "us=local:100", "--owner", "finance", "--tag", "plan=gold")
	ta.set(t, "tenant/beta", 50)
	ta.set(t, "other/x", 10)
	dir := t.TempDir()

	exported := ta.q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout
	for _, want := range []string{"manage: [tenant/]\n", "  - id: tenant/atlas\n", "  - id: tenant/beta\n",
		`    fallback: {eu: closed, us: "local:100"}` + "\n", "    tags: {plan: gold}\n"} {
		if !strings.Contains(exported, want) {
			t.Fatalf("export lacks %q:\n%s", want, exported)
		}
	}
	if strings.Contains(exported, "other/x") {
		t.Fatalf("export --prefix tenant/ wrote other/x:\n%s", exported)
	}
	orig := writeFile(t, dir, "limits.yaml", exported)
	r := ta.q("limits", "plan", "-f", orig).want(t, 0)
	if !strings.Contains(r.stdout, "No changes: the live limits match the file (2 unchanged).") {
		t.Fatalf("plan of the export:\n%s", r.stdout)
	}

	// The edit: raise atlas, drop beta, add gamma (written as export
	// writes it, so the export after apply can be compared byte for byte).
	edited := strings.Replace(exported, "    limit: 1000\n", "    limit: 1500\n", 1)
	edited = dropBlock(t, edited, "tenant/beta")
	edited += "  - id: tenant/gamma\n    limit: 5\n    window: 1s\n    regions: [eu]\n    mode: strict\n" +
		"    fallback: {eu: closed}\n    lease: {ttl: 250ms, min_chunk: 1, max_chunk: 0}\n"
	editPath := writeFile(t, dir, "limits.yaml", edited)
	planPath := filepath.Join(dir, "plan.json")
	before := ta.gate.served.Load()
	r = ta.q("limits", "plan", "-f", editPath, "-o", planPath).want(t, 0)
	for _, want := range []string{
		"~ update tenant/atlas (version 1)\n    limit: 1000 -> 1500\n",
		"- delete tenant/beta (version 1)\n",
		"+ create tenant/gamma\n",
		"1 to create, 1 to update, 1 to delete, 0 unchanged.\n",
		"quotactl limits apply --plan " + planPath,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("plan lacks %q:\n%s", want, r.stdout)
		}
	}
	if n := ta.gate.served.Load() - before; n != 1 {
		t.Errorf("plan made %d requests, want 1 (one list)", n)
	}
	if v, g := ta.version(t, "tenant/atlas"); v != 1 || g != 1000 {
		t.Fatalf("plan wrote: atlas at version %d, G %d", v, g)
	}
	if v, _ := ta.version(t, "tenant/beta"); v != 1 {
		t.Fatalf("plan wrote: beta at version %d", v)
	}

	// --json plan is the plan file's content.
	r = ta.q("--json", "limits", "plan", "-f", editPath).want(t, 0)
	var pj struct {
		Changes []struct{ Action, ID string } `json:"changes"`
		Live    map[string]int64              `json:"live"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &pj); err != nil || len(pj.Changes) != 3 || pj.Live["tenant/beta"] != 1 {
		t.Fatalf("plan --json: %v\n%s", err, r.stdout)
	}

	r = ta.q("limits", "apply", "--plan", planPath, "-f", editPath, "--reason", "Q3 contract review", "--effective", "now").want(t, 0)
	for _, want := range []string{"updated tenant/atlas: version 2", "deleted tenant/beta\n", "created tenant/gamma: version 1",
		"Applied: 1 created, 1 updated, 1 deleted"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("apply lacks %q:\n%s", want, r.stdout)
		}
	}
	after := ta.q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout
	if after != edited {
		t.Fatalf("export after apply differs from the edit:\n--- export\n%s\n--- edit\n%s", after, edited)
	}
	if v, _ := ta.version(t, "other/x"); v != 1 {
		t.Fatalf("other/x (out of scope) at version %d", v)
	}
	r = ta.q("limits", "plan", "-f", editPath).want(t, 0)
	if !strings.Contains(r.stdout, "No changes") {
		t.Fatalf("plan after apply:\n%s", r.stdout)
	}
	// Applying the same plan again is refused: the live state moved.
	r = ta.q("limits", "apply", "--plan", planPath, "--reason", "again").want(t, 1)
	if !strings.Contains(r.stderr, "moved since the plan") || !strings.Contains(r.stderr, "nothing was applied") {
		t.Fatalf("second apply: %s", r.stderr)
	}

	// One step: apply -f plans, prints the plan and applies it; applying
	// the same file again changes nothing.
	oneStep := strings.Replace(edited, "    limit: 5\n", "    limit: 7\n", 1)
	if oneStep == edited {
		t.Fatal("the edit has no \"limit: 5\" line to change")
	}
	oneStepPath := filepath.Join(t.TempDir(), "one-step.yaml")
	if err := os.WriteFile(oneStepPath, []byte(oneStep), 0o600); err != nil {
		t.Fatal(err)
	}
	r = ta.q("limits", "apply", "-f", oneStepPath, "--reason", "one step").want(t, 0)
	if !strings.Contains(r.stdout, "Applied: 0 created, 1 updated, 0 deleted") {
		t.Fatalf("one-step apply:\n%s", r.stdout)
	}
	if got := ta.q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout; got != oneStep {
		t.Fatalf("export after the one-step apply:\n%s\nwant\n%s", got, oneStep)
	}
	r = ta.q("limits", "apply", "-f", oneStepPath, "--reason", "one step again").want(t, 0)
	if !strings.Contains(r.stdout, "No changes") {
		t.Fatalf("second one-step apply:\n%s", r.stdout)
	}
	// Put the edit back for the history checks below.
	ta.q("limits", "apply", "-f", editPath, "--reason", "back to the edit").want(t, 0)

	// History shows the change with its reason and the field it changed.
	r = ta.q("limits", "history", "tenant/atlas").want(t, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "VERSION") {
		t.Fatalf("history:\n%s", r.stdout)
	}
	if !strings.HasPrefix(lines[1], "1 ") || !strings.Contains(lines[1], "setup") || !strings.Contains(lines[1], "created") {
		t.Errorf("history row 1: %q", lines[1])
	}
	if !strings.HasPrefix(lines[2], "2 ") || !strings.Contains(lines[2], "Q3 contract review") ||
		!strings.Contains(lines[2], "limit 1000->1500") || !strings.Contains(lines[2], "anonymous") {
		t.Errorf("history row 2: %q", lines[2])
	}
	r = ta.q("--json", "limits", "history", "tenant/beta").want(t, 0)
	var evs []json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &evs); err != nil || len(evs) != 2 {
		t.Fatalf("history --json of the deleted beta: %v\n%s", err, r.stdout)
	}
	last := &pb.AuditEvent{}
	if err := protojson.Unmarshal(evs[1], last); err != nil || last.Reason != "Q3 contract review" || last.OldVersion != 1 {
		t.Fatalf("beta's last event %v: %v", last, err)
	}
}

// TestApplyRefusedWhenLiveMoved: another writer changes a limit between
// plan and apply: apply writes nothing from the file and says what moved.
func TestApplyRefusedWhenLiveMoved(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ta.set(t, "tenant/a", 100)
	ta.set(t, "tenant/b", 200)
	dir := t.TempDir()
	exported := ta.q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout
	edited := strings.Replace(exported, "    limit: 100\n", "    limit: 150\n", 1)
	edited += "  - id: tenant/c\n    limit: 5\n    window: 1m\n    regions: [eu]\n    mode: strict\n"
	file := writeFile(t, dir, "limits.yaml", edited)
	planPath := filepath.Join(dir, "plan.json")

	for _, tc := range []struct {
		name  string
		other func()
		want  string
	}{
		// The other writer changes a limit the plan leaves as it is...
		{"unchanged limit moved", func() { ta.set(t, "tenant/b", 201) }, "tenant/b is at version 2, the plan saw 1"},
		// ...the limit the plan updates...
		{"updated limit moved", func() { ta.set(t, "tenant/a", 99) }, "tenant/a is at version 2, the plan saw 1"},
		// ...or creates a limit in the file's scope.
		{"limit created in scope", func() { ta.set(t, "tenant/z", 1) }, "tenant/z was created (version 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta.q("limits", "plan", "-f", file, "-o", planPath).want(t, 0)
			tc.other()
			va, ga := ta.version(t, "tenant/a")
			r := ta.q("limits", "apply", "--plan", planPath, "--reason", "raise a").want(t, 1)
			if !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "nothing was applied") {
				t.Fatalf("apply: %s; want %q", r.stderr, tc.want)
			}
			if v, g := ta.version(t, "tenant/a"); v != va || g != ga {
				t.Errorf("tenant/a written: version %d G %d, was %d %d", v, g, va, ga)
			}
			if v, _ := ta.version(t, "tenant/c"); v != 0 {
				t.Errorf("tenant/c created at version %d", v)
			}
			ta.q("limits", "delete", "tenant/z", "--reason", "cleanup") // exit 1 unless the case created it
		})
	}

	// The file changed since the plan: refused, nothing written.
	ta.q("limits", "plan", "-f", file, "-o", planPath).want(t, 0)
	writeFile(t, dir, "limits.yaml", edited+"  - id: tenant/d\n    limit: 5\n    window: 1m\n    regions: [eu]\n    mode: strict\n")
	r := ta.q("limits", "apply", "--plan", planPath, "-f", file, "--reason", "r").want(t, 1)
	if !strings.Contains(r.stderr, "changed since the plan") {
		t.Fatalf("apply of a changed file: %s", r.stderr)
	}

	// The allocator is the last guard: the plan's request, sent after
	// another writer moved one of its limits, changes nothing (all or
	// nothing, by expected versions), even past quotactl's own check.
	data, err := os.ReadFile(planPath)
	if err != nil {
		t.Fatal(err)
	}
	p, err := unmarshalPlan(data)
	if err != nil {
		t.Fatal(err)
	}
	ta.set(t, "tenant/a", 98)
	conn, err := grpc.NewClient(ta.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pb.NewAdminClient(conn).ApplyLimits(ctx, p.request("raise a", pb.Effective_EFFECTIVE_NOW, false)); err == nil {
		t.Fatal("ApplyLimits with a stale expected version succeeded")
	}
	if v, _ := ta.version(t, "tenant/c"); v != 0 {
		t.Fatalf("tenant/c created by a refused apply (version %d)", v)
	}
}

// TestInvalidFileChangesNothing: a file with one invalid limit is refused
// before any request, naming the file, the line and the limit; a limit the
// allocator refuses (an unknown region) fails the whole apply.
func TestInvalidFileChangesNothing(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ta.set(t, "tenant/a", 100)
	dir := t.TempDir()
	good := "  - {id: tenant/a, limit: 300, window: 1m, regions: [eu, us], mode: bounded}\n" +
		"  - {id: tenant/b, limit: 10, window: 1m, regions: [eu], mode: strict}\n"
	for _, tc := range []struct{ name, limits, want string }{
		{"invalid value", good + "  - id: tenant/c\n    limit: 10\n    window: 1m\n    regions: [eu]\n    mode: strict\n    lease:\n      ttl: 2m\n",
			"bad.yaml:11: tenant/c: lease.ttl: must be <= the window (1m0s), got 2m0s"},
		{"unknown key", good + "  - id: tenant/c\n    limit: 10\n    windw: 1m\n",
			`bad.yaml:7: limits[2]: unknown key "windw"`},
		{"bad fallback", good + "  - {id: tenant/c, limit: 10, window: 1m, regions: [eu], mode: bounded, fallback: {eu: loose}}\n",
			`bad.yaml:5: tenant/c: fallback.eu: "loose": want closed, open or local:A`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, dir, "bad.yaml", "manage: [tenant/]\nlimits:\n"+tc.limits)
			before := ta.gate.served.Load()
			r := ta.q("limits", "plan", "-f", file).want(t, 2)
			if want := "quotactl: limits plan: " + filepath.Join(dir, tc.want); !strings.HasPrefix(r.stderr, want) {
				t.Errorf("stderr %q\nwant   %q", r.stderr, want)
			}
			ta.q("limits", "apply", "--plan", filepath.Join(dir, "none.json"), "-f", file, "--reason", "r").want(t, 2)
			if n := ta.gate.served.Load() - before; n != 0 {
				t.Errorf("%d requests sent for an invalid file", n)
			}
		})
	}
	if v, g := ta.version(t, "tenant/a"); v != 1 || g != 100 {
		t.Fatalf("tenant/a at version %d G %d", v, g)
	}

	// Valid as a file, refused by the allocator: "mars" is not one of its
	// regions. The apply fails whole: tenant/a keeps its G, tenant/b is
	// not created.
	file := writeFile(t, dir, "mars.yaml", "manage: [tenant/]\nlimits:\n"+good+
		"  - {id: tenant/m, limit: 10, window: 1m, regions: [mars], mode: strict}\n")
	planPath := filepath.Join(dir, "plan.json")
	ta.q("limits", "plan", "-f", file, "-o", planPath).want(t, 0)
	r := ta.q("limits", "apply", "--plan", planPath, "--reason", "r").want(t, 1)
	if !strings.Contains(r.stderr, "nothing was applied") || !strings.Contains(r.stderr, "mars") {
		t.Fatalf("apply with an unknown region: %s", r.stderr)
	}
	if v, g := ta.version(t, "tenant/a"); v != 1 || g != 100 {
		t.Fatalf("tenant/a at version %d G %d after a refused apply", v, g)
	}
	if v, _ := ta.version(t, "tenant/b"); v != 0 {
		t.Fatalf("tenant/b created by a refused apply")
	}
}

// TestDryRun: --dry-run on set, delete and apply prints the effect and
// writes nothing; a dry run against a window with grants shows its usage
// against the new G.
func TestDryRun(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ta.set(t, "tenant/atlas", 1000, "--fallback", "us=local:100")
	ta.waitApplied(t, "tenant/atlas", 1)

	// Spend some of the current window: eu takes 700 tokens.
	conn, err := grpc.NewClient(ta.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := pb.NewAllocatorClient(conn).AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu",
		Requests: []*pb.LeaseRequest{{RequestId: "dry-1", LimitId: "tenant/atlas", WantTokens: 700, DemandPerSecond: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	granted := resp.GetResults()[0].GetLease().GetTokens()
	if granted <= 0 {
		t.Fatalf("no tokens granted: %v", resp)
	}

	r := ta.q("limits", "set", "tenant/atlas", "--limit", "500", "--window", "1m", "--regions", "eu,us",
		"--mode", "strict", "--reason", "downgrade", "--effective", "now", "--dry-run").want(t, 0)
	out := r.stdout
	for _, want := range []string{
		"dry run: nothing was written\n",
		"limit:          tenant/atlas\n",
		"action:         update\n",
		"changes:\n",
		"1000 -> 500\n",
		"local:100 -> closed\n",
		fmt.Sprintf("granted:        %d\n", granted),
		"new-g:          500\n",
		fmt.Sprintf("pool-after:     %d\n", max(0, 500-granted)),
		"bound:          0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "window:         ") || !strings.Contains(out, "(running), G 1000") {
		t.Errorf("dry run lacks the current window:\n%s", out)
	}
	if v, g := ta.version(t, "tenant/atlas"); v != 1 || g != 1000 {
		t.Fatalf("dry run wrote: version %d G %d", v, g)
	}

	// --json: the PutLimitResponse with its effect.
	r = ta.q("--json", "limits", "set", "tenant/atlas", "--limit", "2000", "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--fallback", "us=open", "--reason", "upgrade", "--dry-run").want(t, 0)
	pr := &pb.PutLimitResponse{}
	if err := protojson.Unmarshal([]byte(r.stdout), pr); err != nil {
		t.Fatalf("set --dry-run --json: %v\n%s", err, r.stdout)
	}
	if pr.GetEffect().GetNewLimitTokens() != 1000 && pr.GetEffect().GetNewLimitTokens() != 2000 || !pr.GetEffect().GetBoundInfinite() ||
		pr.GetEffect().GetAction() != "update" || pr.GetLimit().GetLimitTokens() != 2000 {
		t.Fatalf("set --dry-run --json: %v", pr)
	}

	r = ta.q("limits", "delete", "tenant/atlas", "--reason", "end of contract", "--dry-run").want(t, 0)
	if !strings.Contains(r.stdout, "dry run: nothing was written\n") || !strings.Contains(r.stdout, "action:         delete\n") {
		t.Fatalf("delete --dry-run:\n%s", r.stdout)
	}
	if v, _ := ta.version(t, "tenant/atlas"); v != 1 {
		t.Fatalf("delete --dry-run deleted (version %d)", v)
	}

	// apply --dry-run: the effects of every change, nothing written.
	dir := t.TempDir()
	file := writeFile(t, dir, "limits.yaml", "manage: [tenant/]\nlimits:\n"+
		"  - {id: tenant/new, limit: 10, window: 1m, regions: [eu], mode: strict}\n")
	planPath := filepath.Join(dir, "plan.json")
	ta.q("limits", "plan", "-f", file, "-o", planPath).want(t, 0)
	r = ta.q("limits", "apply", "--plan", planPath, "--reason", "replace", "--dry-run").want(t, 0)
	if !strings.Contains(r.stdout, "dry run: nothing was written\n") || !strings.Contains(r.stdout, "limit:          tenant/new\n") ||
		!strings.Contains(r.stdout, "action:         create\n") || !strings.Contains(r.stdout, "limit:          tenant/atlas\n") ||
		!strings.Contains(r.stdout, "action:         delete\n") {
		t.Fatalf("apply --dry-run:\n%s", r.stdout)
	}
	if v, _ := ta.version(t, "tenant/new"); v != 0 {
		t.Fatal("apply --dry-run created tenant/new")
	}
	if v, _ := ta.version(t, "tenant/atlas"); v != 1 {
		t.Fatal("apply --dry-run deleted tenant/atlas")
	}
	// The plan still applies after its dry run.
	ta.q("limits", "apply", "--plan", planPath, "--reason", "replace").want(t, 0)
	if v, _ := ta.version(t, "tenant/new"); v != 1 {
		t.Fatal("apply after the dry run did not create tenant/new")
	}
}

// TestHistoryAndAudit: history lists a limit's applied changes with their
// reasons; audit lists changes and refused attempts, filtered by --since
// and --prefix.
func TestHistoryAndAudit(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ta.set(t, "tenant/atlas", 1000)
	ta.set(t, "other/x", 5)
	mid := time.Now()
	// A refused attempt (stale version), then an applied change.
	ta.q("limits", "set", "tenant/atlas", "--limit", "1", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--reason", "stale attempt", "--expect-version", "7").want(t, 1)
	ta.q("limits", "set", "tenant/atlas", "--limit", "1200", "--window", "1m", "--regions", "eu,us", "--mode", "bounded",
		"--reason", "raise for Q3", "--expect-version", "1").want(t, 0)

	r := ta.q("limits", "history", "tenant/atlas").want(t, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("history (the refused attempt is not a change):\n%s", r.stdout)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "VERSION TIME ACTION PRINCIPAL EFFECTIVE_FROM REASON CHANGES" {
		t.Errorf("history header %q", lines[0])
	}
	if !strings.Contains(lines[2], "raise for Q3") || !strings.Contains(lines[2], "limit 1000->1200") || !strings.HasPrefix(lines[2], "2 ") {
		t.Errorf("history row %q", lines[2])
	}

	r = ta.q("audit").want(t, 0)
	if !strings.Contains(r.stdout, "OUTCOME") || strings.Count(r.stdout, "applied") != 3 ||
		!strings.Contains(r.stdout, "conflict") || !strings.Contains(r.stdout, "stale attempt") {
		t.Fatalf("audit:\n%s", r.stdout)
	}
	var conflict string
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Contains(l, "conflict") {
			conflict = l
		}
	}
	if !strings.Contains(conflict, "version") || !strings.Contains(conflict, "tenant/atlas") {
		t.Errorf("the conflict row does not carry its error: %q", conflict)
	}

	// --since: only what came after mid (the conflict and the raise).
	r = ta.q("audit", "--since", mid.UTC().Format(time.RFC3339Nano)).want(t, 0)
	if n := strings.Count(r.stdout, "\n"); n != 3 || strings.Contains(r.stdout, "other/x") || strings.Contains(r.stdout, "setup") {
		t.Fatalf("audit --since %v:\n%s", mid, r.stdout)
	}
	r = ta.q("audit", "--since", "1h", "--prefix", "other/").want(t, 0)
	if n := strings.Count(r.stdout, "\n"); n != 2 || !strings.Contains(r.stdout, "other/x") {
		t.Fatalf("audit --prefix other/:\n%s", r.stdout)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	r = ta.q("audit", "--since", future).want(t, 0)
	if strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("audit --since the future:\n%s", r.stdout)
	}
	r = ta.q("--json", "audit", "--since", mid.UTC().Format(time.RFC3339Nano)).want(t, 0)
	var evs []json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &evs); err != nil || len(evs) != 2 {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	ev := &pb.AuditEvent{}
	if err := protojson.Unmarshal(evs[0], ev); err != nil || ev.Outcome != pb.AuditOutcome_AUDIT_OUTCOME_CONFLICT || ev.Error == "" {
		t.Fatalf("first event since mid: %v %v", ev, err)
	}

	r = ta.q("whoami").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"principal": "anonymous", "role": "admin", "via": "none"})
}
