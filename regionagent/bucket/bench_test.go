package bucket

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// benchBuckets starts redis-server and deposits, in each of `limits`
// buckets, `leases` leases far too large to run out (three: an active
// window's renewals overlap), the i-th ending i+1 hours from now, so every
// benchmarked spend is admitted and does the full work.
func benchBuckets(b *testing.B, opts *redis.Options, limits, leases int) (*Buckets, []string) {
	b.Helper()
	srv, _ := realRedis(b)
	opts.Addr = srv.Addr()
	rdb := redis.NewClient(opts)
	b.Cleanup(func() { _ = rdb.Close() })
	bk := New(rdb)
	ctx := context.Background()
	if err := bk.Load(ctx); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMilli()
	keys := make([]string, limits)
	for l := range keys {
		keys[l] = Key("", benchLimit(l), 1)
		for i := range leases {
			_, err := bk.Deposit(ctx, Deposit{Key: keys[l], LeaseID: "L" + strconv.Itoa(i), Tokens: 1 << 50,
				StartMs: now - 1000, DeadlineMs: now + int64(i+1)*3_600_000, ExpireAtMs: now + 4*3_600_000})
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	return bk, keys
}

// benchLimit is the id of benchBuckets' l-th limit (its bucket is of
// window 1).
func benchLimit(l int) string { return "bench" + strconv.Itoa(l) }

// redisScriptUsec is the microseconds redis-server has spent in EVALSHA
// calls since it started (INFO commandstats).
func redisScriptUsec(b *testing.B, rdb redis.UniversalClient) int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
		}
	}
	return 0
}

func reportOps(b *testing.B, spends int) {
	b.ReportMetric(float64(spends)/b.Elapsed().Seconds(), "spends/s")
}

// BenchmarkSpend is one EVALSHA per spend, one caller: the round-trip latency.
func BenchmarkSpend(b *testing.B) {
	bk, keys := benchBuckets(b, &redis.Options{}, 1, 3)
	ctx := context.Background()
	costs := []int64{1}
	b.ReportAllocs()
	for b.Loop() {
		r, err := bk.Spend(ctx, keys, costs, 0)
		if err != nil || !r.Allowed {
			b.Fatal(r, err)
		}
	}
	reportOps(b, b.N)
}

// BenchmarkSpendParallel is one EVALSHA per spend from 50 callers: Redis's
// unpipelined throughput.
func BenchmarkSpendParallel(b *testing.B) {
	bk, keys := benchBuckets(b, &redis.Options{PoolSize: 64}, 1, 3)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(25) // x GOMAXPROCS (2) = 50 callers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		costs := []int64{1}
		for pb.Next() {
			if _, err := bk.Spend(ctx, keys, costs, 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportOps(b, b.N)
}

// BenchmarkSpendBatch sends batches of n spends, one pipeline each, from one
// caller; one iteration is one batch (ns/op is per batch, spends/s counts
// spends). limits=1: every spend on one hot limit, one script call decides
// the batch; limits=16: spread over 16 limits, 16 script calls per pipeline.
func BenchmarkSpendBatch(b *testing.B) {
	for _, n := range []int{16, 64} {
		for _, limits := range []int{1, 16, n} {
			b.Run(fmt.Sprintf("n=%d/limits=%d", n, limits), func(b *testing.B) {
				bk, keys := benchBuckets(b, &redis.Options{}, limits, 3)
				ctx := context.Background()
				ops := make([]SpendOp, n)
				for i := range ops {
					ops[i] = SpendOp{Keys: []string{keys[i%limits]}, Costs: []int64{1}}
				}
				before := redisScriptUsec(b, bk.rdb)
				b.ReportAllocs()
				for b.Loop() {
					res, err := bk.SpendBatch(ctx, ops)
					if err != nil || !res[n-1].Allowed {
						b.Fatal(err)
					}
				}
				reportOps(b, b.N*n)
				// What the spends cost Redis itself, from its own counters:
				// a figure the load of the machine moves far less than the
				// wall clock (limits=n is the warm shape: every key once).
				b.ReportMetric(float64(redisScriptUsec(b, bk.rdb)-before)/float64(b.N*n), "redis-µs/spend")
			})
		}
	}
}

// BenchmarkSpendBatchParallel is 4 callers each sending batches of n spread
// over 16 limits: an agent with a few batchers on one Redis.
func BenchmarkSpendBatchParallel(b *testing.B) {
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("n=%d/limits=16", n), func(b *testing.B) {
			bk, keys := benchBuckets(b, &redis.Options{}, 16, 3)
			ctx := context.Background()
			var batches atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(2) // x GOMAXPROCS (2) = 4 callers
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ops := make([]SpendOp, n)
				for i := range ops {
					ops[i] = SpendOp{Keys: []string{keys[i%len(keys)]}, Costs: []int64{1}}
				}
				for pb.Next() {
					if _, err := bk.SpendBatch(ctx, ops); err != nil {
						b.Error(err)
						return
					}
					batches.Add(1)
				}
			})
			reportOps(b, int(batches.Load())*n)
		})
	}
}

