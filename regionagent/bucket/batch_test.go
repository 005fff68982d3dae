package bucket

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestBatchAsSingleCalls: a renewal round's calls for several limits, sent
// in one Batch, have the outcomes the same calls have one at a time (on
// both backends), each call its own: a refused lock, an invalid call and
// a duplicate deposit do not touch the others.
func TestBatchAsSingleCalls(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			if err := b.Load(ctx); err != nil {
				t.Fatal(err)
			}
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

			x := b.Batch()
			lockA, lockB := x.TryLock(la, "me", time.Minute), x.TryLock(lb, "me", time.Minute)
			balA := x.Balance(ka, T0+1)
			bad := x.Balance("", T0+1)
			dupA := x.Deposit(depA)
			newB := x.Deposit(Deposit{Key: kb, LeaseID: "L2", Tokens: 7, StartMs: T0, DeadlineMs: T0 + 4000, ExpireAtMs: exp, NowMs: T0 + 1})
			unB := x.Unlock(lb, "me")
			if x.Len() != 7 {
				t.Fatalf("Len = %d, want 7", x.Len())
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
			if err != nil || werr != nil || got.Spendable != want.Spendable || got.Spendable != 10 {
				t.Errorf("balance of a in a batch %+v (%v), alone %+v (%v), want 10 spendable", got, err, want, werr)
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
