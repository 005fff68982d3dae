package bucket

import (
	"errors"
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
			key := Key("", "res", 1)
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

// TestReleaseGoesBackToItsLeases: unspent tokens of a sub-lease go back
// to the leases they came from (at most what each gave, earliest deadline
// first) while those are open, so the lease's close returns them to the
// allocator; only what came from a closed lease becomes a "sub:" lease,
// lost after the reservation's deadline. (Before, every release became a
// "sub:" lease with the earliest deadline, never returned: the gateway
// stranded half of a window's G.)
func TestReleaseGoesBackToItsLeases(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "back", 1)
			for _, d := range []Deposit{
				{LeaseID: "a", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000},
				{LeaseID: "b", Tokens: 50, StartMs: T0, DeadlineMs: T0 + 9000},
				{LeaseID: "c", Tokens: 20, StartMs: T0, DeadlineMs: T0 + 9500},
			} {
				d.Key, d.ExpireAtMs, d.NowMs = key, farExpiry(), T0
				if _, err := b.Deposit(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			spendable := func(at int64) int64 {
				t.Helper()
				bal, err := b.Balance(ctx, key, at)
				if err != nil {
					t.Fatal(err)
				}
				return bal.Spendable
			}
			closeLease := func(id string, at int64) int64 {
				t.Helper()
				r, err := b.Close(ctx, key, id, at)
				if err != nil || r.AlreadyClosed {
					t.Fatalf("close %s: %+v %v", id, r, err)
				}
				return r.Unspent
			}
			// c1 takes 10 from a and 20 from b, spends 5: 10 back to a, 15 to b.
			if r, _ := b.Reserve(ctx, key, "c1", 30, 1, T0+10); r.Granted != 30 || r.DeadlineMs != T0+1000 {
				t.Fatalf("reserve c1: %+v", r)
			}
			if rel, _ := b.Release(ctx, key, "c1", 25, T0+500); rel != (ReleaseResult{Returned: 25, Status: Released}) {
				t.Fatalf("release c1: %+v", rel)
			}
			if got := spendable(T0 + 500); got != 80-5 {
				t.Fatalf("spendable after c1: %d, want 75", got)
			}
			if got := spendable(T0 + 1000); got != 45+20 {
				t.Fatalf("spendable at a's deadline: %d, want b's 45 and c's 20", got)
			}
			if n := closeLease("a", T0+1000); n != 10 {
				t.Fatalf("a closed with %d unspent, want its 10 (returned to the allocator)", n)
			}
			// c2 takes 45 from b and 5 from c; b closes before c2 is
			// released with 50 unspent: 45 stay a sub-lease until b's
			// deadline (b's return has gone), 5 go back to c.
			if r, _ := b.Reserve(ctx, key, "c2", 50, 1, T0+2000); r.Granted != 50 || r.DeadlineMs != T0+9000 {
				t.Fatalf("reserve c2: %+v", r)
			}
			if n := closeLease("b", T0+2100); n != 0 {
				t.Fatalf("b closed with %d unspent, want 0 (all reserved)", n)
			}
			if rel, _ := b.Release(ctx, key, "c2", 50, T0+2200); rel != (ReleaseResult{Returned: 50, Status: Released}) {
				t.Fatalf("release c2: %+v", rel)
			}
			if got := spendable(T0 + 8999); got != 45+20 {
				t.Fatalf("spendable before b's deadline: %d", got)
			}
			if got := spendable(T0 + 9000); got != 20 {
				t.Fatalf("spendable at b's deadline: %d, want c's 20 only", got)
			}
			// c3 takes 5 from c, released after c's deadline but before c
			// is closed: not spendable, but c's close returns it.
			if r, _ := b.Reserve(ctx, key, "c3", 5, 1, T0+9100); r.Granted != 5 {
				t.Fatalf("reserve c3: %+v", r)
			}
			if rel, _ := b.Release(ctx, key, "c3", 5, T0+9600); rel != (ReleaseResult{Returned: 0, Status: Released}) {
				t.Fatalf("release c3 after c's deadline: %+v", rel)
			}
			if n := closeLease("c", T0+9700); n != 20 {
				t.Fatalf("c closed with %d unspent, want 20 (its own 15 and c3's 5)", n)
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
					in[i] = FallbackAdd{Key: Key("", "case-fb", x.Key.Window), Cost: x.Cost, Cap: x.Cap, Mode: x.Mode}
				}
				return bk.AdmitFallback(ctx, in)
			})
			bal, _ := bk.Balance(ctx, Key("", "case-fb", 1), T0)
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
	key := Key("", "cap", 1)
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

// TestReserveLasting: with two spendable leases, one ending in 300 ms and
// one in 9 s, a reservation that wants leases lasting 1 s takes from the
// late one only (its deadline is the late lease's), at most what it holds;
// when no lasting lease holds min, from the ending one, as Reserve does.
func TestReserveLasting(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "lasting", 1)
			mustDeposit(t, ctx, b, Deposit{Key: key, LeaseID: "ending", Tokens: 40, StartMs: T0, DeadlineMs: T0 + 300, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			mustDeposit(t, ctx, b, Deposit{Key: key, LeaseID: "late", Tokens: 30, StartMs: T0, DeadlineMs: T0 + 9000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			r, err := b.ReserveLasting(ctx, key, "c1", 20, 1, 1000, T0)
			if err != nil {
				t.Fatal(err)
			}
			if r != (Reservation{Granted: 20, DeadlineMs: T0 + 9000, Balance: 50, NowMs: T0, Status: Reserved}) {
				t.Fatalf("reserve lasting 1 s: %+v, want 20 from the late lease", r)
			}
			// Want 50: the late lease has 10 left (>= min 5): those only.
			if r, _ = b.ReserveLasting(ctx, key, "c2", 50, 5, 1000, T0); r.Granted != 10 || r.DeadlineMs != T0+9000 {
				t.Fatalf("reserve lasting, late lease short of want: %+v, want its 10", r)
			}
			// Nothing lasting left: nothing taken from the ending lease (its
			// 40 are for Checks), the balance says what is spendable.
			if r, _ = b.ReserveLasting(ctx, key, "c3", 15, 1, 1000, T0); r != (Reservation{Balance: 40, NowMs: T0, Status: NotEnough}) {
				t.Fatalf("reserve lasting with only an ending lease: %+v, want nothing taken", r)
			}
			// Without last (Reserve), from the ending lease.
			if r, _ = b.Reserve(ctx, key, "c5", 15, 1, T0); r.Granted != 15 || r.DeadlineMs != T0+300 {
				t.Fatalf("reserve with only an ending lease: %+v, want 15 from it", r)
			}
			bal, _ := b.Balance(ctx, key, T0)
			if bal.Spendable != 25 || bal.Admitted != 45 {
				t.Fatalf("after the reservations: spendable %d admitted %d, want 25 and 45", bal.Spendable, bal.Admitted)
			}
			if _, err := b.ReserveLasting(ctx, key, "c4", 1, 1, -1, T0); err == nil {
				t.Fatal("a negative last was accepted")
			}
		})
	}
}

// TestReleaseOutOfRange: releasing more than a reservation holds is
// ErrUnspentTooLarge (and ErrInvalid), from the script's own status, and
// writes nothing: a right-sized release afterwards is the first.
func TestReleaseOutOfRange(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "range", 1)
			mustDeposit(t, ctx, b, Deposit{Key: key, LeaseID: "l", Tokens: 40, StartMs: T0, DeadlineMs: T0 + 9000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			if r, err := b.Reserve(ctx, key, "c1", 10, 10, T0); err != nil || r.Granted != 10 {
				t.Fatalf("reserve: %+v %v", r, err)
			}
			if _, err := b.Release(ctx, key, "c1", 11, T0); !errors.Is(err, ErrUnspentTooLarge) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("release of 11 from 10: %v, want ErrUnspentTooLarge", err)
			}
			if r, err := b.Release(ctx, key, "c1", 4, T0); err != nil || r != (ReleaseResult{Returned: 4, Status: Released}) {
				t.Fatalf("release of 4 after the refused one: %+v %v, want the first release", r, err)
			}
		})
	}
}
