package simulations

import (
	"fmt"
	"reflect"
	"testing"

	"leasehold/regionagent/bucket"
)

// The step tables below are regionagent/bucket's scriptCases
// (bucket_test.go), which run the Lua scripts on redis-server and on
// miniredis. Replaying them on the in-memory Bucket shows it has the same
// semantics. Keep them in step with the originals.

const T0 = int64(1_700_000_000_000)

// farExpiry is a key expiry after every instant of the tables.
const farExpiry = T0 + 3_600_000

type step struct {
	op      string // deposit, spend, close, balance, add
	key     string
	keys    []string
	costs   []int64
	id      string
	tokens  int64
	start   int64
	dl      int64
	now     int64
	counter string
	want    any
}

func dep(key, id string, tokens, start, dl, now int64, status bucket.DepositStatus, bal int64) step {
	return step{op: "deposit", key: key, id: id, tokens: tokens, start: start, dl: dl, now: now,
		want: bucket.DepositResult{Status: status, Balance: bal}}
}

type kc struct {
	key  string
	cost int64
}

func spend(now int64, kcs []kc, allowed bool, failed int, keys ...bucket.KeyResult) step {
	s := step{op: "spend", now: now, want: bucket.SpendResult{Allowed: allowed, Failed: failed, Keys: keys}}
	for _, x := range kcs {
		s.keys = append(s.keys, x.key)
		s.costs = append(s.costs, x.cost)
	}
	return s
}

func yes(bal, earliest int64) bucket.KeyResult {
	return bucket.KeyResult{Allowed: true, Balance: bal, EarliestDeadlineMs: earliest}
}
func no(bal, earliest int64) bucket.KeyResult {
	return bucket.KeyResult{Allowed: false, Balance: bal, EarliestDeadlineMs: earliest}
}

func closeL(key, id string, now, unspent int64, already, unknown bool, bal int64) step {
	return step{op: "close", key: key, id: id, now: now,
		want: bucket.CloseResult{Unspent: unspent, AlreadyClosed: already, Unknown: unknown, Balance: bal}}
}

func bal(key string, now int64, want bucket.BalanceResult) step {
	return step{op: "balance", key: key, now: now, want: want}
}

func add(key, counter string, delta, want int64) step {
	return step{op: "add", key: key, counter: counter, tokens: delta, now: T0, want: want}
}

func keyOf(name string) BKey { return BKey{Limit: "case", Window: int64(name[0]-'a') + 1} }

func (s step) run(b *Bucket) (any, error) {
	switch s.op {
	case "deposit":
		return b.Deposit(Deposit{Key: keyOf(s.key), LeaseID: s.id, Tokens: s.tokens,
			StartMs: s.start, DeadlineMs: s.dl, ExpireAtMs: farExpiry, NowMs: s.now})
	case "spend":
		keys := make([]BKey, len(s.keys))
		for i, k := range s.keys {
			keys[i] = keyOf(k)
		}
		return b.Spend(keys, s.costs, s.now)
	case "close":
		return b.Close(keyOf(s.key), s.id, s.now)
	case "balance":
		r := b.Balance(keyOf(s.key), s.now)
		r.Open = nil
		return r, nil
	case "add":
		return b.AddCounter(keyOf(s.key), s.counter, s.tokens, s.now)
	}
	return nil, fmt.Errorf("unknown op %q", s.op)
}

type (
	BR = bucket.BalanceResult
	EL = bucket.ExpiredLease
)

const (
	Deposited        = bucket.Deposited
	AlreadyDeposited = bucket.AlreadyDeposited
	RefusedClosed    = bucket.RefusedClosed
)

