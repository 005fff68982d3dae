package bucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSpendBatch checks that a batch gives the same results as the same
// spends run one by one, that an invalid op fails alone, and that the whole
// batch is one pipeline round trip.
func TestSpendBatch(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := loaded(t, ctx, be)
			a, c, o := Key("", "batch", 1), Key("", "batch", 2), Key("", "other", 1)
			mustDeposit(t, ctx, b, Deposit{Key: a, LeaseID: "L1", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			mustDeposit(t, ctx, b, Deposit{Key: c, LeaseID: "L2", Tokens: 3, StartMs: T0, DeadlineMs: T0 + 2000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			mustDeposit(t, ctx, b, Deposit{Key: o, LeaseID: "L3", Tokens: 5, StartMs: T0, DeadlineMs: T0 + 3000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)

			var pipelines, calls atomic.Int64
			be.rdb.AddHook(countHook{pipelines: &pipelines, calls: &calls})
			ops := []SpendOp{
				{Keys: []string{a}, Costs: []int64{4}, NowMs: T0},
				{Keys: []string{a, c}, Costs: []int64{4, 4}, NowMs: T0},
				{Keys: []string{a}, Costs: []int64{-1}, NowMs: T0}, // invalid
				{Keys: []string{c, a}, Costs: []int64{3, 6}, NowMs: T0},
				{Keys: []string{a}, Costs: []int64{1}, NowMs: T0 + 1000}, // own call: other now
				{Keys: []string{o, a}, Costs: []int64{2, 0}, NowMs: T0},  // own call: two hash tags
				{Keys: []string{o}, Costs: []int64{4}, NowMs: T0},
			}
			res, err := b.SpendBatch(ctx, ops)
			if err != nil {
				t.Fatalf("SpendBatch error = %v, want nil: only one op failed", err)
			}
			if !errors.Is(res[2].Err, ErrInvalid) {
				t.Fatalf("op 2 Err = %v, want ErrInvalid", res[2].Err)
			}
			res[2].Err = nil
			want := []SpendResult{
				{Allowed: true, Failed: -1, Keys: []KeyResult{yes(6, T0+1000)}},
				{Allowed: false, Failed: 1, Keys: []KeyResult{yes(6, T0+1000), no(3, T0+2000)}},
				{Failed: -1},
				{Allowed: true, Failed: -1, Keys: []KeyResult{yes(0, 0), yes(0, 0)}},
				{Allowed: false, Failed: 0, Keys: []KeyResult{no(0, 0)}},
				{Allowed: true, Failed: -1, Keys: []KeyResult{yes(3, T0+3000), yes(0, 0)}},
				{Allowed: false, Failed: 0, Keys: []KeyResult{no(3, T0+3000)}},
			}
			for i := range res {
				res[i] = stripCounts(res[i])
			}
			if !reflect.DeepEqual(res, want) {
				t.Fatalf("SpendBatch:\n got %+v\nwant %+v", res, want)
			}
			if n := pipelines.Load(); n != 1 {
				t.Fatalf("%d pipelines sent, want 1", n)
			}
			// One Redis, not a Cluster: one script call for every op of
			// one now, whatever their hash tags, and one for the other now.
			if n := calls.Load(); n != 2 {
				t.Fatalf("%d script calls sent, want 2 (one per now)", n)
			}
			if res, err := b.SpendBatch(ctx, nil); err != nil || len(res) != 0 || pipelines.Load() != 1 {
				t.Fatalf("empty SpendBatch = %v, %v, or sent a pipeline", res, err)
			}
			got, err := b.Balance(ctx, a, T0)
			if err != nil {
				t.Fatal(err)
			}
			if got.Admitted != 10 || got.Denied != 1 {
				t.Fatalf("a counters admitted %d denied %d, want 10, 1", got.Admitted, got.Denied)
			}
		})
	}
}

// countHook counts pipelines of EVALSHA sent, and (if calls is set) the
// EVALSHA calls in them.
type countHook struct {
	pipelines *atomic.Int64
	calls     *atomic.Int64
}

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" {
			h.pipelines.Add(1)
			if h.calls != nil {
				h.calls.Add(int64(len(cmds)))
			}
		}
		return next(ctx, cmds)
	}
}

