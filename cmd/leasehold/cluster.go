package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/bounds"
	"leasehold/internal/history"
	"leasehold/internal/ports"
	"leasehold/internal/supervise"
	pb "leasehold/proto/leasehold/v1"
)

// clusterConfig is everything `leasehold cluster` takes.
type clusterConfig struct {
	dir             string
	basePort        int
	prometheus      bool
	prometheusRules string
	restart         bool
	noDemo          bool
	demoTokens      int64
	demoWindow      time.Duration
	noHistory       bool
	log             logFlags
}

// ClusterStateFile is the file in -dir that says what runs where (JSON,
// clusterState): rewritten when a process exits or restarts, and when the
// cluster stops.
const clusterStateFile = "cluster.json"

var clusterRegions = []string{"eu", "us"}

func (c *clusterConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "leasehold-data/cluster", "`DIR` of the cluster's data, logs, histories and "+clusterStateFile+" (emptied of an earlier cluster's state at start)")
	fs.IntVar(&c.basePort, "base-port", 0, "listen on consecutive ports from this one (0: free loopback ports)")
	fs.BoolVar(&c.prometheus, "prometheus", false, "also run Prometheus (the prometheus binary on PATH) scraping every process, with -prometheus-rules")
	fs.StringVar(&c.prometheusRules, "prometheus-rules", filepath.Join("deploy", "prometheus", "alerts.yaml"), "`FILE` of alert rules Prometheus loads (empty: none)")
	fs.BoolVar(&c.restart, "restart", false, "start a process that exits again, on the same flags and ports, a second later (default: the cluster runs on without it)")
	fs.BoolVar(&c.noDemo, "no-demo", false, "do not create the demo limit "+demoLimit)
	fs.Int64Var(&c.demoTokens, "demo-limit", 1000, "the demo limit's G: tokens per -demo-window, all regions together")
	fs.DurationVar(&c.demoWindow, "demo-window", time.Minute, "the demo limit's window (>= 1s)")
	fs.BoolVar(&c.noHistory, "no-history", false, "do not record the allocators', agents' and gateways' histories in DIR/history (leasehold history check DIR/history)")
	c.log.register(fs)
}

func (c *clusterConfig) validate() error {
	switch {
	case c.dir == "":
		return usagef("-dir is required")
	case c.basePort < 0 || (c.basePort > 0 && (c.basePort < 1024 || c.basePort+clusterPorts > 65535)):
		return usagef("-base-port %d: want 0 or 1024..%d (the cluster takes %d ports)", c.basePort, 65535-clusterPorts, clusterPorts)
	case c.demoTokens < 1:
		return usagef("-demo-limit %d: must be >= 1", c.demoTokens)
	case c.demoWindow < time.Second || c.demoWindow%time.Millisecond != 0:
		return usagef("-demo-window %v: must be >= 1s, in whole milliseconds", c.demoWindow)
	}
	return checkClusterDir(c.dir)
}

// checkClusterDir refuses a -dir that holds files and no cluster.json:
// the cluster empties its directory at start.
func checkClusterDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(ents) == 0) {
		return nil
	}
	if err != nil {
		return usagef("-dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, clusterStateFile)); err != nil {
		return usagef("-dir %s: not empty and not a cluster's (no %s): give an empty or new directory", dir, clusterStateFile)
	}
	return nil
}

// clusterPorts is how many ports a cluster listens on: 3 etcd members x
// 2, 2 Redis, 2 allocators x 2, 4 agents x 2, 2 gateways x 2 (requests,
// metrics), the upstream, Prometheus.
const clusterPorts = 6 + 2 + 4 + 8 + 4 + 1 + 1

// clusterProc is one process of the cluster, as cluster.json shows it.
type clusterProc struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"` // etcd, redis, allocator, agent, gateway, prometheus
	Region  string `json:"region,omitempty"`
	PID     int    `json:"pid"`
	Running bool   `json:"running"`
	Starts  int    `json:"starts"`
	GRPC    string `json:"grpc,omitempty"`
	HTTP    string `json:"http,omitempty"`    // HTTP address: /metrics, /healthz (a gateway: its listen address)
	Metrics string `json:"metrics,omitempty"` // a gateway's /metrics address
	Addr    string `json:"addr,omitempty"`    // etcd: client URL; Redis: HOST:PORT
	Peer    string `json:"peer,omitempty"`    // etcd: peer URL
	Log     string `json:"log"`

	spec  supervise.Spec
	ready func(ctx context.Context, p *supervise.Process) error
	proc  *supervise.Process
}

