package bucket

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"leasehold/regionagent/store"
)

// TestReservationRecordsBesideBucket: a limit that makes a reservation
// every second for five minutes (a hot limit's chunks, a settle-later
// limit's decisions) leaves no record in its bucket, which every
// reservation and many spends read whole, and keeps only the records of
// the last two minutes beside it. Before records moved, each reservation
// left 3 fields in the bucket for the window's life: 11,000 chunks of one
// hot limit made a reservation cost Redis 8.7 ms.
func TestReservationRecordsBesideBucket(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "hot", 1)
			rk, ek := RecordsKey(key), RecordsIndexKey(key)
			lease := Deposit{Key: key, LeaseID: "L", Tokens: 1 << 40, StartMs: T0, DeadlineMs: T0 + 6*3600*1000,
				ExpireAtMs: farExpiry(), NowMs: T0}
			if _, err := b.Deposit(ctx, lease); err != nil {
				t.Fatal(err)
			}
			const n = 300
			for i := range n {
				now := T0 + int64(i)*1000
				r, err := b.Reserve(ctx, key, fmt.Sprintf("r%d", i), 10, 1, now)
				if err != nil || r.Status != Reserved {
					t.Fatalf("reserve %d: %+v %v", i, r, err)
				}
				// The lease lasts 6 h; the reservation 60 s at most.
				if r.DeadlineMs != now+60_000 {
					t.Fatalf("reserve %d: deadline %d, want now+60000 = %d", i, r.DeadlineMs, now+60_000)
				}
				if i%2 == 1 { // half are given back in part, half spent whole
					if rel, err := b.Release(ctx, key, fmt.Sprintf("r%d", i), 4, now+500); err != nil || rel.Status != Released || rel.Returned != 4 {
						t.Fatalf("release %d: %+v %v", i, rel, err)
					}
				}
			}
			fields, err := be.rdb.HKeys(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fields {
				if p, _, ok := strings.Cut(f, ":"); ok && strings.Contains("vwfxgy", p) && len(p) == 1 {
					t.Fatalf("bucket holds reservation record field %q", f)
				}
			}
			// A record may go 60 s after its deadline, 120 s after it was
			// made: the last reservation (at 299 s) kept those made after
			// 179 s, 120 of them.
			if c, _ := be.rdb.ZCard(ctx, ek).Result(); c != 120 {
				t.Errorf("records indexed: %d, want 120 (those of the last 120 s)", c)
			}
			// 60 released (x: alone), 60 spent whole (f:, v:, w:).
			if h, _ := be.rdb.HLen(ctx, rk).Result(); h != 60+3*60 {
				t.Errorf("record fields: %d, want 240", h)
			}
			if ok, _ := be.rdb.HExists(ctx, rk, "v:r0").Result(); ok {
				t.Error("the first reservation's record was not dropped")
			}
			now := T0 + n*1000
			if rel, err := b.Release(ctx, key, "r2", 3, now); err != nil || rel.Status != UnknownReservation {
				t.Errorf("release of a dropped record: %+v %v, want unknown", rel, err)
			}
			if rel, err := b.Release(ctx, key, fmt.Sprintf("r%d", n-2), 3, now); err != nil || rel.Status != Released {
				t.Errorf("release of a kept record: %+v %v", rel, err)
			}
			if rel, err := b.Release(ctx, key, fmt.Sprintf("r%d", n-1), 3, now); err != nil || rel.Status != ReleasedBefore || rel.Returned != 4 {
				t.Errorf("second release of a kept record: %+v %v, want the first's 4", rel, err)
			}
			// The records expire with the bucket.
			exp, _ := be.rdb.PExpireTime(ctx, key).Result()
			for _, k := range []string{rk, ek} {
				if got, _ := be.rdb.PExpireTime(ctx, k).Result(); got != exp {
					t.Errorf("%s expires at %v, the bucket at %v", k, got, exp)
				}
			}
			// Admitted less released is what the reservations kept:
			// 300 x 10, 150 x 4 given back, 3 more by the late release.
			bal, err := b.Balance(ctx, key, now)
			if err != nil {
				t.Fatal(err)
			}
			var released int64
			for _, c := range bal.Counters {
				if c.Name == store.CounterReleased {
					released = c.Value
				}
			}
			if got, want := bal.Admitted-released, int64(n*10-150*4-3); got != want {
				t.Errorf("admitted - released = %d, want %d", got, want)
			}
		})
	}
}

