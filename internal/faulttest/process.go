package faulttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"leasehold/internal/etcdtest"
	"leasehold/internal/ports"
	"leasehold/internal/supervise"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Binary builds the leasehold command once per test binary (go build into
// a temporary directory) and returns its path. Main removes the directory.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "leasehold-faulttest-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "leasehold")
		cmd := exec.Command("go", "build", "-o", build.bin, "leasehold/cmd/leasehold")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build leasehold/cmd/leasehold: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatalf("faulttest: %v", build.err)
	}
	return build.bin
}

// Main runs the tests and removes the binary Binary built. Use it from
// TestMain: os.Exit(faulttest.Main(m)). A copy of the test binary started
// as an etcd member (etcdtest.StartProcesses) runs the member instead.
func Main(m *testing.M) int {
	etcdtest.RunMemberIfChild() // a member process of etcdtest.StartProcesses never returns
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	return code
}

// Process is a leasehold process (allocator or agent) that a test can
// kill, stop and restart on the same flags (same ports, same data dir).
type Process struct {
	t    testing.TB
	name string
	bin  string
	args []string
	// GRPCAddr and HTTPAddr are where the process listens.
	GRPCAddr, HTTPAddr string
	// EtcdEndpoint is the embedded etcd's client URL (allocators without
	// external endpoints), else "".
	EtcdEndpoint string
	// Advertise is the address the allocator names to callers of its
	// followers ("" for agents).
	Advertise string
	// MetricsAddr is a gateway's own /metrics address ("" for the others).
	MetricsAddr string
	service     string // the gRPC service whose health says it is up

	mu     sync.Mutex         // protects proc
	proc   *supervise.Process // nil until started
	stderr syncbuf.Buffer     // the output of every run, runs separated by a line
}

// Name is the process's name in logs (e.g. "allocator-0", "agent eu-1").
func (p *Process) Name() string { return p.name }

// Pid is the process id of the current run.
func (p *Process) Pid() int { return p.current().Pid() }

func (p *Process) current() *supervise.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc
}

// launch starts p (its addresses already set) and stops it in t.Cleanup;
// the test's history check (history.go) runs after every process stopped.
func launch(t testing.TB, p *Process) *Process {
	historyOf(t)
	p.t, p.bin = t, Binary(t)
	p.start()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s stderr (tail):\n%s", p.name, tail(p.Stderr(), 3000))
		}
	})
	return p
}

// start starts the process, or starts it again on the same flags; it
// runs in a process group of its own and is killed if the test process
// dies (package supervise).
func (p *Process) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		sp, err := supervise.Start(supervise.Spec{Name: p.name, Path: p.bin, Args: p.args, Output: &p.stderr})
		if err != nil {
			p.t.Fatalf("faulttest: %v", err)
		}
		p.proc = sp
		return
	}
	_, _ = p.stderr.Write([]byte("\n--- restarted ---\n"))
	if err := p.proc.Restart(); err != nil {
		p.t.Fatalf("faulttest: %v", err)
	}
}

// Running reports whether the process has not exited.
func (p *Process) Running() bool { return p.current().Running() }

// Exited is closed when the current run of the process exits.
func (p *Process) Exited() <-chan struct{} { return p.current().Exited() }

// Kill stops the process with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() { p.current().Kill() }

// Stop stops the process with SIGTERM and waits (SIGKILL after 15 s).
func (p *Process) Stop() { p.current().Stop(15 * time.Second) }

// Restart kills the process if it runs, starts it again on the same flags
// and waits until it serves.
func (p *Process) Restart() {
	p.t.Helper()
	p.Kill()
	p.start()
	p.WaitServing(60 * time.Second)
}

// Stderr is what every run wrote to stdout and stderr, runs separated
// by a "--- restarted ---" line.
func (p *Process) Stderr() string { return p.stderr.String() }

// WaitServing waits until the process's gRPC health says its service
// serves (for an agent: it has its limits from the allocator; for an
// allocator: Admin, on every replica). It fails the test after timeout or
// when the process exits.
func (p *Process) WaitServing(timeout time.Duration) {
	p.t.Helper()
	wait, addr := WaitHealthy, p.GRPCAddr
	if p.service == "" { // a gateway: HTTP only
		wait, addr = waitHTTP, p.HTTPAddr
	}
	if err := wait(addr, p.service, timeout, p.Exited()); err != nil {
		p.t.Fatalf("faulttest: %s: %v\nstderr:\n%s", p.name, err, tail(p.Stderr(), 3000))
	}
}

// IsLeader asks an allocator's health service whether it leads (the
// Allocator service serves only on the leader).
func (p *Process) IsLeader() bool {
	return WaitHealthy(p.GRPCAddr, pb.Allocator_ServiceDesc.ServiceName, 0, nil) == nil
}

