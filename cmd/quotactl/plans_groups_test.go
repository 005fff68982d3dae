package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/groupmap"
	"leasehold/internal/ports"
	pb "leasehold/proto/leasehold/v1"
)

// TestQuotactlPlansAcrossGroups: with two allocator groups, quotactl
// writes a plan to both and shows each group's version; a plan that one
// group has at another version (a write that reached one group only) is
// flagged DIFFER by plans get and plans list, and the same plans set
// again completes it (the group that has it answers unchanged); a dry run
// counts the tenants of both groups; an override and a delete reach both;
// a limits file with a plan is applied to both.
func TestQuotactlPlansAcrossGroups(t *testing.T) {
	addrs, store := startGroups(t)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", addrs["a"]}, args...)...) }
	set := []string{"plans", "set", "pro", "--limit", "100", "--window", "1m", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--reason", "the pro plan"}
	r := q(set...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "plans/pro", "version": "1", "groups": "a v1, b v1"})
	r = quotactl("--allocator", addrs["b"], "plans", "get", "pro").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"limit": "100", "groups": "a v1, b v1"})

	// A change that reached group a only (written to it alone).
	conn := func(addr string) *grpc.ClientConn {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	grown := &pb.Limit{Id: "plans/pro", LimitTokens: 200, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Binds: []string{"tenant/{id}"}}
	if _, err := pb.NewAdminClient(conn(addrs["a"])).PutLimit(ctx, &pb.PutLimitRequest{Limit: grown, Reason: "half-written",
		Effective: pb.Effective_EFFECTIVE_NOW}); err != nil {
		t.Fatal(err)
	}
	r = q("plans", "get", "pro").want(t, 0)
	if g := kv(t, r.stdout)["groups"]; !strings.HasPrefix(g, "a v2, b v1 (DIFFER") {
		t.Fatalf("plans get of a plan the groups disagree on: groups %q", g)
	}
	r = q("plans", "list").want(t, 0)
	if !strings.Contains(r.stdout, "GROUPS") || !strings.Contains(r.stdout, "a v2, b v1 (DIFFER") {
		t.Fatalf("plans list:\n%s", r.stdout)
	}
	grownSet := append([]string{}, set...)
	grownSet[4] = "200"
	r = q(append(grownSet, "--effective", "now")...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"limit": "200", "groups": "a v2, b v2"})

	// Tenants of both groups use the plan; a dry run counts them all.
	m, _, err := store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alloc := map[string]pb.AllocatorClient{"a": pb.NewAllocatorClient(conn(addrs["a"])), "b": pb.NewAllocatorClient(conn(addrs["b"]))}
	used := map[string]int{}
	for i := 0; used["a"] < 2 || used["b"] < 2; i++ {
		id := fmt.Sprintf("tenant/u%d", i)
		o, _, _ := m.Owner(id, time.Now())
		if used[o] >= 2 {
			continue
		}
		used[o]++
		for {
			resp, err := alloc[o].AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu",
				Requests: []*pb.LeaseRequest{{RequestId: fmt.Sprintf("r-u%d", i), LimitId: id, WantTokens: 10, DemandPerSecond: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			if res := resp.GetResults()[0]; res.GetCode() == pb.ItemCode_ITEM_CODE_OK && res.GetLease().GetTokens() == 10 {
				break
			} else if res.GetCode() != pb.ItemCode_ITEM_CODE_NOT_FOUND || ctx.Err() != nil {
				t.Fatalf("%s at its group %s: %v", id, o, res)
			}
			time.Sleep(5 * time.Millisecond) // the group's watch has not brought the plan yet: polling, not ordering
		}
	}
	r = q(append(grownSet, "--dry-run")...).want(t, 0)
	if got := kv(t, r.stdout)["tenants"]; !strings.HasPrefix(got, "4 ") {
		t.Fatalf("dry run: tenants %q, want 4 (two per group):\n%s", got, r.stdout)
	}

	// An override reaches both groups.
	r = q("limits", "override", "plans/pro", "--limit", "500", "--for", "1h", "--reason", "surge").want(t, 0)
	if got := kv(t, r.stdout); got["limit"] != "500" || got["groups"] != "a v3, b v3" {
		t.Fatalf("override of a plan across groups:\n%s", r.stdout)
	}
	for _, g := range []string{"a", "b"} {
		r = quotactl("--allocator", addrs[g], "limits", "get", "plans/pro").want(t, 0)
		if got := kv(t, r.stdout); !strings.Contains(got["override"], "in force until") || got["groups"] != "a v3, b v3" {
			t.Fatalf("group %s after the override:\n%s", g, r.stdout)
		}
	}

	// A limits file with a plan is applied to both groups.
	file := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(file, []byte("limits:\n  - id: plans/free\n    binds: [\"free/{id}\"]\n    limit: 10\n    window: 1m\n"+
		"    regions: [eu]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "free plan", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("plans", "get", "free").want(t, 0).stdout), map[string]string{"limit": "10", "groups": "a v1, b v1"})

	// A delete reaches both; a second one finds nothing to delete.
	q("limits", "delete", "plans/free", "--reason", "no free tier").want(t, 0)
	r = q("plans", "get", "free")
	r.want(t, 1)
	r = q("plans", "list").want(t, 0)
	if strings.Contains(r.stdout, "free") {
		t.Fatalf("plans list after the delete:\n%s", r.stdout)
	}
}

// TestQuotactlPlanPartialWrite: a plan written while one group of the map
// does not answer reaches the others, and quotactl exits 1 naming the
// groups that have it (with their versions) and the one that does not;
// plans get shows that group unreachable and the copies flagged.
func TestQuotactlPlanPartialWrite(t *testing.T) {
	addrs, store := startGroups(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, rev, err := store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dead := ports.Addr(t) // nothing listens there
	_, rev, err = store.Change(ctx, rev, m, time.Now(), groupmap.Change{Reason: "a group that is down", Groups: []groupmap.Group{
		{Name: "a", Allocators: []string{addrs["a"]}}, {Name: "b", Allocators: []string{addrs["b"]}}, {Name: "c", Allocators: []string{dead}}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := grpc.NewClient(addrs["a"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for { // group a re-reads the map every second: polling it, not ordering
		resp, err := pb.NewAdminClient(c).GetGroupMap(ctx, &pb.GetGroupMapRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetRevision() >= rev {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	q := func(args ...string) result {
		return quotactl(append([]string{"--allocator", addrs["a"], "--timeout", "2s"}, args...)...)
	}
	r := q("plans", "set", "pro", "--limit", "100", "--window", "1m", "--regions", "eu", "--mode", "strict",
		"--bind", "tenant/{id}", "--reason", "pro")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "changed in allocator groups a (version 1), b (version 1); NOT in c") ||
		!strings.Contains(r.stderr, "allocator group c:") {
		t.Fatalf("a partial write:\n%s", r.stderr)
	}
	r = q("plans", "get", "pro").want(t, 0)
	if g := kv(t, r.stdout)["groups"]; !strings.HasPrefix(g, "a v1, b v1, c unreachable (DIFFER") {
		t.Fatalf("plans get after a partial write: groups %q", g)
	}
}

// TestQuotactlGroupsSetCopiesPlans: a group that groups set adds to the
// map gets every plan, contracts included, before the command returns; a
// first-use tenant whose id hashes to the new group is granted by it under
// the plan at once; the same command again copies nothing.
func TestQuotactlGroupsSetCopiesPlans(t *testing.T) {
	addrs, store, cli := startGroupsEtcd(t)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", addrs["a"]}, args...)...) }
	q("plans", "set", "pro", "--limit", "100", "--window", "2s", "--regions", "eu,us", "--mode", "strict",
		"--bind", "tenant/{id}", "--contract", "tenant/atlas=300", "--reason", "the pro plan").want(t, 0)

	addrs["c"], _ = startGroupAllocator(t, cli, store, "c")
	set := []string{"groups", "set", "a=" + addrs["a"], "b=" + addrs["b"], "c=" + addrs["c"], "--reason", "a third group"}
	r := q(set...).want(t, 0)
	if !strings.Contains(r.stdout, "copied plan plans/pro to group c") {
		t.Fatalf("groups set adding group c:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "to group a") || strings.Contains(r.stdout, "to group b") {
		t.Fatalf("groups set copied the plan to a group that had it:\n%s", r.stdout)
	}
	got := kv(t, quotactl("--allocator", addrs["c"], "plans", "get", "pro").want(t, 0).stdout)
	checkKV(t, got, map[string]string{"limit": "100", "groups": "a v1, b v1, c v1"})
	if !strings.Contains(got["contracts"], "tenant/atlas") || !strings.Contains(got["contracts"], "300") {
		t.Fatalf("group c's copy of the plan has contracts %q, want tenant/atlas's 300", got["contracts"])
	}

	// A tenant never created, whose id hashes to c, is granted by c: in
	// the windows the new map version governs (those starting from its
	// From; the plan's 2 s windows reach it soon).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, _, err := store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	from := m.Current().From
	id := ""
	for i := 0; id == ""; i++ {
		if o, _, _ := m.Owner(fmt.Sprintf("tenant/n%d", i), from.Add(time.Minute)); o == "c" {
			id = fmt.Sprintf("tenant/n%d", i)
		}
	}
	for time.Now().Truncate(2 * time.Second).Before(from) {
		time.Sleep(20 * time.Millisecond) // waiting for the wall clock to reach the first window group c governs
	}
	conn, err := grpc.NewClient(addrs["c"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	resp, err := pb.NewAllocatorClient(conn).AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu",
		Requests: []*pb.LeaseRequest{{RequestId: "r-first", LimitId: id, WantTokens: 150, DemandPerSecond: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if res := resp.GetResults()[0]; res.GetCode() != pb.ItemCode_ITEM_CODE_OK || res.GetLease().GetTokens() == 0 ||
		res.GetLease().GetTokens()+res.GetLease().GetPoolLeft() != 100 {
		t.Fatalf("%s, first used at its new group c: %v, want a lease out of the plan's 100 (tokens + pool left)", id, res)
	}

	// Again: every group has the plan; nothing is copied.
	if r := q(set...).want(t, 0); strings.Contains(r.stdout, "copied plan") {
		t.Fatalf("groups set a second time copied a plan:\n%s", r.stdout)
	}
}