// BenchmarkSpendRedisCPU splits what a spend batch costs redis-server
// itself into a per-call and a per-key part, from its own CPU counters
// (INFO cpu, used_cpu_user + used_cpu_sys), for the warm shape: every key
// of the call a different limit holding one lease (as a warm key does),
// or three.
// The shapes take turns, 100 calls each per iteration, so a machine whose
// load drifts moves them alike: compare them within one run. "floor" is
// a script that returns at once (the round trip and the EVALSHA itself),
// "keys=1" and "keys=64" one spend call of 1 and of 64 keys; per key =
// (keys=64 - keys=1) / 63, per call = keys=1 - per key. The commands the
// scripts run per key (INFO commandstats, split the same way) are
// reported as <command>/key, and the time Redis spent inside EVALSHA per
// key (commandstats' usec: no I/O, less moved by load than the CPU
// counters) as redis-evalsha-µs/key.
func BenchmarkSpendRedisCPU(b *testing.B) {
	for _, leases := range []int{1, 3} {
		b.Run(fmt.Sprintf("leases=%d", leases), func(b *testing.B) { benchSpendRedisCPU(b, leases) })
	}
}

// benchSpendRedisCPU is BenchmarkSpendRedisCPU with buckets of n leases
// (3: a window whose renewals overlap).
func benchSpendRedisCPU(b *testing.B, n int) {
	bk, keys := benchBuckets(b, &redis.Options{}, 64, n)
	rdb := bk.rdb
	ctx := context.Background()
	floor, err := rdb.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		b.Fatal(err)
	}
	ops := func(n int) []SpendOp {
		o := make([]SpendOp, n)
		for i := range o {
			o[i] = SpendOp{Keys: []string{keys[i]}, Costs: []int64{1}}
		}
		return o
	}
	shapes := []struct {
		name string
		call func() error
	}{
		{"floor", func() error { return rdb.EvalSha(ctx, floor, nil).Err() }},
		{"keys=1", func() error { _, err := bk.SpendBatch(ctx, ops(1)); return err }},
		{"keys=64", func() error { _, err := bk.SpendBatch(ctx, ops(64)); return err }},
	}
	cpu := make([]float64, len(shapes))
	calls := make([]map[string]int64, len(shapes))
	for i := range calls {
		calls[i] = map[string]int64{}
	}
	for b.Loop() {
		for i, sh := range shapes {
			n0 := redisCalls(b, rdb)
			c0 := redisCPU(b, rdb)
			for range 100 {
				if err := sh.call(); err != nil {
					b.Fatal(err)
				}
			}
			cpu[i] += redisCPU(b, rdb) - c0
			for name, n := range redisCalls(b, rdb) {
				calls[i][name] += n - n0[name]
			}
		}
	}
	per := func(i int) float64 { return cpu[i] * 1e6 / float64(b.N*100) }
	for i, sh := range shapes {
		b.ReportMetric(per(i), "redis-cpu-µs/call-"+sh.name)
	}
	key := (per(2) - per(1)) / 63
	b.ReportMetric(key, "redis-cpu-µs/key")
	b.ReportMetric(per(1)-key, "redis-cpu-µs/call")
	for name, n := range calls[2] {
		perKey := float64(n-calls[1][name]) / float64(63*b.N*100)
		switch {
		case name == "evalsha-usec":
			b.ReportMetric(perKey, "redis-evalsha-µs/key")
		case !strings.HasSuffix(name, "-usec") && name != "info" && perKey >= 0.005:
			b.ReportMetric(perKey, name+"/key")
		}
	}
}