// clusterState is cluster.json.
type clusterState struct {
	State     string         `json:"state"` // starting, serving, stopped
	Dir       string         `json:"dir"`
	DemoLimit string         `json:"demo_limit,omitempty"`
	Upstream  string         `json:"upstream"`
	History   string         `json:"history,omitempty"`
	Processes []*clusterProc `json:"processes"`
}

func runClusterCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c clusterConfig
	log, err := setup("cluster", c.register, &c.log, c.validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	return runCluster(ctx, c, stdout, log)
}

// cluster is a running `leasehold cluster`.
type cluster struct {
	c    clusterConfig
	log  *slog.Logger
	dir  string // absolute
	self string // this binary

	mu       sync.Mutex // protects state, stopping
	state    clusterState
	stopping bool
	tiers    [][]*clusterProc // in start order
}

// runCluster runs the production topology on this machine from real
// processes until ctx ends: three etcd members (leasehold etcd), a Redis
// per region (redis-server), two allocators against the etcd cluster,
// two agents per region sharing their region's Redis, a gateway per
// region in front of a stand-in upstream (served by this process), and
// optionally Prometheus. Each runs in a process group of its own and dies
// with this process (package supervise).
func runCluster(ctx context.Context, c clusterConfig, stdout io.Writer, log *slog.Logger) error {
	redisServer, err := exec.LookPath("redis-server")
	if err != nil {
		return errors.New("redis-server not found on PATH: install it (Debian: apt-get install redis-server)")
	}
	var prometheus string
	if c.prometheus {
		if prometheus, err = exec.LookPath("prometheus"); err != nil {
			return errors.New("-prometheus: prometheus not found on PATH: install it (Debian: apt-get install prometheus)")
		}
		if c.prometheusRules != "" {
			if c.prometheusRules, err = filepath.Abs(c.prometheusRules); err == nil {
				_, err = os.Stat(c.prometheusRules)
			}
			if err != nil {
				return usagef("-prometheus-rules: %v (run from the repository's root, or give -prometheus-rules '')", err)
			}
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("this binary's path: %w", err)
	}
	dir, err := prepareClusterDir(c.dir)
	if err != nil {
		return err
	}
	cl := &cluster{c: c, log: log, dir: dir, self: self}
	cl.state = clusterState{State: "starting", Dir: dir}
	if !c.noHistory {
		cl.state.History = filepath.Join(dir, "history")
	}
	port, err := cl.portAllocator()
	if err != nil {
		return err
	}
	upstream := port()
	cl.state.Upstream = "http://" + upstream
	cl.plan(port, redisServer, prometheus)
	for _, d := range []string{"logs", "etcd", "redis", "history", "prometheus"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	defer cl.stopAll()

	// The stand-in upstream behind both gateways, served by this process.
	ul, err := listen("upstream", upstream)
	if err != nil {
		return err
	}
	upSrv := bounds.Service.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the upstream: %s %s\n", r.Method, r.URL.Path)
	}), nil)
	go func() { _ = upSrv.Serve(ul) }()
	defer upSrv.Close()

	for _, tier := range cl.tiers {
		if err := cl.startTier(ctx, tier); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
		if tier[0].Kind == "allocator" && !c.noDemo { // the demo limit, before the agents sync
			if err := cl.createDemo(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			cl.state.DemoLimit = demoLimit
		}
	}
	cl.mu.Lock()
	cl.state.State = "serving"
	cl.mu.Unlock()
	cl.writeState()
	cl.print(stdout)
	log.Info("cluster serving", "processes", len(cl.state.Processes), "state", filepath.Join(dir, clusterStateFile))

	var wg sync.WaitGroup
	for _, p := range cl.state.Processes {
		wg.Add(1)
		go func() { defer wg.Done(); cl.watch(ctx, p) }()
	}
	<-ctx.Done()
	log.Info("cluster stopping")
	cl.stopAll()
	wg.Wait()
	fmt.Fprintln(stdout, "leasehold cluster: stopped")
	return nil
}

