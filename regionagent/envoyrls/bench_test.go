package envoyrls

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// benchChecker admits everything at once, allocating its answer as the
// agent does: what is measured is the Envoy API layer alone.
type benchChecker struct{}

func (benchChecker) CheckMulti(_ context.Context, items []regionagent.CheckItem) ([]regionagent.Decision, error) {
	out := make([]regionagent.Decision, len(items))
	for i := range out {
		out[i] = regionagent.Decision{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 1000,
			ResetAfter: 30 * time.Second, Limit: 100000, Window: time.Minute, Version: 1}
	}
	return out, nil
}

// benchRequests: one descriptor, and three (two mapped through templates,
// one unmapped), as a route with a tenant and a tenant+path action sends.
var benchRequests = map[string]*rlsv3.RateLimitRequest{
	"descriptors=1": request("api", 1, desc("tenant_id", "acme")),
	"descriptors=3": request("api", 1, desc("tenant_id", "acme"), desc("tenant_id", "acme", "path", "/search"),
		desc("country", "fr")),
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time since cpu0 per op, garbage
// collection included: on a busy machine it moves less than ns/op, which
// counts the time other processes held the cores.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkShouldRateLimit measures the Envoy API on a Checker that admits
// at once: "handler" is the server code alone (cpu-ns/op and allocs are
// its CPU per decision; "warm" cycles through 10,000 tenants); "grpc"
// adds gRPC over loopback TCP through the go-control-plane client stubs,
// with 1 and 64 concurrent callers on one connection (decisions/s; cpu-µs/decision is client and server together,
// in this one process).
//
//	go test -run '^$' -bench BenchmarkShouldRateLimit -benchmem ./regionagent/envoyrls/
func BenchmarkShouldRateLimit(b *testing.B) {
	s := NewServer(benchChecker{}, mustParse(b, apiMapping), WithLogger(quietLogger()))
	ctx := context.Background()
	for _, name := range []string{"descriptors=1", "descriptors=3"} {
		req := benchRequests[name]
		b.Run("handler/"+name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				r, err := s.ShouldRateLimit(ctx, req)
				if err != nil || r.OverallCode != OK {
					b.Fatal(r, err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
	warm := warmRequests(warmKeys)
	b.Run("handler/warm", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := cpuTime()
		i := 0
		for b.Loop() {
			r, err := s.ShouldRateLimit(ctx, warm[i%len(warm)])
			if err != nil || r.OverallCode != OK {
				b.Fatal(r, err)
			}
			i++
		}
		reportCPU(b, cpu0)
	})
	cl := serveTCP(b, s)
	for _, callers := range []int{1, 64} {
		for _, name := range []string{"descriptors=1", "descriptors=3"} {
			b.Run(fmt.Sprintf("grpc/callers=%d/%s", callers, name), func(b *testing.B) {
				benchCalls(b, cl, []*rlsv3.RateLimitRequest{benchRequests[name]}, callers, false)
			})
		}
	}
	b.Run("grpc/callers=64/warm", func(b *testing.B) {
		benchCalls(b, cl, warm, 64, false)
	})
}

// warmKeys is the number of distinct keys of the warm benchmarks, as in
// make bench-check's warm case.
const warmKeys = 10000

// warmRequests are n requests of one descriptor each, tenant_id values
// t00000, t00001, ...: a decision on each of many warm keys in turn, as
// make bench-check's warm case sends them.
func warmRequests(n int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = request("api", 1, desc("tenant_id", fmt.Sprintf("t%05d", i)))
	}
	return out
}

// BenchmarkShouldRateLimitAgent is the same through a real agent (Redis
// bucket on a local redis-server, renewal running, allocator on embedded
// etcd): the region's decisions per second through the Envoy API.
//
//	go test -run '^$' -bench BenchmarkShouldRateLimitAgent -benchmem ./regionagent/envoyrls/
func BenchmarkShouldRateLimitAgent(b *testing.B) {
	ra := startRealAgent(b, wholeLimit("tenant/acme", 1<<40), wholeLimit("tenant/acme/search", 1<<40))
	s := NewServer(ra.agent, mustParse(b, apiMapping), WithLogger(quietLogger()))
	cl := serveTCP(b, s)
	for _, name := range []string{"descriptors=1", "descriptors=3"} {
		// Warm up: the first leases.
		eventually(b, 10*time.Second, "first lease", func() bool {
			r, err := cl.ShouldRateLimit(context.Background(), benchRequests[name])
			return err == nil && r.OverallCode == OK
		})
	}
	for _, callers := range []int{1, 64} {
		for _, name := range []string{"descriptors=1", "descriptors=3"} {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, name), func(b *testing.B) {
				benchCalls(b, cl, []*rlsv3.RateLimitRequest{benchRequests[name]}, callers, true)
			})
		}
	}
}

// benchCalls makes b.N calls from callers goroutines, call i sending
// reqs[i % len(reqs)], and reports decisions/s, CPU per decision and the
// share denied.
func benchCalls(b *testing.B, cl rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, callers int, allowDenied bool) {
	b.ReportAllocs()
	ctx := context.Background()
	var next, denied atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0, start := cpuTime(), time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				r, err := cl.ShouldRateLimit(ctx, reqs[i%int64(len(reqs))])
				if err != nil {
					b.Error(err)
					return
				}
				if r.OverallCode != OK {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/decision")
	if d := denied.Load(); d > 0 && (!allowDenied || d > int64(b.N)/100) {
		b.Errorf("%d of %d calls denied: the benchmark measured denials", d, b.N)
	}
}

// serveTCP serves s on a loopback TCP port and returns the Envoy client
// stub on it.
func serveTCP(b *testing.B, s *Server) rlsv3.RateLimitServiceClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// BenchmarkMessages measures protobuf's work on the messages of one
// warm decision, Envoy's API against Check: decoding the request and
// encoding the answer, as gRPC does on the agent.
//
//	go test -run '^$' -bench BenchmarkMessages -benchmem ./regionagent/envoyrls/
func BenchmarkMessages(b *testing.B) {
	s := NewServer(benchChecker{}, mustParse(b, apiMapping), WithLogger(quietLogger()))
	req := warmRequests(1)[0]
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	creq := &pb.CheckRequest{LimitId: "tenant/t00000", Cost: 1}
	cresp := &pb.CheckResponse{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 1000,
		ResetAfter: durationpb.New(30 * time.Second), LimitTokens: 100000, Window: durationpb.New(time.Minute)}
	for _, c := range []struct {
		name      string
		req, resp proto.Message
		newReq    func() proto.Message
	}{
		{"envoy", req, resp, func() proto.Message { return &rlsv3.RateLimitRequest{} }},
		{"check", creq, cresp, func() proto.Message { return &pb.CheckRequest{} }},
	} {
		wire, err := proto.Marshal(c.req)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name+"/decode-request", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := proto.Unmarshal(wire, c.newReq()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/encode-answer", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := proto.Marshal(c.resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
