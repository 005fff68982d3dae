package regionagent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

func benchFlushers() int {
	n, _ := strconv.Atoi(os.Getenv("LEASEHOLD_BENCH_FLUSHERS"))
	return max(1, n)
}

// noopAgent answers every Check at once: the floor a real agent is
// compared with (the cost of the RPC itself).
type noopAgent struct {
	pb.UnimplementedRegionAgentServer
}

func (noopAgent) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 1,
		RetryAfter: durationpb.New(0), ResetAfter: durationpb.New(time.Second), LimitTokens: 1, Window: durationpb.New(time.Minute)}, nil
}

// serveTCP serves srv on a loopback TCP port and returns a client.
func serveTCP(b *testing.B, register func(*grpc.Server)) pb.RegionAgentClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go func() { _ = s.Serve(lis) }()
	b.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return pb.NewRegionAgentClient(conn)
}

// BenchmarkCheck measures gRPC Check calls per second and their latency
// (p50, p99) through the real agent (Redis bucket on a local
// redis-server, its work loop running) and through a do-nothing server,
// in the same run, with 1 and 64 concurrent callers on one connection, for
// one hot key and for 10,000 warm keys (each leased before the run, for
// the whole run; the callers cycle through them). The agent's figures carry their ratio to
// the do-nothing server's (LEASEHOLD_BENCH_FLUSHERS sets the Redis
// pipelines in flight, default 1).
func BenchmarkCheck(b *testing.B) {
	w := startWorld(b, false, "eu")
	hot := w.putLimit(limit("tenant/bench", 1<<40, time.Minute, 15*time.Second, "eu"))
	// Hour-long windows and leases: the warm keys stay leased for the whole
	// run (a key leased, left a minute and checked again is a cold key).
	warm := w.putLimits(10000, "tenant/warm-%05d", 1<<40, time.Hour, time.Hour, "eu")
	a, ctx, _ := runningBenchAgent(b, w, append([]string{hot.Id}, warm...))
	// The warm-up's own work (10,000 first reports, closes) settles before
	// anything is measured: reports go every 2 s.
	time.Sleep(5 * time.Second)
	servers := map[string]pb.RegionAgentClient{
		"agent": serveTCP(b, func(s *grpc.Server) { NewServer(a).Register(s) }),
		"noop":  serveTCP(b, func(s *grpc.Server) { pb.RegisterRegionAgentServer(s, noopAgent{}) }),
	}
	keySets := []struct {
		name string
		ids  []string
	}{{"hot", []string{hot.Id}}, {"warm10k", warm}}
	for _, ks := range keySets {
		for _, callers := range []int{1, 64} {
			floor := 0.0 // the do-nothing server's checks/s in this run
			for _, name := range []string{"noop", "agent"} {
				cl := servers[name]
				b.Run(fmt.Sprintf("keys=%s/server=%s/callers=%d", ks.name, name, callers), func(b *testing.B) {
					var next atomic.Int64
					lat := make([][]time.Duration, callers)
					var denied atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					sched0 := schedEvents()
					start := time.Now()
					for c := range callers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
								id := ks.ids[int(i)%len(ks.ids)]
								t0 := time.Now()
								resp, err := cl.Check(ctx, &pb.CheckRequest{LimitId: id, Cost: 1})
								lat[c] = append(lat[c], time.Since(t0))
								if err != nil {
									b.Error(err)
									return
								}
								if !resp.Allowed {
									denied.Add(1)
								}
							}
						}()
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					// Goroutines scheduled per Check, in this process (the
					// driver and the allocator included, alike for both
					// servers): a count that load does not move, where
					// each hand-off between goroutines is one. The runtime
					// samples them (it tracks one transition in 8), so
					// 0.125 sched/op is about one hand-off per Check.
					b.ReportMetric(float64(schedEvents()-sched0)/float64(b.N), "sched/op")
					all := slices.Concat(lat...)
					slices.Sort(all)
					rate := float64(b.N) / elapsed.Seconds()
					b.ReportMetric(rate, "checks/s")
					if name == "noop" {
						floor = rate
					} else if floor > 0 {
						b.ReportMetric(rate/floor, "x-noop")
					}
					if len(all) > 0 {
						b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
						b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
					}
					if d := denied.Load(); d > int64(b.N)/100 {
						b.Errorf("%d of %d checks denied: the benchmark measured denials", d, b.N)
					}
				})
			}
		}
	}
}

