package bucket

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestBatchAsSingleCalls: a renewal round's calls and usage reads for
// several limits, sent in one Batch, have the outcomes the same calls have
// one at a time (on both backends), each call its own: a refused lock, an
// invalid call, a duplicate deposit and a limit without an epoch do not
// touch the others.
func TestBatchAsSingleCalls(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := loaded(t, ctx, be)
			ka, kb := Key("", "a", 1), Key("", "b", 1)
			la, lb := LockKey("", "a"), LockKey("", "b")
			if ok, err := b.TryLock(ctx, lb, "other", time.Minute); !ok || err != nil {
				t.Fatal(ok, err)
			}
			exp := farExpiry()
			depA := Deposit{Key: ka, LeaseID: "L1", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 5000, ExpireAtMs: exp, NowMs: T0 + 1}
			if _, err := b.Deposit(ctx, depA); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Spend(ctx, []string{ka}, []int64{3}, T0+1); err != nil {
				t.Fatal(err)
			}
			if _, err := b.AddCounter(ctx, ka, "fallback_admitted", 2); err != nil {
				t.Fatal(err)
			}
			if err := b.SetEpochs(ctx, []LimitRef{{ID: "a"}}); err != nil {
				t.Fatal(err)
			}

			x := b.Batch()
			useA, useB := x.Usage(LimitRef{ID: "a"}, []int64{1, 2}), x.Usage(LimitRef{ID: "b"}, []int64{1})
			badUse := x.Usage(LimitRef{ID: "a"}, make([]int64, MaxUsageWindows+1))
			lockA, lockB := x.TryLock(la, "me", time.Minute), x.TryLock(lb, "me", time.Minute)
			balA := x.Balance(ka, T0+1)
			bad := x.Balance("", T0+1)
			dupA := x.Deposit(depA)
			newB := x.Deposit(Deposit{Key: kb, LeaseID: "L2", Tokens: 7, StartMs: T0, DeadlineMs: T0 + 4000, ExpireAtMs: exp, NowMs: T0 + 1})
			unB := x.Unlock(lb, "me")
			if x.Len() != 10 {
				t.Fatalf("Len = %d, want 10", x.Len())
			}
			x.Exec(ctx)

			if ok, err := x.Locked(lockA); !ok || err != nil {
				t.Errorf("lock a: %v %v, want taken", ok, err)
			}
			if ok, err := x.Locked(lockB); ok || err != nil {
				t.Errorf("lock b (held by another owner): %v %v, want refused", ok, err)
			}
			got, err := x.BalanceOf(balA)
			want, werr := b.Balance(ctx, ka, T0+1)
			if err != nil || werr != nil || got.Spendable != want.Spendable || got.Spendable != 7 {
				t.Errorf("balance of a in a batch %+v (%v), alone %+v (%v), want 7 spendable (10 less 3 spent)", got, err, want, werr)
			}
			if _, err := x.BalanceOf(bad); !errors.Is(err, ErrInvalid) {
				t.Errorf("empty key: %v, want ErrInvalid", err)
			}
			if r, err := x.DepositOf(dupA); err != nil || r.Status != AlreadyDeposited {
				t.Errorf("deposit again: %+v %v, want AlreadyDeposited", r, err)
			}
			if r, err := x.DepositOf(newB); err != nil || r.Status != Deposited || r.Balance != 7 {
				t.Errorf("deposit b: %+v %v, want Deposited, 7", r, err)
			}
			epoch, counts, err := x.UsageOf(useA)
			wepoch, wcounts, werr := b.Usage(ctx, LimitRef{ID: "a"}, []int64{1, 2})
			if err != nil || werr != nil || epoch == "" || epoch != wepoch || !reflect.DeepEqual(counts, wcounts) {
				t.Errorf("usage of a in a batch %q %+v (%v), alone %q %+v (%v)", epoch, counts, err, wepoch, wcounts, werr)
			}
			if len(counts) != 2 || counts[0].Admitted != 3 || len(counts[0].Counters) != 1 || counts[0].Counters[0].Value != 2 || counts[1].Admitted != 0 {
				t.Errorf("usage of a: %+v, want 3 admitted and 2 fallback-admitted in window 1, nothing in 2", counts)
			}
			if epoch, counts, err := x.UsageOf(useB); err != nil || epoch != "" || len(counts) != 1 {
				t.Errorf("usage of b (no epoch yet): %q %+v %v, want no epoch", epoch, counts, err)
			}
			if _, _, err := x.UsageOf(badUse); !errors.Is(err, ErrInvalid) {
				t.Errorf("usage of %d windows: %v, want ErrInvalid", MaxUsageWindows+1, err)
			}
			if err := x.Unlocked(unB); !errors.Is(err, ErrNotHeld) {
				t.Errorf("unlock b (another owner's): %v, want ErrNotHeld", err)
			}
			if owner, err := be.rdb.Get(ctx, lb).Result(); err != nil || owner != "other" {
				t.Errorf("lock b's owner %q (%v), want other's lock kept", owner, err)
			}
			y := b.Batch()
			extA, extB := y.ExtendLock(la, "me", time.Hour), y.ExtendLock(lb, "me", time.Hour)
			y.Exec(ctx)
			if err := y.Extended(extA); err != nil {
				t.Errorf("extend the lock the batch took: %v", err)
			}
			if err := y.Extended(extB); !errors.Is(err, ErrNotHeld) {
				t.Errorf("extend another owner's lock: %v, want ErrNotHeld", err)
			}
			if ttl := be.rdb.PTTL(ctx, la).Val(); ttl < 59*time.Minute {
				t.Errorf("lock a's TTL %v after the extension, want about an hour", ttl)
			}
			if ttl := be.rdb.PTTL(ctx, lb).Val(); ttl > time.Minute {
				t.Errorf("lock b's TTL %v: another owner's lock was extended", ttl)
			}
			if err := b.Unlock(ctx, la, "me"); err != nil {
				t.Errorf("the lock the batch took: %v", err)
			}
		})
	}
}

