package bucket

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"leasehold/regionagent/store"
)

// memKeyOf names the in-memory buckets of the tests, as keyOf does the
// Redis keys of TestScripts.
func memKeyOf(name string) store.Key { return store.Key{Limit: "case", Window: int64(name[0]-'a') + 1} }

// runMem runs a step of scriptCases on an in-memory bucket.
func (s step) runMem(b *store.Mem) (any, error) {
	switch s.op {
	case "deposit":
		return b.Deposit(store.Deposit{Key: memKeyOf(s.key), LeaseID: s.id, Tokens: s.tokens,
			StartMs: s.start, DeadlineMs: s.dl, ExpireAtMs: farExpiry(), NowMs: s.now})
	case "spend":
		keys := make([]store.Key, len(s.keys))
		for i, k := range s.keys {
			keys[i] = memKeyOf(k)
		}
		return b.Spend(keys, s.costs, s.counted, s.now)
	case "close":
		return b.Close(memKeyOf(s.key), s.id, s.now)
	case "balance":
		r := b.Balance(memKeyOf(s.key), s.now)
		r.Open = nil
		return r, nil
	case "add":
		return b.AddCounter(memKeyOf(s.key), s.counter, s.tokens, s.now)
	}
	return nil, fmt.Errorf("unknown op %q", s.op)
}

// TestMemScripts replays the scripts' step tables (scriptCases, which
// TestScripts runs on redis-server and miniredis) on the in-memory bucket:
// the agent's in-process store and the simulator's bucket have the Lua
// scripts' semantics.
func TestMemScripts(t *testing.T) {
	for _, c := range scriptCases {
		t.Run(c.name, func(t *testing.T) {
			b := store.NewMem(24 * 3600 * 1000)
			for i, s := range c.steps {
				got, err := s.runMem(b)
				if err != nil {
					t.Fatalf("step %d (%s %s): %v", i, s.op, s.id, err)
				}
				if got = s.strip(got); !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d (%s %s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.id, s.now-T0, got, s.want)
				}
			}
		})
	}
}