// BenchmarkCheckHandler counts what the agent's own Check path allocates:
// Server.Check called directly (no gRPC), for one hot key decided from a
// chunk in memory and for the same key through Redis (chunks off), beside
// the do-nothing server's handler. gRPC's own allocations (streams,
// frames, the codec) are the same for every server and are left out, so
// allocs/op above the do-nothing handler's are the agent's.
func BenchmarkCheckHandler(b *testing.B) {
	w := startWorld(b, false, "eu")
	hot := w.putLimit(limit("tenant/handler", 1<<40, time.Minute, 15*time.Second, "eu"))
	ctx := context.Background()
	servers := map[string]pb.RegionAgentServer{"noop": noopAgent{}}
	for _, name := range []string{"agent-redis", "agent-chunks"} {
		rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr(), PoolSize: 8})
		b.Cleanup(func() { rdb.Close() })
		opts := []Option{WithBatching(1, 128)}
		if name == "agent-chunks" {
			opts = append(opts, WithChunks(ChunkConfig{HotRate: 50}))
		}
		a, err := New(Config{Region: "eu", Allocators: []string{w.addr}, Redis: rdb, ReplicaID: name,
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Logger:      slog.New(slog.DiscardHandler)}, opts...)
		if err != nil {
			b.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(actx) }()
		b.Cleanup(func() { cancel(); <-done; a.Close() })
		<-a.Ready()
		srv := NewServer(a)
		// Warm up until the key is hot: chunks are taken after the rate
		// passes HotRate.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if resp, _ := srv.Check(ctx, &pb.CheckRequest{LimitId: hot.Id, Cost: 1}); resp != nil && resp.Allowed {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for range 5000 {
			_, _ = srv.Check(ctx, &pb.CheckRequest{LimitId: hot.Id, Cost: 1})
		}
		servers[name] = srv
	}
	for _, name := range []string{"noop", "agent-redis", "agent-chunks"} {
		srv := servers[name]
		b.Run("server="+name, func(b *testing.B) {
			req := &pb.CheckRequest{LimitId: hot.Id, Cost: 1}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := srv.Check(ctx, req)
				if err != nil || !resp.Allowed {
					b.Fatalf("%v %v", resp, err)
				}
			}
		})
	}
}

// schedEvents is how many times a goroutine has started running after
// being runnable, in this process (runtime/metrics /sched/latencies).
func schedEvents() uint64 {
	m := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
	rtmetrics.Read(m)
	if m[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range m[0].Value.Float64Histogram().Counts {
		n += c
	}
	return n
}

// BenchmarkCheckWarm measures the agent's own cost of a warm Check:
// Agent.Check called directly (no gRPC), over 10,000 limits each leased
// before the run (a Check is one spend in its Redis bucket, batched with
// the other callers'), on a real redis-server, with 1 and 64 callers.
// ns/op is wall time per Check over all callers; B/op and allocs/op
// count the whole process (the flusher, the work loop's reports and the
// allocator included) per Check, so they are the agent's allocations
// per warm decision with its background work spread over them. Set
// LEASEHOLD_BENCH_PROFILE to profile the measured run alone. The keys'
// windows are an hour long: a run that crosses the hour (UTC) sees its
// keys go cold, and measures first leases.
func BenchmarkCheckWarm(b *testing.B) {
	w := startWorld(b, false, "eu")
	warm := w.putLimits(10000, "tenant/warm-%05d", 1<<40, time.Hour, time.Hour, "eu")
	a, ctx, rdb := runningBenchAgent(b, w, warm)
	time.Sleep(5 * time.Second) // the warm-up's first reports settle (every 2 s)
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			var next atomic.Int64
			var denied atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			stopProfile := profileRun(b, fmt.Sprintf("callers%d", callers))
			b.ResetTimer()
			sched0, cpu0, rcpu0 := schedEvents(), processCPU(b), redisCPUOf(b, rdb)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						d, err := a.Check(ctx, warm[int(i)%len(warm)], 1)
						if err != nil {
							b.Error(err)
							return
						}
						if !d.Allowed {
							denied.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			stopProfile()
			b.ReportMetric(float64(schedEvents()-sched0)/float64(b.N), "sched/op")
			// CPU per Check, which the machine's other load moves far
			// less than the wall time: this process's (the agent, its
			// work loop and the in-process allocator and etcd), and
			// redis-server's.
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric((redisCPUOf(b, rdb)-rcpu0)*1e9/float64(b.N), "redis-cpu-ns/op")
			if d := denied.Load(); d > int64(b.N)/100 {
				b.Errorf("%d of %d checks denied: the benchmark measured denials", d, b.N)
			}
		})
	}
}

