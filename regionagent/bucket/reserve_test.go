package bucket

import (
	"testing"
)

// TestReserveRelease runs on redis-server and miniredis with the same Lua.
func TestReserveRelease(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("res", 1)
			for _, d := range []Deposit{
				{LeaseID: "early", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000},
				{LeaseID: "late", Tokens: 50, StartMs: T0, DeadlineMs: T0 + 9000},
			} {
				d.Key, d.ExpireAtMs, d.NowMs = key, farExpiry(), T0
				if _, err := b.Deposit(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			// 25 tokens: 10 from early, 15 from late; the deadline is early's.
			r, err := b.Reserve(ctx, key, "c1", 25, 1, T0+10)
			if err != nil {
				t.Fatal(err)
			}
			if r != (Reservation{Granted: 25, DeadlineMs: T0 + 1000, Balance: 35, NowMs: T0 + 10, Status: Reserved}) {
				t.Fatalf("reserve: %+v", r)
			}
			if r2, _ := b.Reserve(ctx, key, "c1", 25, 1, T0+20); r2.Status != ReplayedReservation || r2.Granted != 25 || r2.DeadlineMs != T0+1000 {
				t.Fatalf("replayed reserve: %+v", r2)
			}
			bal, _ := b.Balance(ctx, key, T0+20)
			if bal.Spendable != 35 || bal.Admitted != 25 || len(bal.Counters) != 0 {
				t.Fatalf("after reserve: %+v", bal)
			}
			// Partial: want 100, min 5: takes the 35 left, from late only.
			r, _ = b.Reserve(ctx, key, "c2", 100, 5, T0+30)
			if r.Granted != 35 || r.DeadlineMs != T0+9000 || r.Status != Reserved {
				t.Fatalf("partial reserve: %+v", r)
			}
			if r, _ = b.Reserve(ctx, key, "c3", 10, 1, T0+30); r.Status != NotEnough || r.Granted != 0 {
				t.Fatalf("empty bucket reserve: %+v", r)
			}
			// Release c1 with 5 unspent before its deadline: spendable again
			// until T0+1000, and admitted drops by 5.
			rel, err := b.Release(ctx, key, "c1", 5, T0+500)
			if err != nil || rel != (ReleaseResult{Returned: 5, Status: Released}) {
				t.Fatalf("release: %+v %v", rel, err)
			}
			if rel, _ = b.Release(ctx, key, "c1", 9, T0+600); rel != (ReleaseResult{Returned: 5, Status: ReleasedBefore}) {
				t.Fatalf("retried release: %+v", rel)
			}
			if r, _ = b.Reserve(ctx, key, "c1", 3, 1, T0+600); r.Status != AlreadyReleased {
				t.Fatalf("reserve after release: %+v", r)
			}
			if res, _ := b.Spend(ctx, []string{key}, []int64{5}, T0+999); !res.Allowed {
				t.Fatalf("released tokens not spendable before the deadline: %+v", res)
			}
			if res, _ := b.Spend(ctx, []string{key}, []int64{1}, T0+1000); res.Allowed {
				t.Fatal("spent at the reservation's deadline")
			}
			// Release c2 after its deadline: nothing comes back, admitted
			// drops by the unspent (they were never admitted).
			if rel, _ = b.Release(ctx, key, "c2", 20, T0+9000); rel != (ReleaseResult{Returned: 0, Status: Released}) {
				t.Fatalf("late release: %+v", rel)
			}
			bal, _ = b.Balance(ctx, key, T0+9000)
			// admitted: 25 + 35 - 5 (c1) + 5 (spend) - 20 (c2) = 40
			if bal.Admitted != 40 || bal.Spendable != 0 {
				t.Fatalf("final: %+v", bal)
			}
			if rel, _ = b.Release(ctx, key, "nope", 1, T0); rel.Status != UnknownReservation {
				t.Fatalf("unknown release: %+v", rel)
			}
			if _, err := b.Release(ctx, key, "c9", -1, T0); err == nil {
				t.Fatal("negative unspent accepted")
			}
			if _, err := b.Reserve(ctx, key, "a:b", 1, 1, T0); err == nil {
				t.Fatal("id with ':' accepted")
			}
		})
	}
}
