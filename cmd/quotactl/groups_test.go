package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"leasehold/allocator"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/groupmap"
)

// startGroups starts two allocator groups (a and b) on one etcd, each its
// own leader on its own prefix, and writes the group map naming them.
func startGroups(t *testing.T) (addrs map[string]string, store *allocator.MapStore) {
	t.Helper()
	addrs, store, _ = startGroupsEtcd(t)
	return addrs, store
}

// startGroupsEtcd is startGroups, also returning the etcd client the
// groups keep their state with (for a group started later:
// startGroupAllocator).
func startGroupsEtcd(t *testing.T) (addrs map[string]string, store *allocator.MapStore, cli *clientv3.Client) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	cli = c.Client(t)
	store = allocator.NewMapStore(cli, "", 2*time.Second)
	addrs = map[string]string{}
	var groups []groupmap.Group
	var views []*allocator.MapView
	for _, g := range []string{"a", "b"} {
		addr, view := startGroupAllocator(t, cli, store, g)
		addrs[g] = addr
		groups = append(groups, groupmap.Group{Name: g, Allocators: []string{addr}})
		views = append(views, view)
	}
	_, rev, err := store.Change(context.Background(), 0, groupmap.Map{}, time.Now(), groupmap.Change{Groups: groups, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := v.Wait(ctx, rev)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return addrs, store, cli
}

// startGroupAllocator starts group g's allocator, the leader, serving
// gRPC on loopback at addr, reading the group map from store.
func startGroupAllocator(t *testing.T, cli *clientv3.Client, store *allocator.MapStore, g string) (addr string, view *allocator.MapView) {
	t.Helper()
	view, err := allocator.NewMapView(context.Background(), store, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	lis := allocatortest.Listen(t)
	addr = lis.Addr().String()
	a, err := allocator.New(allocator.Config{Client: cli, Prefix: "/leasehold/g/" + g + "/", Regions: []string{"eu", "us"},
		Advertise: addr, Logger: slog.New(slog.DiscardHandler)}, allocator.WithGroup(g, view))
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	allocatortest.WaitLeader(t, a)
	allocatortest.Serve(t, lis, allocator.NewServer(a))
	return addr, view
}

// TestQuotactlAcrossGroups: with two allocator groups, quotactl pointed at
// group a writes and reads every limit where it lives (a's refusal names
// b, and quotactl follows), lists the limits of both groups, applies a
// limits file that spans them, shows the map, and moves a limit between
// groups (the map placed, the limit copied, read at its new group). Bad
// group changes are usage errors, and nothing is written.
func TestQuotactlAcrossGroups(t *testing.T) {
	addrs, store := startGroups(t)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", addrs["a"]}, args...)...) }
	m, _, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("tenant/t%02d", i)
		owners[id], _, _ = m.Owner(id, time.Now())
		ids = append(ids, id)
		q("limits", "set", id, "--limit", "100", "--window", "1m", "--regions", "eu,us", "--mode", "strict", "--reason", "setup").want(t, 0)
	}
	inB := ""
	for _, id := range ids {
		if owners[id] == "b" {
			inB = id
			break
		}
	}
	if inB == "" {
		t.Fatal("no limit of 12 hashes to group b")
	}
	// Each limit lives in its owner group only: b's own allocator reads
	// it, and quotactl at a follows a's refusal to b.
	qb := func(args ...string) result { return quotactl(append([]string{"--allocator", addrs["b"]}, args...)...) }
	checkKV(t, kv(t, qb("limits", "get", inB).want(t, 0).stdout), map[string]string{"version": "1"})
	checkKV(t, kv(t, q("limits", "get", inB).want(t, 0).stdout), map[string]string{"version": "1"})
	list := q("limits", "list").want(t, 0).stdout
	for _, id := range ids {
		if !strings.Contains(list, id) {
			t.Errorf("limits list at group a lacks %s (group %s):\n%s", id, owners[id], list)
		}
	}
	// A limits file spanning both groups.
	var y strings.Builder
	y.WriteString("manage: [tenant/]\nlimits:\n")
	for _, id := range ids {
		fmt.Fprintf(&y, "  - id: %s\n    limit: 200\n    window: 1m\n    regions: [eu, us]\n    mode: strict\n", id)
	}
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := q("limits", "apply", "-f", file, "--reason", "raise", "--effective", "now").want(t, 0)
	if !strings.Contains(r.stdout, "Applied: 0 created, 12 updated, 0 deleted") {
		t.Fatalf("apply across groups:\n%s", r.stdout)
	}
	checkKV(t, kv(t, qb("limits", "get", inB).want(t, 0).stdout), map[string]string{"version": "2", "limit": "200"})

	show := q("groups", "show").want(t, 0).stdout
	for _, want := range []string{"version 1", "a  " + addrs["a"] + "  " + addrs["a"] + "  answers", "b  " + addrs["b"] + "  " + addrs["b"] + "  answers"} {
		if !strings.Contains(show, want) {
			t.Errorf("groups show lacks %q:\n%s", want, show)
		}
	}
	// Move inB to a: the map places it, the record is copied to a.
	r = q("groups", "place", inB, "a", "--reason", "big tenant").want(t, 0)
	if !strings.Contains(r.stdout, "moved "+inB+": group b -> a") {
		t.Fatalf("groups place:\n%s", r.stdout)
	}
	checkKV(t, kv(t, q("limits", "get", inB).want(t, 0).stdout), map[string]string{"version": "1", "limit": "200"})
	// b now refuses changes of it, naming a (quotactl at b follows).
	checkKV(t, kv(t, qb("limits", "get", inB).want(t, 0).stdout), map[string]string{"limit": "200"})
	if n := strings.Count(q("limits", "list").want(t, 0).stdout, inB); n != 1 {
		t.Errorf("after the move limits list names %s %d times, want once", inB, n)
	}
	// The history follows the limit: its changes in b, then the copy in a.
	hist := q("limits", "history", inB).want(t, 0).stdout
	iSetup, iRaise, iMove := strings.Index(hist, "setup"), strings.Index(hist, "raise"), strings.Index(hist, "moved from allocator group b: big tenant")
	if iSetup < 0 || iRaise < iSetup || iMove < iRaise {
		t.Errorf("limits history after the move, want setup, raise, then the move, in that order:\n%s", hist)
	}
	show = q("groups", "show").want(t, 0).stdout
	if !strings.Contains(show, "version 2") || !strings.Contains(show, inB+"  a") {
		t.Errorf("groups show after the move:\n%s", show)
	}

	// Bad input: usage errors (exit 2), nothing written.
	for _, args := range [][]string{
		{"groups", "place", inB, "zz", "--reason", "r"},
		{"groups", "place", inB, "--reason", "r"},
		{"groups", "place", inB, "a"},
		{"groups", "set", "a", "--reason", "r"},
		{"groups", "set", "A=127.0.0.1:1", "--reason", "r"},
		{"groups", "set", "a=nohost", "--reason", "r"},
	} {
		r := q(args...).want(t, 2)
		if strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line", args, r.stderr)
		}
	}
	if cur, _, _ := store.Get(context.Background()); cur.Current().Number != 2 {
		t.Errorf("the map is at version %d after refused changes, want 2", cur.Current().Number)
	}
}