// redisCalls is how often redis-server has run each command since it
// started (INFO commandstats), commands called by scripts included.
func redisCalls(b *testing.B, rdb redis.UniversalClient) map[string]int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, stats, _ := strings.Cut(rest, ":")
		for f := range strings.SplitSeq(stats, ",") {
			for _, m := range []struct{ field, name string }{{"calls=", name}, {"usec=", name + "-usec"}} {
				if v, ok := strings.CutPrefix(f, m.field); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						b.Fatal(err)
					}
					calls[m.name] = n
				}
			}
		}
	}
	return calls
}

// redisCPU is the CPU seconds redis-server has used since it started.
func redisCPU(b *testing.B, rdb redis.UniversalClient) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var t float64
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				t += x
			}
		}
	}
	return t
}

// TestMemoryPerKey measures Redis memory for active (limit, window) keys
// holding 3 leases each, after spends and one closed lease: MEMORY USAGE of
// one key and the used_memory delta over 1,000 keys.
func TestMemoryPerKey(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	b := New(rdb)
	now := time.Now().UnixMilli()
	used := func() int64 {
		t.Helper()
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatal("no used_memory in INFO")
		return 0
	}
	fill := func(limit string) string {
		key := Key("", limit, 28_333_333)
		for i := range 3 {
			_, err := b.Deposit(ctx, Deposit{Key: key, LeaseID: fmt.Sprintf("01JDX3ZK%018d", i), Tokens: 1000,
				StartMs: now - 1000, DeadlineMs: now + int64(i+1)*20_000, ExpireAtMs: now + 120_000})
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Spend(ctx, []string{key}, []int64{1500}, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Spend(ctx, []string{key}, []int64{5000}, 0); err != nil {
			t.Fatal(err)
		}
		return key
	}
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	one := fill("tenant/atlas")
	usage, err := rdb.MemoryUsage(ctx, one).Result()
	if err != nil {
		t.Fatal(err)
	}
	fields := rdb.HLen(ctx, one).Val()

	const n = 1000
	before := used()
	for i := range n {
		fill(fmt.Sprintf("tenant/t%06d", i))
	}
	perKey := (used() - before) / n
	t.Logf("one key, 3 leases (26-char ids), %d fields: MEMORY USAGE %d bytes; used_memory delta over %d keys: %d bytes/key", fields, usage, n, perKey)
	if usage <= 0 || usage > 2048 || perKey <= 0 || perKey > 4096 {
		t.Fatalf("memory per key out of the expected range: %d, %d", usage, perKey)
	}
}

// BenchmarkBaseline measures the same calls with a trivial script
// (return 1), to tell the round trip and go-redis apart from the bucket
// script's own cost on the machine at hand.
func BenchmarkBaseline(b *testing.B) {
	_, rdb := realRedis(b)
	ctx := context.Background()
	trivial := redis.NewScript("return 1")
	if err := trivial.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	keys := []string{Key("", "base", 1)}
	b.Run("evalsha", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := trivial.EvalSha(ctx, rdb, keys).Err(); err != nil {
				b.Fatal(err)
			}
		}
		reportOps(b, b.N)
	})
	b.Run("pipeline16", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pipe := rdb.Pipeline()
			for range 16 {
				trivial.EvalSha(ctx, pipe, keys)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		reportOps(b, b.N*16)
	})
}

// benchRate starts redis-server and installs, in a bucket limit's token
// bucket, a share refilling far faster than any benchmark spends (a
// billion tokens per second, burst 4 billion), so every take is admitted
// and does the full work.
func benchRate(b *testing.B, opts *redis.Options) (*Buckets, string) {
	b.Helper()
	srv, _ := realRedis(b)
	opts.Addr = srv.Addr()
	rdb := redis.NewClient(opts)
	b.Cleanup(func() { _ = rdb.Close() })
	bk := New(rdb)
	ctx := context.Background()
	if err := bk.Load(ctx); err != nil {
		b.Fatal(err)
	}
	key := RateKey("", "benchrate")
	now := time.Now().UnixMilli()
	_, err := bk.InstallShare(ctx, key, ShareInstall{Share: share(1, 1_000_000_000_000, 4_000_000_000, now+3_600_000),
		ExpireAtMs: now + 4*3_600_000, NowMs: now - 10_000})
	if err != nil {
		b.Fatal(err)
	}
	return bk, key
}

