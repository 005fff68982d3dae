package bucket

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// rstep is one call of a token bucket step table at an explicit Redis
// instant: install a share, or take cost tokens.
type rstep struct {
	op     string // install, take
	now    int64
	share  lease.BucketShare
	shadow bool // take: the limit is in shadow mode
	cost   int64
	want   any // ShareResult or TakeResult
}

// u is the unit of a 1 s rate period: a token is 1,000,000 units, and a
// share of r milli-tokens per second refills r units per ms.
const u = 1_000_000

func share(seq, rateMilli, burst, deadline int64) lease.BucketShare {
	return lease.BucketShare{Seq: seq, Rate: rateMilli, Burst: burst, Unit: u, DeadlineMs: deadline}
}

func install(now int64, s lease.BucketShare, status ShareStatus, tokens int64) rstep {
	return rstep{op: "install", now: now, share: s, want: ShareResult{Status: status, Tokens: tokens}}
}

func take(now, cost int64, allowed bool, tokens, wait, deadline, admitted, denied int64) rstep {
	return rstep{op: "take", now: now, cost: cost, want: TakeResult{Allowed: allowed, Tokens: tokens, WaitMs: wait,
		DeadlineMs: deadline, Admitted: admitted, Denied: denied}}
}

// shadowTake is a take of a limit in shadow mode: wd and wdc are the
// shadow counters after it.
func shadowTake(now, cost int64, allowed bool, tokens, wait, deadline, admitted, denied, wd, wdc int64) rstep {
	st := enforcedTake(now, cost, allowed, tokens, wait, deadline, admitted, denied, wd, wdc)
	st.shadow = true
	return st
}

// enforcedTake is a take of an enforced limit on a bucket with shadow
// counters (wd, wdc) from before.
func enforcedTake(now, cost int64, allowed bool, tokens, wait, deadline, admitted, denied, wd, wdc int64) rstep {
	st := take(now, cost, allowed, tokens, wait, deadline, admitted, denied)
	r := st.want.(TakeResult)
	r.WouldDeny, r.WouldDenyChecks = wd, wdc
	st.want = r
	return st
}

// wouldDeny is a take in shadow mode the bucket could not pay: not
// allowed (the enforcing decision), Shadowed (counted in WouldDeny,
// uncharged, not denied).
func wouldDeny(now, cost, tokens, wait, deadline, admitted, denied, wd, wdc int64) rstep {
	st := shadowTake(now, cost, false, tokens, wait, deadline, admitted, denied, wd, wdc)
	r := st.want.(TakeResult)
	r.Shadowed = true
	st.want = r
	return st
}

