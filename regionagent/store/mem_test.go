package store

import (
	"testing"

	"leasehold/lease"
)

// A clone is a snapshot: writes to either side after it do not reach the
// other (the explorer's model of a Redis failover rests on it).
func TestMemCloneIsDeep(t *testing.T) {
	k := Key{Limit: "L", Window: 1}
	m := NewMem(0)
	if _, err := m.Deposit(Deposit{Key: k, LeaseID: "a", Tokens: 3, DeadlineMs: 100, ExpireAtMs: 200, NowMs: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddCounter(k, CounterModeLocal, 1, 1); err != nil {
		t.Fatal(err)
	}
	c := m.Clone()
	if r := m.Spend1(k, 2, false, 2); !r.Allowed {
		t.Fatalf("spend: %+v", r)
	}
	if _, err := m.Close(k, "a", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddCounter(k, CounterModeLocal, 5, 3); err != nil {
		t.Fatal(err)
	}
	b := c.Balance(k, 3)
	if b.Spendable != 3 || b.Admitted != 0 || len(b.Counters) != 1 || b.Counters[0].Value != 1 {
		t.Fatalf("the clone saw later writes: %+v", b)
	}
	if got := m.Balance(k, 3); got.Spendable != 0 || got.Admitted != 2 {
		t.Fatalf("the original: %+v", got)
	}
}

// A clone copies the token buckets of bucket limits too, deeply: a
// failover to the clone brings back the level it had, and takes on either
// side do not reach the other.
func TestMemCloneRates(t *testing.T) {
	k := RateKey{Limit: "B"}
	m := NewMem(0)
	share := lease.BucketShare{Seq: 1, Rate: 10_000, Burst: 5, Unit: 1_000_000, DeadlineMs: 100_000}
	if _, err := m.InstallShare(ShareInstall{Key: k, Share: share, ExpireAtMs: 200_000, NowMs: 1}); err != nil {
		t.Fatal(err)
	}
	if r, _ := m.Take(k, 3, 1_000, false); !r.Allowed || r.Tokens != 2 {
		t.Fatalf("take: %+v", r)
	}
	c := m.Clone()
	if r, _ := m.Take(k, 2, 1_000, false); !r.Allowed || r.Tokens != 0 {
		t.Fatalf("take on the original: %+v", r)
	}
	if r, _ := c.Take(k, 2, 1_000, false); !r.Allowed || r.Tokens != 0 || r.Admitted != 5 {
		t.Fatalf("take on the clone (the spend lost in the failover is admitted again): %+v", r)
	}
	if NewMem(0).Clone().rates == nil {
		t.Fatal("a clone's rates are nil where a new Mem's are empty: equal states would differ")
	}
}

// A refused spend makes its key (its denied counter, with the orphan
// TTL); a counted one adds nothing, so it makes no key either, as
// spend.lua writes nothing then.
func TestMemCountedRefusalMakesNoKey(t *testing.T) {
	m := NewMem(1000)
	k := Key{Limit: "L", Window: 1}
	if r := m.Spend1(k, 1, true, 1); r.Allowed || r.Denied != 0 {
		t.Fatalf("counted spend of a missing key: %+v", r)
	}
	if r, _ := m.Spend([]Key{k}, []int64{1}, []bool{true}, 1); r.Allowed || r.Keys[0].Denied != 0 {
		t.Fatalf("counted spend of a missing key: %+v", r)
	}
	if n := m.Keys(); n != 0 {
		t.Fatalf("%d keys after counted refusals, want 0", n)
	}
	if r := m.Spend1(k, 1, false, 1); r.Denied != 1 || m.Keys() != 1 {
		t.Fatalf("a first refusal: %+v, %d keys", r, m.Keys())
	}
}