// TestBatchReloadsScripts: a batch sent to a Redis that forgot its
// scripts (restart, failover, SCRIPT FLUSH) loads them and sends those
// calls again, once each.
func TestBatchReloadsScripts(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	x := b.Batch()
	var deps []int
	for i, k := range []string{Key("", "a", 1), Key("", "b", 1), Key("", "c", 1)} {
		deps = append(deps, x.Deposit(Deposit{Key: k, LeaseID: "L", Tokens: int64(i + 1), StartMs: T0, DeadlineMs: T0 + 1000,
			ExpireAtMs: farExpiry(), NowMs: T0}))
	}
	bal := x.Balance(Key("", "a", 1), T0)
	x.Exec(ctx)
	for i, d := range deps {
		if r, err := x.DepositOf(d); err != nil || r.Status != Deposited || r.Balance != int64(i+1) {
			t.Errorf("deposit %d after SCRIPT FLUSH: %+v %v", i, r, err)
		}
	}
	if r, err := x.BalanceOf(bal); err != nil || r.Spendable != 1 {
		t.Errorf("balance after SCRIPT FLUSH: %+v %v", r, err)
	}
}

// TestBatchRedisDown: with Redis unreachable every call of the batch
// fails, each with its own error.
func TestBatchRedisDown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	x := New(rdb).Batch()
	l := x.TryLock(LockKey("", "a"), "me", time.Second)
	d := x.Deposit(Deposit{Key: Key("", "a", 1), LeaseID: "L", Tokens: 1, StartMs: T0, DeadlineMs: T0 + 1, ExpireAtMs: T0 + 1})
	x.Exec(testCtx(t))
	if _, err := x.Locked(l); err == nil {
		t.Error("lock with Redis down: no error")
	}
	if _, err := x.DepositOf(d); err == nil {
		t.Error("deposit with Redis down: no error")
	}
}

// TestSpendBatchDepositsFirst: a spend that carries a deposit (a region's
// standing share) spends from it in the same batch, and so does every
// spend of the batch on that key, even one before it in the batch: the
// deposits go first. A deposit made again is a duplicate (the share is
// deposited once, whichever replica comes first), and a deposit that is
// invalid fails alone: its spend is decided.
func TestSpendBatchDepositsFirst(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := loaded(t, ctx, be)
			k := Key("", "s", 1)
			share := Deposit{Key: k, LeaseID: "1/eu/~standing", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 5000, ExpireAtMs: farExpiry(), NowMs: T0 + 1}
			res, err := b.SpendBatch(ctx, []SpendOp{
				{Keys: []string{k}, Costs: []int64{2}, NowMs: T0 + 1},
				{Keys: []string{k}, Costs: []int64{1}, NowMs: T0 + 1, Deposit: &share},
			})
			if err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || !res[1].Allowed || res[1].Keys[0].Balance != 2 {
				t.Fatalf("spends with the share deposited in the batch: %+v", res)
			}
			if res[1].DepositErr != nil || res[1].Deposited.Status != Deposited || res[0].Deposited.Status != 0 {
				t.Fatalf("deposit outcome: %+v, %v (the other op: %+v)", res[1].Deposited, res[1].DepositErr, res[0].Deposited)
			}
			bad := share
			bad.Tokens = 0
			res, err = b.SpendBatch(ctx, []SpendOp{
				{Keys: []string{k}, Costs: []int64{1}, NowMs: T0 + 2, Deposit: &share},
				{Keys: []string{k}, Costs: []int64{1}, NowMs: T0 + 2, Deposit: &bad},
			})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Deposited.Status != AlreadyDeposited || !res[0].Allowed || res[0].Keys[0].Balance != 1 {
				t.Fatalf("the share deposited again: %+v", res[0])
			}
			if res[1].DepositErr == nil || !res[1].Allowed || res[1].Keys[0].Balance != 0 {
				t.Fatalf("an invalid deposit with its spend: %+v", res[1])
			}

			// On Redis's own clock (NowMs 0, as the agent spends), with
			// one scratch for batch after batch: spends never join a
			// deposit's call, in this batch or the next.
			var sc SpendScratch
			k2 := Key("", "s", 2)
			onRedis := Deposit{Key: k2, LeaseID: "2/eu/~standing", Tokens: 5, DeadlineMs: farExpiry() - 1, ExpireAtMs: farExpiry()}
			for round := range 2 {
				ops := []SpendOp{{Keys: []string{k2}, Costs: []int64{1}}, {Keys: []string{k2}, Costs: []int64{1}}}
				if round == 0 {
					ops[1].Deposit = &onRedis
				}
				res, err = b.SpendBatchInto(ctx, ops, &sc)
				if err != nil {
					t.Fatal(err)
				}
				want := int64(3 - 2*round)
				if !res[0].Allowed || !res[1].Allowed || res[1].Keys[0].Balance != want || res[1].Keys[0].Admitted != 2+2*int64(round) {
					t.Fatalf("batch %d on Redis's clock: %+v", round, res)
				}
			}
		})
	}
}