// rateCases are the token bucket's behaviours (lua/rate.lua), as step
// tables at fixed instants. TestRateScript runs each on redis-server and
// on miniredis, TestMemRate on the in-memory bucket (lease.TokenBucket),
// with the same expected results.
// Rates: 10,000 milli-tokens per second is one token per 100 ms.
var rateCases = []struct {
	name  string
	steps []rstep
}{
	{"no share: denied, counted", []rstep{
		take(T0, 3, false, 0, -1, 0, 0, 3),
		take(T0, 0, false, 0, -1, 0, 0, 3),
	}},
	{"refill from empty, spend", []rstep{
		install(T0, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		take(T0+99, 1, false, 0, 1, T0+60_000, 0, 1),
		take(T0+100, 1, true, 0, 100, T0+60_000, 1, 1),
		take(T0+550, 4, true, 0, 350, T0+60_000, 5, 1),
		take(T0+600, 2, false, 1, 100, T0+60_000, 5, 3),
	}},
	{"cap at burst", []rstep{
		install(T0, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		take(T0+10_000, 0, true, 20, 0, T0+60_000, 0, 0),
		take(T0+10_000, 21, false, 20, -1, T0+60_000, 0, 21), // above the burst: never
		take(T0+10_000, 20, true, 0, 2000, T0+60_000, 20, 21),
		take(T0+40_000, 20, true, 0, 2000, T0+60_000, 40, 21),
	}},
	{"clock going backwards on failover: nothing refilled twice", []rstep{
		install(T0, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		take(T0+1_000, 10, true, 0, 1000, T0+60_000, 10, 0),
		take(T0+500, 1, false, 0, 100, T0+60_000, 10, 1),   // the new primary's clock is 500 ms behind
		take(T0+1_000, 1, false, 0, 100, T0+60_000, 10, 2), // it catches up: still nothing
		take(T0+1_100, 1, true, 0, 100, T0+60_000, 11, 2),
		install(T0+900, share(2, 10_000, 20, T0+60_000), ShareInstalled, 0), // installs at the latest instant
		take(T0+1_200, 1, true, 0, 100, T0+60_000, 12, 2),
	}},
	{"renewal: level kept, capped at the new burst; stale share ignored", []rstep{
		install(T0, share(1, 10_000, 20, T0+5_000), ShareInstalled, 0),
		install(T0+1_000, share(2, 20_000, 30, T0+60_000), ShareInstalled, 10),
		install(T0+1_000, share(2, 20_000, 30, T0+60_000), ShareStale, 10), // a retry
		install(T0+1_500, share(1, 1, 1, T0+90_000), ShareStale, 20),       // a late, older reply
		take(T0+1_500, 20, true, 0, 1000, T0+60_000, 20, 0),
		take(T0+3_000, 0, true, 30, 0, T0+60_000, 20, 0),
		install(T0+3_000, share(3, 10_000, 5, T0+60_000), ShareInstalled, 5),
		take(T0+3_000, 5, true, 0, 500, T0+60_000, 25, 0),
	}},
	{"deadline: empty at and after it, a new share starts empty", []rstep{
		install(T0, share(1, 10_000, 20, T0+5_000), ShareInstalled, 0),
		take(T0+4_999, 0, true, 20, 0, T0+5_000, 0, 0),
		take(T0+4_999, 1, true, 19, 0, T0+5_000, 1, 0),
		take(T0+4_999, 19, true, 0, -1, T0+5_000, 20, 0), // the deadline comes before a token
		take(T0+5_000, 1, false, 0, -1, T0+5_000, 20, 1),
		take(T0+4_000, 1, false, 0, -1, T0+5_000, 20, 2), // a clock going back does not revive it
		install(T0+20_000, share(2, 10_000, 20, T0+60_000), ShareInstalled, 0),
		take(T0+20_000, 1, false, 0, 100, T0+60_000, 20, 3),
		take(T0+20_100, 1, true, 0, 100, T0+60_000, 21, 3),
	}},
	{"after expiry a lower seq is heard (a new leader that lost count)", []rstep{
		install(T0, share(7, 10_000, 20, T0+5_000), ShareInstalled, 0),
		install(T0+1_000, share(1, 10_000, 20, T0+60_000), ShareStale, 10),
		install(T0+5_000, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		take(T0+5_100, 1, true, 0, 100, T0+60_000, 1, 0),
	}},
	{"a share expired on arrival gives nothing", []rstep{
		install(T0+1_000, share(1, 10_000, 20, T0+1_000), ShareInstalled, 0),
		take(T0+1_000, 0, false, 0, -1, T0+1_000, 0, 0),
	}},
	{"zero rate: only the carried level", []rstep{
		install(T0, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		install(T0+500, share(2, 0, 20, T0+60_000), ShareInstalled, 5),
		take(T0+10_000, 5, true, 0, -1, T0+60_000, 5, 0),
	}},
	{"shadow: the enforcing decision, a would-be denial charges nothing and is counted instead", []rstep{
		install(T0, share(1, 10_000, 20, T0+60_000), ShareInstalled, 0),
		wouldDeny(T0+99, 1, 0, 1, T0+60_000, 0, 0, 1, 1),               // empty: would deny, not denied
		shadowTake(T0+100, 1, true, 0, 100, T0+60_000, 1, 0, 1, 1),     // refilled: charged as ever
		wouldDeny(T0+550, 7, 4, 250, T0+60_000, 1, 0, 8, 2),            // 4.5 held, 7 asked: the 4.5 stay
		shadowTake(T0+550, 4, true, 0, 350, T0+60_000, 5, 0, 8, 2),     // so the next take still finds them
		wouldDeny(T0+550, 21, 0, -1, T0+60_000, 5, 0, 29, 3),           // above the burst: never, counted
		enforcedTake(T0+600, 2, false, 1, 100, T0+60_000, 5, 2, 29, 3), // enforced again: denied
		enforcedTake(T0+700, 2, true, 0, 200, T0+60_000, 7, 2, 29, 3),
	}},
	{"shadow with no share, or past its deadline: would deny, counted", []rstep{
		wouldDeny(T0, 3, 0, -1, 0, 0, 0, 3, 1),
		install(T0, share(1, 10_000, 20, T0+1_000), ShareInstalled, 0),
		wouldDeny(T0+1_000, 1, 0, -1, T0+1_000, 0, 0, 4, 2),
	}},
	{"sub-token rates: 1 token per second split in thirds", []rstep{
		install(T0, share(1, 333, 1, T0+60_000), ShareInstalled, 0),
		take(T0+3_003, 1, false, 0, 1, T0+60_000, 0, 1),   // 999,999 units: one short
		take(T0+3_004, 1, true, 0, 3004, T0+60_000, 1, 1), // capped at the burst of 1 token, then spent
	}},
}

func (s rstep) run(t *testing.T, b *Buckets, key string) (any, error) {
	switch s.op {
	case "install":
		return b.InstallShare(testCtx(t), key, ShareInstall{Share: s.share, ExpireAtMs: farExpiry(), NowMs: s.now})
	case "take":
		return b.Take(testCtx(t), key, s.cost, s.now, s.shadow)
	}
	return nil, fmt.Errorf("unknown op %q", s.op)
}

func (s rstep) runMem(m *store.Mem, key store.RateKey) (any, error) {
	switch s.op {
	case "install":
		return m.InstallShare(store.ShareInstall{Key: key, Share: s.share, ExpireAtMs: farExpiry(), NowMs: s.now})
	case "take":
		return m.Take(key, s.cost, s.now, s.shadow)
	}
	return nil, fmt.Errorf("unknown op %q", s.op)
}

// TestRateScript runs rateCases on redis-server and on miniredis.
func TestRateScript(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := New(be.rdb)
			for ci, c := range rateCases {
				t.Run(c.name, func(t *testing.T) {
					key := RateKey("", fmt.Sprintf("rate%d", ci))
					for i, s := range c.steps {
						got, err := s.run(t, b, key)
						if err != nil {
							t.Fatalf("step %d (%s at T0%+d): %v", i, s.op, s.now-T0, err)
						}
						if !reflect.DeepEqual(got, s.want) {
							t.Fatalf("step %d (%s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.now-T0, got, s.want)
						}
					}
				})
			}
		})
	}
}

// TestMemRate runs rateCases on the in-memory bucket (the agent's
// in-process store while Redis is down, and the simulator's).
func TestMemRate(t *testing.T) {
	for ci, c := range rateCases {
		t.Run(c.name, func(t *testing.T) {
			m := store.NewMem(24 * 3600 * 1000)
			key := store.RateKey{Limit: fmt.Sprintf("rate%d", ci)}
			for i, s := range c.steps {
				got, err := s.runMem(m, key)
				if err != nil {
					t.Fatalf("step %d (%s at T0%+d): %v", i, s.op, s.now-T0, err)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d (%s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.now-T0, got, s.want)
				}
			}
		})
	}
}

// TestRateRandomAgainstModel drives redis-server, miniredis and the
// in-memory bucket with the same random steps (shares of every size,
// clocks stepping back) and wants identical results from all three at
// every step: the Lua arithmetic in float64 and the Go arithmetic in
// int64 agree, at the largest magnitudes too.
func TestRateRandomAgainstModel(t *testing.T) {
	bes := backends(t)
	runs := 20
	if testing.Short() {
		runs = 5
	}
	for run := range runs {
		rng := rand.New(rand.NewSource(int64(run)))
		m := store.NewMem(24 * 3600 * 1000)
		mkey := store.RateKey{Limit: fmt.Sprintf("random%d", run)}
		key := RateKeyOf(mkey)
		now, seq := T0, int64(0)
		// Large units and rates: a 1 h period, bursts near the maximum.
		unit := lease.BucketUnit(time.Hour * time.Duration(1+rng.Intn(2)))
		maxBurst := lease.MaxBucketUnits / unit
		for i := range 150 {
			var s rstep
			switch rng.Intn(5) {
			case 0:
				seq += int64(rng.Intn(2)) // sometimes a repeat
				sh := lease.BucketShare{Seq: max(seq, 1), Rate: rng.Int63n(lease.MaxBucketUnits), Burst: rng.Int63n(maxBurst + 1),
					Unit: unit, DeadlineMs: now + rng.Int63n(100_000)}
				s = rstep{op: "install", now: now, share: sh}
			case 1:
				now += rng.Int63n(10_000)
				continue
			case 2:
				now -= rng.Int63n(1_000)
				continue
			default:
				s = rstep{op: "take", now: now, cost: rng.Int63n(maxBurst/4 + 1), shadow: rng.Intn(3) == 0}
			}
			want, err := s.runMem(m, mkey)
			if err != nil {
				t.Fatalf("run %d step %d: mem: %v", run, i, err)
			}
			for _, be := range bes {
				got, err := s.run(t, New(be.rdb), key)
				if err != nil {
					t.Fatalf("run %d step %d (%+v): %s: %v", run, i, s, be.name, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("run %d step %d (%s at T0%+d, %+v): %s\n got %+v\nmem %+v", run, i, s.op, s.now-T0, s.share, be.name, got, want)
				}
			}
		}
	}
}

// TestRateRedisClock: with now 0 the script reads Redis's TIME.
func TestRateRedisClock(t *testing.T) {
	_, rdb := realRedis(t)
	b := New(rdb)
	key := RateKey("", "clock")
	deadline := farExpiry() - 1000
	if r, err := b.InstallShare(testCtx(t), key, ShareInstall{Share: share(1, 1_000_000, 10, deadline), ExpireAtMs: farExpiry()}); err != nil || r.Status != ShareInstalled {
		t.Fatalf("install: %+v, %v", r, err)
	}
	// 1,000 tokens per second: a token within a few ms of real time.
	var r TakeResult
	for range 1000 {
		var err error
		if r, err = b.Take(testCtx(t), key, 1, 0, false); err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			break
		}
	}
	if !r.Allowed || r.DeadlineMs != deadline {
		t.Fatalf("take on Redis's clock: %+v", r)
	}
}

// TestRateInvalid: arguments the script would refuse are refused before
// Redis, with ErrInvalid.
func TestRateInvalid(t *testing.T) {
	b := New(newClient(t, "127.0.0.1:1")) // never reached
	key := RateKey("", "bad")
	for _, in := range []ShareInstall{
		{Share: share(0, 1, 1, T0)},
		{Share: share(1, -1, 1, T0), ExpireAtMs: T0},
		{Share: share(1, 1, lease.MaxBucketUnits/u+1, T0), ExpireAtMs: T0},
		{Share: lease.BucketShare{Seq: 1, Unit: 0, DeadlineMs: T0}, ExpireAtMs: T0},
		{Share: share(1, 1, 1, T0), ExpireAtMs: T0 - 1},
		{Share: share(1, 1, 1, T0), ExpireAtMs: T0, NowMs: -1},
	} {
		if _, err := b.InstallShare(testCtx(t), key, in); !errors.Is(err, ErrInvalid) {
			t.Errorf("InstallShare(%+v): %v, want ErrInvalid", in, err)
		}
	}
	if _, err := b.InstallShare(testCtx(t), "", ShareInstall{Share: share(1, 1, 1, T0), ExpireAtMs: T0}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty key: %v", err)
	}
	for _, c := range []struct {
		key       string
		cost, now int64
	}{{"", 1, 0}, {key, -1, 0}, {key, maxExact + 1, 0}, {key, 1, -1}} {
		if _, err := b.Take(testCtx(t), c.key, c.cost, c.now, false); !errors.Is(err, ErrInvalid) {
			t.Errorf("Take(%q, %d, %d): %v, want ErrInvalid", c.key, c.cost, c.now, err)
		}
	}
}

// TestTakeBatch: takes in a batch of spends (SpendOp.Take) are decided in
// one rate.lua call per hash tag, in order, and give exactly what the same
// takes made one by one give, on redis-server and miniredis; an invalid
// take fails alone.
func TestTakeBatch(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := New(be.rdb)
			ctx := testCtx(t)
			batchKeys := []string{RateKey("", "tb1"), RateKey("", "tb2")}
			oneKeys := []string{RateKey("", "to1"), RateKey("", "to2")}
			for _, k := range append(append([]string{}, batchKeys...), oneKeys...) {
				if _, err := b.InstallShare(ctx, k, ShareInstall{Share: share(1, 10_000, 8, T0+60_000), ExpireAtMs: farExpiry(), NowMs: T0}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.Deposit(ctx, Deposit{Key: Key("", "tbw", 1), LeaseID: "L", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 60_000,
				ExpireAtMs: farExpiry(), NowMs: T0}); err != nil {
				t.Fatal(err)
			}
			now := T0 + 700 // 7 tokens in each bucket
			takes := []struct {
				key    int
				cost   int64
				shadow bool
			}{{0, 3, false}, {1, 1, true}, {0, 5, true}, {0, 4, false}, {0, 0, false}, {1, 9, true}}
			var ops []SpendOp
			for i, tk := range takes {
				ops = append(ops, SpendOp{Keys: []string{batchKeys[tk.key]}, Costs: []int64{tk.cost}, NowMs: now, Take: true, Shadow: tk.shadow})
				if i == 1 {
					ops = append(ops, SpendOp{Keys: []string{Key("", "tbw", 1)}, Costs: []int64{2}, NowMs: now})
				}
			}
			ops = append(ops, SpendOp{Keys: []string{batchKeys[0], batchKeys[1]}, Costs: []int64{1, 1}, NowMs: now, Take: true})
			res, err := b.SpendBatch(ctx, ops)
			if err != nil {
				t.Fatal(err)
			}
			j := 0
			for i, tk := range takes {
				want, err := b.Take(ctx, oneKeys[tk.key], tk.cost, now, tk.shadow)
				if err != nil {
					t.Fatal(err)
				}
				if got := res[j]; got.Err != nil || got.Take != want || got.Allowed != want.Allowed {
					t.Fatalf("take %d in the batch: %+v, one by one: %+v", i, got, want)
				}
				j++
				if i == 1 {
					if got := res[j]; got.Err != nil || !got.Allowed || got.Keys[0].Balance != 3 {
						t.Fatalf("the spend between the takes: %+v", got)
					}
					j++
				}
			}
			if last := res[len(res)-1]; !errors.Is(last.Err, ErrInvalid) {
				t.Fatalf("a take of two keys: %+v", last)
			}
		})
	}
}
