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
// from a stale read is refused); a view that re-reads it sees every
// stored version, keeps the last good map when the stored value is
// broken, and answers only for windows that start before its horizon
// (its last successful read's send time plus half the notice), on a real
// etcd.
func TestMapStoreAndView(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const notice = 20 * time.Second
	store := NewMapStore(cli, "", notice)
	t1 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	clock := newFakeClock(t1)
	view, err := NewMapView(ctx, store, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := view.Owner("t/x", t1); ok {
		t.Fatal("an owner before any map was stored")
	}

	one := []groupmap.Group{{Name: "a", Allocators: []string{"127.0.0.1:1"}}}
	two := append(one, groupmap.Group{Name: "b", Allocators: []string{"127.0.0.1:2"}})
	m1, rev1, err := store.Change(ctx, 0, groupmap.Map{}, t1, groupmap.Change{Groups: one})
	if err != nil {
		t.Fatal(err)
	}
	// A second writer that also read "no map" loses.
	if _, _, err := store.Change(ctx, 0, groupmap.Map{}, t1, groupmap.Change{Groups: two}); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("create over an existing map: err = %v, want ErrMapChanged", err)
	}
	m2, rev2, err := store.Change(ctx, rev1, m1, t1, groupmap.Change{Groups: two, Place: map[string]string{"t/x": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Change(ctx, rev1, m1, t1, groupmap.Change{Unplace: []string{"t/x"}}); !errors.Is(err, ErrMapChanged) {
		t.Fatalf("change from a stale read: err = %v, want ErrMapChanged", err)
	}
	got, rev, err := store.Get(ctx)
	if err != nil || rev != rev2 || got.Current().Number != 2 {
		t.Fatalf("Get = v%d at %d, %v; want v2 at %d", got.Current().Number, rev, err, rev2)
	}
	from := m2.Current().From
	if !from.Equal(t1.Add(notice)) {
		t.Fatalf("the second version governs from %v, want the notice after the change", from)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	viewErrs := make(chan error, 16)
	go func() {
		defer close(done)
		view.Run(runCtx, 10*time.Millisecond, func(err error) {
			if err == nil {
				return
			}
			select {
			case viewErrs <- err:
			default:
			}
		})
	}()
	defer func() { stop(); <-done }()
	if err := view.Wait(ctx, rev2); err != nil {
		t.Fatalf("the view did not read the second version: %v", err)
	}
	// Read at t1: the horizon is t1 + notice/2, before the second
	// version's From: the view answers for the window in progress only.
	if g, _, ok := view.Owner("t/x", from.Add(-notice)); !ok || g != "a" {
		t.Errorf("Owner(t/x, a window before the change) = %q %v, want a", g, ok)
	}
	if _, _, ok := view.Owner("t/x", t1.Add(notice/2)); ok {
		t.Error("the view answered for a window at its horizon")
	}
	// The clock moves past From; the next reads move the horizon.
	clock.Set(from)
	_, rev3, err := store.Change(ctx, rev2, m2, t1, groupmap.Change{Reason: "wait for a read"})
	if err != nil {
		t.Fatal(err)
	}
	if err := view.Wait(ctx, rev3); err != nil {
		t.Fatal(err)
	}
	if g, _, ok := view.Owner("t/x", from); !ok || g != "b" {
		t.Errorf("Owner(t/x, From) = %q %v, want b", g, ok)
	}
	// A value that is not a map: reported, refused by Get, and the view
	// keeps the last good map.
	if _, err := cli.Put(ctx, DefaultGroupMapKey, "not json"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-viewErrs:
		if !strings.Contains(err.Error(), "stored group map") {
			t.Errorf("view error = %v, want the broken map named", err)
		}
	case <-ctx.Done():
		t.Fatal("the view never reported the broken map")
	}
	if _, _, err := store.Get(ctx); err == nil {
		t.Error("Get of a broken map: no error")
	}
	if g, _, _ := view.Owner("t/x", from); g != "b" {
		t.Errorf("after a broken write the view says %q, want the last good map's b", g)
	}
	// Reads keep failing while the clock moves on: the horizon stays, so
	// the view stops answering for later windows.
	clock.Set(from.Add(time.Hour))
	if _, _, ok := view.Owner("t/x", from.Add(time.Hour)); ok {
		t.Error("a view that cannot read the map answered for a window an hour later")
	}
}
