package bucket

import "testing"

// TestEpoch: the epoch of a limit's buckets stays while Redis keeps its
// data (every caller, every limit of the server gets the same one), and is
// new after a restart that emptied Redis.
func TestEpoch(t *testing.T) {
	srv, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	e1, err := b.Epoch(ctx, "tenant/a")
	if err != nil || e1 == "" {
		t.Fatalf("epoch: %q, %v", e1, err)
	}
	if again, err := New(rdb).Epoch(ctx, "tenant/a"); err != nil || again != e1 {
		t.Fatalf("second caller: %q, %v; want %q", again, err, e1)
	}
	if other, err := b.Epoch(ctx, "tenant/b"); err != nil || other != e1 {
		t.Fatalf("another limit of the same server: %q, %v; want %q (its run_id)", other, err, e1)
	}
	srv.Restart()
	e2, err := b.Epoch(ctx, "tenant/a")
	if err != nil || e2 == "" || e2 == e1 {
		t.Fatalf("after a restart: %q, %v; want a new epoch (was %q)", e2, err, e1)
	}
	if _, err := b.Epoch(ctx, ""); err == nil {
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
			e1, err := b.Epoch(ctx, "tenant/m")
			if err != nil || e1 == "" {
				t.Fatalf("epoch: %q, %v", e1, err)
			}
			if e2, err := b.Epoch(ctx, "tenant/m"); err != nil || e2 != e1 {
				t.Fatalf("epoch changed without a restart: %q -> %q (%v)", e1, e2, err)
			}
		})
	}
}
