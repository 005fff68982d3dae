package store

import "testing"

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
	if r := m.Spend1(k, 2, 2); !r.Allowed {
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