// prepareClusterDir makes dir, or empties the state an earlier cluster
// left there; it refuses a directory with other files.
func prepareClusterDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("-dir: %w", err)
	}
	if err := checkClusterDir(abs); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return abs, os.MkdirAll(abs, 0o755)
	case err != nil:
		return "", fmt.Errorf("-dir: %w", err)
	}
	// Each run forms a new etcd cluster on new ports: the old members'
	// data would name the old peers.
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(abs, e.Name())); err != nil {
			return "", fmt.Errorf("-dir: emptying %s: %w", e.Name(), err)
		}
	}
	return abs, nil
}

// portAllocator hands out the cluster's ports: consecutive from
// -base-port, or free loopback ports.
func (cl *cluster) portAllocator() (func() string, error) {
	if cl.c.basePort > 0 {
		next := cl.c.basePort
		return func() string { next++; return "127.0.0.1:" + strconv.Itoa(next-1) }, nil
	}
	var errOnce error
	addrs := make([]string, clusterPorts)
	seen := map[int]bool{}
	for i := range addrs {
		for {
			p, err := ports.Free()
			if err != nil {
				errOnce = err
				break
			}
			if !seen[p] {
				seen[p] = true
				addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
				break
			}
		}
		if errOnce != nil {
			return nil, fmt.Errorf("no free port: %w", errOnce)
		}
	}
	i := 0
	return func() string { i++; return addrs[i-1] }, nil
}