var scriptCases = []struct {
	name  string
	steps []step
}{
	{"deposit is idempotent by lease id", []step{
		dep("a", "L1", 100, T0, T0+1000, T0, Deposited, 100),
		dep("a", "L1", 100, T0, T0+1000, T0, AlreadyDeposited, 100),
		dep("a", "L1", 7, T0, T0+5, T0, AlreadyDeposited, 100),
		spend(T0, []kc{{"a", 10}}, true, -1, yes(90, T0+1000)),
		dep("a", "L1", 100, T0, T0+1000, T0, AlreadyDeposited, 90),
		bal("a", T0, BR{Spendable: 90, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 10}),
	}},
	{"start inclusive, deadline exclusive", []step{
		dep("a", "L1", 10, T0+100, T0+200, T0, Deposited, 0),
		bal("a", T0, BR{Pending: 10}),
		spend(T0+99, []kc{{"a", 1}}, false, 0, no(0, 0)),
		spend(T0+100, []kc{{"a", 1}}, true, -1, yes(9, T0+200)),
		spend(T0+199, []kc{{"a", 1}}, true, -1, yes(8, T0+200)),
		spend(T0+200, []kc{{"a", 1}}, false, 0, no(0, 0)),
		spend(T0+5000, []kc{{"a", 1}}, false, 0, no(0, 0)),
		bal("a", T0+200, BR{Admitted: 2, Denied: 3, Expired: []EL{{ID: "L1", Remaining: 8}}}),
		closeL("a", "L1", T0+200, 8, false, false, 0),
		bal("a", T0+200, BR{Admitted: 2, Denied: 3}),
	}},
	{"earliest deadline first, split across leases", []step{
		dep("a", "L1", 50, T0, T0+2000, T0, Deposited, 50),
		dep("a", "L2", 50, T0, T0+1000, T0, Deposited, 100),
		dep("a", "L3", 50, T0+500, T0+3000, T0, Deposited, 100),
		spend(T0, []kc{{"a", 60}}, true, -1, yes(40, T0+2000)),
		bal("a", T0, BR{Spendable: 40, Live: 2, EarliestDeadlineMs: T0 + 2000, Pending: 50, Admitted: 60}),
		spend(T0+500, []kc{{"a", 40}}, true, -1, yes(50, T0+3000)),
		closeL("a", "L2", T0+500, 0, false, false, 50),
		closeL("a", "L1", T0+500, 0, false, false, 50),
		closeL("a", "L3", T0+500, 50, false, false, 0),
	}},
	{"equal deadlines pay by lease id", []step{
		dep("a", "Lb", 5, T0, T0+1000, T0, Deposited, 5),
		dep("a", "La", 5, T0, T0+1000, T0, Deposited, 10),
		spend(T0, []kc{{"a", 7}}, true, -1, yes(3, T0+1000)),
		closeL("a", "La", T0, 0, false, false, 3),
		closeL("a", "Lb", T0, 3, false, false, 0),
	}},
	{"drain exactly, then deny", []step{
		dep("a", "L1", 5, T0, T0+1000, T0, Deposited, 5),
		spend(T0, []kc{{"a", 5}}, true, -1, yes(0, 0)),
		spend(T0, []kc{{"a", 1}}, false, 0, no(0, 0)),
		bal("a", T0, BR{Live: 1, Admitted: 5, Denied: 1}),
	}},
	{"close returns the unspent amount once", []step{
		dep("a", "L1", 100, T0, T0+1000, T0, Deposited, 100),
		spend(T0, []kc{{"a", 30}}, true, -1, yes(70, T0+1000)),
		closeL("a", "L1", T0+10, 70, false, false, 0),
		closeL("a", "L1", T0+10, 70, true, false, 0),
		closeL("a", "L1", T0+2000, 70, true, false, 0),
		spend(T0+20, []kc{{"a", 1}}, false, 0, no(0, 0)),
		dep("a", "L1", 100, T0, T0+1000, T0+30, RefusedClosed, 0),
		spend(T0+40, []kc{{"a", 1}}, false, 0, no(0, 0)),
		closeL("a", "L1", T0+50, 70, true, false, 0),
		bal("a", T0+50, BR{Admitted: 30, Denied: 2}),
	}},
	{"closing an unknown lease refuses its late deposit", []step{
		closeL("a", "L9", T0, 0, false, true, 0),
		closeL("a", "L9", T0, 0, true, false, 0),
		dep("a", "L9", 100, T0, T0+1000, T0, RefusedClosed, 0),
		spend(T0, []kc{{"a", 1}}, false, 0, no(0, 0)),
		closeL("a", "L9", T0, 0, true, false, 0),
	}},
	{"a closed lease is not spent", []step{
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		dep("a", "L2", 10, T0, T0+2000, T0, Deposited, 20),
		closeL("a", "L1", T0, 10, false, false, 10),
		spend(T0, []kc{{"a", 15}}, false, 0, no(10, T0+2000)),
		spend(T0, []kc{{"a", 10}}, true, -1, yes(0, 0)),
		closeL("a", "L2", T0, 0, false, false, 0),
	}},
	{"expired leases are listed until closed", []step{
		dep("a", "L1", 30, T0, T0+100, T0, Deposited, 30),
		dep("a", "L2", 20, T0, T0+300, T0, Deposited, 50),
		dep("a", "L3", 5, T0, T0+100, T0, Deposited, 55),
		dep("a", "L4", 9, T0, T0+50, T0+60, Deposited, 55),
		bal("a", T0+100, BR{Spendable: 20, Live: 1, EarliestDeadlineMs: T0 + 300,
			Expired: []EL{{ID: "L4", Remaining: 9}, {ID: "L1", Remaining: 30}, {ID: "L3", Remaining: 5}}}),
		closeL("a", "L1", T0+100, 30, false, false, 20),
		bal("a", T0+300, BR{Expired: []EL{{ID: "L4", Remaining: 9}, {ID: "L3", Remaining: 5}, {ID: "L2", Remaining: 20}}}),
	}},
	{"multi-key spend is all or nothing", []step{
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		dep("b", "L2", 5, T0, T0+2000, T0, Deposited, 5),
		spend(T0, []kc{{"a", 3}, {"b", 6}}, false, 1, yes(10, T0+1000), no(5, T0+2000)),
		bal("a", T0, BR{Spendable: 10, Live: 1, EarliestDeadlineMs: T0 + 1000}),
		bal("b", T0, BR{Spendable: 5, Live: 1, EarliestDeadlineMs: T0 + 2000, Denied: 6}),
		spend(T0, []kc{{"a", 3}, {"b", 5}}, true, -1, yes(7, T0+1000), yes(0, 0)),
		spend(T0, []kc{{"b", 1}, {"a", 1}}, false, 0, no(0, 0), yes(7, T0+1000)),
		bal("a", T0, BR{Spendable: 7, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 3}),
		bal("b", T0, BR{Live: 1, Admitted: 5, Denied: 7}),
	}},
	{"multi-key reports the first failing key", []step{
		dep("a", "L1", 1, T0, T0+1000, T0, Deposited, 1),
		spend(T0, []kc{{"a", 1}, {"b", 1}, {"c", 2}}, false, 1, yes(1, T0+1000), no(0, 0), no(0, 0)),
		bal("c", T0, BR{Denied: 2}),
	}},
	{"a key given twice pays both costs", []step{
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		spend(T0, []kc{{"a", 6}, {"a", 6}}, false, 0, no(10, T0+1000), no(10, T0+1000)),
		spend(T0, []kc{{"a", 4}, {"a", 6}}, true, -1, yes(0, 0), yes(0, 0)),
		bal("a", T0, BR{Live: 1, Admitted: 10, Denied: 12}),
	}},
	{"zero cost is always allowed", []step{
		spend(T0, []kc{{"a", 0}}, true, -1, yes(0, 0)),
		bal("a", T0, BR{}),
	}},
	{"named counters", []step{
		add("a", "fallback_admitted", 5, 5),
		add("a", "fallback_admitted", 2, 7),
		add("a", "zz", -1, -1),
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		bal("a", T0, BR{Spendable: 10, Live: 1, EarliestDeadlineMs: T0 + 1000,
			Counters: []bucket.Counter{{Name: "fallback_admitted", Value: 7}, {Name: "zz", Value: -1}}}),
	}},
	{"large values stay exact", []step{
		dep("a", "L1", 1<<52, T0, T0+1000, T0, Deposited, 1<<52),
		spend(T0, []kc{{"a", 1<<51 + 3}}, true, -1, yes(1<<52-1<<51-3, T0+1000)),
		closeL("a", "L1", T0, 1<<52-1<<51-3, false, false, 0),
	}},
}

