package bucket

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// step is one call of a step table, at an explicit Redis instant (now).
// Keys are logical names ("a", "b", "c") that each case maps to real keys.
type step struct {
	op      string // deposit, spend, close, balance, add
	key     string
	keys    []string
	costs   []int64
	counted []bool // spend: SpendOp.Counted (the step runs as a batch of one)
	id      string
	tokens  int64
	start   int64
	dl      int64
	now     int64
	counter string
	want    any
	// counts: the spend's expected KeyResults include Count and PoolSpent
	// (the other step tables check balances; strip compares them without).
	counts bool
}

// strip removes the demand counts and pool-spent marks of a spend result
// unless the step expects them.
func (s step) strip(got any) any {
	if r, ok := got.(SpendResult); ok && !s.counts {
		return stripCounts(r)
	}
	return got
}

func stripCounts(r SpendResult) SpendResult {
	keys := make([]KeyResult, len(r.Keys))
	for i, k := range r.Keys {
		k.Admitted, k.Denied, k.PoolSpent = 0, 0, false
		keys[i] = k
	}
	if r.Keys != nil {
		r.Keys = keys
	}
	return r
}

func dep(key, id string, tokens, start, dl, now int64, status DepositStatus, bal int64) step {
	return step{op: "deposit", key: key, id: id, tokens: tokens, start: start, dl: dl, now: now,
		want: DepositResult{Status: status, Balance: bal}}
}

// kc is a logical key and a cost, for spend steps.
type kc struct {
	key  string
	cost int64
}

func spend(now int64, kcs []kc, allowed bool, failed int, keys ...KeyResult) step {
	s := step{op: "spend", now: now, want: SpendResult{Allowed: allowed, Failed: failed, Keys: keys}}
	for _, x := range kcs {
		s.keys = append(s.keys, x.key)
		s.costs = append(s.costs, x.cost)
	}
	return s
}

func yes(bal, earliest int64) KeyResult {
	return KeyResult{Allowed: true, Balance: bal, EarliestDeadlineMs: earliest}
}
func no(bal, earliest int64) KeyResult {
	return KeyResult{Allowed: false, Balance: bal, EarliestDeadlineMs: earliest}
}

// counted is a spend step whose keys' results carry their counters and
// pool-spent marks: kr(...).
func counted(now int64, kcs []kc, allowed bool, failed int, keys ...KeyResult) step {
	s := spend(now, kcs, allowed, failed, keys...)
	s.counts = true
	return s
}

// again is spend step s as a later attempt of a request refused before:
// flags[i] marks key i as counted (SpendOp.Counted).
func again(s step, flags ...bool) step {
	s.counted = flags
	return s
}

func kr(allowed bool, bal, earliest, admitted, denied int64, spent bool) KeyResult {
	return KeyResult{Allowed: allowed, Balance: bal, EarliestDeadlineMs: earliest, Admitted: admitted, Denied: denied,
		PoolSpent: spent}
}

func closeL(key, id string, now, unspent int64, already, unknown bool, bal int64) step {
	return step{op: "close", key: key, id: id, now: now,
		want: CloseResult{Unspent: unspent, AlreadyClosed: already, Unknown: unknown, Balance: bal}}
}

func bal(key string, now int64, want BalanceResult) step {
	return step{op: "balance", key: key, now: now, want: want}
}

// add's now is only for the in-memory bucket (add.lua takes no time).
func add(key, counter string, delta, want int64) step {
	return step{op: "add", key: key, counter: counter, tokens: delta, now: T0, want: want}
}