// plan lays out every process: its flags, log and readiness check, in
// tiers started one after the other.
func (cl *cluster) plan(port func() string, redisServer, prometheus string) {
	logFile := func(name string) string { return filepath.Join(cl.dir, "logs", name+".log") }
	hist := func(name string) []string {
		if cl.c.noHistory {
			return nil
		}
		return []string{"--history", filepath.Join(cl.dir, "history", name+history.Suffix)}
	}
	proc := func(p *clusterProc, path string, args ...string) *clusterProc {
		p.Log = logFile(p.Name)
		p.spec = supervise.Spec{Name: p.Name, Path: path, Args: args, Log: p.Log}
		return p
	}

	// Three etcd members: leasehold etcd, each a process of its own.
	var etcd []*clusterProc
	var initial, endpoints []string
	for i := 1; i <= 3; i++ {
		p := &clusterProc{Name: fmt.Sprintf("etcd-%d", i), Kind: "etcd", Addr: "http://" + port(), Peer: "http://" + port()}
		initial = append(initial, p.Name+"="+p.Peer)
		endpoints = append(endpoints, p.Addr)
		etcd = append(etcd, p)
	}
	for _, p := range etcd {
		proc(p, cl.self, "etcd", "--name", p.Name, "--data-dir", filepath.Join(cl.dir, "etcd", p.Name),
			"--client-addr", strings.TrimPrefix(p.Addr, "http://"), "--peer-addr", strings.TrimPrefix(p.Peer, "http://"),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "leasehold-cluster")
		p.ready = func(ctx context.Context, sp *supervise.Process) error {
			return supervise.WaitHTTP(ctx, p.Addr+"/health", sp.Exited())
		}
	}

	// A Redis per region: redis-server, nothing persisted.
	redisOf := map[string]*clusterProc{}
	var redises []*clusterProc
	for _, r := range clusterRegions {
		p := &clusterProc{Name: "redis-" + r, Kind: "redis", Region: r, Addr: port()}
		host, prt, _ := strings.Cut(p.Addr, ":")
		proc(p, redisServer, "--bind", host, "--port", prt, "--save", "", "--appendonly", "no",
			"--dir", filepath.Join(cl.dir, "redis"), "--logfile", "")
		p.ready = func(ctx context.Context, sp *supervise.Process) error {
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
			defer rdb.Close()
			return supervise.Wait(ctx, sp.Exited(), func(ctx context.Context) error {
				cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
				return rdb.Ping(cctx).Err()
			})
		}
		redisOf[r] = p
		redises = append(redises, p)
	}

	// Two allocators against the etcd cluster: one leads, one waits.
	var allocs []*clusterProc
	var allocAddrs []string
	for i := 1; i <= 2; i++ {
		p := &clusterProc{Name: fmt.Sprintf("allocator-%d", i), Kind: "allocator", GRPC: port(), HTTP: port()}
		allocAddrs = append(allocAddrs, p.GRPC)
		proc(p, cl.self, append([]string{"allocator", "--grpc-addr", p.GRPC, "--http-addr", p.HTTP,
			"--etcd-endpoints", strings.Join(endpoints, ","), "--regions", strings.Join(clusterRegions, ",")},
			hist(p.Name)...)...)
		p.ready = func(ctx context.Context, sp *supervise.Process) error {
			return supervise.WaitGRPC(ctx, p.GRPC, pb.Admin_ServiceDesc.ServiceName, sp.Exited())
		}
		allocs = append(allocs, p)
	}

	// Two agents per region, sharing the region's Redis.
	var agents []*clusterProc
	agentsOf := map[string][]string{}
	for _, r := range clusterRegions {
		for i := 1; i <= 2; i++ {
			p := &clusterProc{Name: fmt.Sprintf("agent-%s-%d", r, i), Kind: "agent", Region: r, GRPC: port(), HTTP: port()}
			proc(p, cl.self, append([]string{"agent", "--region", r, "--allocator", strings.Join(allocAddrs, ","),
				"--redis", redisOf[r].Addr, "--grpc-addr", p.GRPC, "--http-addr", p.HTTP,
				"--replica-id", fmt.Sprintf("%s-%d", r, i)}, hist(p.Name)...)...)
			p.ready = func(ctx context.Context, sp *supervise.Process) error {
				return supervise.WaitGRPC(ctx, p.GRPC, pb.RegionAgent_ServiceDesc.ServiceName, sp.Exited())
			}
			agentsOf[r] = append(agentsOf[r], p.GRPC)
			agents = append(agents, p)
		}
	}

	// A gateway per region in front of the upstream, calling the region's
	// agents (the first that answers, the next when it goes away); the
	// X-Tenant header names the limit demo/{tenant}.
	var gateways []*clusterProc
	for _, r := range clusterRegions {
		p := &clusterProc{Name: "gateway-" + r, Kind: "gateway", Region: r, HTTP: port(), Metrics: port()}
		proc(p, cl.self, append([]string{"gateway", "--listen", p.HTTP, "--metrics-addr", p.Metrics, "--upstream", cl.state.Upstream,
			"--agent", strings.Join(agentsOf[r], ","), "--key-header", "X-Tenant", "--limit-template", "demo/{key}"}, hist(p.Name)...)...)
		p.ready = func(ctx context.Context, sp *supervise.Process) error {
			return supervise.WaitHTTP(ctx, "http://"+p.HTTP+"/healthz", sp.Exited())
		}
		gateways = append(gateways, p)
	}
	promAddr := port()
	cl.tiers = [][]*clusterProc{etcd, redises, allocs, agents, gateways}
	if prometheus != "" {
		p := &clusterProc{Name: "prometheus", Kind: "prometheus", HTTP: promAddr}
		cfg := filepath.Join(cl.dir, "prometheus", "prometheus.yml")
		proc(p, prometheus, "--config.file", cfg, "--storage.tsdb.path", filepath.Join(cl.dir, "prometheus", "data"),
			"--web.listen-address", p.HTTP)
		p.ready = func(ctx context.Context, sp *supervise.Process) error {
			return supervise.WaitHTTP(ctx, "http://"+p.HTTP+"/-/ready", sp.Exited())
		}
		cl.tiers = append(cl.tiers, []*clusterProc{p})
	}
	for _, t := range cl.tiers {
		cl.state.Processes = append(cl.state.Processes, t...)
	}
}