// TestNoScript flushes the script cache before single and pipelined calls:
// they must reload and run exactly once.
func TestNoScript(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := loaded(t, ctx, be)
			flush := func() {
				t.Helper()
				if err := be.rdb.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if ok := be.rdb.ScriptExists(ctx, spendScript.sha).Val(); len(ok) != 1 || ok[0] {
					t.Fatalf("script still cached after SCRIPT FLUSH: %v", ok)
				}
			}
			key := Key("", "noscript", 1)
			flush()
			mustDeposit(t, ctx, b, Deposit{Key: key, LeaseID: "L1", Tokens: 100, StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
			flush()
			r, err := b.Spend(ctx, []string{key}, []int64{5}, T0)
			if err != nil || !r.Allowed || r.Keys[0].Balance != 95 {
				t.Fatalf("Spend after flush = %+v, %v; want allowed, balance 95", r, err)
			}
			flush()
			ops := make([]SpendOp, 8)
			for i := range ops {
				ops[i] = SpendOp{Keys: []string{key}, Costs: []int64{int64(i + 1)}, NowMs: T0}
			}
			res, err := b.SpendBatch(ctx, ops)
			if err != nil {
				t.Fatalf("SpendBatch after flush: %v", err)
			}
			left := int64(95)
			for i, r := range res {
				left -= int64(i + 1)
				if !r.Allowed || r.Keys[0].Balance != left {
					t.Fatalf("op %d = %+v, want allowed with balance %d", i, r, left)
				}
			}
			flush()
			if c, err := b.Close(ctx, key, "L1", T0); err != nil || c.Unspent != 59 {
				t.Fatalf("Close after flush = %+v, %v; want unspent 59", c, err)
			}
			flush()
			if got, err := b.Balance(ctx, key, T0); err != nil || got.Admitted != 41 {
				t.Fatalf("Balance after flush = %+v, %v; want admitted 41", got, err)
			}
			flush()
			lk := LockKey("", "noscript")
			if ok, err := b.TryLock(ctx, lk, "o", time.Second); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if err := b.Unlock(ctx, lk, "o"); err != nil {
				t.Fatalf("Unlock after flush: %v", err)
			}
		})
	}
}

// dropHook simulates a pipeline in which some EVALSHAs meet NOSCRIPT (as
// when one Cluster primary lost its script cache): the ops it picks are
// not sent and get a NOSCRIPT error, as Redis would answer without running
// them. Only the first `left` EVALSHA pipelines are affected.
type dropHook struct {
	mu      sync.Mutex
	left    int // pipelines still to tamper with
	dropped int
}

func (h *dropHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *dropHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *dropHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		tamper := h.left > 0 && len(cmds) > 0 && cmds[0].Name() == "evalsha"
		if tamper {
			h.left--
		}
		h.mu.Unlock()
		if !tamper {
			return next(ctx, cmds)
		}
		var send []redis.Cmder
		for i, c := range cmds {
			if i%3 == 1 && c.Name() == "evalsha" {
				c.SetErr(redis.ErrNoScript)
				h.mu.Lock()
				h.dropped++
				h.mu.Unlock()
				continue
			}
			send = append(send, c)
		}
		if len(send) == 0 {
			return nil
		}
		return next(ctx, send)
	}
}