func (s step) run(ctx context.Context, b *Buckets, keyOf func(string) string) (any, error) {
	switch s.op {
	case "deposit":
		return b.Deposit(ctx, Deposit{Key: keyOf(s.key), LeaseID: s.id, Tokens: s.tokens,
			StartMs: s.start, DeadlineMs: s.dl, ExpireAtMs: farExpiry(), NowMs: s.now})
	case "spend":
		keys := make([]string, len(s.keys))
		for i, k := range s.keys {
			keys[i] = keyOf(k)
		}
		if s.counted != nil {
			res, err := b.SpendBatch(ctx, []SpendOp{{Keys: keys, Costs: s.costs, Counted: s.counted, NowMs: s.now}})
			if err != nil {
				return nil, err
			}
			return res[0], nil
		}
		return b.Spend(ctx, keys, s.costs, s.now)
	case "close":
		return b.Close(ctx, keyOf(s.key), s.id, s.now)
	case "balance":
		// The open-lease list has its own test (TestOpenLeases); the step
		// tables check the aggregates.
		r, err := b.Balance(ctx, keyOf(s.key), s.now)
		r.Open = nil
		return r, err
	case "add":
		return b.AddCounter(ctx, keyOf(s.key), s.counter, s.tokens)
	}
	return nil, fmt.Errorf("unknown op %q", s.op)
}