// startTier starts a tier's processes and waits until each serves. On a
// failure it names the process and the last line of its log.
func (cl *cluster) startTier(ctx context.Context, tier []*clusterProc) error {
	if len(tier) > 0 && tier[0].Kind == "prometheus" {
		if err := cl.writePrometheusConfig(tier[0]); err != nil {
			return err
		}
	}
	for _, p := range tier {
		sp, err := supervise.Start(p.spec)
		if err != nil {
			return err
		}
		cl.mu.Lock()
		p.proc = sp
		cl.mu.Unlock()
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	errs := make(chan error, len(tier))
	for _, p := range tier {
		go func() {
			err := p.ready(wctx, p.proc)
			if err != nil {
				last := p.proc.LogTail(600)
				if i := strings.LastIndexByte(last, '\n'); i >= 0 {
					last = last[i+1:]
				}
				err = fmt.Errorf("%s did not start: %v; its log (%s) ends: %s", p.Name, err, p.Log, last)
			}
			errs <- err
		}()
	}
	var first error
	for range tier {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// createDemo creates the demo limit on the allocators' leader.
func (cl *cluster) createDemo(ctx context.Context) error {
	var allocs []*clusterProc
	for _, p := range cl.state.Processes {
		if p.Kind == "allocator" {
			allocs = append(allocs, p)
		}
	}
	ttl := min(15*time.Second, cl.c.demoWindow)
	limit := &pb.Limit{
		Id: demoLimit, LimitTokens: cl.c.demoTokens, Window: durationpb.New(cl.c.demoWindow), Regions: clusterRegions,
		Mode: pb.Mode_MODE_STRICT, Owner: "leasehold cluster", Description: "demo limit created by leasehold cluster",
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)},
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return supervise.Wait(wctx, nil, func(ctx context.Context) error {
		for _, p := range allocs {
			if supervise.CheckGRPC(ctx, p.GRPC, pb.Allocator_ServiceDesc.ServiceName) != nil {
				continue // not the leader
			}
			conn, err := grpc.NewClient(p.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = pb.NewAdminClient(conn).PutLimit(cctx, &pb.PutLimitRequest{Limit: limit, Reason: "leasehold cluster demo limit"})
			if err != nil {
				return fmt.Errorf("demo limit: %w", err)
			}
			return nil
		}
		return errors.New("demo limit: no allocator leads yet")
	})
}

// writePrometheusConfig writes DIR/prometheus/prometheus.yml: every
// process's /metrics and the rules file.
func (cl *cluster) writePrometheusConfig(p *clusterProc) error {
	var b strings.Builder
	b.WriteString("# Written by leasehold cluster: every process of the cluster, scraped every 5s.\n")
	b.WriteString("global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n")
	if cl.c.prometheusRules != "" {
		fmt.Fprintf(&b, "rule_files:\n  - %q\n", cl.c.prometheusRules)
	}
	b.WriteString("scrape_configs:\n")
	job := func(name string, kind string, addr func(*clusterProc) string) {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n", name)
		for _, q := range cl.state.Processes {
			if q.Kind != kind {
				continue
			}
			fmt.Fprintf(&b, "      - targets: [%q]\n        labels: {process: %q", addr(q), q.Name)
			if q.Region != "" {
				fmt.Fprintf(&b, ", region: %q", q.Region)
			}
			b.WriteString("}\n")
		}
	}
	job("leasehold-allocator", "allocator", func(q *clusterProc) string { return q.HTTP })
	job("leasehold-agent", "agent", func(q *clusterProc) string { return q.HTTP })
	job("leasehold-gateway", "gateway", func(q *clusterProc) string { return q.Metrics })
	job("etcd", "etcd", func(q *clusterProc) string { return strings.TrimPrefix(q.Addr, "http://") })
	fmt.Fprintf(&b, "  - job_name: prometheus\n    static_configs:\n      - targets: [%q]\n", p.HTTP)
	return os.WriteFile(filepath.Join(cl.dir, "prometheus", "prometheus.yml"), []byte(b.String()), 0o644)
}

// watch reports p's exit while the cluster runs (and, with -restart,
// starts it again).
func (cl *cluster) watch(ctx context.Context, p *clusterProc) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.proc.Exited():
		}
		cl.mu.Lock()
		stopping := cl.stopping
		cl.mu.Unlock()
		if stopping || ctx.Err() != nil {
			return
		}
		cl.writeState()
		if !cl.c.restart {
			cl.log.Warn("process exited; the cluster runs on without it (restart: leasehold cluster -restart)",
				"process", p.Name, "pid", p.proc.Pid(), "status", p.proc.ExitStatus(), "log", p.Log)
			return
		}
		cl.log.Warn("process exited; restarting it in 1s", "process", p.Name, "pid", p.proc.Pid(), "status", p.proc.ExitStatus(), "log", p.Log)
		t := time.NewTimer(time.Second) // a crash loop costs a start a second, not a busy loop
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		cl.mu.Lock()
		stopping = cl.stopping
		var err error
		if !stopping {
			err = p.proc.Restart()
		}
		cl.mu.Unlock()
		if stopping {
			return
		}
		if err != nil {
			cl.log.Error("restart failed; the cluster runs on without it", "process", p.Name, "err", err)
			return
		}
		cl.writeState()
		cl.log.Info("process restarted", "process", p.Name, "pid", p.proc.Pid(), "starts", p.proc.Starts())
	}
}

