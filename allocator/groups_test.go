package allocator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/groupmap"
	pb "leasehold/proto/leasehold/v1"
)

// TestGroupsGrantEachWindowOnce: two allocator groups (a and b, each its
// own leader on its own etcd prefix) hold the same limit while it moves
// from a to b. Before the move a grants and b refuses WRONG_GROUP naming
// a; the window in progress at the move's From stays a's, the first
// window starting at or after From is b's (a refuses it naming b); and in
// etcd every (limit, window) has grant records under one group's prefix
// only.
func TestGroupsGrantEachWindowOnce(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const W, notice = 10 * time.Second, 20 * time.Second
	clock := newFakeClock(t0) // t0 is a boundary of 10 s windows
	store := NewMapStore(cli, "", notice)
	groups := []groupmap.Group{{Name: "a", Allocators: []string{"a:1"}}, {Name: "b", Allocators: []string{"b:1"}}}
	m1, rev1, err := store.Change(ctx, 0, groupmap.Map{}, clock.Now(), groupmap.Change{Groups: groups, Place: map[string]string{"t/x": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	start := func(name string) (*runningAllocator, *MapView) {
		view, err := NewMapView(ctx, store, clock.Now)
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(Config{Client: cli, Prefix: "/leasehold/g/" + name + "/", Regions: []string{"eu", "us", "ap"},
			Advertise: name, Logger: testLog()}, clock.opt(), WithGroup(name, view))
		if err != nil {
			t.Fatal(err)
		}
		r := &runningAllocator{Allocator: a, Running: allocatortest.Run(t, a)}
		allocatortest.WaitLeader(t, r)
		return r, view
	}
	// The limit is written where it lives: at a, and at b once the map
	// places it there (as quotactl groups place copies it).
	put := func(a *runningAllocator) {
		t.Helper()
		l, err := a.PutLimit(ctx, &pb.Limit{Id: "t/x", LimitTokens: 100, Window: durationpb.New(W), Regions: []string{"eu", "us"},
			Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(W)}}, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
		if err != nil {
			t.Fatal(err)
		}
		waitLimit(t, a.Allocator, l.Id, l.Version)
	}
	a, viewA := start("a")
	b, viewB := start("b")
	if err := viewA.Wait(ctx, rev1); err != nil {
		t.Fatal(err)
	}
	put(a)
	if _, err := b.PutLimit(ctx, &pb.Limit{Id: "t/x", LimitTokens: 1, Window: durationpb.New(W), Regions: []string{"eu"},
		Mode: pb.Mode_MODE_STRICT}, Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW}); !strings.Contains(fmt.Sprint(err), `lives in allocator group "a"`) {
		t.Fatalf("writing a's limit at b: err = %v, want a refusal naming a", err)
	}
	n := 0
	ask := func(al *runningAllocator, next bool) *pb.LeaseResult {
		t.Helper()
		n++
		choice := pb.WindowChoice_WINDOW_CHOICE_CURRENT
		if next {
			choice = pb.WindowChoice_WINDOW_CHOICE_NEXT
		}
		res, err := al.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r" + string(rune('a'+n)), LimitId: "t/x", Window: choice, WantTokens: 5}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	expect := func(what string, r *pb.LeaseResult, owner string) {
		t.Helper()
		if owner == "" {
			if r.Code != pb.ItemCode_ITEM_CODE_OK || r.Lease.GetTokens() != 5 {
				t.Errorf("%s: %v, want 5 tokens", what, r)
			}
			return
		}
		if r.Code != pb.ItemCode_ITEM_CODE_WRONG_GROUP || r.OwnerGroup != owner || !strings.Contains(r.Message, `group "`+owner+`"`) {
			t.Errorf("%s: %v, want WRONG_GROUP naming %s", what, r, owner)
		}
	}
	clock.Set(t0.Add(time.Second))
	for _, v := range []*MapView{viewA, viewB} {
		if err := v.WaitRead(ctx, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	expect("a, before the move", ask(a, false), "")
	expect("b, before the move", ask(b, false), "a")

	// Move t/x to b: From = t0+1s+notice = t0+21s; the window [t0+20s,
	// t0+30s) started before it and stays a's.
	m2, rev2, err := store.Change(ctx, rev1, m1, clock.Now(), groupmap.Change{Place: map[string]string{"t/x": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if from := m2.Current().From; !from.Equal(t0.Add(21 * time.Second)) {
		t.Fatalf("the move governs from %v, want t0+21s", from.Sub(t0))
	}
	clock.Set(t0.Add(25 * time.Second))
	for _, v := range []*MapView{viewA, viewB} {
		if err := v.Wait(ctx, rev2); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitRead(ctx, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	put(b)
	expect("a, the window in progress at the move", ask(a, false), "")
	expect("b, the window in progress at the move", ask(b, false), "a")
	expect("a, the first window after the move", ask(a, true), "b")
	expect("b, the first window after the move", ask(b, true), "")
	clock.Set(t0.Add(31 * time.Second))
	for _, v := range []*MapView{viewA, viewB} {
		if err := v.WaitRead(ctx, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	expect("a, after the move", ask(a, false), "b")
	expect("b, after the move", ask(b, false), "")

	// etcd: every window's grant records under one prefix.
	owners := map[string]map[string]bool{} // window part -> groups
	for _, g := range []string{"a", "b"} {
		prefix := "/leasehold/g/" + g + "/grants/"
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			// grants/<limit>!<window>/<region>/<request>
			lim, rest, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "!")
			win, _, _ := strings.Cut(rest, "/")
			w := lim + "!" + win
			if owners[w] == nil {
				owners[w] = map[string]bool{}
			}
			owners[w][g] = true
		}
	}
	if len(owners) != 3 {
		t.Errorf("grants in %d windows, want 3 (t0, t0+20s, t0+30s): %v", len(owners), owners)
	}
	for w, gs := range owners {
		if len(gs) != 1 {
			t.Errorf("window %s granted by %d groups: %v", w, len(gs), gs)
		}
	}
}