func TestNoScriptPartialPipeline(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// Seven limits, each spent at its own now: the batch is seven script
	// calls in one pipeline (on one Redis, ops of one now share a call).
	const limits = 7
	for l := range limits {
		mustDeposit(t, ctx, b, Deposit{Key: Key("", fmt.Sprint("partial", l), 1), LeaseID: "L1", Tokens: 1000,
			StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
	}
	hook := &dropHook{left: 2}
	rdb.AddHook(hook)
	ops := make([]SpendOp, 3*limits)
	var sum [limits]int64
	for i := range ops {
		cost := int64(i + 1)
		ops[i] = SpendOp{Keys: []string{Key("", fmt.Sprint("partial", i%limits), 1)}, Costs: []int64{cost}, NowMs: T0 + int64(i%limits)}
		sum[i%limits] += cost
	}
	res, err := b.SpendBatch(ctx, ops)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Allowed {
			t.Fatalf("op %d denied: %+v", i, r)
		}
	}
	if hook.dropped < 3 || hook.left != 0 {
		t.Fatalf("hook dropped %d calls over %d pipelines; the test did not exercise re-sending", hook.dropped, 2-hook.left)
	}
	for l := range limits {
		got, err := b.Balance(ctx, Key("", fmt.Sprint("partial", l), 1), T0)
		if err != nil {
			t.Fatal(err)
		}
		// Every op ran exactly once: none lost, none re-run.
		if got.Admitted != sum[l] || got.Spendable != 1000-sum[l] {
			t.Fatalf("limit %d: admitted %d, spendable %d; want %d, %d", l, got.Admitted, got.Spendable, sum[l], 1000-sum[l])
		}
	}
}

// TestSpendBatchMatchesSequential runs the same random spends as one
// SpendBatch and as separate Spend calls on identical buckets: the results
// and the final buckets must be the same. The batch spans several limits,
// multi-key spends and more spends per limit than one script call takes.
func TestSpendBatchMatchesSequential(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			rng := rand.New(rand.NewPCG(7, 11))
			const limits, windows = 3, 2
			key := func(prefix string, l, w int) string { return Key("", fmt.Sprintf("%s%d", prefix, l), int64(w)) }
			for _, prefix := range []string{"seq", "bat"} {
				for l := range limits {
					for w := range windows {
						k := key(prefix, l, w)
						for i, d := range []Deposit{
							{Tokens: 150, StartMs: T0 - 10, DeadlineMs: T0 + 500},
							{Tokens: 90, StartMs: T0, DeadlineMs: T0 + 300},
							{Tokens: 70, StartMs: T0 + 1, DeadlineMs: T0 + 900}, // not started
						} {
							d.Key, d.LeaseID, d.ExpireAtMs, d.NowMs = k, fmt.Sprint("L", i), farExpiry(), T0
							mustDeposit(t, ctx, b, d, Deposited)
						}
					}
				}
			}
			type spec struct {
				l     int
				ws    []int
				costs []int64
			}
			specs := make([]spec, 2*maxSpendsPerCall+40)
			for i := range specs {
				s := spec{l: rng.IntN(limits)}
				for range 1 + rng.IntN(3) { // 1..3 keys of one limit, repeats allowed
					s.ws = append(s.ws, rng.IntN(windows))
					s.costs = append(s.costs, rng.Int64N(8))
				}
				specs[i] = s
			}
			var want []SpendResult
			ops := make([]SpendOp, len(specs))
			for i, s := range specs {
				var seqKeys []string
				for _, w := range s.ws {
					seqKeys = append(seqKeys, key("seq", s.l, w))
					ops[i].Keys = append(ops[i].Keys, key("bat", s.l, w))
				}
				ops[i].Costs, ops[i].NowMs = s.costs, T0
				r, err := b.Spend(ctx, seqKeys, s.costs, T0)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, r)
			}
			got, err := b.SpendBatch(ctx, ops)
			if err != nil {
				t.Fatal(err)
			}
			allowed, denied := 0, 0
			for i := range want {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("op %d %+v:\nbatch      %+v\nsequential %+v", i, specs[i], got[i], want[i])
				}
				if want[i].Allowed {
					allowed++
				} else {
					denied++
				}
			}
			if allowed == 0 || denied == 0 {
				t.Fatalf("%d allowed, %d denied: the random spends do not cover both outcomes", allowed, denied)
			}
			for l := range limits {
				for w := range windows {
					s, err1 := b.Balance(ctx, key("seq", l, w), T0)
					g, err2 := b.Balance(ctx, key("bat", l, w), T0)
					if err1 != nil || err2 != nil {
						t.Fatal(err1, err2)
					}
					if !reflect.DeepEqual(s, g) {
						t.Fatalf("limit %d window %d: batch bucket %+v, sequential %+v", l, w, g, s)
					}
				}
			}
		})
	}
}

// TestRedisRestart kills redis-server and restarts it empty: calls
// reconnect, reload their scripts and see the empty state.
func TestRedisRestart(t *testing.T) {
	srv, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	key := Key("", "restart", 1)
	d := Deposit{Key: key, LeaseID: "L1", Tokens: 10, StartMs: T0, DeadlineMs: T0 + 1000, ExpireAtMs: farExpiry(), NowMs: T0}
	mustDeposit(t, ctx, b, d, Deposited)
	srv.Kill()
	if _, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err == nil {
		t.Fatal("Spend with Redis down succeeded")
	}
	srv.Restart()
	r, err := b.Spend(ctx, []string{key}, []int64{1}, T0)
	if err != nil {
		t.Fatalf("Spend after restart: %v", err)
	}
	if r.Allowed {
		t.Fatalf("Spend after restart allowed on an empty Redis: %+v", r)
	}
	mustDeposit(t, ctx, b, d, Deposited)
	if r, err := b.Spend(ctx, []string{key}, []int64{1}, T0); err != nil || !r.Allowed {
		t.Fatalf("Spend after re-deposit = %+v, %v", r, err)
	}
}