// stopAll stops every process, the last tier first (gateways before
// agents before allocators before etcd and Redis), each tier's processes
// together: SIGTERM, then SIGKILL after 10 s. It can be called twice.
func (cl *cluster) stopAll() {
	cl.mu.Lock()
	already := cl.stopping
	cl.stopping = true
	cl.mu.Unlock()
	if already {
		return
	}
	for i := len(cl.tiers) - 1; i >= 0; i-- {
		start := time.Now()
		var wg sync.WaitGroup
		for _, p := range cl.tiers[i] {
			cl.mu.Lock()
			sp := p.proc
			cl.mu.Unlock()
			if sp == nil {
				continue
			}
			if p.Kind == "etcd" {
				// One member at a time: a member that stops hands its
				// leadership to a running peer; stopped together, each
				// would wait for peers that are gone.
				sp.Stop(10 * time.Second)
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); sp.Stop(10 * time.Second) }()
		}
		wg.Wait()
		if len(cl.tiers[i]) > 0 {
			cl.log.Debug("stopped", "kind", cl.tiers[i][0].Kind, "took", time.Since(start).Round(time.Millisecond))
		}
	}
	cl.mu.Lock()
	cl.state.State = "stopped"
	cl.mu.Unlock()
	cl.writeState()
}

// writeState writes cluster.json (atomically: a reader sees the old or
// the new file).
func (cl *cluster) writeState() {
	cl.mu.Lock()
	for _, p := range cl.state.Processes {
		if p.proc != nil {
			p.PID, p.Running, p.Starts = p.proc.Pid(), p.proc.Running(), p.proc.Starts()
		}
	}
	b, err := json.MarshalIndent(&cl.state, "", "  ")
	cl.mu.Unlock()
	if err != nil {
		cl.log.Error("cluster state", "err", err)
		return
	}
	path := filepath.Join(cl.dir, clusterStateFile)
	tmp := path + ".tmp"
	err = os.WriteFile(tmp, append(b, '\n'), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		cl.log.Error("cluster state", "err", err)
	}
}

// print shows every process: PID, addresses, log.
func (cl *cluster) print(out io.Writer) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	fmt.Fprintf(out, "leasehold cluster: serving (state in %s)\n", filepath.Join(cl.dir, clusterStateFile))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  process\tpid\taddresses\tlog")
	var gw, alloc []string
	for _, p := range cl.state.Processes {
		var addrs []string
		switch p.Kind {
		case "etcd":
			addrs = []string{"client " + p.Addr, "peer " + p.Peer}
		case "redis":
			addrs = []string{p.Addr}
		case "gateway":
			addrs = []string{"http://" + p.HTTP, "metrics http://" + p.Metrics + "/metrics"}
			gw = append(gw, p.HTTP)
		case "prometheus":
			addrs = []string{"http://" + p.HTTP}
		default:
			addrs = []string{"gRPC " + p.GRPC, "HTTP " + p.HTTP}
			if p.Kind == "allocator" {
				alloc = append(alloc, p.GRPC)
			}
		}
		rel, err := filepath.Rel(cl.dir, p.Log)
		if err != nil {
			rel = p.Log
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", p.Name, p.PID, strings.Join(addrs, "  "), rel)
	}
	fmt.Fprintf(tw, "  upstream\t%d\t%s\t(this process)\n", os.Getpid(), cl.state.Upstream)
	tw.Flush()
	if cl.state.DemoLimit != "" {
		fmt.Fprintf(out, "  demo limit %s: %d per %v, regions eu+us, strict\n", demoLimit, cl.c.demoTokens, cl.c.demoWindow)
	}
	if len(gw) > 0 {
		fmt.Fprintf(out, "Try: curl -i -H 'X-Tenant: tenant' http://%s/\n", gw[0])
	}
	if len(alloc) > 0 {
		fmt.Fprintf(out, "     go run ./cmd/quotactl --allocator %s windows %s\n", alloc[0], demoLimit)
	}
	fmt.Fprintf(out, "     kill -9 PID: the cluster runs on without it")
	if cl.c.restart {
		fmt.Fprintf(out, " (and starts it again)")
	}
	fmt.Fprintf(out, "; Ctrl-C stops everything\n")
	if cl.state.History != "" {
		fmt.Fprintf(out, "     afterwards: leasehold history check %s\n", cl.state.History)
	}
}
