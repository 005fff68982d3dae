package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// buildBinaries builds leasehold and quotactl into a temp dir.
func buildBinaries(t *testing.T) (leasehold, quotactl string) {
	t.Helper()
	dir := t.TempDir()
	leasehold, quotactl = filepath.Join(dir, "leasehold"), filepath.Join(dir, "quotactl")
	for out, pkg := range map[string]string{leasehold: "leasehold/cmd/leasehold", quotactl: "leasehold/cmd/quotactl"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return leasehold, quotactl
}

// checkReport is what `quotactl check --json` prints (the fields used).
type checkReport struct {
	Calls        int64 `json:"calls"`
	AdmittedCost int64 `json:"admitted_cost"`
	FallbackCost int64 `json:"fallback_cost"`
	Windows      []struct {
		Start        time.Time        `json:"window_start"`
		Seconds      float64          `json:"window_seconds"`
		AdmittedCost int64            `json:"admitted_cost"`
		Denied       map[string]int64 `json:"denied"`
	} `json:"windows"`
}

// TestEndToEnd: leasehold dev with two agents; quotactl sets 600 per 10 s;
// two quotactl check processes drive both agents at ~3x the limit for
// about four windows. From the check results alone, every full window
// admitted <= 600 and >= 594.
func TestEndToEnd(t *testing.T) {
	leasehold, quotactl := buildBinaries(t)
	alloc, eu, us := ports.Addr(t), ports.Addr(t), ports.Addr(t)
	histDir := filepath.Join(t.TempDir(), "history")
	dev := exec.Command(leasehold, "dev", "--data-dir", filepath.Join(t.TempDir(), "dev"), "--no-demo", "--history-dir", histDir,
		"--allocator-grpc", alloc, "--allocator-http", ports.Addr(t),
		"--etcd-client-addr", ports.Addr(t), "--etcd-peer-addr", ports.Addr(t),
		"--eu-grpc", eu, "--eu-http", ports.Addr(t), "--us-grpc", us, "--us-http", ports.Addr(t),
		"--eu-gateway", ports.Addr(t), "--us-gateway", ports.Addr(t))
	var devOut, devErr syncbuf.Buffer
	dev.Stdout, dev.Stderr = &devOut, &devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	stopDev := sync.OnceFunc(func() {
		_ = dev.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("leasehold dev exited with %v after Ctrl-C\n%s", err, devErr.String())
			}
		case <-time.After(30 * time.Second):
			_ = dev.Process.Kill()
			t.Error("leasehold dev did not stop on Ctrl-C")
		}
	})
	defer stopDev()
	for _, addr := range []string{eu, us} {
		waitHealthy(t, addr, pb.RegionAgent_ServiceDesc.ServiceName, exited, &devErr)
	}

	set := exec.Command(quotactl, "--allocator", alloc, "limits", "set", "tenant/e2e",
		"--limit", "600", "--window", "10s", "--regions", "eu,us", "--mode", "strict", "--reason", "end-to-end test")
	if b, err := set.CombinedOutput(); err != nil {
		t.Fatalf("quotactl limits set: %v\n%s", err, b)
	}
	// Agents learn the limit within a sync interval; wait until eu knows it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		probe := exec.Command(quotactl, "--json", "check", "--agent", eu, "--limit", "tenant/e2e", "--count", "1")
		if probe.Run() == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // waiting for the agents' limit sync
	}

	start := time.Now()
	const drive = 42 * time.Second
	reports := make([]checkReport, 2)
	var wg sync.WaitGroup
	for i, addr := range []string{eu, us} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(quotactl, "--json", "check", "--agent", addr, "--limit", "tenant/e2e",
				"--concurrency", "4", "--rate", "100", "--duration", drive.String())
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("quotactl check %s: %v\n%s", addr, err, stderr.String())
				return
			}
			if err := json.Unmarshal(out.Bytes(), &reports[i]); err != nil {
				t.Errorf("quotactl check output: %v\n%s", err, out.String())
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	if t.Failed() {
		return
	}
	perWindow := map[time.Time]int64{}
	for _, r := range reports {
		if r.FallbackCost != 0 {
			t.Errorf("fallback admits in a strict limit: %d", r.FallbackCost)
		}
		for _, w := range r.Windows {
			if w.Seconds != 10 {
				t.Fatalf("window of %vs, want 10s", w.Seconds)
			}
			perWindow[w.Start] += w.AdmittedCost
		}
	}
	var full []time.Time
	for s := range perWindow {
		if !s.Before(start) && !s.Add(10*time.Second).After(end) {
			full = append(full, s)
		}
	}
	sort.Slice(full, func(i, j int) bool { return full[i].Before(full[j]) })
	if len(full) < 3 {
		t.Fatalf("only %d full windows in the run (%v)", len(full), perWindow)
	}
	for _, s := range full {
		n := perWindow[s]
		t.Logf("window %s: admitted %d of 600", s.Format("15:04:05"), n)
		if n > 600 || n < 594 {
			t.Errorf("window %s admitted %d: want 594..600 while demand (~2000) exceeds 600", s.Format("15:04:05"), n)
		}
	}
	if t.Failed() {
		// What the allocator saw per window and region (stranded tokens).
		b, err := exec.Command(quotactl, "--allocator", alloc, "windows", "tenant/e2e", "--last", "8").CombinedOutput()
		t.Logf("quotactl windows: %v\n%s", err, b)
	}
	for i, r := range reports {
		if r.Calls < int64(drive.Seconds())*50 {
			t.Errorf("checker %d made only %d calls: demand did not exceed the limit", i, r.Calls)
		}
	}
	// What every component recorded (-history-dir), checked offline
	// against the per-window invariants: a clean stop leaves a complete
	// history, and nothing in it breaks the strict limit.
	stopDev()
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"history", "check", "--strict", "tenant/e2e", "--require-complete", histDir}, &out, &errs)
	t.Logf("leasehold history check:\n%s", out.String())
	if code != 0 {
		t.Errorf("leasehold history check: exit %d: %s", code, errs.String())
	}
}

func waitHealthy(t *testing.T, addr, service string, exited <-chan error, stderr *syncbuf.Buffer) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("leasehold dev exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy: %v\n%s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling readiness
	}
}