// TestRecordInBucketStillEnded: a reservation an agent of an earlier
// version recorded in the bucket itself is released (and its retry
// answered) from there during a rolling upgrade, and a settle-later
// decision likewise settled.
func TestRecordInBucketStillEnded(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "old", 1)
			lease := Deposit{Key: key, LeaseID: "L", Tokens: 100, StartMs: T0, DeadlineMs: T0 + 60_000,
				ExpireAtMs: farExpiry(), NowMs: T0}
			if _, err := b.Deposit(ctx, lease); err != nil {
				t.Fatal(err)
			}
			// What the earlier reserve.lua wrote for 10 tokens, and for a
			// settle-later decision of 5 (settle by T0+30000).
			if err := be.rdb.HSet(ctx, key, "r:L", "85", "admitted", "15", "f:old", "L=10", "v:old", "10", "w:old", fmt.Sprint(T0+60_000),
				"f:dec", "L=5", "v:dec", "5", "w:dec", fmt.Sprint(T0+60_000), "g:dec", fmt.Sprint(T0+30_000)).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Reserve(ctx, key, "old", 10, 1, T0+100); err != nil {
				t.Fatal(err)
			} else if r, _ := b.Reserve(ctx, key, "old", 10, 1, T0+100); r.Status != ReplayedReservation || r.Granted != 10 {
				t.Fatalf("retried reserve of an old record: %+v, want a replay of 10", r)
			}
			rel, err := b.Release(ctx, key, "old", 4, T0+1000)
			if err != nil || rel.Status != Released || rel.Returned != 4 {
				t.Fatalf("release: %+v %v", rel, err)
			}
			if rel, _ := b.Release(ctx, key, "old", 4, T0+1100); rel.Status != ReleasedBefore || rel.Returned != 4 {
				t.Fatalf("retried release: %+v", rel)
			}
			s, err := b.Settle(ctx, key, Key("", "old", 2), "dec", 2, false, T0+2000)
			if err != nil || s.Status != Settled || s.Refunded != 3 {
				t.Fatalf("settle: %+v %v", s, err)
			}
			bal, _ := b.Balance(ctx, key, T0+2000)
			if bal.Spendable != 85+4+3 {
				t.Errorf("spendable %d, want 92 (85, 4 released, 3 refunded)", bal.Spendable)
			}
		})
	}
}

// TestSettleRecordDropped: a settle-later decision's record is kept 60 s
// past its settle-by time (a settle then is too late, and says so), then
// dropped by a later reservation (a settle then is of an unknown
// decision).
func TestSettleRecordDropped(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key, next := Key("", "llm", 1), Key("", "llm", 2)
			lease := Deposit{Key: key, LeaseID: "L", Tokens: 1000, StartMs: T0, DeadlineMs: T0 + 3600_000,
				ExpireAtMs: farExpiry(), NowMs: T0}
			if _, err := b.Deposit(ctx, lease); err != nil {
				t.Fatal(err)
			}
			r, err := b.ReserveToSettle(ctx, key, "d1", 10, 1000, T0)
			if err != nil || r.Status != Reserved || r.DeadlineMs != T0+3600_000 {
				t.Fatalf("reserve to settle: %+v %v (its deadline is the lease's, not capped)", r, err)
			}
			if s, _ := b.Settle(ctx, key, next, "d1", 3, false, T0+1500); s.Status != SettleTooLate {
				t.Fatalf("settle after its settle-by time: %+v, want too late", s)
			}
			if _, err := b.ReserveToSettle(ctx, key, "d2", 10, 1000, T0+61_000); err != nil {
				t.Fatal(err)
			}
			if s, _ := b.Settle(ctx, key, next, "d1", 3, false, T0+61_001); s.Status != UnknownDecision {
				t.Fatalf("settle after its record was dropped: %+v, want unknown", s)
			}
		})
	}
}

