package bucket

import (
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"leasehold/regionagent/store"
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
			// until T0+1000, and admitted less released drops by 5 (each
			// counter only grows).
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
			// less released drops by the unspent (never admitted).
			if rel, _ = b.Release(ctx, key, "c2", 20, T0+9000); rel != (ReleaseResult{Returned: 0, Status: Released}) {
				t.Fatalf("late release: %+v", rel)
			}
			bal, _ = b.Balance(ctx, key, T0+9000)
			// admitted: 25 + 35 - 5 (c1) + 5 (spend) - 20 (c2) = 40, as
			// admitted 65 less released 25.
			released := int64(0)
			for _, c := range bal.Counters {
				if c.Name == "released" {
					released = c.Value
				}
			}
			if bal.Admitted-released != 40 || bal.Admitted != 65 || bal.Spendable != 0 {
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

// TestAdmitFallback: a fallback admission is all or nothing and never
// takes a counter past its cap, on redis-server, miniredis and the
// in-memory store alike.
func TestAdmitFallback(t *testing.T) {
	type step struct {
		adds []store.FallbackAdd
		ok   bool
		vals []int64
	}
	a, b := store.Key{Limit: "fb", Window: 1}, store.Key{Limit: "fb", Window: 2}
	local := func(k store.Key, cost int64) store.FallbackAdd {
		return store.FallbackAdd{Key: k, Cost: cost, Cap: 5, Mode: store.CounterModeLocal}
	}
	open := func(k store.Key, cost int64) store.FallbackAdd {
		return store.FallbackAdd{Key: k, Cost: cost, Mode: store.CounterModeOpen}
	}
	steps := []step{
		{[]store.FallbackAdd{local(a, 2)}, true, []int64{2}},
		{[]store.FallbackAdd{local(a, 3)}, true, []int64{5}},
		{[]store.FallbackAdd{local(a, 1)}, false, []int64{5}},
		{[]store.FallbackAdd{open(b, 7)}, true, []int64{7}},
		{[]store.FallbackAdd{open(b, 1), local(a, 1)}, false, []int64{7, 5}}, // b is not charged
		{[]store.FallbackAdd{open(b, 1), open(b, 2)}, true, []int64{8, 10}},
	}
	check := func(t *testing.T, run func(adds []store.FallbackAdd) (bool, []int64, error)) {
		for i, s := range steps {
			ok, vals, err := run(s.adds)
			if err != nil || ok != s.ok || !reflect.DeepEqual(vals, s.vals) {
				t.Fatalf("step %d: %v %v %v, want %v %v", i, ok, vals, err, s.ok, s.vals)
			}
		}
	}
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			bk := New(be.rdb)
			check(t, func(adds []store.FallbackAdd) (bool, []int64, error) {
				in := make([]FallbackAdd, len(adds))
				for i, x := range adds {
					in[i] = FallbackAdd{Key: Key("case-fb", x.Key.Window), Cost: x.Cost, Cap: x.Cap, Mode: x.Mode}
				}
				return bk.AdmitFallback(ctx, in)
			})
			bal, _ := bk.Balance(ctx, Key("case-fb", 1), T0)
			if len(bal.Counters) != 2 || bal.Counters[1].Name != "mode_local" {
				t.Fatalf("counters %+v: want fallback_admitted and the mode mark", bal.Counters)
			}
		})
	}
	t.Run("mem", func(t *testing.T) {
		m := store.NewMem(0)
		check(t, func(adds []store.FallbackAdd) (bool, []int64, error) { return m.AdmitFallback(adds, T0) })
	})
}

// TestAdmitFallbackNeverOverCap: concurrent admissions of a local fallback
// of A = 50 on redis-server, read all the while: no reading ever exceeds
// A (a report read at any moment must never be taken back), and exactly A
// are admitted.
func TestAdmitFallbackNeverOverCap(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	key := Key("cap", 1)
	var admitted, worst atomic.Int64
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if v, err := rdb.HGet(ctx, key, "fallback_admitted").Int64(); err == nil && v > worst.Load() {
				worst.Store(v)
			}
		}
	}()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				ok, _, err := b.AdmitFallback(ctx, []FallbackAdd{{Key: key, Cost: 1, Cap: 50, Mode: "mode_local"}})
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	if admitted.Load() != 50 || worst.Load() > 50 {
		t.Fatalf("admitted %d, highest reading %d: want exactly 50, never above", admitted.Load(), worst.Load())
	}
}
