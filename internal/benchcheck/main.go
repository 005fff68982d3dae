// Command benchcheck is `make bench-check`: it measures what a Check costs
// on the region agent against what it costs on a gRPC server that does
// nothing, both driven the same way in the same run, and prints one table.
//
// It starts, each as its own process on free loopback ports: a real
// redis-server, `leasehold allocator` (embedded etcd, in a temporary
// directory), `leasehold agent` (with an Envoy mapping, so it serves
// ShouldRateLimit on its gRPC port too) and noopserver (./noopserver).
// It creates the limits through the allocator's Admin API, then drives
// both servers over loopback gRPC with the same callers, case by case:
//
//	1 hot          one limit
//	10,000 warm    10,000 limits, each leased before the case (day-long windows)
//	10,000 busy    the same 10,000 limits, measured after -busy-warmup of the
//	               case's own load (unmeasured): keys under steady traffic
//	10,000 cold    10,000 limits created for this case and never checked before
//
// with 1 and 64 callers, through Check and through Envoy's ShouldRateLimit.
// Every case is bounded in decisions (-max) and time (-duration). The
// server's CPU per decision comes from its utime+stime in /proc/PID/stat.
// docs/benchmarks.md explains how to read the table.
//
// Every child is killed when benchcheck exits, on Ctrl-C too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/ports"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
)

// config is benchcheck's flags.
type config struct {
	dur          time.Duration
	max          int
	keys         int
	callers      []int
	conns        int
	apis         []string
	settle       time.Duration
	busyWarmup   time.Duration
	leasehold    string
	noopserver   string
	redisServer  string
	keep         bool
	readyTimeout time.Duration
	agentFlags   []string
	coldStanding int64
}

// benchCase is one line pair of the table: the agent and the floor under
// the same load.
type benchCase struct {
	api     string // "Check" or "Envoy"
	kind    string // "hot", "warm", "busy" or "cold"
	keys    int    // limits the case cycles through
	callers int
}

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "benchcheck:", err)
		stop()
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("benchcheck", flag.ContinueOnError)
	fs.DurationVar(&c.dur, "duration", 4*time.Second, "at most this long per case and server")
	fs.IntVar(&c.max, "max", 200000, "at most this many decisions per case and server")
	fs.IntVar(&c.keys, "keys", 10000, "limits in the warm set and in each cold set")
	callers := fs.String("callers", "1,64", "comma-separated concurrent callers per case")
	fs.IntVar(&c.conns, "conns", 1, "gRPC connections per server, shared by the callers")
	apis := fs.String("apis", "check,envoy", "comma-separated APIs: check (RegionAgent Check), envoy (ShouldRateLimit)")
	fs.DurationVar(&c.settle, "settle", 5*time.Second, "pause after the warm-up and before each cold case, so the work before (first reports, the busy case's limits winding down) is done before measuring")
	fs.DurationVar(&c.busyWarmup, "busy-warmup", 4*time.Second, "how long a busy case runs its own load, unmeasured, before it is measured")
	fs.StringVar(&c.leasehold, "leasehold", "", "leasehold binary (default: go build ./cmd/leasehold)")
	fs.StringVar(&c.noopserver, "noopserver", "", "noopserver binary (default: go build ./internal/benchcheck/noopserver)")
	fs.StringVar(&c.redisServer, "redis-server", os.Getenv("REDIS_SERVER"), "redis-server binary (default: $REDIS_SERVER, else redis-server on PATH)")
	fs.BoolVar(&c.keep, "keep", false, "keep the working directory (logs, etcd data) instead of removing it")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 60*time.Second, "how long each server may take to come up")
	fs.Int64Var(&c.coldStanding, "cold-standing", 0, "give the cold sets' limits a standing share of N tokens and G = 100 x N per day (0: G = 2^50 per day, no share, as the other sets)")
	agentFlags := fs.String("agent-flags", "", "more flags for `leasehold agent`, separated by spaces (e.g. \"--chunk-hot-rate 0\" to compare without chunks)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.coldStanding < 0 || c.coldStanding > 1<<40 {
		return c, fmt.Errorf("-cold-standing: %d is not 0..2^40", c.coldStanding)
	}
	c.agentFlags = strings.Fields(*agentFlags)
	for _, s := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return c, fmt.Errorf("-callers: %q is not a count >= 1", s)
		}
		c.callers = append(c.callers, n)
	}
	for _, s := range strings.Split(*apis, ",") {
		switch s = strings.TrimSpace(s); s {
		case "check", "envoy":
			c.apis = append(c.apis, s)
		default:
			return c, fmt.Errorf("-apis: unknown API %q (check, envoy)", s)
		}
	}
	switch {
	case c.dur <= 0 || c.max < 1 || c.keys < 1 || c.conns < 1 || c.busyWarmup <= 0:
		return c, errors.New("-duration, -max, -keys, -conns and -busy-warmup must be > 0")
	case c.redisServer == "":
		c.redisServer = "redis-server"
	}
	return c, nil
}

