package main

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/ports"
	"leasehold/internal/redistest"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// proc is a leasehold process the test can kill and restart.
type proc struct {
	t      *testing.T
	bin    string
	args   []string
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan struct{}
}

func startProc(t *testing.T, bin string, args ...string) *proc {
	p := &proc{t: t, bin: bin, args: args}
	p.start()
	t.Cleanup(func() { p.signal(syscall.SIGINT) })
	return p
}

func (p *proc) start() {
	p.cmd = exec.Command(p.bin, p.args...)
	p.stderr = &syncbuf.Buffer{}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
}

// signal stops the process with sig and waits for it.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startAllocatorProc starts `leasehold allocator` (bin) with extra flags
// on fresh loopback ports and its own data directory, and waits until it
// serves gRPC health. A port that another process bound between
// ports.Addr and the allocator's bind is not the test's failure: the
// allocator exits ("address already in use") and starts again on fresh
// ports, at most three times (a CI run once waited 90 s for agents whose
// allocator had died so).
func startAllocatorProc(t *testing.T, bin string, extra ...string) (grpcAddr string, p *proc) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		grpcAddr = ports.Addr(t)
		args := append([]string{"allocator", "--grpc-addr", grpcAddr, "--http-addr", ports.Addr(t),
			"--data-dir", filepath.Join(t.TempDir(), "alloc"), "--etcd-client-addr", ports.Addr(t), "--etcd-peer-addr", ports.Addr(t)},
			extra...)
		p = startProc(t, bin, args...)
		err := p.waitServing(grpcAddr, 90*time.Second)
		if err == nil {
			return grpcAddr, p
		}
		if attempt < 3 && strings.Contains(p.stderr.String(), "address already in use") {
			t.Logf("the allocator found a port taken (%v): starting it again on fresh ports", err)
			continue
		}
		t.Fatalf("the allocator did not serve: %v\n%s", err, p.stderr.String())
	}
}

// waitServing waits until p serves gRPC health at addr, for at most d; it
// returns an error at once if p exits.
func (p *proc) waitServing(addr string, d time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(d); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("it exited: %v", p.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond) // polling readiness
	}
}

// tally is the test's own count of admitted tokens per window and region,
// from the Check answers it received.
type tally struct {
	mu       sync.Mutex
	admitted map[int64]map[string]int64
	fallback map[int64]int64
	failed   atomic.Int64 // Checks that got no answer (their outcome is unknown)
}

func (c *tally) add(window int64, region string, cost int64, fallback bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admitted[window] == nil {
		c.admitted[window] = map[string]int64{}
	}
	c.admitted[window][region] += cost
	if fallback {
		c.fallback[window] += cost
	}
}

// TestFallbackBoundEndToEnd runs the allocator and two agents as real
// processes with real redis-servers, drives both regions well over G,
// kills the allocator (SIGKILL) for two windows and restarts it. While it
// is gone the agents spend what they hold, then admit under their
// fallback. The test counts admitted tokens per window and region from the
// Check answers; the allocator's reports must match those counts, and in
// every window the observed overshoot must stay within the reported bound.
func TestFallbackBoundEndToEnd(t *testing.T) {
	leasehold, _ := buildBinaries(t)
	for _, tc := range []struct {
		name     string
		fallback map[string]*pb.Fallback
		infinite bool // the outage windows' bound
	}{
		{"local", map[string]*pb.Fallback{
			"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 30},
			"us": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 30}}, false},
		{"open", map[string]*pb.Fallback{
			"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 30},
			"us": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) { runFallbackScenario(t, leasehold, tc.fallback, tc.infinite) })
	}
}

