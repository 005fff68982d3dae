package allocator

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/internal/etcdtest"
)

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrFenced, false},
		{fmt.Errorf("allocator: commit 3 ops: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", context.Canceled), false},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrLeaderChanged), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrNoLeader), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrTimeoutDueToLeaderFail), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrStopped), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", status.Error(codes.Unavailable, "transport is closing")), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", status.Error(codes.Unknown, "raft proposal dropped")), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", status.Error(codes.Unknown, "raft: stopped")), true},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrTooManyOps), false},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrRequestTooLarge), false},
		{fmt.Errorf("allocator: commit 3 ops: %w", rpctypes.ErrPermissionDenied), false},
		{errors.New("something else"), false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestSuperseded: a failed batch retried after a later one committed does
// not write again the keys the later one wrote, nor keys a later range
// delete removed, but writes their newest later state; earlier committed
// batches do not count.
func TestSuperseded(t *testing.T) {
	put := func(k string) *pendingOp { return &pendingOp{op: clientv3.OpPut(k, "v")} }
	failed := &batch{seq: 5, ops: []*pendingOp{put("/g/a"), put("/g/b"), put("/u/w1/x"), put("/g/c"),
		{op: clientv3.OpDelete("/d/", clientv3.WithPrefix())}}}
	committed := map[uint64][]clientv3.Op{
		4: {clientv3.OpPut("/g/c", "v4")}, // older: does not supersede
		6: {clientv3.OpPut("/g/b", "v6"), clientv3.OpDelete("/u/w1/", clientv3.WithPrefix())},
		7: {clientv3.OpPut("/g/b", "v7")},
	}
	var got []string
	for _, p := range superseded(failed, committed) {
		got = append(got, string(p.op.KeyBytes()))
	}
	if fmt.Sprint(got) != "[/g/a /g/c /d/]" {
		t.Fatalf("retried writes %v, want [/g/a /g/c /d/]", got)
	}
	if n := len(superseded(failed, map[uint64][]clientv3.Op{})); n != 5 {
		t.Fatalf("nothing committed later: %d writes retried, want 5", n)
	}
	// What the retry writes instead: the newest later state of each
	// superseded key (the failed batch's first attempt may have landed
	// after the later batches and put its older records back).
	var back []string
	for _, op := range restored(failed, committed) {
		back = append(back, fmt.Sprintf("%v %s=%s", op.IsPut(), op.KeyBytes(), op.ValueBytes()))
	}
	if fmt.Sprint(back) != "[true /g/b=v7 false /u/w1/x=]" {
		t.Fatalf("restored %v, want [true /g/b=v7 false /u/w1/x=]", back)
	}
}

// TestLateCopyDoesNothing: on real etcd, a copy of a batch that lands
// after a retry of it committed and after a newer batch overwrote its
// records (a timed-out first attempt, a hedged copy still in flight) does
// nothing: the newer record stays. A copy under another term's fence is
// refused as fenced.
func TestLateCopyDoesNothing(t *testing.T) {
	cli := etcdtest.Start(t, 1).Client(t)
	ctx := context.Background()
	s := NewStore(cli, "/lh-test/")
	lead, err := cli.Put(ctx, "/lh-test/election/x", "a")
	if err != nil {
		t.Fatal(err)
	}
	f := Fence{Key: "/lh-test/election/x", Rev: lead.Header.Revision}
	put := func(v string) []clientv3.Op { return []clientv3.Op{clientv3.OpPut("/lh-test/grants/k", v)} }
	value := func() string {
		t.Helper()
		r, err := cli.Get(ctx, "/lh-test/grants/k")
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("get: %v %v", r, err)
		}
		return string(r.Kvs[0].Value)
	}
	steps := []struct {
		name string
		f    Fence
		seq  uint64
		v    string
		mark bool
		err  error
		want string
	}{
		{"batch 1, first attempt", f, 1, "v1", false, nil, "v1"},
		{"batch 1, its retry (the first attempt's answer was lost)", f, 1, "v1", true, nil, "v1"},
		{"batch 2 overwrites the record", f, 2, "v2", false, nil, "v2"},
		{"batch 1's first attempt lands again, late", f, 1, "v1", false, nil, "v2"},
		{"batch 1's hedged copy lands late", f, 1, "v1", true, nil, "v2"},
		{"batch 3 of another term", Fence{Key: f.Key, Rev: f.Rev + 100}, 3, "v3", false, ErrFenced, "v2"},
	}
	for _, st := range steps {
		if err := s.CommitBatch(ctx, st.f, st.seq, put(st.v), st.mark); !errors.Is(err, st.err) {
			t.Fatalf("%s: %v, want %v", st.name, err, st.err)
		}
		if got := value(); got != st.want {
			t.Fatalf("%s: the record is %q, want %q", st.name, got, st.want)
		}
	}
	// A new term clears the marks.
	if err := s.ClearOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := cli.Get(ctx, "/lh-test/once/", clientv3.WithPrefix(), clientv3.WithCountOnly()); r.Count != 0 {
		t.Fatalf("%d marks left after ClearOnce", r.Count)
	}
}