// target is one server under test.
type target struct {
	name   string
	p      *proc
	check  []decider // one per connection
	envoy  []decider
	closer []*grpc.ClientConn
}

func run(ctx context.Context, c config) error {
	redisBin, err := exec.LookPath(c.redisServer)
	if err != nil {
		return fmt.Errorf("redis-server not found (%v): install it (apt-get install -y redis-server) or set -redis-server / $REDIS_SERVER", err)
	}
	dir, err := os.MkdirTemp("", "benchcheck-")
	if err != nil {
		return err
	}
	if c.keep {
		fmt.Fprintln(os.Stderr, "working directory (kept):", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	ps := &procs{dir: dir}
	defer ps.kill()

	if c.leasehold == "" || c.noopserver == "" {
		step("building leasehold and noopserver")
	}
	if c.leasehold == "" {
		if c.leasehold, err = build(ctx, dir, "leasehold/cmd/leasehold"); err != nil {
			return err
		}
	}
	if c.noopserver == "" {
		if c.noopserver, err = build(ctx, dir, "leasehold/internal/benchcheck/noopserver"); err != nil {
			return err
		}
	}

	addr := func() (string, error) {
		p, err := ports.Free()
		return "127.0.0.1:" + strconv.Itoa(p), err
	}
	var a [8]string
	for i := range a {
		if a[i], err = addr(); err != nil {
			return fmt.Errorf("no free port: %w", err)
		}
	}
	redisAddr, allocGRPC, allocHTTP, etcdClient, etcdPeer, agentGRPC, agentHTTP, noopGRPC := a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]

	step("starting redis-server and the allocator")
	_, redisPort, _ := strings.Cut(redisAddr, ":")
	redis, err := ps.start("redis", redisBin, "--port", redisPort, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--daemonize", "no", "--databases", "1")
	if err != nil {
		return err
	}
	if err := redis.waitFor(ctx, c.readyTimeout, func(context.Context) error { return redistest.Ping(redisAddr) }); err != nil {
		return err
	}
	alloc, err := ps.start("allocator", c.leasehold, "allocator", "--grpc-addr", allocGRPC, "--http-addr", allocHTTP,
		"--data-dir", filepath.Join(dir, "etcd"), "--etcd-client-addr", etcdClient, "--etcd-peer-addr", etcdPeer,
		"--regions", "eu", "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := alloc.waitFor(ctx, c.readyTimeout, serving(allocGRPC, pb.Allocator_ServiceDesc.ServiceName)); err != nil {
		return err
	}

	// Every limit exists before the agent starts: its first sync has them
	// all, and no case pays for a sync.
	sets := keySets(c)
	n := 0
	for _, ks := range sets {
		n += len(ks)
	}
	step(fmt.Sprintf("creating %s limits", thousands(float64(n))))
	if err := createLimits(ctx, allocGRPC, sets, c.coldStanding); err != nil {
		return alloc.failed(err)
	}
	mapping := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(mapping, []byte(envoyMapping), 0o644); err != nil {
		return err
	}

	step("starting the agent and noopserver")
	agentP, err := ps.start("agent", c.leasehold, append([]string{"agent", "--region", "eu", "--allocator", allocGRPC, "--redis", redisAddr,
		"--grpc-addr", agentGRPC, "--http-addr", agentHTTP, "--envoy-mapping", mapping, "--log-level", "warn"}, c.agentFlags...)...)
	if err != nil {
		return err
	}
	noopP, err := ps.start("noop", c.noopserver, "-grpc-addr", noopGRPC)
	if err != nil {
		return err
	}
	if err := agentP.waitFor(ctx, c.readyTimeout, serving(agentGRPC, pb.RegionAgent_ServiceDesc.ServiceName)); err != nil {
		return err
	}
	if err := noopP.waitFor(ctx, c.readyTimeout, serving(noopGRPC, "")); err != nil {
		return err
	}
	noop, err := dial("noop", noopP, noopGRPC, c.conns)
	if err != nil {
		return err
	}
	defer noop.close()
	agent, err := dial("agent", agentP, agentGRPC, c.conns)
	if err != nil {
		return err
	}
	defer agent.close()

	step("warming up: the hot key on both servers, a lease for each warm key on the agent")
	for _, t := range []*target{noop, agent} {
		for _, ds := range [][]decider{t.check, t.envoy} {
			if _, err := drive(ctx, ds, load{keys: sets["hot"], callers: 64, max: 2000, dur: 10 * time.Second}); err != nil {
				return t.p.failed(fmt.Errorf("warm-up of %s: %w", t.name, err))
			}
		}
	}
	if err := lease(ctx, agent.check, sets["warm"], 60*time.Second); err != nil {
		return agentP.failed(err)
	}
	if err := pause(ctx, c.settle); err != nil {
		return err
	}

	cs := newCounters(redisAddr, allocHTTP)
	defer cs.close()
	load0 := loadavg()
	started := time.Now()
	var rows []row
	var problems []string
	for _, bc := range cases(c) {
		keys := sets[bc.set()]
		var floor result
		if bc.kind == "cold" {
			// The case before (busy) leaves 10,000 limits active for a
			// few seconds: their renewals and chunk releases would be
			// counted as the cold limits' cost.
			if err := pause(ctx, c.settle); err != nil {
				return err
			}
		}
		for _, t := range []*target{noop, agent} {
			ds := t.check
			if bc.api == "Envoy" {
				ds = t.envoy
			}
			l := load{keys: keys, callers: bc.callers, max: c.max, dur: c.dur, once: bc.kind == "cold"}
			if bc.kind == "busy" {
				// The case's own load first, unmeasured (its errors show in
				// the measured run that follows).
				warm := l
				warm.dur, warm.max = c.busyWarmup, c.max*int(max(1, c.busyWarmup/c.dur))
				_, _ = drive(ctx, ds, warm)
			}
			r, err := measure(ctx, t.p, redis, alloc, cs, ds, l)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s %s keys %d callers, %s: %d errors, the first: %v",
					bc.api, bc.label(), bc.callers, t.name, r.errors, err))
			}
			x := row{c: bc, server: t.name, r: r}
			if t == noop {
				floor = r
			} else {
				vs := compare(r, floor)
				x.vs = &vs
			}
			rows = append(rows, x)
			fmt.Fprintf(os.Stderr, "  %-5s %-12s %2d callers %-5s %9s/s p50 %s\n", bc.api, bc.label(), bc.callers, t.name,
				thousands(r.rate()), micros(r.p50))
			if t == agent {
				fmt.Fprintf(os.Stderr, "        Redis commands per decision: %s\n", r.commands)
			}
		}
	}

	fmt.Printf("bench-check %s, %d CPUs, load average %s before the cases and %s after (%v)\n",
		started.Format(time.RFC3339), runtime.NumCPU(), load0, loadavg(), time.Since(started).Round(time.Second))
	fmt.Printf("each case: at most %s decisions and %v per server; %d gRPC connection(s) per server\n",
		thousands(float64(c.max)), c.dur, c.conns)
	if c.coldStanding > 0 {
		fmt.Printf("cold limits: G = %d per day, a standing share of %d (-cold-standing)\n", 100*c.coldStanding, c.coldStanding)
	}
	fmt.Println()
	if err := writeTable(os.Stdout, rows); err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Println("\nerrors:", p)
	}
	return nil
}