// TestConcurrentSpend hammers one key from 2 clients x 32 goroutines while
// 5 leases of 1,000 tokens arrive: no token is spent twice or lost, no
// balance goes negative, and the counters match what callers saw.
func TestConcurrentSpend(t *testing.T) {
	_, rdb1 := realRedis(t)
	ctx := testCtx(t)
	rdb2 := newClient(t, rdb1.Options().Addr)
	clients := []*Buckets{New(rdb1), New(rdb2)}
	key := Key("", "hammer", 1)

	const (
		leases     = 5
		perLease   = 1000
		deposited  = leases * perLease
		goroutines = 32
		attempts   = 150 // per goroutine: 9,600 spends of mean cost 3
	)
	now := time.Now().UnixMilli()
	deposit := func(i int) {
		_, err := clients[i%2].Deposit(ctx, Deposit{Key: key, LeaseID: "L" + string(rune('0'+i)), Tokens: perLease,
			StartMs: now - 1000, DeadlineMs: now + int64(i+1)*600_000, ExpireAtMs: now + 3_600_000})
		if err != nil {
			t.Error(err)
		}
	}
	deposit(0)
	deposit(1)

	var admitted, denied, calls atomic.Int64
	stop := time.Now().Add(30 * time.Second) // time bound besides the count
	var wg sync.WaitGroup
	for c := range clients {
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(c), uint64(g)))
				for range attempts {
					if time.Now().After(stop) {
						return
					}
					cost := 1 + rng.Int64N(5)
					r, err := clients[c].Spend(ctx, []string{key}, []int64{cost}, 0)
					if err != nil {
						t.Error(err)
						return
					}
					calls.Add(1)
					k := r.Keys[0]
					switch {
					case k.Balance < 0:
						t.Errorf("negative balance %d", k.Balance)
					case r.Allowed:
						admitted.Add(cost)
					case k.Balance >= cost:
						t.Errorf("denied cost %d with balance %d", cost, k.Balance)
					default:
						denied.Add(cost)
					}
				}
			}()
		}
	}
	for i := 2; i < leases; i++ { // the rest arrive during the load
		time.Sleep(5 * time.Millisecond)
		deposit(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	got, err := clients[0].Balance(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d spends, admitted %d, denied %d, left %d", calls.Load(), admitted.Load(), denied.Load(), got.Spendable)
	if calls.Load() != 2*goroutines*attempts {
		t.Fatalf("only %d of %d spends ran within the time bound", calls.Load(), 2*goroutines*attempts)
	}
	if admitted.Load()+got.Spendable != deposited {
		t.Fatalf("admitted %d + left %d != deposited %d", admitted.Load(), got.Spendable, deposited)
	}
	if got.Spendable >= 5 {
		t.Fatalf("%d tokens left after %d spends: the load did not drain the bucket", got.Spendable, calls.Load())
	}
	if got.Admitted != admitted.Load() || got.Denied != denied.Load() {
		t.Fatalf("counters admitted %d denied %d, callers saw %d, %d", got.Admitted, got.Denied, admitted.Load(), denied.Load())
	}
	var closed int64
	for i := range leases {
		r, err := clients[i%2].Close(ctx, key, "L"+string(rune('0'+i)), 0)
		if err != nil {
			t.Fatal(err)
		}
		closed += r.Unspent
	}
	if closed != got.Spendable {
		t.Fatalf("closing returned %d, balance was %d", closed, got.Spendable)
	}
}

// TestConcurrentClose closes one lease from many goroutines while others
// spend: exactly one close is first, and all return the same amount.
func TestConcurrentClose(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	key := Key("", "close-race", 1)
	now := time.Now().UnixMilli()
	_, err := b.Deposit(ctx, Deposit{Key: key, LeaseID: "L1", Tokens: 10_000, StartMs: now - 1000,
		DeadlineMs: now + 600_000, ExpireAtMs: now + 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	var firsts, spent atomic.Int64
	results := make([]int64, 16)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 20 {
				r, err := b.Spend(ctx, []string{key}, []int64{3}, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					spent.Add(3)
				}
			}
		}()
		go func() {
			defer wg.Done()
			r, err := b.Close(ctx, key, "L1", 0)
			if err != nil {
				t.Error(err)
				return
			}
			if !r.AlreadyClosed {
				firsts.Add(1)
			}
			results[i] = r.Unspent
		}()
	}
	wg.Wait()
	if firsts.Load() != 1 {
		t.Fatalf("%d closes reported first, want 1", firsts.Load())
	}
	for _, u := range results {
		if u != results[0] {
			t.Fatalf("closes returned different amounts: %v", results)
		}
	}
	if results[0]+spent.Load() != 10_000 {
		t.Fatalf("unspent %d + spent %d != 10000", results[0], spent.Load())
	}
}

// TestSpendBatchRedisDown: with Redis unreachable every op carries the
// error and so does the batch.
func TestSpendBatchRedisDown(t *testing.T) {
	srv, _ := realRedis(t)
	ctx := testCtx(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer rdb.Close()
	b := New(rdb)
	srv.Kill()
	ops := []SpendOp{{Keys: []string{Key("", "a", 1)}, Costs: []int64{1}}, {Keys: []string{Key("", "b", 1)}, Costs: []int64{1}}}
	res, err := b.SpendBatch(ctx, ops)
	if err == nil {
		t.Fatal("SpendBatch with Redis down: nil error")
	}
	for i, r := range res {
		if r.Err == nil || r.Allowed || r.Failed != -1 || r.Keys != nil {
			t.Fatalf("op %d = %+v, want an undecided result", i, r)
		}
	}
}

// TestSpendBatchIntoReusesScratch: batches of varied sizes (one op, more
// than one script call's worth, an invalid op among them) sent one after
// another through one SpendScratch decide exactly what the same spends
// made one by one decide: nothing of a batch's results, calls or
// arguments leaks into the next.
func TestSpendBatchIntoReusesScratch(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx := testCtx(t)
			b := New(be.rdb)
			rng := rand.New(rand.NewPCG(3, 5))
			const limits = 4
			key := func(prefix string, l int) string { return Key("", fmt.Sprintf("%s%d", prefix, l), 0) }
			for _, prefix := range []string{"seq", "bat"} {
				for l := range limits {
					mustDeposit(t, ctx, b, Deposit{Key: key(prefix, l), LeaseID: "L", Tokens: 400, StartMs: T0 - 10,
						DeadlineMs: T0 + 500, ExpireAtMs: farExpiry(), NowMs: T0}, Deposited)
				}
			}
			var scratch SpendScratch
			allowed, denied, invalid := 0, 0, 0
			for n, size := range []int{1, maxSpendsPerCall + 7, 2, 1, 40, 3, maxSpendsPerCall*2 + 1, 1} {
				ops := make([]SpendOp, size)
				want := make([]SpendResult, size)
				for i := range ops {
					if size > 2 && i == size/2 {
						ops[i] = SpendOp{Costs: []int64{1}, NowMs: T0 + int64(n)} // no key: invalid, alone
						continue
					}
					var seqKeys []string
					for range 1 + rng.IntN(2) {
						l := rng.IntN(limits)
						seqKeys = append(seqKeys, key("seq", l))
						ops[i].Keys = append(ops[i].Keys, key("bat", l))
						ops[i].Costs = append(ops[i].Costs, rng.Int64N(9))
					}
					ops[i].NowMs = T0 + int64(n) // one NowMs a batch: one order (calls of several go in turn)
					r, err := b.Spend(ctx, seqKeys, ops[i].Costs, ops[i].NowMs)
					if err != nil {
						t.Fatal(err)
					}
					want[i] = r
				}
				got, err := b.SpendBatchInto(ctx, ops, &scratch)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != size {
					t.Fatalf("%d results for %d ops", len(got), size)
				}
				for i := range ops {
					if ops[i].Keys == nil {
						if got[i].Err == nil {
							t.Fatalf("batch of %d, op %d (no key): decided %+v", size, i, got[i])
						}
						invalid++
						continue
					}
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("batch of %d, op %d:\nbatch      %+v\nsequential %+v", size, i, got[i], want[i])
					}
					if want[i].Allowed {
						allowed++
					} else {
						denied++
					}
				}
			}
			if allowed == 0 || denied == 0 || invalid == 0 {
				t.Fatalf("%d allowed, %d denied, %d invalid: the batches do not cover every outcome", allowed, denied, invalid)
			}
		})
	}
}