// WaitHealthy polls addr's gRPC health for service until it is SERVING, the
// timeout passes (0: ask once), or exited is closed.
func WaitHealthy(addr, service string, timeout time.Duration, exited <-chan struct{}) error {
	if timeout <= 0 {
		return supervise.CheckGRPC(context.Background(), addr, service)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := supervise.WaitGRPC(ctx, addr, service, exited); err != nil {
		return fmt.Errorf("after %v: %w", timeout, err)
	}
	return nil
}

// waitHTTP polls addr's GET /healthz until it answers 200, the timeout
// passes, or exited is closed.
func waitHTTP(addr, _ string, timeout time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := supervise.WaitHTTP(ctx, "http://"+addr+"/healthz", exited); err != nil {
		return fmt.Errorf("after %v: %w", timeout, err)
	}
	return nil
}

// GatewayOptions configure StartGateway.
type GatewayOptions struct {
	// Agent is the region agent's gRPC address (required).
	Agent string
	// Upstream is the URL of the service behind the gateway (required).
	Upstream string
	// Args are added to the command line (the defaults stand otherwise).
	Args []string
}

// StartGateway starts `leasehold gateway` on its default flags, the key
// taken from the X-Tenant header (limit tenant/<key>), and waits until it
// answers /healthz. Its address is HTTPAddr, its metrics' MetricsAddr
// (a free port: not the default, which gateways started together would
// share).
func StartGateway(t testing.TB, o GatewayOptions) *Process {
	t.Helper()
	if o.Agent == "" || o.Upstream == "" {
		t.Fatalf("faulttest: StartGateway needs Agent and Upstream")
	}
	listen, metrics := ports.Addr(t), ports.Addr(t)
	args := []string{"gateway", "--listen", listen, "--metrics-addr", metrics, "--upstream", o.Upstream, "--agent", o.Agent,
		"--key-header", "X-Tenant", "--log-level", "warn", "--history", historyFile(t, "gateway")}
	p := launch(t, &Process{name: "gateway", args: append(args, o.Args...), HTTPAddr: listen, MetricsAddr: metrics})
	p.WaitServing(30 * time.Second)
	return p
}

// AllocatorOptions configure StartAllocator.
type AllocatorOptions struct {
	// Name in logs; default "allocator".
	Name string
	// Regions limits may name; default eu, us.
	Regions []string
	// EtcdEndpoints of an external cluster (etcdtest's Endpoints()); empty
	// runs an embedded single member on free ports.
	EtcdEndpoints []string
	// GRPCAddr to listen on; default a free port. Choose it beforehand to
	// put a Proxy in front of it.
	GRPCAddr string
	// Advertise is what followers name as the leader (--advertise):
	// give the leader's proxy address to keep agents behind the proxy.
	Advertise string
	// SessionTTL (--session-ttl); 0 keeps the allocator's default.
	SessionTTL time.Duration
	// Retention of grant records (--retention); 0 keeps the default.
	Retention time.Duration
	// Args are added to the command line.
	Args []string
}

// StartAllocator starts `leasehold allocator` and waits until its Admin
// service serves.
func StartAllocator(t testing.TB, o AllocatorOptions) *Process {
	t.Helper()
	if o.Name == "" {
		o.Name = "allocator"
	}
	if len(o.Regions) == 0 {
		o.Regions = []string{"eu", "us"}
	}
	if o.GRPCAddr == "" {
		o.GRPCAddr = ports.Addr(t)
	}
	p := &Process{name: o.Name, service: pb.Admin_ServiceDesc.ServiceName,
		GRPCAddr: o.GRPCAddr, HTTPAddr: ports.Addr(t), Advertise: o.Advertise}
	args := []string{"allocator", "--grpc-addr", p.GRPCAddr, "--http-addr", p.HTTPAddr,
		"--regions", strings.Join(o.Regions, ","), "--log-level", "warn", "--history", historyFile(t, o.Name)}
	if len(o.EtcdEndpoints) > 0 {
		args = append(args, "--etcd-endpoints", strings.Join(o.EtcdEndpoints, ","))
	} else {
		client := ports.Addr(t)
		p.EtcdEndpoint = "http://" + client
		args = append(args, "--data-dir", filepath.Join(t.TempDir(), "etcd"),
			"--etcd-client-addr", client, "--etcd-peer-addr", ports.Addr(t))
	}
	if o.Advertise != "" {
		args = append(args, "--advertise", o.Advertise)
	} else {
		p.Advertise = p.GRPCAddr
	}
	if o.SessionTTL > 0 {
		args = append(args, "--session-ttl", o.SessionTTL.String())
	}
	if o.Retention > 0 {
		args = append(args, "--retention", o.Retention.String())
	}
	p.args = append(args, o.Args...)
	launch(t, p)
	p.WaitServing(90 * time.Second)
	return p
}

// AgentOptions configure StartAgent.
type AgentOptions struct {
	// Region the agent serves (required).
	Region string
	// Allocators: every allocator replica's address (or its proxy's).
	Allocators []string
	// Redis is the region's Redis address (or its proxy's).
	Redis string
	// ReplicaID (--replica-id); default "<region>-1".
	ReplicaID string
	// RenewInterval (--renew-interval); 0 keeps the default.
	RenewInterval time.Duration
	// NoWait returns without waiting until the agent serves.
	NoWait bool
	// Args are added to the command line.
	Args []string
}

// StartAgent starts `leasehold agent` and (unless NoWait) waits until it
// serves, which needs its allocator.
func StartAgent(t testing.TB, o AgentOptions) *Process {
	t.Helper()
	if o.Region == "" || len(o.Allocators) == 0 || o.Redis == "" {
		t.Fatalf("faulttest: StartAgent needs Region, Allocators and Redis")
	}
	if o.ReplicaID == "" {
		o.ReplicaID = o.Region + "-1"
	}
	grpcAddr, httpAddr := ports.Addr(t), ports.Addr(t)
	args := []string{"agent", "--region", o.Region, "--allocator", strings.Join(o.Allocators, ","),
		"--redis", o.Redis, "--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--replica-id", o.ReplicaID, "--log-level", "warn", "--history", historyFile(t, "agent "+o.ReplicaID)}
	if o.RenewInterval > 0 {
		args = append(args, "--renew-interval", o.RenewInterval.String())
	}
	p := launch(t, &Process{name: "agent " + o.ReplicaID, service: pb.RegionAgent_ServiceDesc.ServiceName,
		args: append(args, o.Args...), GRPCAddr: grpcAddr, HTTPAddr: httpAddr})
	if !o.NoWait {
		p.WaitServing(60 * time.Second)
	}
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