// scriptCases are the behaviours of the scripts, as step tables at fixed
// instants. Each runs on redis-server and on miniredis and must give the
// same, expected, results on both; TestMemScripts replays them on the
// in-memory bucket.
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
		bal("a", T0, BalanceResult{Spendable: 90, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 10}),
	}},
	{"start inclusive, deadline exclusive", []step{
		dep("a", "L1", 10, T0+100, T0+200, T0, Deposited, 0),
		bal("a", T0, BalanceResult{Pending: 10}),
		spend(T0+99, []kc{{"a", 1}}, false, 0, no(0, 0)),
		spend(T0+100, []kc{{"a", 1}}, true, -1, yes(9, T0+200)),
		spend(T0+199, []kc{{"a", 1}}, true, -1, yes(8, T0+200)),
		spend(T0+200, []kc{{"a", 1}}, false, 0, no(0, 0)),
		spend(T0+5000, []kc{{"a", 1}}, false, 0, no(0, 0)),
		bal("a", T0+200, BalanceResult{Admitted: 2, Denied: 3, Expired: []ExpiredLease{{ID: "L1", Remaining: 8}}}),
		closeL("a", "L1", T0+200, 8, false, false, 0),
		bal("a", T0+200, BalanceResult{Admitted: 2, Denied: 3}),
	}},
	{"earliest deadline first, split across leases", []step{
		dep("a", "L1", 50, T0, T0+2000, T0, Deposited, 50),
		dep("a", "L2", 50, T0, T0+1000, T0, Deposited, 100),
		dep("a", "L3", 50, T0+500, T0+3000, T0, Deposited, 100),
		spend(T0, []kc{{"a", 60}}, true, -1, yes(40, T0+2000)),
		bal("a", T0, BalanceResult{Spendable: 40, Live: 2, EarliestDeadlineMs: T0 + 2000, Pending: 50, Admitted: 60}),
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
	{"a request spent again counts once", []step{
		counted(T0, []kc{{"a", 2}}, false, 0, kr(false, 0, 0, 0, 2, false)),
		again(counted(T0+1, []kc{{"a", 2}}, false, 0, kr(false, 0, 0, 0, 2, false)), true),
		dep("a", "L1", 5, T0, T0+1000, T0+2, Deposited, 5),
		again(counted(T0+3, []kc{{"a", 2}}, true, -1, kr(true, 3, T0+1000, 2, 0, false)), true),
		counted(T0+4, []kc{{"a", 9}}, false, 0, kr(false, 3, T0+1000, 2, 9, false)),
		again(counted(T0+5, []kc{{"a", 1}}, true, -1, kr(true, 2, T0+1000, 3, 8, false)), true),
		again(counted(T0+6, []kc{{"a", 1}}, true, -1, kr(true, 1, T0+1000, 4, 8, false)), false),
		counted(T0+7, []kc{{"a", 1}, {"b", 1}}, false, 1, kr(true, 1, T0+1000, 4, 8, false), kr(false, 0, 0, 0, 1, false)),
		again(counted(T0+8, []kc{{"a", 1}, {"b", 1}}, false, 1, kr(true, 1, T0+1000, 4, 8, false), kr(false, 0, 0, 0, 1, false)), false, true),
		dep("b", "L2", 5, T0, T0+1000, T0+9, Deposited, 5),
		again(counted(T0+10, []kc{{"a", 1}, {"b", 1}}, true, -1, kr(true, 0, 0, 5, 8, false), kr(true, 4, T0+1000, 1, 0, false)), false, true),
		bal("b", T0+10, BalanceResult{Spendable: 4, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 1}),
		dep("c", "L3", 5, T0, T0+1000, T0+10, Deposited, 5),
		again(counted(T0+11, []kc{{"c", 3}}, true, -1, kr(true, 2, T0+1000, 3, 0, false)), true),
		bal("c", T0+11, BalanceResult{Spendable: 2, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 3}),
		// A counted key that does not exist is not made.
		again(counted(T0+12, []kc{{"d", 1}}, false, 0, kr(false, 0, 0, 0, 0, false)), true),
		bal("d", T0+12, BalanceResult{}),
	}},
	{"drain exactly, then deny", []step{
		dep("a", "L1", 5, T0, T0+1000, T0, Deposited, 5),
		spend(T0, []kc{{"a", 5}}, true, -1, yes(0, 0)),
		spend(T0, []kc{{"a", 1}}, false, 0, no(0, 0)),
		bal("a", T0, BalanceResult{Live: 1, Admitted: 5, Denied: 1}),
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
		bal("a", T0+50, BalanceResult{Admitted: 30, Denied: 2}),
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
		bal("a", T0+100, BalanceResult{Spendable: 20, Live: 1, EarliestDeadlineMs: T0 + 300,
			Expired: []ExpiredLease{{ID: "L4", Remaining: 9}, {ID: "L1", Remaining: 30}, {ID: "L3", Remaining: 5}}}),
		closeL("a", "L1", T0+100, 30, false, false, 20),
		bal("a", T0+300, BalanceResult{Expired: []ExpiredLease{{ID: "L4", Remaining: 9}, {ID: "L3", Remaining: 5}, {ID: "L2", Remaining: 20}}}),
	}},
	{"multi-key spend is all or nothing", []step{
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		dep("b", "L2", 5, T0, T0+2000, T0, Deposited, 5),
		spend(T0, []kc{{"a", 3}, {"b", 6}}, false, 1, yes(10, T0+1000), no(5, T0+2000)),
		bal("a", T0, BalanceResult{Spendable: 10, Live: 1, EarliestDeadlineMs: T0 + 1000}),
		bal("b", T0, BalanceResult{Spendable: 5, Live: 1, EarliestDeadlineMs: T0 + 2000, Denied: 6}),
		spend(T0, []kc{{"a", 3}, {"b", 5}}, true, -1, yes(7, T0+1000), yes(0, 0)),
		spend(T0, []kc{{"b", 1}, {"a", 1}}, false, 0, no(0, 0), yes(7, T0+1000)),
		bal("a", T0, BalanceResult{Spendable: 7, Live: 1, EarliestDeadlineMs: T0 + 1000, Admitted: 3}),
		bal("b", T0, BalanceResult{Live: 1, Admitted: 5, Denied: 7}),
	}},
	{"multi-key reports the first failing key", []step{
		dep("a", "L1", 1, T0, T0+1000, T0, Deposited, 1),
		spend(T0, []kc{{"a", 1}, {"b", 1}, {"c", 2}}, false, 1, yes(1, T0+1000), no(0, 0), no(0, 0)),
		bal("c", T0, BalanceResult{Denied: 2}),
	}},
	{"a key given twice pays both costs", []step{
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		spend(T0, []kc{{"a", 6}, {"a", 6}}, false, 0, no(10, T0+1000), no(10, T0+1000)),
		spend(T0, []kc{{"a", 4}, {"a", 6}}, true, -1, yes(0, 0), yes(0, 0)),
		bal("a", T0, BalanceResult{Live: 1, Admitted: 10, Denied: 12}),
	}},
	{"zero cost is always allowed", []step{
		spend(T0, []kc{{"a", 0}}, true, -1, yes(0, 0)),
		bal("a", T0, BalanceResult{}),
	}},
	{"named counters", []step{
		add("a", "fallback_admitted", 5, 5),
		add("a", "fallback_admitted", 2, 7),
		add("a", "zz", -1, -1),
		dep("a", "L1", 10, T0, T0+1000, T0, Deposited, 10),
		bal("a", T0, BalanceResult{Spendable: 10, Live: 1, EarliestDeadlineMs: T0 + 1000,
			Counters: []Counter{{Name: "fallback_admitted", Value: 7}, {Name: "zz", Value: -1}}}),
	}},
	{"spends report the window's demand and the pool-spent mark", []step{
		dep("a", "L1", 5, T0, T0+1000, T0, Deposited, 5),
		counted(T0, []kc{{"a", 3}}, true, -1, kr(true, 2, T0+1000, 3, 0, false)),
		counted(T0, []kc{{"a", 4}}, false, 0, kr(false, 2, T0+1000, 3, 4, false)),
		add("a", "pool_spent", 1, 1),
		add("a", "fallback_admitted", 9, 9), // a counter of its own
		counted(T0, []kc{{"a", 2}}, true, -1, kr(true, 0, 0, 5, 4, true)),
		counted(T0, []kc{{"a", 1}, {"b", 1}}, false, 0, kr(false, 0, 0, 5, 5, true), kr(false, 0, 0, 0, 1, false)),
		counted(T0, []kc{{"b", 0}, {"b", 2}}, false, 0, kr(false, 0, 0, 0, 1, false), kr(false, 0, 0, 0, 3, false)), // b named twice needs 2
	}},
	{"large values stay exact", []step{
		dep("a", "L1", 1<<52, T0, T0+1000, T0, Deposited, 1<<52),
		spend(T0, []kc{{"a", 1<<51 + 3}}, true, -1, yes(1<<52-1<<51-3, T0+1000)),
		closeL("a", "L1", T0, 1<<52-1<<51-3, false, false, 0),
	}},
}

func TestScripts(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			for ci, c := range scriptCases {
				t.Run(c.name, func(t *testing.T) {
					limit := fmt.Sprintf("case%d", ci)
					keyOf := func(name string) string {
						return Key("", limit, int64(name[0]-'a'+1))
					}
					for i, s := range c.steps {
						got, err := s.run(ctx, b, keyOf)
						if err != nil {
							t.Fatalf("step %d (%s %s): %v", i, s.op, s.id, err)
						}
						if got = s.strip(got); !reflect.DeepEqual(got, s.want) {
							t.Fatalf("step %d (%s %s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.id, s.now-T0, got, s.want)
						}
					}
				})
			}
		})
	}
}