// TestSpendBatchReservesAndReleases: reservations and releases ride in a
// batch of spends (one pipeline) with the results single calls give; an
// invalid one fails alone; after SCRIPT FLUSH their scripts are loaded
// again.
func TestSpendBatchReservesAndReleases(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "mixed", 1)
			mustDeposit(t, ctx, b, Deposit{Key: key, LeaseID: "L", Tokens: 100, StartMs: T0, DeadlineMs: T0 + 30_000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			if r, err := b.Reserve(ctx, key, "r0", 5, 1, T0); err != nil || r.Granted != 5 {
				t.Fatalf("reserve r0: %+v %v", r, err)
			}
			if err := be.rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			ops := []SpendOp{
				{Keys: []string{key}, Costs: []int64{1}, NowMs: T0 + 10},
				{Reserve: &ReserveOp{Key: key, ID: "r1", Want: 10, Min: 1, NowMs: T0 + 10}},
				{Keys: []string{key}, Costs: []int64{2}, NowMs: T0 + 10},
				{Release: &ReleaseOp{Key: key, ID: "r0", Unspent: 3, NowMs: T0 + 10}},
				{Reserve: &ReserveOp{Key: key, ID: "bad:id", Want: 1, Min: 1}},
				{Release: &ReleaseOp{Key: key, ID: "nobody", Unspent: 1, NowMs: T0 + 10}},
				{Release: &ReleaseOp{Key: key, ID: "r0", Unspent: 4, NowMs: T0 + 10}},
				{Reserve: &ReserveOp{Key: key, ID: "s1", Want: 4, Min: 4, GraceMs: 1000, NowMs: T0 + 10}},
			}
			res, err := b.SpendBatch(ctx, ops)
			if err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || !res[2].Allowed {
				t.Errorf("spends: %+v, %+v", res[0], res[2])
			}
			if r := res[1]; r.Err != nil || r.Reserved != (Reservation{Granted: 10, DeadlineMs: T0 + 30_000, Balance: 82, NowMs: T0 + 10, Status: Reserved}) {
				t.Errorf("reserve r1: %+v", r)
			}
			if r := res[3]; r.Err != nil || r.Released != (ReleaseResult{Returned: 3, Status: Released}) {
				t.Errorf("release r0: %+v", r)
			}
			if !errors.Is(res[4].Err, ErrInvalid) {
				t.Errorf("invalid reserve: %+v, want ErrInvalid", res[4])
			}
			if r := res[5]; r.Err != nil || r.Released.Status != UnknownReservation {
				t.Errorf("release of an unknown id: %+v", r)
			}
			if r := res[6]; r.Err != nil || r.Released != (ReleaseResult{Returned: 3, Status: ReleasedBefore}) {
				t.Errorf("second release of r0: %+v", r)
			}
			if r := res[7]; r.Err != nil || r.Reserved.Granted != 4 || r.Reserved.Status != Reserved {
				t.Errorf("reserve to settle: %+v", r)
			}
			if s, err := b.Settle(ctx, key, Key("", "mixed", 2), "s1", 1, false, T0+20); err != nil || s.Status != Settled || s.Refunded != 3 {
				t.Errorf("settle of the batch's decision: %+v %v", s, err)
			}
			// 100 - 5 (r0) + 3 - 1 - 10 (r1) - 2 - 4 (s1) + 3 refunded.
			if bal, _ := b.Balance(ctx, key, T0+20); bal.Spendable != 84 {
				t.Errorf("spendable %d, want 84", bal.Spendable)
			}
		})
	}
}