// step reports progress on stderr (the table goes to stdout).
func step(s string) { fmt.Fprintln(os.Stderr, "bench-check:", s) }

// build compiles pkg into dir and returns the binary's path.
func build(ctx context.Context, dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w (run from the module, or give -leasehold and -noopserver)", pkg, err)
	}
	return out, nil
}

// cases lists the cases in the order they run.
func cases(c config) []benchCase {
	var cs []benchCase
	for _, api := range c.apis {
		name := map[string]string{"check": "Check", "envoy": "Envoy"}[api]
		for _, kind := range []string{"hot", "warm", "busy", "cold"} {
			keys := c.keys
			if kind == "hot" {
				keys = 1
			}
			for _, n := range c.callers {
				cs = append(cs, benchCase{api: name, kind: kind, keys: keys, callers: n})
			}
		}
	}
	return cs
}

// set names the key set the case uses: a busy case uses the warm keys.
func (bc benchCase) set() string {
	switch bc.kind {
	case "busy":
		return "warm"
	case "cold":
		return coldSet(bc)
	}
	return bc.kind
}

// coldSet names the key set a cold case uses: its own, so that no key is
// warm from an earlier case.
func coldSet(bc benchCase) string {
	return fmt.Sprintf("cold-%s-%d", strings.ToLower(bc.api), bc.callers)
}

// pause waits d, or until ctx is done (its error).
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// label names the case's keys in the table: "1 hot", "10,000 warm".
func (bc benchCase) label() string { return thousands(float64(bc.keys)) + " " + bc.kind }