func runFallbackScenario(t *testing.T, leasehold string, fallback map[string]*pb.Fallback, infinite bool) {
	const W = 10 * time.Second
	allocAddr, alloc := startAllocatorProc(t, leasehold, "--regions", "eu,us", "--session-ttl", "1s")
	agents := map[string]string{}
	for _, region := range []string{"eu", "us"} {
		rs := redistest.Start(t)
		agents[region] = ports.Addr(t)
		startProc(t, leasehold, "agent", "--region", region, "--allocator", allocAddr, "--redis", rs.Addr(),
			"--grpc-addr", agents[region], "--http-addr", ports.Addr(t), "--replica-id", region+"-1")
	}
	exited := make(chan error)
	for _, addr := range agents {
		waitHealthy(t, addr, pb.RegionAgent_ServiceDesc.ServiceName, exited, alloc.stderr)
	}
	conn, err := grpc.NewClient(allocAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := pb.NewAdminClient(conn)
	ctx := context.Background()
	if _, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: &pb.Limit{Id: "tenant/fb", LimitTokens: 100,
		Window: durationpb.New(W), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_BOUNDED, Fallback: fallback}}); err != nil {
		t.Fatal(err)
	}

	// Drive both regions at 20 Checks/s each (400 per window against G =
	// 100), counting what is admitted, until stop.
	counts := &tally{admitted: map[int64]map[string]int64{}, fallback: map[int64]int64{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for region, addr := range agents {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cl := pb.NewRegionAgentClient(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				// A generous deadline: a Check the agent admitted but
				// whose answer came after the caller gave up would be in
				// the reports and not in the test's counts.
				sent := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				resp, err := cl.Check(cctx, &pb.CheckRequest{LimitId: "tenant/fb", Cost: 1})
				cancel()
				if err != nil {
					counts.failed.Add(1)
					continue
				}
				if !resp.Allowed {
					continue
				}
				// Decided between sent and now: the window ends reset_after
				// after the midpoint (a loaded machine's late answer moves
				// the estimate by half its delay, not all of it).
				end := sent.Add(time.Since(sent) / 2).Add(resp.ResetAfter.AsDuration())
				w := int64(math.Round(float64(end.UnixNano())/float64(W))) - 1
				counts.add(w, region, 1, resp.Reason == pb.Reason_REASON_FALLBACK)
			}
		}()
	}
	time.Sleep(12 * time.Second) // the scenario's timeline: traffic with the allocator up
	alloc.signal(syscall.SIGKILL)
	time.Sleep(22 * time.Second) // two windows without an allocator
	alloc.start()
	time.Sleep(14 * time.Second) // traffic with the allocator back
	close(stop)
	wg.Wait()

	// The agents report within seconds; wait until every window the test
	// counted (closed by now) matches the allocator's report, then check.
	counts.mu.Lock()
	defer counts.mu.Unlock()
	var reps []*pb.WindowReport
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := admin.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: "tenant/fb", Last: 20})
		if err == nil {
			reps = resp.Windows
			if matches(reps, counts, W) == "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports never matched the test's counts: %s (err %v; %d Checks without an answer)\nallocator: %s",
				matches(reps, counts, W), err, counts.failed.Load(), alloc.stderr.String())
		}
		time.Sleep(500 * time.Millisecond) // polling until the agents' reports arrive
	}
	sawFallback := false
	for _, r := range reps {
		w := r.WindowStart.AsTime().UnixNano() / int64(W)
		if r.ObservedOvershoot > r.Bound && !r.BoundInfinite {
			t.Errorf("window %v: observed overshoot %d above the bound %d", r.WindowStart.AsTime(), r.ObservedOvershoot, r.Bound)
		}
		if counts.fallback[w] > 0 {
			sawFallback = true
			if r.FallbackAdmitted != counts.fallback[w] {
				t.Errorf("window %v: fallback admitted %d, the test counted %d", r.WindowStart.AsTime(), r.FallbackAdmitted, counts.fallback[w])
			}
			if r.BoundInfinite != infinite && r.Fallback["us"] == fallback["us"].Kind {
				t.Errorf("window %v: bound infinite=%v, want %v", r.WindowStart.AsTime(), r.BoundInfinite, infinite)
			}
		}
		t.Logf("window %s: admitted %v (total %d, fallback %d), bound %d (inf %v), observed %d, stranded %d",
			r.WindowStart.AsTime().Format("15:04:05"), r.Admitted, r.AdmittedTotal, r.FallbackAdmitted, r.Bound, r.BoundInfinite, r.ObservedOvershoot, r.Stranded)
	}
	if !sawFallback {
		t.Fatal("no window admitted under fallback: the outage did not exercise it")
	}
}

// matches says how the reports differ from the test's counts ("" if they
// agree), for every window the test counted that has closed.
func matches(reps []*pb.WindowReport, c *tally, W time.Duration) string {
	byWindow := map[int64]*pb.WindowReport{}
	for _, r := range reps {
		byWindow[r.WindowStart.AsTime().UnixNano()/int64(W)] = r
	}
	now := time.Now().UnixNano() / int64(W)
	for w, regions := range c.admitted {
		if w >= now {
			continue
		}
		r := byWindow[w]
		if r == nil {
			return "window " + time.Unix(0, w*int64(W)).Format("15:04:05") + " missing"
		}
		for region, n := range regions {
			if r.Admitted[region] != n {
				return fmt.Sprintf("window %s %s: the report says %d admitted, the test counted %d",
					time.Unix(0, w*int64(W)).Format("15:04:05"), region, r.Admitted[region], n)
			}
		}
	}
	return ""
}