// TestSpendBatchReservationsShareACall: the reservations and releases of
// a batch are decided by one script call per now (on a Cluster client, per
// hash tag and now), in order, with the results the same ops give as
// single calls one by one; an invalid one fails alone.
func TestSpendBatchReservationsShareACall(t *testing.T) {
	for _, be := range backends(t) {
		for _, cluster := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/cluster=%v", be.name, cluster), func(t *testing.T) {
				ctx := testCtx(t)
				b := New(be.rdb)
				b.anySlot = !cluster // as New does for a ClusterClient: calls per hash tag
				// The batch runs on limits p*, the same ops one by one on q*.
				keys := func(p string) (a, c string) {
					p += fmt.Sprint(cluster)
					return Key("", p+"a", 1), Key("", p+"c", 1)
				}
				ops := func(p string) []SpendOp {
					a, c := keys(p)
					return []SpendOp{
						{Reserve: &ReserveOp{Key: a, ID: "r1", Want: 10, Min: 1, NowMs: T0 + 10}},
						{Keys: []string{a}, Costs: []int64{1}, NowMs: T0 + 10},
						{Release: &ReleaseOp{Key: a, ID: "r0", Unspent: 2, NowMs: T0 + 10}},
						{Reserve: &ReserveOp{Key: c, ID: "r2", Want: 60, Min: 50, LastMs: 1000, NowMs: T0 + 10}},
						{Release: &ReleaseOp{Key: c, ID: "nobody", Unspent: 1, NowMs: T0 + 10}},
						{Reserve: &ReserveOp{Key: a, ID: "r3", Want: 95, Min: 1, NowMs: T0 + 20}}, // another now
						{Reserve: &ReserveOp{Key: a, ID: "bad:id", Want: 1, Min: 1, NowMs: T0 + 10}},
						{Reserve: &ReserveOp{Key: c, ID: "r4", Want: 60, Min: 50, NowMs: T0 + 10}}, // after r2: not enough
						{Release: &ReleaseOp{Key: a, ID: "r1", Unspent: 11, NowMs: T0 + 10}},       // more than r1 holds
					}
				}
				for _, p := range []string{"p", "q"} {
					a, c := keys(p)
					mustDeposit(t, ctx, b, Deposit{Key: a, LeaseID: "L", Tokens: 100, StartMs: T0, DeadlineMs: T0 + 30_000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
					mustDeposit(t, ctx, b, Deposit{Key: c, LeaseID: "L", Tokens: 100, StartMs: T0, DeadlineMs: T0 + 30_000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
					if r, err := b.Reserve(ctx, a, "r0", 5, 1, T0); err != nil || r.Granted != 5 {
						t.Fatalf("reserve r0: %+v %v", r, err)
					}
				}
				var one []SpendResult
				for _, op := range ops("q") {
					r, err := b.SpendBatch(ctx, []SpendOp{op})
					if err != nil && !errors.Is(err, ErrInvalid) {
						t.Fatal(err)
					}
					one = append(one, r[0])
				}
				var pipelines, calls atomic.Int64
				be.rdb.AddHook(countHook{pipelines: &pipelines, calls: &calls})
				got, err := b.SpendBatch(ctx, ops("p"))
				if err != nil {
					t.Fatal(err)
				}
				for i := range got {
					g, w := got[i], one[i]
					if (g.Err == nil) != (w.Err == nil) || g.Err != nil && g.Err.Error() != w.Err.Error() ||
						g.Reserved != w.Reserved || g.Released != w.Released || g.Allowed != w.Allowed {
						t.Errorf("op %d: batch %+v, one by one %+v", i, g, w)
					}
				}
				if !errors.Is(got[6].Err, ErrInvalid) || !errors.Is(got[8].Err, ErrUnspentTooLarge) {
					t.Errorf("invalid ops: %v, %v", got[6].Err, got[8].Err)
				}
				if r := got[3].Reserved; r.Granted != 60 || got[7].Reserved.Status != NotEnough || got[0].Reserved.Balance != 85 {
					t.Errorf("r2 %+v, r4 %+v, r1 %+v", r, got[7].Reserved, got[0].Reserved)
				}
				// The spends' call, and the reservations' per now: one
				// for T0+10 and one for T0+20 on one Redis; per hash tag
				// too on a Cluster (a and c at T0+10, a at T0+20).
				want := int64(3)
				if cluster {
					want = 4
				}
				if n := calls.Load(); pipelines.Load() != 1 || n != want {
					t.Errorf("%d pipelines, %d script calls, want 1 and %d", pipelines.Load(), n, want)
				}
			})
		}
	}
}
