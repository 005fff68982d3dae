package adminhttp

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"leasehold/allocator"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	"leasehold/internal/groupmap"
)

// TestOtherGroupsLimitIs421: with the limits sharded over allocator
// groups, the HTTP API of group a answers a write or read of a limit that
// lives in group b with 421 Misdirected Request naming the group and one
// of its allocators (headers and problem fields); a's own limits are
// served as ever.
func TestOtherGroupsLimitIs421(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	store := allocator.NewMapStore(cli, "", 2*time.Second)
	_, rev, err := store.Change(context.Background(), 0, groupmap.Map{}, time.Now(), groupmap.Change{
		Groups: []groupmap.Group{{Name: "a", Allocators: []string{"10.0.0.1:7400"}}, {Name: "b", Allocators: []string{"10.0.0.2:7400"}}},
		Place:  map[string]string{"tenant/atlas": "a", "tenant/borealis": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	view, err := allocator.NewMapView(context.Background(), store, time.Now)
	if err != nil || view.Wait(context.Background(), rev) != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(allocator.Config{Client: cli, Prefix: "/leasehold/g/a/", Regions: []string{"eu", "us"}, Advertise: "a",
		Logger: slog.New(slog.DiscardHandler)}, allocator.WithGroup("a", view))
	if err != nil {
		t.Fatal(err)
	}
	allocatortest.Run(t, a)
	allocatortest.WaitLeader(t, a)
	api := api{t: t, base: serveHTTP(t, a, nil)}
	mustCode(t, api.do("PUT", "/v1/limits/tenant/atlas", nil, limitBody(100, "")), 200)
	for _, req := range [][2]string{{"PUT", limitBody(100, "")}, {"GET", ""}} {
		r := api.do(req[0], "/v1/limits/tenant/borealis", nil, req[1])
		mustCode(t, r, http.StatusMisdirectedRequest)
		var p struct{ Group, Allocator, Detail string }
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		if p.Group != "b" || p.Allocator != "10.0.0.2:7400" || r.hdr.Get(GroupHeader) != "b" || r.hdr.Get(GroupAllocatorHeader) != "10.0.0.2:7400" {
			t.Errorf("%s of b's limit: %d %s, headers %v: want 421 naming group b and 10.0.0.2:7400", req[0], r.code, r.body, r.hdr)
		}
	}
	mustCode(t, api.do("GET", "/v1/limits/tenant/atlas", nil, ""), 200)
}