func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"lh:{tenant/atlas}:w:1":   "tenant/atlas",
		"lh:{tenant/atlas}:renew": "tenant/atlas",
		"{a}{b}":                  "a",
		"lh:{}:w:1":               "lh:{}:w:1",
		"lh:{a":                   "lh:{a",
		"plain":                   "plain",
		"x}{y}":                   "y",
		"{{a}}":                   "{a",
	} {
		if got := hashTag(key); got != want {
			t.Errorf("hashTag(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestExpiry checks the key TTLs: deposits set PEXPIREAT and only extend it;
// keys created without a deposit get the orphan TTL; nothing else creates a
// key without expiry.
func TestExpiry(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb, WithOrphanTTL(time.Minute))
			key := Key("", "expiry", 1)
			pexpiretime := func(k string) int64 {
				t.Helper()
				v, err := be.rdb.PExpireTime(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				return v.Milliseconds()
			}
			pttl := func(k string) time.Duration {
				t.Helper()
				v, err := be.rdb.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			exp := farExpiry()
			d := Deposit{Key: key, LeaseID: "L1", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: exp, NowMs: T0}
			mustDeposit(t, ctx, b, d, Deposited)
			if got := pexpiretime(key); got != exp {
				t.Fatalf("PEXPIRETIME = %d, want %d", got, exp)
			}
			if p := pttl(key); p <= 0 {
				t.Fatalf("PTTL = %v, want > 0", p)
			}
			d.LeaseID, d.ExpireAtMs = "L2", exp+60_000
			mustDeposit(t, ctx, b, d, Deposited)
			if got := pexpiretime(key); got != exp+60_000 {
				t.Fatalf("PEXPIRETIME after later expiry = %d, want %d", got, exp+60_000)
			}
			d.LeaseID, d.ExpireAtMs = "L3", exp-60_000
			mustDeposit(t, ctx, b, d, Deposited)
			if got := pexpiretime(key); got != exp+60_000 {
				t.Fatalf("PEXPIRETIME after earlier expiry = %d, want unchanged %d", got, exp+60_000)
			}
			// Retried and refused deposits extend too, never shorten.
			d.LeaseID, d.ExpireAtMs = "L1", exp+120_000
			mustDeposit(t, ctx, b, d, AlreadyDeposited)
			if got := pexpiretime(key); got != exp+120_000 {
				t.Fatalf("PEXPIRETIME after duplicate = %d, want %d", got, exp+120_000)
			}
			if _, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil {
				t.Fatal(err)
			}
			if got := pexpiretime(key); got != exp+120_000 {
				t.Fatalf("PEXPIRETIME after spend = %d, want unchanged", got)
			}

			// A key expiry at or before Redis's TIME is refused, nothing written.
			past := Key("", "expiry", 2)
			mustDeposit(t, ctx, b, Deposit{Key: past, LeaseID: "L1", Tokens: 10, StartMs: T0,
				DeadlineMs: T0 + 1000, ExpireAtMs: T0 + 1000, NowMs: T0}, RefusedKeyExpiry)
			if n := be.rdb.Exists(ctx, past).Val(); n != 0 {
				t.Fatalf("refused deposit created the key")
			}

			// Keys created without a deposit carry the orphan TTL.
			for i, create := range []func(k string) error{
				func(k string) error { _, err := b.Spend(ctx, []string{k}, []int64{3}, T0); return err },
				func(k string) error { _, err := b.Close(ctx, k, "Lx", T0); return err },
				func(k string) error { _, err := b.AddCounter(ctx, k, "fallback_admitted", 1); return err },
			} {
				k := Key("", "orphan", int64(i))
				if err := create(k); err != nil {
					t.Fatal(err)
				}
				if p := pttl(k); p <= 0 || p > time.Minute {
					t.Fatalf("orphan key %d: PTTL = %v, want in (0, 1m]", i, p)
				}
				// A deposit extends the orphan TTL to the window's expiry.
				mustDepositAny(t, ctx, b, Deposit{Key: k, LeaseID: "Ly", Tokens: 1, StartMs: T0,
					DeadlineMs: T0 + 1, ExpireAtMs: exp, NowMs: T0})
				if got := pexpiretime(k); got != exp {
					t.Fatalf("orphan key %d after deposit: PEXPIRETIME = %d, want %d", i, got, exp)
				}
			}

			// A zero-cost spend on a missing key creates nothing.
			zero := Key("", "zero", 1)
			if _, err := b.Spend(ctx, []string{zero}, []int64{0}, T0); err != nil {
				t.Fatal(err)
			}
			if n := be.rdb.Exists(ctx, zero).Val(); n != 0 {
				t.Fatalf("zero-cost spend created the key")
			}
		})
	}
}

func mustDeposit(t *testing.T, ctx context.Context, b *Buckets, d Deposit, want DepositStatus) {
	t.Helper()
	r, err := b.Deposit(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != want {
		t.Fatalf("deposit %s: status %v, want %v", d.LeaseID, r.Status, want)
	}
}

func mustDepositAny(t *testing.T, ctx context.Context, b *Buckets, d Deposit) {
	t.Helper()
	if _, err := b.Deposit(ctx, d); err != nil {
		t.Fatal(err)
	}
}

func TestLock(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := LockKey("", "tenant/atlas")
			if ok, err := b.TryLock(ctx, key, "r1", 10*time.Second); err != nil || !ok {
				t.Fatalf("r1 TryLock = %v, %v; want true", ok, err)
			}
			if ok, err := b.TryLock(ctx, key, "r2", 10*time.Second); err != nil || ok {
				t.Fatalf("r2 TryLock = %v, %v; want false", ok, err)
			}
			if err := b.Unlock(ctx, key, "r2"); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("r2 Unlock = %v, want ErrNotHeld", err)
			}
			if err := b.ExtendLock(ctx, key, "r2", time.Minute); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("r2 ExtendLock = %v, want ErrNotHeld", err)
			}
			if err := b.ExtendLock(ctx, key, "r1", time.Minute); err != nil {
				t.Fatalf("r1 ExtendLock = %v", err)
			}
			if p := be.rdb.PTTL(ctx, key).Val(); p <= 10*time.Second || p > time.Minute {
				t.Fatalf("PTTL after extend = %v, want (10s, 1m]", p)
			}
			if err := b.Unlock(ctx, key, "r1"); err != nil {
				t.Fatalf("r1 Unlock = %v", err)
			}
			if err := b.Unlock(ctx, key, "r1"); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("second r1 Unlock = %v, want ErrNotHeld", err)
			}
			if ok, err := b.TryLock(ctx, key, "r2", 1500*time.Millisecond); err != nil || !ok {
				t.Fatalf("r2 TryLock after unlock = %v, %v; want true", ok, err)
			}
			if p := be.rdb.PTTL(ctx, key).Val(); p <= 0 || p > 1500*time.Millisecond {
				t.Fatalf("PTTL = %v, want (0, 1.5s]", p)
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	// No server: every call below must be refused before reaching Redis.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	b := New(rdb)
	ctx := context.Background()
	ok := Deposit{Key: "k", LeaseID: "L", Tokens: 1, StartMs: 0, DeadlineMs: 1, ExpireAtMs: 1}
	for name, mod := range map[string]func(*Deposit){
		"empty key":          func(d *Deposit) { d.Key = "" },
		"empty id":           func(d *Deposit) { d.LeaseID = "" },
		"zero tokens":        func(d *Deposit) { d.Tokens = 0 },
		"huge tokens":        func(d *Deposit) { d.Tokens = 1<<53 + 1 },
		"negative start":     func(d *Deposit) { d.StartMs = -1 },
		"deadline = start":   func(d *Deposit) { d.DeadlineMs = d.StartMs },
		"expiry < deadline":  func(d *Deposit) { d.DeadlineMs, d.ExpireAtMs = 5, 4 },
		"negative now":       func(d *Deposit) { d.NowMs = -1 },
		"huge expiry":        func(d *Deposit) { d.ExpireAtMs = 1 << 60 },
		"deadline too large": func(d *Deposit) { d.DeadlineMs, d.ExpireAtMs = 1<<54, 1<<54 },
	} {
		d := ok
		mod(&d)
		if _, err := b.Deposit(ctx, d); !errors.Is(err, ErrInvalid) {
			t.Errorf("Deposit(%s) = %v, want ErrInvalid", name, err)
		}
	}
	spends := []struct {
		name  string
		keys  []string
		costs []int64
		now   int64
	}{
		{"no keys", nil, nil, 0},
		{"length mismatch", []string{"a"}, []int64{1, 2}, 0},
		{"negative cost", []string{"a"}, []int64{-1}, 0},
		{"empty key", []string{""}, []int64{1}, 0},
		{"negative now", []string{"a"}, []int64{1}, -5},
	}
	for _, s := range spends {
		if _, err := b.Spend(ctx, s.keys, s.costs, s.now); !errors.Is(err, ErrInvalid) {
			t.Errorf("Spend(%s) = %v, want ErrInvalid", s.name, err)
		}
	}
	res, err := b.SpendBatch(ctx, []SpendOp{{Keys: nil}, {Keys: []string{"k"}, Costs: []int64{-2}},
		{Keys: []string{"k"}, Costs: []int64{1}, Counted: []bool{true, false}}})
	if !errors.Is(err, ErrInvalid) || len(res) != 3 || !errors.Is(res[0].Err, ErrInvalid) || !errors.Is(res[1].Err, ErrInvalid) ||
		!errors.Is(res[2].Err, ErrInvalid) {
		t.Errorf("SpendBatch(all invalid) = %+v, %v; want ErrInvalid", res, err)
	}
	if _, err := b.Close(ctx, "k", "", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Close(empty id) = %v", err)
	}
	if _, err := b.Balance(ctx, "", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Balance(empty key) = %v", err)
	}
	for _, name := range []string{"", "admitted", "denied", "r:x"} {
		if _, err := b.AddCounter(ctx, "k", name, 1); !errors.Is(err, ErrInvalid) {
			t.Errorf("AddCounter(%q) = %v", name, err)
		}
	}
	if _, err := b.TryLock(ctx, "k", "", time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("TryLock(empty owner) = %v", err)
	}
	if _, err := b.TryLock(ctx, "k", "o", time.Microsecond); !errors.Is(err, ErrInvalid) {
		t.Errorf("TryLock(1µs) = %v", err)
	}
}

