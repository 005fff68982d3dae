package bucket

import (
	"errors"
	"testing"
)

// counter returns the named counter of a bucket at now.
func counter(t *testing.T, b *Buckets, key, name string, nowMs int64) int64 {
	t.Helper()
	bal, err := b.Balance(testCtx(t), key, nowMs)
	if err != nil {
		t.Fatal(err)
	}
	if name == "admitted" {
		return bal.Admitted
	}
	for _, c := range bal.Counters {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}

// TestSettle runs on redis-server and miniredis with the same Lua: a
// refund, a charge the window absorbs, an overrun carried as debt into the
// next window (paid from its open lease and from its next deposit), a
// forgiven overrun, retries, and the refusals.
func TestSettle(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key, next := Key("", "st", 1), Key("", "st", 2)
			deposit := func(k, id string, tokens int64) {
				t.Helper()
				d := Deposit{Key: k, LeaseID: id, Tokens: tokens, StartMs: T0, DeadlineMs: T0 + 9000, ExpireAtMs: farExpiry(), NowMs: T0}
				if _, err := b.Deposit(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			deposit(key, "a", 100)
			reserve := func(id string, est int64) {
				t.Helper()
				r, err := b.ReserveToSettle(ctx, key, id, est, 4990, T0+10)
				if err != nil || r.Status != Reserved || r.Granted != est {
					t.Fatalf("reserve %s: %+v %v", id, r, err)
				}
			}
			reserve("d1", 30)
			reserve("d2", 30)
			reserve("d3", 30)
			// 10 spendable left. d1 cost 10: a refund of 20.
			s, err := b.Settle(ctx, key, next, "d1", 10, true, T0+100)
			if err != nil || s != (Settlement{Status: Settled, Estimate: 30, Refunded: 20}) {
				t.Fatalf("refund: %+v %v", s, err)
			}
			if s, _ = b.Settle(ctx, key, next, "d1", 10, true, T0+200); s != (Settlement{Status: SettledBefore, Estimate: 30, Refunded: 20}) {
				t.Fatalf("retried refund: %+v", s)
			}
			if s, _ = b.Settle(ctx, key, next, "d1", 11, true, T0+200); s.Status != SettledOtherwise || s.Refunded != 20 {
				t.Fatalf("another actual: %+v", s)
			}
			// 30 spendable. d2 cost 50: 20 more, absorbed.
			if s, _ = b.Settle(ctx, key, next, "d2", 50, true, T0+300); s != (Settlement{Status: Settled, Estimate: 30, Charged: 20}) {
				t.Fatalf("charge: %+v", s)
			}
			// 10 spendable. The next window holds a lease of 5 already.
			deposit(next, "n1", 5)
			// d3 cost 70: 40 more, 10 absorbed, 30 overrun carried: 5 from
			// n1 now, 25 owed by the next deposit.
			if s, _ = b.Settle(ctx, key, next, "d3", 70, true, T0+400); s != (Settlement{Status: Settled, Estimate: 30, Charged: 10, Overrun: 30, Debt: 30}) {
				t.Fatalf("overrun: %+v", s)
			}
			// Admitted in window 1: 10 + 50 + 70 = 130 = 100 leased + 30 overrun.
			if a, r := counter(t, b, key, "admitted", T0+400), counter(t, b, key, "released", T0+400); a-r != 130 {
				t.Fatalf("admitted %d released %d", a, r)
			}
			if o := counter(t, b, key, "settle_overrun", T0+400); o != 30 {
				t.Fatalf("settle_overrun %d", o)
			}
			deposit(next, "n2", 100)
			bal, _ := b.Balance(ctx, next, T0+500)
			if bal.Spendable != 75 || bal.Admitted != 30 {
				t.Fatalf("next window after debt: %+v", bal)
			}
			if p, o := counter(t, b, next, "debt_paid", T0+500), counter(t, b, next, "debt_owed", T0+500); p != 30 || o != 30 {
				t.Fatalf("debt paid %d owed %d", p, o)
			}
			// A forgiven overrun is counted in its window only.
			k3, k4 := Key("", "st", 3), Key("", "st", 4)
			deposit(k3, "c", 20)
			if r, err := b.ReserveToSettle(ctx, k3, "f1", 10, 4990, T0+10); err != nil || r.Status != Reserved {
				t.Fatalf("reserve f1: %+v %v", r, err)
			}
			if s, _ = b.Settle(ctx, k3, k4, "f1", 35, false, T0+100); s != (Settlement{Status: Settled, Estimate: 10, Charged: 10, Overrun: 15}) {
				t.Fatalf("forgiven: %+v", s)
			}
			if o := counter(t, b, k4, "debt_owed", T0+100); o != 0 {
				t.Fatalf("forgiven overrun owed %d", o)
			}
			// Refusals: unknown, too late, released by Release, bad input.
			deposit(k3, "c2", 2)
			if s, _ = b.Settle(ctx, k3, k4, "nope", 1, true, T0+100); s.Status != UnknownDecision {
				t.Fatalf("unknown: %+v", s)
			}
			_, _ = b.ReserveToSettle(ctx, k3, "late", 1, 4990, T0+10)
			if s, _ = b.Settle(ctx, k3, k4, "late", 1, true, T0+5001); s.Status != SettleTooLate {
				t.Fatalf("late: %+v", s)
			}
			if s, _ = b.Settle(ctx, k3, k4, "late", 1, true, T0+5000); s.Status != Settled {
				t.Fatalf("at the settle-by time: %+v", s)
			}
			_, _ = b.ReserveToSettle(ctx, k3, "rel", 1, 4990, T0+10)
			if _, err := b.Release(ctx, k3, "rel", 1, T0+20); err != nil {
				t.Fatal(err)
			}
			if s, _ = b.Settle(ctx, k3, k4, "rel", 1, true, T0+30); s.Status != UnknownDecision {
				t.Fatalf("released: %+v", s)
			}
			for name, err := range map[string]error{
				"negative actual": func() error { _, err := b.Settle(ctx, k3, k4, "x", -1, true, T0); return err }(),
				"same keys":       func() error { _, err := b.Settle(ctx, k3, k3, "x", 1, true, T0); return err }(),
				"id with colon":   func() error { _, err := b.Settle(ctx, k3, k4, "a:b", 1, true, T0); return err }(),
				"no settle grace": func() error { _, err := b.ReserveToSettle(ctx, k3, "y", 1, 0, T0); return err }(),
			} {
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("%s: %v, want ErrInvalid", name, err)
				}
			}
		})
	}
}
