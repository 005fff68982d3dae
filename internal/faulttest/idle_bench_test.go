package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/faulttest"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
)

// BenchmarkIdleAgent measures, on real processes (`leasehold allocator`,
// `leasehold agent`, a redis-server), what 10,000 limits cost an agent:
// its RSS and Redis's memory per limit while each holds a lease (every
// limit checked once), and once they are idle (their leases run out and
// returned) the agent's CPU over 10 s and the same memory figures. It runs
// once, whatever b.N:
//
//	go test -run '^$' -bench IdleAgent -benchtime 1x ./internal/faulttest
func BenchmarkIdleAgent(b *testing.B) {
	const n = 10000
	W, ttl := 10*time.Second, 5*time.Second
	alloc := faulttest.StartAllocator(b, faulttest.AllocatorOptions{Regions: []string{"eu"}})
	rs := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	agent := faulttest.StartAgent(b, faulttest.AgentOptions{Region: "eu", Allocators: []string{alloc.GRPCAddr}, Redis: rs.Addr()})
	ctx := context.Background()
	mem0 := redisMemory(b, rdb)
	rss0 := procRSS(b, agent.Pid())

	conn, err := grpc.NewClient(alloc.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	admin := pb.NewAdminClient(conn)
	ids := make([]string, n)
	for i := 0; i < n; i += 60 {
		req := &pb.ApplyLimitsRequest{Reason: "bench", Effective: pb.Effective_EFFECTIVE_NOW}
		for j := i; j < min(n, i+60); j++ {
			ids[j] = fmt.Sprintf("tenant/idle-%05d", j)
			req.Changes = append(req.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: &pb.Limit{Id: ids[j],
				LimitTokens: 100, Window: durationpb.New(W), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
				Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}}})
		}
		if _, err := admin.ApplyLimits(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	aconn, err := grpc.NewClient(agent.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer aconn.Close()
	cl := pb.NewRegionAgentClient(aconn)
	// The agent syncs its limits every second: wait until it knows the last.
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := cl.Check(ctx, &pb.CheckRequest{LimitId: ids[n-1]}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the agent never learned the limits")
		}
		time.Sleep(100 * time.Millisecond) // polling the agent's sync
	}
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				if r, err := cl.Check(ctx, &pb.CheckRequest{LimitId: ids[i]}); err == nil && r.Allowed {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	held := time.Now()
	rssActive, memActive := procRSS(b, agent.Pid()), redisMemory(b, rdb)
	// Their leases run out by their window's end, are closed and returned,
	// and each window is reported once more after its end.
	time.Sleep(time.Until(held.Add(2*W + 8*time.Second))) // the agent's own timers (wall clock)
	cpu0, t0 := procCPU(b, agent.Pid()), time.Now()
	time.Sleep(10 * time.Second) // the measured idle span
	cpu1, t1 := procCPU(b, agent.Pid()), time.Now()
	rssIdle, memIdle := procRSS(b, agent.Pid()), redisMemory(b, rdb)
	b.ReportMetric(float64(ok.Load()), "admitted")
	b.ReportMetric(float64(rssActive-rss0)/n, "agent-rss-B/limit")
	b.ReportMetric(float64(memActive-mem0)/n, "redis-B/limit")
	b.ReportMetric(float64(rssIdle-rss0)/n, "idle-agent-rss-B/limit")
	b.ReportMetric(float64(memIdle-mem0)/n, "idle-redis-B/limit")
	b.ReportMetric(float64((cpu1-cpu0).Milliseconds())/t1.Sub(t0).Seconds(), "idle-cpu-ms/s")
}

// redisMemory is Redis's used_memory.
func redisMemory(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory")
	return 0
}

// procCPU is a process's user + system CPU so far (from /proc).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	// The fields after the command name (in parentheses): utime is the
	// 12th and stime the 13th of them.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// procRSS is a process's resident set size in bytes.
func procRSS(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