// keySets are the limits' short names (without benchPrefix): "hot",
// "warm" and one cold set per cold case.
func keySets(c config) map[string][]string {
	names := func(prefix string) []string {
		ks := make([]string, c.keys)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s-%05d", prefix, i)
		}
		return ks
	}
	sets := map[string][]string{"hot": {"hot"}, "warm": names("warm")}
	for _, bc := range cases(c) {
		if bc.kind == "cold" {
			sets[coldSet(bc)] = names(coldSet(bc))
		}
	}
	return sets
}

// createLimits puts every limit through the allocator's Admin API
// (ApplyLimits, 60 per call: under the allocator's cap of 63 changes with
// etcd's default transaction size), a few calls at a time. G is huge, so
// nothing is ever denied for want of tokens, and windows and leases last
// a day, so a leased key stays leased for the whole run.
func createLimits(ctx context.Context, allocAddr string, sets map[string][]string, coldStanding int64) error {
	conn, err := grpc.NewClient(allocAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := pb.NewAdminClient(conn)
	const perCall = 60
	reqs := make(chan *pb.ApplyLimitsRequest)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex // protects firstErr
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 4 {
		wg.Go(func() {
			for req := range reqs {
				cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := admin.ApplyLimits(cctx, req)
				ccancel()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("creating limits (ApplyLimits): %w", err)
					}
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	day := durationpb.New(24 * time.Hour)
	req := &pb.ApplyLimitsRequest{Reason: "bench-check", Effective: pb.Effective_EFFECTIVE_NOW}
	send := func() bool {
		select {
		case reqs <- req:
		case <-ctx.Done():
			return false
		}
		req = &pb.ApplyLimitsRequest{Reason: req.Reason, Effective: req.Effective}
		return true
	}
	func() {
		defer close(reqs)
		for set, ks := range sets {
			for _, k := range ks {
				l := &pb.Limit{Id: benchPrefix + k, LimitTokens: 1 << 50, Window: day, Regions: []string{"eu"},
					Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: day}}
				if coldStanding > 0 && strings.HasPrefix(set, "cold-") {
					// A share of 1 % of G: a sparse tenant's limit.
					l.LimitTokens, l.Lease.Standing = 100*coldStanding, coldStanding
				}
				req.Changes = append(req.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: l}})
				if len(req.Changes) == perCall && !send() {
					return
				}
			}
		}
		if len(req.Changes) > 0 {
			send()
		}
	}()
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// lease checks every key through ds until each has answered OK once: the
// agent then holds a lease for each. It gives up after timeout.
func lease(ctx context.Context, ds []decider, keys []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	todo := make(chan string, len(keys))
	for _, k := range keys {
		todo <- k
	}
	close(todo)
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for i := range 64 {
		decide := ds[i%len(ds)]
		wg.Go(func() {
			for k := range todo {
				for {
					ok, err := decide(ctx, k)
					if ok {
						break
					}
					if ctx.Err() != nil {
						errc <- fmt.Errorf("warm key %s never answered OK within %v (last error: %v)", k, timeout, err)
						return
					}
					time.Sleep(10 * time.Millisecond) // its first lease is on the way
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// measure drives one case against p and adds the CPU it, redis-server and
// the allocator spent meanwhile, and the Redis commands and grants made.
func measure(ctx context.Context, p, redis, alloc *proc, cs *counters, ds []decider, l load) (result, error) {
	ps := []*proc{p, redis, alloc}
	cpus := func() (out [3]time.Duration, err error) {
		for i, q := range ps {
			if out[i], err = q.cpu(); err != nil {
				return out, err
			}
		}
		return out, nil
	}
	n0, err := cs.read(ctx)
	if err != nil {
		return result{}, err
	}
	c0, err := cpus()
	if err != nil {
		return result{}, err
	}
	r, derr := drive(ctx, ds, l)
	c1, err := cpus()
	if err != nil {
		return r, err
	}
	n1, err := cs.read(ctx)
	if err != nil {
		return r, err
	}
	r.cpu, r.redis, r.alloc = c1[0]-c0[0], c1[1]-c0[1], c1[2]-c0[2]
	r.redisCmds, r.grants = n1.redisCmds-n0.redisCmds, n1.grants-n0.grants
	r.commands = topCommands(n0.byCommand, n1.byCommand, r.decisions, 6)
	return r, derr
}

// dial opens conns connections to addr and the deciders on them.
func dial(name string, p *proc, addr string, conns int) (*target, error) {
	t := &target{name: name, p: p}
	for range conns {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.close()
			return nil, err
		}
		t.closer = append(t.closer, cc)
		t.check = append(t.check, checker(cc))
		t.envoy = append(t.envoy, envoyChecker(cc))
	}
	return t, nil
}

func (t *target) close() {
	for _, cc := range t.closer {
		cc.Close()
	}
}

// loadavg is the 1-minute load average, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