// TestClosedMarkerWins writes a hash by hand in which a lease has both its
// fields and a closed marker (no API call leaves that state; a partial
// write or an old layout might): the marker wins, the lease is not spent.
func TestClosedMarkerWins(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "marker", 1)
			err := be.rdb.HSet(ctx, key, "r:L1", 50, "s:L1", T0, "d:L1", T0+1000, "c:L1", 7,
				"r:L2", 5, "s:L2", T0, "d:L2", T0+1000, "r:L3", 9, "s:L3", T0).Err() // L3 lacks its deadline
			if err != nil {
				t.Fatal(err)
			}
			r, err := b.Spend(ctx, []string{key}, []int64{6}, T0)
			if err != nil {
				t.Fatal(err)
			}
			if want := (SpendResult{Failed: 0, Keys: []KeyResult{no(5, T0+1000)}}); !reflect.DeepEqual(stripCounts(r), want) {
				t.Fatalf("Spend = %+v, want %+v", r, want)
			}
			c, err := b.Close(ctx, key, "L1", T0)
			if err != nil || c != (CloseResult{Unspent: 7, AlreadyClosed: true, Balance: 5}) {
				t.Fatalf("Close = %+v, %v", c, err)
			}
		})
	}
}

// TestOpenLeases: Balance lists the leases that have not reached their
// deadline, started or pending, sorted by deadline, and Lasting counts only
// the started ones that outlive the horizon.
func TestOpenLeases(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "open", 1)
			for _, d := range []Deposit{
				{LeaseID: "late", Tokens: 30, StartMs: T0, DeadlineMs: T0 + 9000},
				{LeaseID: "soon", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000},
				{LeaseID: "next", Tokens: 50, StartMs: T0 + 5000, DeadlineMs: T0 + 20000},
				{LeaseID: "gone", Tokens: 5, StartMs: T0 - 9000, DeadlineMs: T0 - 1},
			} {
				d.Key, d.ExpireAtMs, d.NowMs = key, farExpiry(), T0
				if _, err := b.Deposit(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.Spend(ctx, []string{key}, []int64{4}, T0); err != nil {
				t.Fatal(err)
			}
			r, err := b.Balance(ctx, key, T0)
			if err != nil {
				t.Fatal(err)
			}
			want := []OpenLease{
				{ID: "soon", Remaining: 6, StartMs: T0, DeadlineMs: T0 + 1000},
				{ID: "late", Remaining: 30, StartMs: T0, DeadlineMs: T0 + 9000},
				{ID: "next", Remaining: 50, StartMs: T0 + 5000, DeadlineMs: T0 + 20000},
			}
			if !reflect.DeepEqual(r.Open, want) {
				t.Fatalf("open = %+v, want %+v", r.Open, want)
			}
			for _, tc := range []struct{ horizon, want int64 }{{0, 36}, {999, 36}, {1000, 30}, {8999, 30}, {9000, 0}} {
				if got := r.Lasting(T0, tc.horizon); got != tc.want {
					t.Errorf("Lasting(T0, %d) = %d, want %d", tc.horizon, got, tc.want)
				}
			}
		})
	}
}