// BenchmarkTake is BenchmarkSpend for a bucket limit: one EVALSHA of
// rate.lua per take, one caller.
func BenchmarkTake(b *testing.B) {
	bk, key := benchRate(b, &redis.Options{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		r, err := bk.Take(ctx, key, 1, 0, false)
		if err != nil || !r.Allowed {
			b.Fatal(r, err)
		}
	}
	reportOps(b, b.N)
}

// BenchmarkTakeParallel is BenchmarkSpendParallel for a bucket limit: 50
// callers, one EVALSHA per take.
func BenchmarkTakeParallel(b *testing.B) {
	bk, key := benchRate(b, &redis.Options{PoolSize: 64})
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(25) // x GOMAXPROCS (2) = 50 callers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bk.Take(ctx, key, 1, 0, false); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportOps(b, b.N)
}

// BenchmarkReserveRedisCPU measures redis-server's CPU per chunk taken and
// given back (a reservation and its release) on 64 limits: each op in a
// batch of its own (a script call each), and the 64 limits' at once (a
// batch of the reservations, then one of the releases: reservations.lua,
// one call for each); and the commands the scripts run per chunk.
//
//	go test -run '^$' -bench BenchmarkReserveRedisCPU -benchtime 20x ./regionagent/bucket/
func BenchmarkReserveRedisCPU(b *testing.B) {
	bk, keys := benchBuckets(b, &redis.Options{}, 64, 1)
	rdb := bk.rdb
	ctx := context.Background()
	seq := 0
	pairs := func(first, n int) {
		reserve, release := make([]SpendOp, n), make([]SpendOp, n)
		for i := range n {
			seq++
			id := "c" + strconv.Itoa(seq)
			reserve[i] = SpendOp{Reserve: &ReserveOp{Key: keys[first+i], ID: id, Want: 100, Min: 1}}
			release[i] = SpendOp{Release: &ReleaseOp{Key: keys[first+i], ID: id, Unspent: 40}}
		}
		for _, ops := range [][]SpendOp{reserve, release} {
			res, err := bk.SpendBatch(ctx, ops)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
	}
	var alone, batched float64
	cmds := map[string]int64{}
	for b.Loop() {
		c0 := redisCPU(b, rdb)
		for l := range keys {
			pairs(l, 1)
		}
		c1, n1 := redisCPU(b, rdb), redisCalls(b, rdb)
		pairs(0, len(keys))
		alone, batched = alone+c1-c0, batched+redisCPU(b, rdb)-c1
		for name, n := range redisCalls(b, rdb) {
			cmds[name] += n - n1[name]
		}
	}
	per := float64(b.N * len(keys))
	b.ReportMetric(alone*1e6/per, "redis-cpu-µs/chunk-alone")
	b.ReportMetric(batched*1e6/per, "redis-cpu-µs/chunk-batched")
	// What a chunk's reservation and release run, batched (the scripts'
	// commands; EVALSHA and the INFO that reads the counts left out).
	total := int64(0)
	for name, n := range cmds {
		if n > 0 && name != "evalsha" && name != "info" && !strings.HasSuffix(name, "-usec") {
			total += n
			b.ReportMetric(float64(n)/per, name+"/chunk")
		}
	}
	b.ReportMetric(float64(total)/per, "cmds/chunk")
}

// BenchmarkUsageRedisCPU measures redis-server's CPU per usage read (a
// limit's epoch and one window's counters, as a report round reads them)
// on 256 limits: each read a call and a round trip of its own, and the
// reads in pipelines of 64 (Batch.Usage, as the agent sends them).
//
//	go test -run '^$' -bench BenchmarkUsageRedisCPU -benchtime 50x ./regionagent/bucket/
func BenchmarkUsageRedisCPU(b *testing.B) {
	const perPipeline = 64
	bk, keys := benchBuckets(b, &redis.Options{}, 256, 1)
	ctx := context.Background()
	refs := make([]LimitRef, len(keys))
	for l := range refs {
		refs[l] = LimitRef{ID: benchLimit(l)}
	}
	if err := bk.SetEpochs(ctx, refs); err != nil {
		b.Fatal(err)
	}
	window := []int64{1}
	var alone, batched float64
	for b.Loop() {
		c0 := redisCPU(b, bk.rdb)
		for _, l := range refs {
			if epoch, _, err := bk.Usage(ctx, l, window); err != nil || epoch == "" {
				b.Fatal(epoch, err)
			}
		}
		c1 := redisCPU(b, bk.rdb)
		for first := 0; first < len(refs); first += perPipeline {
			x := bk.Batch()
			for _, l := range refs[first : first+perPipeline] {
				x.Usage(l, window)
			}
			x.Exec(ctx)
			for i := range perPipeline {
				if epoch, _, err := x.UsageOf(i); err != nil || epoch == "" {
					b.Fatal(epoch, err)
				}
			}
		}
		alone, batched = alone+c1-c0, batched+redisCPU(b, bk.rdb)-c1
	}
	per := float64(b.N * len(refs))
	b.ReportMetric(alone*1e6/per, "redis-cpu-µs/read-alone")
	b.ReportMetric(batched*1e6/per, "redis-cpu-µs/read-batched")
}

// BenchmarkColdRedisCPU measures redis-server's CPU per limit for each step
// an agent takes on a limit's first Check of a window (a cold limit), 64
// limits at a time as a renewal round batches them: the spend that finds
// no lease, the round's lock and balance read, the lease's deposit, the
// unlock, and the spend that is then admitted.
//
//	go test -run '^$' -bench BenchmarkColdRedisCPU -benchtime 50x ./regionagent/bucket/
func BenchmarkColdRedisCPU(b *testing.B) {
	const limits = 64
	bk, _ := benchBuckets(b, &redis.Options{}, 0, 0)
	rdb := bk.rdb
	ctx := context.Background()
	spend := func(keys []string) {
		ops := make([]SpendOp, len(keys))
		for i, k := range keys {
			ops[i] = SpendOp{Keys: []string{k}, Costs: []int64{1}}
		}
		if _, err := bk.SpendBatch(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	batch := func(keys []string, add func(x *Batch, i int, k string)) {
		x := bk.Batch()
		for i, k := range keys {
			add(x, i, k)
		}
		x.Exec(ctx)
		for i := range x.Len() {
			if err := x.Err(i); err != nil {
				b.Fatal(err)
			}
		}
	}
	now := time.Now().UnixMilli()
	steps := []struct {
		name string
		run  func(keys []string)
	}{
		{"spend-miss", spend},
		{"lock+balance", func(keys []string) {
			batch(keys, func(x *Batch, _ int, k string) {
				x.TryLock(LockKey("", k), "owner", 3*time.Second)
				x.Balance(k, 0)
			})
		}},
		{"deposit", func(keys []string) {
			batch(keys, func(x *Batch, _ int, k string) {
				x.Deposit(Deposit{Key: k, LeaseID: "w/eu/r1", Tokens: 1000, StartMs: now - 1000,
					DeadlineMs: now + 3_600_000, ExpireAtMs: now + 4*3_600_000})
			})
		}},
		{"unlock", func(keys []string) {
			batch(keys, func(x *Batch, _ int, k string) { x.Unlock(LockKey("", k), "owner") })
		}},
		{"spend-hit", spend},
	}
	cpu := make([]float64, len(steps))
	cmds := make([]map[string]int64, len(steps))
	for i := range cmds {
		cmds[i] = map[string]int64{}
	}
	win := 0
	for b.Loop() {
		win++
		keys := make([]string, limits)
		for i := range keys {
			keys[i] = Key("", benchLimit(i), int64(win))
		}
		for i, st := range steps {
			n0, c0 := redisCalls(b, rdb), redisCPU(b, rdb)
			st.run(keys)
			cpu[i] += redisCPU(b, rdb) - c0
			for name, n := range redisCalls(b, rdb) {
				cmds[i][name] += n - n0[name]
			}
		}
	}
	per := float64(b.N * limits)
	total := 0.0
	for i, st := range steps {
		total += cpu[i]
		b.ReportMetric(cpu[i]*1e6/per, "redis-cpu-µs/"+st.name)
		var n int64
		for name, c := range cmds[i] {
			if name != "info" && !strings.HasSuffix(name, "-usec") {
				n += c
			}
		}
		b.ReportMetric(float64(n)/per, "cmds/"+st.name)
	}
	b.ReportMetric(total*1e6/per, "redis-cpu-µs/limit")
}