func TestBucketScripts(t *testing.T) {
	for _, c := range scriptCases {
		t.Run(c.name, func(t *testing.T) {
			b := NewBucket(24 * 3600 * 1000)
			for i, s := range c.steps {
				got, err := s.run(b)
				if err != nil {
					t.Fatalf("step %d (%s %s): %v", i, s.op, s.id, err)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d (%s %s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.id, s.now-T0, got, s.want)
				}
			}
		})
	}
}

// TestBucketSpend1 checks the fast single-key spend against Spend on the
// same sequence of operations.
func TestBucketSpend1(t *testing.T) {
	a, b := NewBucket(0), NewBucket(0)
	k := BKey{"l", 1}
	for _, x := range []*Bucket{a, b} {
		for _, d := range []Deposit{
			{Key: k, LeaseID: "L1", Tokens: 3, StartMs: T0, DeadlineMs: T0 + 100, ExpireAtMs: farExpiry, NowMs: T0},
			{Key: k, LeaseID: "L2", Tokens: 4, StartMs: T0 + 50, DeadlineMs: T0 + 200, ExpireAtMs: farExpiry, NowMs: T0},
		} {
			if _, err := x.Deposit(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, s := range []struct{ now, cost int64 }{{T0, 2}, {T0, 2}, {T0 + 50, 2}, {T0 + 99, 3}, {T0 + 100, 1}, {T0 + 150, 3}, {T0 + 200, 1}, {T0 + 300, 0}} {
		ok, balance := a.Spend1(k, s.cost, s.now)
		r, err := b.Spend([]BKey{k}, []int64{s.cost}, s.now)
		if err != nil {
			t.Fatal(err)
		}
		if ok != r.Allowed || balance != r.Keys[0].Balance {
			t.Fatalf("spend %d: Spend1 = %v, %d; Spend = %+v", i, ok, balance, r)
		}
		if ga, gb := a.Balance(k, s.now), b.Balance(k, s.now); !reflect.DeepEqual(ga, gb) {
			t.Fatalf("spend %d: balances differ:\n%+v\n%+v", i, ga, gb)
		}
	}
}

// TestBucketExpiry: a key disappears at its expiry, counters and closed
// markers with it, as a Redis key would.
func TestBucketExpiry(t *testing.T) {
	b := NewBucket(1000)
	k := BKey{"l", 1}
	if r, _ := b.Deposit(Deposit{Key: k, LeaseID: "L1", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 10, ExpireAtMs: T0 + 20, NowMs: T0}); r.Status != Deposited {
		t.Fatalf("deposit: %+v", r)
	}
	if r, _ := b.Deposit(Deposit{Key: k, LeaseID: "L2", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 10, ExpireAtMs: T0 + 10, NowMs: T0 + 10}); r.Status != bucket.RefusedKeyExpiry {
		t.Fatalf("deposit past expiry: %+v", r)
	}
	if r := b.Balance(k, T0+19); len(r.Expired) != 1 {
		t.Fatalf("before expiry: %+v", r)
	}
	if r := b.Balance(k, T0+20); !reflect.DeepEqual(r, bucket.BalanceResult{}) {
		t.Fatalf("after expiry: %+v", r)
	}
	b.Spend1(BKey{"l", 2}, 1, T0) // orphan key: TTL 1000 ms
	if r := b.Balance(BKey{"l", 2}, T0+999); r.Denied != 1 {
		t.Fatalf("orphan before TTL: %+v", r)
	}
	b.Sweep(T0 + 1000)
	if b.Keys() != 0 {
		t.Fatalf("keys after sweep: %d", b.Keys())
	}
}