// BenchmarkCheckCold is BenchmarkCheckWarm's counterpart for first
// Checks: each Check is the first of a limit nobody has used (b.N limits
// created for the run, synced to the agent, never checked), so each pays
// its first lease: the spend that finds no tokens, the lease request to
// the in-process allocator (batched with the others'), the deposit and
// the spend again. With standing=5 the limits have a standing share of 5
// (G = 500): each first Check's spend carries the share's deposit, and
// no lease is asked for. Reported as BenchmarkCheckWarm's are, the process's
// CPU (agent, allocator and its embedded etcd) and redis-server's per
// Check, and the Redis commands per Check. Run it with a count, e.g.
// -benchtime 5000x.
func BenchmarkCheckCold(b *testing.B) {
	w := startWorld(b, false, "eu")
	a, ctx, rdb := runningBenchAgent(b, w, nil)
	runs := 0
	for _, c := range []struct {
		callers  int
		standing int64
	}{{1, 0}, {64, 0}, {1, 5}, {64, 5}} {
		callers := c.callers
		b.Run(fmt.Sprintf("callers=%d/standing=%d", callers, c.standing), func(b *testing.B) {
			runs++
			// With a standing share (G = 100 x it), a first Check is
			// decided from the share its spend deposits, with no lease.
			ids := w.putLimitsOf(b.N, fmt.Sprintf("tenant/cold%d-%d-%d-%%06d", callers, c.standing, runs), func(id string) *pb.Limit {
				if c.standing == 0 {
					return limit(id, 1<<40, time.Hour, time.Hour, "eu")
				}
				l := limit(id, 100*c.standing, time.Hour, time.Hour, "eu")
				l.Lease.Standing = c.standing
				return l
			})
			waitAllSynced(b, a, ids)
			var next, notOK atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			stopProfile := profileRun(b, fmt.Sprintf("cold-callers%d", callers))
			b.ResetTimer()
			cpu0, rcpu0, calls0 := processCPU(b), redisCPUOf(b, rdb), redisCalls(b, rdb)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						d, err := a.Check(ctx, ids[i-1], 1)
						if err != nil {
							b.Error(err)
							return
						}
						if !d.Allowed {
							notOK.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			stopProfile()
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric((redisCPUOf(b, rdb)-rcpu0)*1e9/float64(b.N), "redis-cpu-ns/op")
			b.ReportMetric(float64(redisCalls(b, rdb)-calls0-1)/float64(b.N), "redis-cmds/op") // minus the INFO that reads them
			if n := notOK.Load(); n > int64(b.N)/100 {
				b.Errorf("%d of %d first checks not admitted: the benchmark measured refusals", n, b.N)
			}
		})
	}
}

// profileRun, when LEASEHOLD_BENCH_PROFILE names a path prefix, writes a
// CPU profile of the measured run alone (PREFIX-NAME.cpu) and heap
// profiles before and after it (PREFIX-NAME.mem0, .mem1: read the run's
// allocations with go tool pprof -sample_index=alloc_objects -diff_base
// .mem0 .mem1), leaving out the benchmark's setup. The returned func
// ends the profile.
func profileRun(b *testing.B, name string) (stop func()) {
	prefix := os.Getenv("LEASEHOLD_BENCH_PROFILE")
	if prefix == "" {
		return func() {}
	}
	heap := func(suffix string) {
		f, err := os.Create(prefix + "-" + name + suffix)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
	}
	heap(".mem0")
	f, err := os.Create(prefix + "-" + name + ".cpu")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		heap(".mem1")
	}
}

// processCPU is the CPU time this process has used (user and system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPUOf is the CPU seconds redis-server has used since it started
// (INFO cpu: used_cpu_user + used_cpu_sys).
func redisCPUOf(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var t float64
	for line := range strings.SplitSeq(info, "\n") {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
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

// runningBenchAgent starts an agent of region eu on the world's Redis,
// its loops running on the wall clock (a benchmark's world), and checks
// each of ids until one is admitted: every limit has its first lease.
// ctx is the agent's, ended when the benchmark is; rdb its Redis client.
func runningBenchAgent(b *testing.B, w *world, ids []string) (*Agent, context.Context, *redis.Client) {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr(), PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	a, err := New(Config{Region: "eu", Allocators: []string{w.addr}, Redis: rdb, ReplicaID: "bench",
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Logger:      slog.New(slog.DiscardHandler)}, WithBatching(benchFlushers(), 128))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; a.Close() })
	<-a.Ready()
	for _, id := range ids {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if d, _ := a.Check(ctx, id, 1); d.Allowed {
				break
			}
			time.Sleep(10 * time.Millisecond) // the limit's sync, its first lease or share
		}
	}
	return a, ctx, rdb
}
