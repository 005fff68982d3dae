package bucket

import (
	"reflect"
	"testing"
)

// TestEpoch: the epoch of a limit's buckets stays while Redis keeps its
// data (every caller, every limit of the server gets the same one), and is
// new after a restart that emptied Redis.
func TestEpoch(t *testing.T) {
	srv, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	e1, err := b.Epoch(ctx, LimitRef{ID: "tenant/a"})
	if err != nil || e1 == "" {
		t.Fatalf("epoch: %q, %v", e1, err)
	}
	if again, err := New(rdb).Epoch(ctx, LimitRef{ID: "tenant/a"}); err != nil || again != e1 {
		t.Fatalf("second caller: %q, %v; want %q", again, err, e1)
	}
	if other, err := b.Epoch(ctx, LimitRef{ID: "tenant/b"}); err != nil || other != e1 {
		t.Fatalf("another limit of the same server: %q, %v; want %q (its run_id)", other, err, e1)
	}
	srv.Restart()
	e2, err := b.Epoch(ctx, LimitRef{ID: "tenant/a"})
	if err != nil || e2 == "" || e2 == e1 {
		t.Fatalf("after a restart: %q, %v; want a new epoch (was %q)", e2, err, e1)
	}
	if _, err := b.Epoch(ctx, LimitRef{ID: ""}); err == nil {
		t.Fatal("empty limit id accepted")
	}
}

// TestEpochMiniredis: a server that gives no run_id gets a random epoch,
// kept like any other.
func TestEpochMiniredis(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := New(be.rdb)
			ctx := testCtx(t)
			e1, err := b.Epoch(ctx, LimitRef{ID: "tenant/m"})
			if err != nil || e1 == "" {
				t.Fatalf("epoch: %q, %v", e1, err)
			}
			if e2, err := b.Epoch(ctx, LimitRef{ID: "tenant/m"}); err != nil || e2 != e1 {
				t.Fatalf("epoch changed without a restart: %q -> %q (%v)", e1, e2, err)
			}
		})
	}
}

// TestUsage: one call reads a limit's epoch and its windows' counters;
// without an epoch key it says so, and SetEpochs sets the keys of many
// limits at once, to the value Epoch would choose.
func TestUsage(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			k := Key("", "tenant/u", 5)
			if _, err := b.Deposit(ctx, Deposit{Key: k, LeaseID: "L1", Tokens: 10, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Spend(ctx, []string{k}, []int64{4}, T0); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Spend(ctx, []string{k}, []int64{7}, T0); err != nil {
				t.Fatal(err)
			}
			if _, err := b.AddCounter(ctx, k, "fallback_admitted", 2); err != nil {
				t.Fatal(err)
			}
			epoch, counts, err := b.Usage(ctx, LimitRef{ID: "tenant/u"}, []int64{5, 6})
			if err != nil || epoch != "" {
				t.Fatalf("before any epoch: %q, %v", epoch, err)
			}
			want := []WindowCounts{{Window: 5, Admitted: 4, Denied: 7, Counters: []Counter{{Name: "fallback_admitted", Value: 2}}}, {Window: 6}}
			if !reflect.DeepEqual(counts, want) {
				t.Fatalf("counts %+v, want %+v", counts, want)
			}
			if err := b.SetEpochs(ctx, []LimitRef{{ID: "tenant/u"}, {ID: "tenant/v"}}); err != nil {
				t.Fatal(err)
			}
			e, err := b.Epoch(ctx, LimitRef{ID: "tenant/v"})
			if err != nil {
				t.Fatal(err)
			}
			epoch, _, err = b.Usage(ctx, LimitRef{ID: "tenant/u"}, []int64{5})
			if err != nil || epoch == "" || epoch != e {
				t.Fatalf("after SetEpochs: %q, %v; want %q for every limit", epoch, err, e)
			}
			if _, _, err := b.Usage(ctx, LimitRef{ID: "tenant/u"}, nil); err == nil {
				t.Fatal("no windows accepted")
			}
		})
	}
}

// TestSnapshot: a region's snapshot is kept newest first, whatever order
// replicas save in, on redis-server and miniredis.
func TestSnapshot(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			if d, err := b.LoadSnapshot(ctx, "eu"); err != nil || d != nil {
				t.Fatalf("no snapshot yet: %q, %v", d, err)
			}
			for i, s := range []struct {
				rev, taken int64
				data       string
				saved      bool
			}{
				{10, 1000, "a", true},
				{10, 2000, "b", true},  // same revision, later
				{9, 5000, "c", false},  // older revision
				{10, 2000, "d", false}, // not newer
				{12, 1500, "e", true},
			} {
				ok, err := b.SaveSnapshot(ctx, "eu", s.rev, s.taken, []byte(s.data))
				if err != nil || ok != s.saved {
					t.Fatalf("step %d: saved %v, %v; want %v", i, ok, err, s.saved)
				}
			}
			if d, err := b.LoadSnapshot(ctx, "eu"); err != nil || string(d) != "e" {
				t.Fatalf("snapshot %q, %v; want the newest", d, err)
			}
		})
	}
}