// TestMemSpend1 checks the fast single-key spend against Spend on the same
// sequence of operations.
func TestMemSpend1(t *testing.T) {
	a, b := store.NewMem(0), store.NewMem(0)
	k := store.Key{Limit: "l", Window: 1}
	for _, x := range []*store.Mem{a, b} {
		for _, d := range []store.Deposit{
			{Key: k, LeaseID: "L1", Tokens: 3, StartMs: T0, DeadlineMs: T0 + 100, ExpireAtMs: farExpiry(), NowMs: T0},
			{Key: k, LeaseID: "L2", Tokens: 4, StartMs: T0 + 50, DeadlineMs: T0 + 200, ExpireAtMs: farExpiry(), NowMs: T0},
		} {
			if _, err := x.Deposit(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, s := range []struct {
		now, cost int64
		counted   bool
	}{{T0, 2, false}, {T0, 2, false}, {T0 + 50, 2, false}, {T0 + 99, 3, false}, {T0 + 99, 3, true}, {T0 + 100, 1, false},
		{T0 + 150, 3, false}, {T0 + 150, 3, true}, {T0 + 200, 1, true}, {T0 + 200, 1, true}, {T0 + 300, 0, true}} {
		one := a.Spend1(k, s.cost, s.counted, s.now)
		r, err := b.Spend([]store.Key{k}, []int64{s.cost}, []bool{s.counted}, s.now)
		if err != nil {
			t.Fatal(err)
		}
		if one.Allowed != r.Allowed || one != r.Keys[0] {
			t.Fatalf("spend %d: Spend1 = %+v; Spend = %+v", i, one, r)
		}
		if ga, gb := a.Balance(k, s.now), b.Balance(k, s.now); !reflect.DeepEqual(ga, gb) {
			t.Fatalf("spend %d: balances differ:\n%+v\n%+v", i, ga, gb)
		}
	}
}

// TestMemExpiry: a key disappears at its expiry, counters and closed
// markers with it, as a Redis key would.
func TestMemExpiry(t *testing.T) {
	b := store.NewMem(1000)
	k := store.Key{Limit: "l", Window: 1}
	if r, _ := b.Deposit(store.Deposit{Key: k, LeaseID: "L1", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 10, ExpireAtMs: T0 + 20, NowMs: T0}); r.Status != Deposited {
		t.Fatalf("deposit: %+v", r)
	}
	if r, _ := b.Deposit(store.Deposit{Key: k, LeaseID: "L2", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 10, ExpireAtMs: T0 + 10, NowMs: T0 + 10}); r.Status != RefusedKeyExpiry {
		t.Fatalf("deposit past expiry: %+v", r)
	}
	if r := b.Balance(k, T0+19); len(r.Expired) != 1 {
		t.Fatalf("before expiry: %+v", r)
	}
	if r := b.Balance(k, T0+20); !reflect.DeepEqual(r, BalanceResult{}) {
		t.Fatalf("after expiry: %+v", r)
	}
	b.Spend1(store.Key{Limit: "l", Window: 2}, 1, false, T0) // orphan key: TTL 1000 ms
	if r := b.Balance(store.Key{Limit: "l", Window: 2}, T0+999); r.Denied != 1 {
		t.Fatalf("orphan before TTL: %+v", r)
	}
	b.Sweep(T0 + 1000)
	if b.Keys() != 0 {
		t.Fatalf("keys after sweep: %d", b.Keys())
	}
}

// TestMemMatchesSpendScript drives the spend script (on redis-server and
// miniredis) and the in-memory bucket with the same random deposits and
// spends, counted keys among them (SpendOp.Counted), and compares every
// result, counters included: the agent's in-process store and the
// simulator decide and count as Redis does.
func TestMemMatchesSpendScript(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			m := store.NewMem(24 * 3600 * 1000)
			rng := rand.New(rand.NewPCG(3, 5))
			keys := []store.Key{{Limit: "x", Window: 1}, {Limit: "x", Window: 2}, {Limit: "y", Window: 1}}
			now := int64(T0)
			for i := range 600 {
				now += rng.Int64N(20)
				if rng.IntN(6) == 0 {
					k := keys[rng.IntN(len(keys))]
					start := now - 50 + rng.Int64N(100)
					d := store.Deposit{Key: k, LeaseID: fmt.Sprint("L", i), Tokens: 1 + rng.Int64N(12), StartMs: start,
						DeadlineMs: start + 1 + rng.Int64N(400), ExpireAtMs: farExpiry(), NowMs: now}
					got, err := b.Deposit(ctx, Deposit{Key: KeyOf(k), LeaseID: d.LeaseID, Tokens: d.Tokens, StartMs: d.StartMs,
						DeadlineMs: d.DeadlineMs, ExpireAtMs: d.ExpireAtMs, NowMs: now})
					if err != nil {
						t.Fatal(err)
					}
					want, err := m.Deposit(d)
					if err != nil || got != want {
						t.Fatalf("op %d: deposit %+v: script %+v, mem %+v (%v)", i, d, got, want, err)
					}
					continue
				}
				n := 1 + rng.IntN(3)
				ks, names := make([]store.Key, n), make([]string, n)
				costs, counted := make([]int64, n), make([]bool, n)
				for j := range n {
					ks[j] = keys[rng.IntN(len(keys))]
					names[j], costs[j], counted[j] = KeyOf(ks[j]), rng.Int64N(6), rng.IntN(3) == 0
				}
				res, err := b.SpendBatch(ctx, []SpendOp{{Keys: names, Costs: costs, Counted: counted, NowMs: now}})
				if err != nil {
					t.Fatal(err)
				}
				want, err := m.Spend(ks, costs, counted, now)
				if err != nil {
					t.Fatal(err)
				}
				got := res[0]
				got.Take, got.Reserved, got.Released = TakeResult{}, Reservation{}, ReleaseResult{}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("op %d: spend %v %v counted %v at T0%+d:\nscript %+v\nmem    %+v", i, ks, costs, counted, now-T0, got, want)
				}
			}
		})
	}
}
