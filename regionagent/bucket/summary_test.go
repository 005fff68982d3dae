package bucket

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The spend summary (z:spend, lua/common.lua's summarize) lets a warm
// spend read a few fields instead of the whole bucket. These tests hold it
// to the rule that it changes no result: the same operations, applied to
// one redis-server as they come and to another whose summaries are
// deleted before every operation (so every script there reads the bucket
// whole, as before the summary existed), must give the same replies and
// leave the same fields. A deposit writes the summary from the one it
// finds when it can (without reading the bucket whole): it must write the
// very summary the oracle's whole read makes.

// chooser picks the operations of a differential run: from a seeded
// generator (the randomized test) or from fuzz bytes.
type chooser interface {
	intn(n int) int // in [0, n); n >= 1
	done() bool
}

type randChooser struct {
	r    *rand.Rand
	left int
}

func (c *randChooser) intn(n int) int { return c.r.IntN(n) }
func (c *randChooser) done() bool {
	c.left--
	return c.left < 0
}

// byteChooser reads choices from fuzz input; it is done when the input is.
type byteChooser struct{ data []byte }

func (c *byteChooser) intn(n int) int {
	if len(c.data) == 0 {
		return 0
	}
	v := int(c.data[0])
	c.data = c.data[1:]
	return v % n
}
func (c *byteChooser) done() bool { return len(c.data) == 0 }

// twin is the pair of Redis servers a differential run compares.
type twin struct {
	sum, orc       *Buckets      // with summaries; without (the oracle)
	sumRdb, orcRdb *redis.Client // the same servers, for raw reads
}

func newTwin(t testing.TB) twin {
	t.Helper()
	_, a := realRedis(t)
	_, b := realRedis(t)
	return twin{sum: New(a), orc: New(b), sumRdb: a, orcRdb: b}
}

// reset empties both servers between runs.
func (w twin) reset(t testing.TB, ctx context.Context) {
	t.Helper()
	for _, r := range []*redis.Client{w.sumRdb, w.orcRdb} {
		if err := r.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	diffLimit   = "diff"
	diffWindows = 2
)

func diffKey(w int) string { return Key("", diffLimit, int64(w)) }

// diffOp is one operation of a differential run: do runs it on one side.
type diffOp struct {
	name  string
	spend bool   // its whole-bucket reads are counted
	key   string // a deposit's: the summary it writes must be the oracle's
	do    func(ctx context.Context, b *Buckets) (any, error)
}

// nextOp picks an operation at now.
func nextOp(c chooser, now int64) diffOp {
	key := func() string { return diffKey(1 + c.intn(diffWindows)) }
	lease := func() string { return "L" + strconv.Itoa(c.intn(6)) }
	res := func() string { return "R" + strconv.Itoa(c.intn(5)) }
	// Large leases keep spends on their head for a while (the fast path);
	// small ones drain (the rebuilds).
	tokens := func() int64 {
		if c.intn(3) == 0 {
			return 1000 + int64(c.intn(1000))
		}
		return 1 + int64(c.intn(20))
	}
	cost := func() int64 { return int64(c.intn(9)) }
	switch k := c.intn(20); {
	case k < 3:
		d := Deposit{Key: key(), LeaseID: lease(), Tokens: tokens(), StartMs: now - 40 + int64(c.intn(70)),
			ExpireAtMs: farExpiry(), NowMs: now}
		d.DeadlineMs = d.StartMs + 1 + int64(c.intn(300))
		return diffOp{name: fmt.Sprintf("deposit %+v", d), key: d.Key, do: func(ctx context.Context, b *Buckets) (any, error) {
			return b.Deposit(ctx, d)
		}}
	case k < 8:
		n := 1 + c.intn(3)
		keys, costs := make([]string, n), make([]int64, n)
		for i := range keys {
			keys[i], costs[i] = key(), cost()
		}
		return diffOp{name: fmt.Sprintf("spend %v %v at %d", keys, costs, now), spend: true,
			do: func(ctx context.Context, b *Buckets) (any, error) { return b.Spend(ctx, keys, costs, now) }}
	case k < 12:
		ops := make([]SpendOp, 1+c.intn(6))
		for i := range ops {
			n := 1 + c.intn(2)
			ops[i] = SpendOp{NowMs: now + int64(c.intn(2)), Keys: make([]string, n), Costs: make([]int64, n)}
			for j := range n {
				ops[i].Keys[j], ops[i].Costs[j] = key(), cost()
			}
		}
		return diffOp{name: fmt.Sprintf("batch %+v", ops), spend: true,
			do: func(ctx context.Context, b *Buckets) (any, error) { return b.SpendBatch(ctx, ops) }}
	case k < 13:
		k, id := key(), lease()
		return diffOp{name: fmt.Sprintf("close %s %s at %d", k, id, now), do: func(ctx context.Context, b *Buckets) (any, error) {
			return b.Close(ctx, k, id, now)
		}}
	case k < 14:
		k := key()
		return diffOp{name: fmt.Sprintf("balance %s at %d", k, now), do: func(ctx context.Context, b *Buckets) (any, error) {
			return b.Balance(ctx, k, now)
		}}
	case k < 15:
		k, id, want, last := key(), res(), 1+int64(c.intn(12)), int64(c.intn(3))*int64(c.intn(150))
		min := 1 + int64(c.intn(int(want)))
		if c.intn(3) == 0 {
			return diffOp{name: fmt.Sprintf("reserve to settle %s %s %d at %d", k, id, want, now),
				do: func(ctx context.Context, b *Buckets) (any, error) {
					return b.ReserveToSettle(ctx, k, id, want, 50, now)
				}}
		}
		return diffOp{name: fmt.Sprintf("reserve %s %s %d-%d last %d at %d", k, id, min, want, last, now),
			do: func(ctx context.Context, b *Buckets) (any, error) {
				return b.ReserveLasting(ctx, k, id, want, min, last, now)
			}}
	case k < 16:
		k, id, unspent := key(), res(), int64(c.intn(10))
		return diffOp{name: fmt.Sprintf("release %s %s %d at %d", k, id, unspent, now),
			do: func(ctx context.Context, b *Buckets) (any, error) { return b.Release(ctx, k, id, unspent, now) }}
	case k < 17:
		w := 1 + c.intn(diffWindows)
		id, actual, carry := res(), int64(c.intn(16)), c.intn(2) == 0
		return diffOp{name: fmt.Sprintf("settle w%d %s %d carry %v at %d", w, id, actual, carry, now),
			do: func(ctx context.Context, b *Buckets) (any, error) {
				return b.Settle(ctx, diffKey(w), diffKey(w%diffWindows+1), id, actual, carry, now)
			}}
	case k < 18:
		k, name, delta := key(), []string{"pool_spent", "fallback_admitted"}[c.intn(2)], int64(c.intn(3))
		return diffOp{name: fmt.Sprintf("add %s %s %d", k, name, delta), do: func(ctx context.Context, b *Buckets) (any, error) {
			return b.AddCounter(ctx, k, name, delta)
		}}
	case k < 19:
		adds := []FallbackAdd{{Key: key(), Cost: int64(c.intn(4)), Cap: int64(c.intn(10))}}
		return diffOp{name: fmt.Sprintf("fallback %+v", adds), do: func(ctx context.Context, b *Buckets) (any, error) {
			ok, vals, err := b.AdmitFallback(ctx, adds)
			return []any{ok, vals}, err
		}}
	default:
		return diffOp{name: "usage", do: func(ctx context.Context, b *Buckets) (any, error) {
			_, counts, err := b.Usage(ctx, LimitRef{ID: diffLimit}, []int64{1, 2})
			return counts, err
		}}
	}
}

// forgetSummaries deletes the summaries of the oracle's buckets.
func (w twin) forgetSummaries(t testing.TB, ctx context.Context) {
	t.Helper()
	for i := 1; i <= diffWindows; i++ {
		if err := w.orcRdb.HDel(ctx, diffKey(i), summaryField).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// sameFields checks that both servers hold the same buckets, field for
// field, but the summaries.
func (w twin) sameFields(t testing.TB, ctx context.Context, after string) {
	t.Helper()
	for i := 1; i <= diffWindows; i++ {
		a, err := w.sumRdb.HGetAll(ctx, diffKey(i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		b, err := w.orcRdb.HGetAll(ctx, diffKey(i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		delete(a, summaryField)
		delete(b, summaryField)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("after %s, window %d:\nwith summaries %v\noracle         %v", after, i, a, b)
		}
	}
}

// diffStats counts a differential run's spends and the whole-bucket
// reads (HGETALL) they made on each side.
type diffStats struct{ spends, sumReads, orcReads int64 }

// runDiff applies c's operations to both sides, comparing every reply.
func runDiff(t testing.TB, ctx context.Context, w twin, c chooser) diffStats {
	t.Helper()
	now := T0
	var st diffStats
	for step := 0; !c.done(); step++ {
		switch j := c.intn(10); {
		case j < 6:
			now += int64(c.intn(12))
		case j < 7:
			now -= int64(c.intn(25)) // Redis's clock may step back (failover)
		}
		op := nextOp(c, now)
		var s0, o0 int64
		w.forgetSummaries(t, ctx)
		if op.spend {
			st.spends++
			s0, o0 = scriptCalls(t, ctx, w.sumRdb, "hgetall"), scriptCalls(t, ctx, w.orcRdb, "hgetall")
		}
		got, gerr := op.do(ctx, w.sum)
		want, werr := op.do(ctx, w.orc)
		if op.spend {
			st.sumReads += scriptCalls(t, ctx, w.sumRdb, "hgetall") - s0
			st.orcReads += scriptCalls(t, ctx, w.orcRdb, "hgetall") - o0
		}
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d, %s:\nwith summaries %+v, %v\noracle         %+v, %v", step, op.name, got, gerr, want, werr)
		}
		w.sameFields(t, ctx, fmt.Sprintf("step %d, %s", step, op.name))
		if r, ok := got.(DepositResult); ok && gerr == nil && r.Status == Deposited {
			got, want := w.sumRdb.HGet(ctx, op.key, summaryField).Val(), w.orcRdb.HGet(ctx, op.key, summaryField).Val()
			if got != want {
				t.Fatalf("step %d, %s: summary %q, the oracle's %q", step, op.name, got, want)
			}
		}
	}
	return st
}

// scriptCalls is how often a redis-server ran cmd (INFO commandstats).
func scriptCalls(t testing.TB, ctx context.Context, rdb *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 0
}

// TestSpendSummaryDifferential runs random sequences of every bucket
// script's operations at a driven clock (forward, and now and then back)
// on two redis-servers, one keeping spend summaries and one whose
// summaries are deleted before every spend: every reply and every field
// must be the same. It also checks that the summaries were used: the
// first server's spends read whole buckets (HGETALL) less often, by at
// least 15 % (these sequences drain and change leases, and deny, far more
// often than traffic does, and every denial reads the whole bucket: a warm
// key's admitted spends read none, BenchmarkSpendRedisCPU's count).
func TestSpendSummaryDifferential(t *testing.T) {
	ctx := testCtx(t)
	w := newTwin(t)
	seeds := 24
	if testing.Short() {
		seeds = 6
	}
	var all diffStats
	for seed := range seeds {
		w.reset(t, ctx)
		st := runDiff(t, ctx, w, &randChooser{r: rand.New(rand.NewPCG(uint64(seed), 15)), left: 300})
		all.spends, all.sumReads, all.orcReads = all.spends+st.spends, all.sumReads+st.sumReads, all.orcReads+st.orcReads
	}
	t.Logf("%d spend operations; their whole-bucket reads: %d with summaries, %d without", all.spends, all.sumReads, all.orcReads)
	if all.sumReads*100 > all.orcReads*85 {
		t.Fatalf("the summaries saved too few whole reads: HGETALL %d with them, %d without", all.sumReads, all.orcReads)
	}
}

// FuzzSpendSummary is TestSpendSummaryDifferential's comparison driven by
// fuzz bytes (each byte one choice).
func FuzzSpendSummary(f *testing.F) {
	for seed := range 4 {
		b := make([]byte, 0, 400)
		r := rand.New(rand.NewPCG(uint64(seed), 99))
		for range 50 {
			b = binary.LittleEndian.AppendUint64(b, r.Uint64())
		}
		f.Add(b)
	}
	w := newTwin(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := testCtx(t)
		w.reset(t, ctx)
		runDiff(t, ctx, w, &byteChooser{data: data})
	})
}

// TestSummaryForgotten: every script that changes what a warm spend would
// read from the summary deletes it or writes it again, so the next spend
// sees the change.
// Each case builds a summary with a spend, changes the bucket, and
// spends again: a summary left in place would report (or pay from) the
// leases as they were.
func TestSummaryForgotten(t *testing.T) {
	dep := func(id string, tokens, dl int64) Deposit {
		return Deposit{LeaseID: id, Tokens: tokens, StartMs: T0, DeadlineMs: dl, ExpireAtMs: farExpiry(), NowMs: T0}
	}
	cases := []struct {
		name   string
		leases []Deposit
		change func(ctx context.Context, b *Buckets, key string) error
		want   KeyResult // the spend of 1 after the change
	}{
		{"a deposit adds to the balance", []Deposit{dep("L1", 100, T0+1000)},
			func(ctx context.Context, b *Buckets, key string) error {
				d := dep("L2", 50, T0+2000)
				d.Key = key
				_, err := b.Deposit(ctx, d)
				return err
			}, yes(148, T0+1000)},
		{"a close takes a lease away", []Deposit{dep("L1", 100, T0+1000), dep("L2", 50, T0+2000)},
			func(ctx context.Context, b *Buckets, key string) error {
				_, err := b.Close(ctx, key, "L2", T0)
				return err
			},
			yes(98, T0+1000)},
		{"a reservation from a later lease", []Deposit{dep("L1", 100, T0+1000), dep("L2", 100, T0+2000)},
			func(ctx context.Context, b *Buckets, key string) error {
				_, err := b.ReserveLasting(ctx, key, "R1", 10, 1, 1500, T0)
				return err
			}, yes(188, T0+1000)},
		{"a release back into a drained earlier lease", []Deposit{dep("L1", 10, T0+1000), dep("L2", 100, T0+2000)},
			func(ctx context.Context, b *Buckets, key string) error {
				// R1 drains L1 (the spend before took 1); a spend of 1
				// then builds the summary on L2; the release refills L1,
				// which the next spend must pay from.
				if _, err := b.Reserve(ctx, key, "R1", 9, 9, T0); err != nil {
					return err
				}
				if r, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil || !reflect.DeepEqual(stripCounts(r).Keys, []KeyResult{yes(99, T0+2000)}) {
					return fmt.Errorf("spend after the reservation: %+v, %v", r, err)
				}
				_, err := b.Release(ctx, key, "R1", 9, T0)
				return err
			}, yes(107, T0+1000)},
	}
	for _, be := range backends(t) {
		for _, c := range cases {
			t.Run(be.name+"/"+c.name, func(t *testing.T) {
				ctx := testCtx(t)
				b := New(be.rdb)
				key := Key("", "forgotten", int64(len(c.name)))
				for _, d := range c.leases {
					d.Key = key
					if _, err := b.Deposit(ctx, d); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil {
					t.Fatal(err)
				}
				if n, err := be.rdb.HExists(ctx, key, summaryField).Result(); err != nil || !n {
					t.Fatalf("no summary after a spend: %v", err)
				}
				if err := c.change(ctx, b, key); err != nil {
					t.Fatal(err)
				}
				r, err := b.Spend(ctx, []string{key}, []int64{1}, T0)
				if err != nil {
					t.Fatal(err)
				}
				if got := stripCounts(r).Keys; !reflect.DeepEqual(got, []KeyResult{c.want}) {
					t.Fatalf("spend after the change = %+v, want %+v", got, c.want)
				}
			})
		}
	}
}

// TestSummaryStaleNeverAdmitsMore: a summary left in place by a script
// that does not know it (an older agent's, during a rolling upgrade) may
// make spends pay from another lease than the earliest, but never admit
// a token the leases do not hold, and never deny a cost they hold: every
// token a spend admits leaves an open lease's r:, no r: goes below zero,
// no closed lease is written again, and a denied cost is above what the
// open leases held.
func TestSummaryStaleNeverAdmitsMore(t *testing.T) {
	foreign := []struct {
		name  string
		write func(ctx context.Context, rdb *redis.Client, key string) error
	}{
		{"the head closed", func(ctx context.Context, rdb *redis.Client, key string) error {
			r := rdb.HGet(ctx, key, "r:L1").Val()
			rdb.HDel(ctx, key, "r:L1", "s:L1", "d:L1")
			return rdb.HSet(ctx, key, "c:L1", r).Err()
		}},
		{"a later lease closed", func(ctx context.Context, rdb *redis.Client, key string) error {
			r := rdb.HGet(ctx, key, "r:L2").Val()
			rdb.HDel(ctx, key, "r:L2", "s:L2", "d:L2")
			return rdb.HSet(ctx, key, "c:L2", r).Err()
		}},
		{"the head spent", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HIncrBy(ctx, key, "r:L1", -35).Err()
		}},
		{"a later lease reserved whole", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HSet(ctx, key, "r:L2", 0).Err()
		}},
		{"a lease deposited", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HSet(ctx, key, "r:L0", 30, "s:L0", T0, "d:L0", T0+500).Err()
		}},
	}
	open := func(t *testing.T, ctx context.Context, rdb *redis.Client, key string) int64 {
		t.Helper()
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for f, v := range h {
			id, ok := strings.CutPrefix(f, "r:")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			if _, closed := h["c:"+id]; closed {
				t.Fatalf("closed lease %s written again: %v", id, h)
			}
			if n < 0 {
				t.Fatalf("lease %s below zero: %v", id, h)
			}
			sum += n
		}
		return sum
	}
	for _, be := range backends(t) {
		for _, fw := range foreign {
			t.Run(be.name+"/"+fw.name, func(t *testing.T) {
				ctx := testCtx(t)
				b := New(be.rdb)
				key := Key("", "stale", int64(len(fw.name)))
				for _, d := range []Deposit{
					{LeaseID: "L1", Tokens: 40, StartMs: T0, DeadlineMs: T0 + 1000},
					{LeaseID: "L2", Tokens: 60, StartMs: T0, DeadlineMs: T0 + 2000},
				} {
					d.Key, d.ExpireAtMs, d.NowMs = key, farExpiry(), T0
					if _, err := b.Deposit(ctx, d); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil {
					t.Fatal(err)
				}
				if err := fw.write(ctx, be.rdb, key); err != nil {
					t.Fatal(err)
				}
				held := open(t, ctx, be.rdb, key)
				var admitted int64
				r := rand.New(rand.NewPCG(7, uint64(len(fw.name))))
				for i := range 40 {
					cost := 1 + r.Int64N(12)
					before := open(t, ctx, be.rdb, key) // every open lease is usable at T0+i
					res, err := b.Spend(ctx, []string{key}, []int64{cost}, T0+int64(i))
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						admitted += cost
					} else if cost <= before {
						t.Fatalf("spend %d (cost %d) denied while the leases hold %d", i, cost, before)
					}
					if left := open(t, ctx, be.rdb, key); left+admitted != held {
						t.Fatalf("spend %d (cost %d): leases hold %d after %d admitted, held %d", i, cost, left, admitted, held)
					}
				}
				if admitted == 0 {
					t.Fatal("nothing admitted: the case tests nothing")
				}
			})
		}
	}
}

// TestSummaryStaleNeverDenies: a lease an older agent's script deposited
// without writing the summary (a rolling upgrade) is not in it, so the
// summary's balance is short; a cost above that balance but within what
// the leases hold is admitted, because a denial is decided on the whole
// bucket.
func TestSummaryStaleNeverDenies(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			key := Key("", "stale-deny", 1)
			d := Deposit{Key: key, LeaseID: "L1", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}
			if _, err := b.Deposit(ctx, d); err != nil {
				t.Fatal(err)
			}
			if res, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil || !res.Allowed {
				t.Fatal(res, err)
			}
			if sum := be.rdb.HGet(ctx, key, "z:spend").Val(); sum == "" {
				t.Fatal("no summary after a deposit and a spend: the case tests nothing")
			}
			// An older agent's deposit: the lease's fields, no summary.
			if err := be.rdb.HSet(ctx, key, "r:L0", 30, "s:L0", T0, "d:L0", T0+2000).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := b.Spend(ctx, []string{key}, []int64{10}, T0+1)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed || res.Keys[0].Balance != 24 {
				t.Fatalf("a cost of 10 with 4 + 30 tokens in open leases, the summary knowing of 4: %+v, want admitted, 24 left", res)
			}
		})
	}
}
