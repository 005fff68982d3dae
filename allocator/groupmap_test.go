package allocator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"leasehold/internal/etcdtest"
	"leasehold/internal/groupmap"
)

// TestMapStoreAndView: the map is changed by compare-and-swap (a change
// from a stale read is refused), and a view kept by a watch sees every
// stored version, in order, on a real etcd.
func TestMapStoreAndView(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := NewMapStore(cli, "")
	view, err := NewMapView(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := view.Owner("t/x", time.Now()); ok {
		t.Fatal("an owner before any map was stored")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	viewErrs := make(chan error, 16)
	go func() {
		defer close(done)
		view.Run(runCtx, func(err error) {
			select {
			case viewErrs <- err:
			default:
			}
		})
	}()
	defer func() { stop(); <-done }()

	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	one := []groupmap.Group{{Name: "a", Allocators: []string{"127.0.0.1:1"}}}
	two := append(one, groupmap.Group{Name: "b", Allocators: []string{"127.0.0.1:2"}})
	m1, rev1, err := store.Change(ctx, 0, groupmap.Map{}, now, DefaultMapNotice, groupmap.Change{Groups: one})
	if err != nil {
		t.Fatal(err)
	}
	// A second writer that also read "no map" loses.
	if _, _, err := store.Change(ctx, 0, groupmap.Map{}, now, DefaultMapNotice, groupmap.Change{Groups: two}); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("create over an existing map: err = %v, want ErrMapChanged", err)
	}
	m2, rev2, err := store.Change(ctx, rev1, m1, now, DefaultMapNotice, groupmap.Change{Groups: two, Place: map[string]string{"t/x": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Change(ctx, rev1, m1, now, DefaultMapNotice, groupmap.Change{Unplace: []string{"t/x"}}); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("change from a stale read: err = %v, want ErrMapChanged", err)
	}
	got, rev, err := store.Get(ctx)
	if err != nil || rev != rev2 || got.Current().Number != 2 {
		t.Fatalf("Get = v%d at %d, %v; want v2 at %d", got.Current().Number, rev, err, rev2)
	}
	from := m2.Current().From
	// The view catches up through its watch.
	if err := view.Wait(ctx, rev2); err != nil {
		t.Fatalf("the view did not see the second version: %v", err)
	}
	for _, c := range []struct {
		start time.Time
		want  string
	}{{from.Add(-time.Second), "a"}, {from, "b"}} {
		if g, _, ok := view.Owner("t/x", c.start); !ok || g != c.want {
			t.Errorf("Owner(t/x, From%+v) = %q, want %q", c.start.Sub(from), g, c.want)
		}
	}
	// A value that is not a map is ignored by the view (it keeps the
	// last good one) and refused by Get.
	if _, err := cli.Put(ctx, DefaultGroupMapKey, "not json"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Get(ctx); err == nil {
		t.Error("Get of a broken map: no error")
	}
	select {
	case err := <-viewErrs:
		if !strings.Contains(err.Error(), "stored group map") {
			t.Errorf("view error = %v, want the broken map named", err)
		}
	case <-ctx.Done():
		t.Fatal("the view never reported the broken map")
	}
	if g, _, _ := view.Owner("t/x", from); g != "b" {
		t.Errorf("after a broken write the view says %q, want the last good map's b", g)
	}
}
