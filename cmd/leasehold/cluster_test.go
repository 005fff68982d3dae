package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"leasehold/internal/history"
	"leasehold/internal/supervise"
	"leasehold/internal/syncbuf"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// TestClusterSurvivesKills: `leasehold cluster` (real processes: three
// etcd members, two Redis, two allocators, four agents, two gateways)
// serves the demo limit through a gateway (200, then 429 over the limit);
// HTTP demand through both gateways and Checks straight to each region's
// second agent run at about 2x G while the leading allocator and then the
// agent gateway-eu calls are SIGKILLed. The cluster goes on (the other
// allocator leads, gateway-eu moves to the other eu agent, both gateways
// admit again), no window admits more than G (the
// allocator's window reports, the test's own count of 200s, and every
// process's history checked offline), and on SIGTERM the cluster exits 0
// leaving none of its processes behind.
func TestClusterSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes (3 etcd, 2 Redis, 2 allocators, 4 agents, 2 gateways): about a minute")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found on PATH (make test installs it)")
	}
	const (
		g      = 40
		window = 3 * time.Second
	)
	bin := filepath.Join(t.TempDir(), "leasehold")
	if out, err := exec.Command("go", "build", "-o", bin, "leasehold/cmd/leasehold").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	var stdout, stderr syncbuf.Buffer
	cmd := exec.Command(bin, "cluster", "--dir", dir, "--demo-limit", fmt.Sprint(g), "--demo-window", window.String())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // its children die with it (they have Pdeathsig too)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("cluster stdout:\n%s\ncluster stderr:\n%s", stdout.String(), lastBytes(stderr.String(), 4000))
			logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s (tail):\n%s", filepath.Base(l), lastBytes(string(b), 1500))
			}
		}
	})

	// Serving: cluster.json says so.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	var st clusterState
	err := waitFor(ctx, 90*time.Second, exited, func(context.Context) error {
		b, err := os.ReadFile(filepath.Join(dir, clusterStateFile))
		if err != nil {
			return err
		}
		st = clusterState{}
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		if st.State != "serving" {
			return fmt.Errorf("state %q", st.State)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cluster not serving: %v", err)
	}
	procs := map[string]*clusterProc{}
	for _, p := range st.Processes {
		procs[p.Name] = p
	}
	for _, name := range []string{"etcd-1", "etcd-2", "etcd-3", "redis-eu", "redis-us", "allocator-1", "allocator-2",
		"agent-eu-1", "agent-eu-2", "agent-us-1", "agent-us-2", "gateway-eu", "gateway-us"} {
		if p := procs[name]; p == nil || p.PID <= 0 || !p.Running {
			t.Fatalf("cluster.json: %s missing or not running: %+v", name, p)
		}
	}
	// The table is printed as the state file is written: the test may
	// read the state before the pipe has brought the whole table (a CI
	// run saw the first two lines only), so it waits for it, bounded.
	for _, want := range []string{"gateway-eu", procs["gateway-eu"].HTTP, procs["allocator-1"].GRPC, "demo limit demo/tenant"} {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stdout.String(), want); {
			if time.Now().After(deadline) {
				t.Errorf("the cluster's output does not show %q:\n%s", want, stdout.String())
				break
			}
			time.Sleep(20 * time.Millisecond) // polling the output the process writes
		}
	}

	// A Check through a gateway: 200, then 429 once over the limit.
	hc := &http.Client{Timeout: 2 * time.Second}
	get := func(gw string) (int, http.Header, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+gw+"/orders", nil)
		req.Header.Set("X-Tenant", "tenant")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header, nil
	}
	gwEU, gwUS := procs["gateway-eu"].HTTP, procs["gateway-us"].HTTP
	// The first Check waits for the region's first lease: on a busy
	// machine it may miss the gateway's deadline (503), so ask until a
	// 200, for at most 15 s.
	if err := waitFor(ctx, 15*time.Second, exited, func(context.Context) error {
		code, _, err := get(gwEU)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		return err
	}); err != nil {
		t.Fatalf("a request through gateway-eu: %v; want 200", err)
	}
	saw429 := false
	for i := 0; i < 10*g && !saw429; i++ {
		code, h, err := get(gwEU)
		if err != nil {
			t.Fatalf("request %d through gateway-eu: %v", i, err)
		}
		if code == http.StatusTooManyRequests {
			saw429 = true
			if h.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After: %v", h)
			}
		}
	}
	if !saw429 {
		t.Fatalf("no 429 in %d requests against G=%d", 10*g, g)
	}

	// Load at about 2x G: HTTP through both gateways, Checks straight to
	// each region's second agent. Counts of 200s per window, by request
	// start and end (a response that crosses a boundary is counted in no
	// window: the count is a lower bound that must still be <= G).
	type counts struct{ ok, denied, failed, ambiguous int64 }
	var mu sync.Mutex
	byWindow := map[int64]int64{}
	var afterKills counts
	var killed bool
	lastOK := map[string]time.Time{} // driver -> start of its last admitted request
	record := func(driver string, start time.Time, allowed, denied bool) {
		end := time.Now()
		ws, we := lease.WindowOf(start, window).Index, lease.WindowOf(end, window).Index
		mu.Lock()
		defer mu.Unlock()
		if allowed {
			lastOK[driver] = start
		}
		c := &afterKills
		switch {
		case allowed && ws == we:
			byWindow[ws]++
		case allowed:
			if killed {
				c.ambiguous++
			}
		}
		if !killed {
			return
		}
		switch {
		case allowed:
			c.ok++
		case denied:
			c.denied++
		default:
			c.failed++
		}
	}
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	var wg sync.WaitGroup
	const maxRequests = 3000  // per driver: the loop is bounded in count and by lctx in time
	every := window / (g / 2) // each of the 4 drivers at G/2 per window: 2x G in all, plus the 429 probe above
	for _, gw := range []string{gwEU, gwUS} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for range maxRequests {
				select {
				case <-lctx.Done():
					return
				case <-tick.C:
				}
				start := time.Now()
				code, _, err := get(gw)
				if lctx.Err() != nil {
					return
				}
				record(gw, start, err == nil && code == http.StatusOK, err == nil && code == http.StatusTooManyRequests)
			}
		}()
	}
	for _, name := range []string{"agent-eu-2", "agent-us-2"} {
		conn, err := grpc.NewClient(procs[name].GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ac := pb.NewRegionAgentClient(conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for range maxRequests {
				select {
				case <-lctx.Done():
					return
				case <-tick.C:
				}
				start := time.Now()
				cctx, cancel := context.WithTimeout(lctx, time.Second)
				resp, err := ac.Check(cctx, &pb.CheckRequest{LimitId: demoLimit, Cost: 1})
				cancel()
				if lctx.Err() != nil {
					return
				}
				record(name, start, err == nil && resp.Allowed, err == nil && !resp.Allowed)
			}
		}()
	}
	stopLoad := func() { lcancel(); wg.Wait() }
	defer stopLoad()

	// A window of load, then SIGKILL the leading allocator: the other
	// takes over.
	waitWindows(t, ctx, window, 1)
	leader, follower := "", ""
	err = waitFor(ctx, 20*time.Second, nil, func(ctx context.Context) error {
		for _, name := range []string{"allocator-1", "allocator-2"} {
			if supervise.CheckGRPC(ctx, procs[name].GRPC, pb.Allocator_ServiceDesc.ServiceName) == nil {
				leader = name
				follower = map[string]string{"allocator-1": "allocator-2", "allocator-2": "allocator-1"}[name]
				return nil
			}
		}
		return errors.New("no allocator leads")
	})
	if err != nil {
		t.Fatal(err)
	}
	kill(t, procs[leader].PID)
	waitLog(t, ctx, &stderr, "process="+leader)
	if err := waitFor(ctx, 30*time.Second, nil, func(ctx context.Context) error {
		return supervise.CheckGRPC(ctx, procs[follower].GRPC, pb.Allocator_ServiceDesc.ServiceName)
	}); err != nil {
		t.Fatalf("%s did not take over after %s was killed: %v", follower, leader, err)
	}
	t.Logf("%s killed; %s leads", leader, follower)

	// Then SIGKILL the agent gateway-eu calls (the first of its -agent
	// list): the gateway moves to the region's other agent.
	kill(t, procs["agent-eu-1"].PID)
	waitLog(t, ctx, &stderr, "process=agent-eu-1")
	mu.Lock()
	killed = true
	mu.Unlock()
	killedAt := time.Now()

	// Load goes on until both gateways admit again well after the kills:
	// past the renewal lock the killed agent may have held (it expires
	// after the agent's allocator retry, 5 s, plus 5 s), in new windows
	// whose leases the new leader granted.
	again := killedAt.Add(11 * time.Second)
	if err := waitFor(ctx, 40*time.Second, nil, func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		for _, gw := range []string{gwEU, gwUS} {
			if !lastOK[gw].After(again) {
				return fmt.Errorf("gateway %s: last 200 for a request sent at %s, want one after %s",
					gw, lastOK[gw].Format("15:04:05.000"), again.Format("15:04:05.000"))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("after the kills: %v", err)
	}
	stopLoad()
	mu.Lock()
	ak := afterKills
	mu.Unlock()
	t.Logf("after the kills: %d admitted, %d denied, %d failed, %d across a boundary", ak.ok, ak.denied, ak.failed, ak.ambiguous)
	if ak.ok == 0 || ak.denied == 0 {
		t.Errorf("after the kills: %d admitted, %d denied; want both > 0", ak.ok, ak.denied)
	}
	mu.Lock()
	for w, n := range byWindow {
		if n > g {
			t.Errorf("window %d: the test saw %d admitted (200 or allowed), G is %d", w, n, g)
		}
	}
	mu.Unlock()

	// The allocator's reports: every closed window admitted <= G, with no
	// observed overshoot (strict).
	conn, err := grpc.NewClient(procs[follower].GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitWindows(t, ctx, window, 1) // the last window of load closes and is reported
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := pb.NewAdminClient(conn).ListWindows(rctx, &pb.ListWindowsRequest{LimitId: demoLimit, Last: 30})
	rcancel()
	if err != nil {
		t.Fatalf("ListWindows on %s: %v", follower, err)
	}
	closed, admitted, laterAdmitting := 0, int64(0), 0
	for _, w := range resp.Windows {
		if !w.Closed {
			continue
		}
		closed++
		admitted += w.AdmittedTotal
		t.Logf("window %s: G %d, admitted %d %v, granted %d, returned %d, stranded %d, overshoot %d",
			w.WindowStart.AsTime().Format("15:04:05"), w.LimitTokens, w.AdmittedTotal, w.Admitted, w.Granted, w.Returned,
			w.Stranded, w.ObservedOvershoot)
		if w.WindowStart.AsTime().After(killedAt) && w.AdmittedTotal > 0 {
			laterAdmitting++ // granted by the new leader, spent by the agents left
		}
		if w.AdmittedTotal > w.LimitTokens || w.ObservedOvershoot != 0 || w.LimitTokens != g {
			t.Errorf("window %s: admitted %d (%v), G %d, observed overshoot %d", w.WindowStart.AsTime().Format("15:04:05.000"),
				w.AdmittedTotal, w.Admitted, w.LimitTokens, w.ObservedOvershoot)
		}
	}
	if closed < 2 || admitted == 0 || laterAdmitting < 2 {
		t.Errorf("the new leader reports %d closed windows, %d admitted in all, %d windows started after the kills admitted; want >= 2",
			closed, admitted, laterAdmitting)
	}

	// SIGTERM: the cluster stops, exits 0, and leaves no process behind.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopStart := time.Now()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("cluster still running 60s after SIGTERM")
	}
	t.Logf("cluster stopped in %v", time.Since(stopStart).Round(time.Millisecond))
	if waitErr != nil {
		t.Errorf("cluster exit: %v, want status 0", waitErr)
	}
	if !strings.Contains(stdout.String(), "leasehold cluster: stopped") {
		t.Errorf("no 'stopped' line in the output")
	}
	for _, p := range st.Processes {
		if err := waitFor(ctx, 10*time.Second, nil, func(context.Context) error {
			if alive(p.PID) {
				return fmt.Errorf("%s (pid %d) still runs after the cluster exited", p.Name, p.PID)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}

	// Every process's history, held against the invariants offline.
	h, err := history.ReadFS(os.DirFS(filepath.Join(dir, "history")))
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	rep := history.Check(h, map[string]history.Limit{demoLimit: {G: g, Window: window, Strict: true}})
	t.Logf("history check: %s", rep.Summary())
	for i, v := range rep.Violations {
		if i == 10 {
			break
		}
		t.Errorf("history check: %s", v)
	}
}

// waitFor polls check (supervise.Wait) for at most d.
func waitFor(ctx context.Context, d time.Duration, exited <-chan struct{}, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return supervise.Wait(ctx, exited, check)
}

// waitWindows waits until n window boundaries have passed.
func waitWindows(t *testing.T, ctx context.Context, w time.Duration, n int) {
	t.Helper()
	end := lease.WindowOf(time.Now(), w).Index + int64(n)
	err := waitFor(ctx, time.Duration(n+1)*w+5*time.Second, nil, func(context.Context) error {
		if lease.WindowOf(time.Now(), w).Index < end {
			return errors.New("window not over")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting %d windows: %v", n, err)
	}
}

// waitLog waits until the cluster's log has a line with want.
func waitLog(t *testing.T, ctx context.Context, log *syncbuf.Buffer, want string) {
	t.Helper()
	err := waitFor(ctx, 10*time.Second, nil, func(context.Context) error {
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, "process exited") && strings.Contains(l, want) {
				return nil
			}
		}
		return fmt.Errorf("the cluster did not log the exit of %s", want)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func kill(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
}

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// lastBytes is the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// TestClusterUsageErrors: bad flags exit 2 with one line; a missing
// redis-server or prometheus exits 1 with one line naming it; nothing is
// started.
func TestClusterUsageErrors(t *testing.T) {
	notCluster := t.TempDir()
	if err := os.WriteFile(filepath.Join(notCluster, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"cluster", "--base-port", "80"},
		{"cluster", "--base-port", "65530"},
		{"cluster", "--demo-limit", "0"},
		{"cluster", "--demo-window", "500ms"},
		{"cluster", "--dir", notCluster},
		{"cluster", "--dir", ""},
		{"cluster", "extra"},
		{"etcd", "--initial-cluster-state", "maybe"},
		{"etcd", "--name", "b", "--initial-cluster", "a=http://127.0.0.1:1"},
		{"etcd", "--name", "a", "--peer-addr", "127.0.0.1:2", "--initial-cluster", "a=http://127.0.0.1:1"},
		{"etcd", "--client-addr", "nowhere"},
		{"etcd", "--initial-cluster", "a=127.0.0.1:1", "--name", "a"},
		{"gateway", "--upstream", "http://127.0.0.1:1", "--key-header", "X-Tenant", "--agent", "127.0.0.1:1,nowhere"},
	} {
		var stderr syncbuf.Buffer
		if code := run(context.Background(), args, nil, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
	if _, err := os.ReadFile(filepath.Join(notCluster, "notes.txt")); err != nil {
		t.Errorf("a directory that is not a cluster's was touched: %v", err)
	}

	redisServer, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not on PATH")
	}
	onlyRedis := t.TempDir()
	if err := os.Symlink(redisServer, filepath.Join(onlyRedis, "redis-server")); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{t.TempDir(): "redis-server not found", onlyRedis: "prometheus not found"} {
		t.Setenv("PATH", path)
		dir := filepath.Join(t.TempDir(), "c")
		var stderr syncbuf.Buffer
		code := run(context.Background(), []string{"cluster", "--dir", dir, "--prometheus"}, io.Discard, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), want) || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("PATH=%s: exit %d, stderr %q; want 1 and %q", path, code, stderr.String(), want)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("PATH=%s: the cluster's directory was made (%v)", path, err)
		}
	}
}

// TestClusterWatch: a process that exits while the cluster runs is
// reported in the log and cluster.json; with -restart it is started
// again on the same spec (a new PID, starts 2); stopAll stops it and
// marks the state stopped. (sleep stands in for a server.)
func TestClusterWatch(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			dir := t.TempDir()
			var logBuf syncbuf.Buffer
			cl := &cluster{c: clusterConfig{restart: restart}, log: slog.New(slog.NewTextHandler(&logBuf, nil)), dir: dir}
			p := &clusterProc{Name: "sleeper", Kind: "agent", Log: filepath.Join(dir, "sleeper.log")}
			p.spec = supervise.Spec{Name: p.Name, Path: sleep, Args: []string{"60"}, Log: p.Log}
			if p.proc, err = supervise.Start(p.spec); err != nil {
				t.Fatal(err)
			}
			cl.tiers = [][]*clusterProc{{p}}
			cl.state = clusterState{State: "serving", Dir: dir, Processes: []*clusterProc{p}}
			cl.writeState()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watched := make(chan struct{})
			go func() { defer close(watched); cl.watch(ctx, p) }()
			first := p.proc.Pid()
			kill(t, first)

			read := func() clusterProc {
				var st clusterState
				b, err := os.ReadFile(filepath.Join(dir, clusterStateFile))
				if err == nil {
					err = json.Unmarshal(b, &st)
				}
				if err != nil || len(st.Processes) != 1 {
					return clusterProc{}
				}
				return *st.Processes[0]
			}
			err := waitFor(context.Background(), 10*time.Second, nil, func(context.Context) error {
				got := read()
				switch {
				case !strings.Contains(logBuf.String(), "process exited"):
					return errors.New("no 'process exited' in the log")
				case !restart && (got.Running || got.PID != first):
					return fmt.Errorf("cluster.json: %+v, want pid %d not running", got, first)
				case restart && (!got.Running || got.PID == first || got.Starts != 2):
					return fmt.Errorf("cluster.json: %+v, want a new pid, running, starts 2", got)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%v\nlog:\n%s", err, logBuf.String())
			}
			if !restart {
				<-watched // it stops watching: the cluster runs on without it
			}
			second := p.proc.Pid()
			cancel()
			<-watched
			cl.stopAll()
			if p.proc.Running() || alive(second) {
				t.Errorf("pid %d still runs after stopAll", second)
			}
			if got := read(); got.Running {
				t.Errorf("cluster.json after stopAll: %+v", got)
			}
			b, _ := os.ReadFile(filepath.Join(dir, clusterStateFile))
			if !strings.Contains(string(b), `"state": "stopped"`) {
				t.Errorf("cluster.json after stopAll: %s", b)
			}
		})
	}
}
