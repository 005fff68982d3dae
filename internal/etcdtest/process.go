package etcdtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"leasehold/internal/ports"
)

// memberEnv carries a child member's settings (JSON) to the re-executed
// test binary.
const memberEnv = "LEASEHOLD_ETCDTEST_MEMBER"

// memberConfig is what a member process needs.
type memberConfig struct {
	Name, Dir, Client, Peer, InitialCluster, Token, State string
}

// RunMemberIfChild runs an etcd member and never returns when the process
// was started by StartProcesses to be one; otherwise it returns at once.
// Call it first thing in TestMain of a package that uses StartProcesses.
func RunMemberIfChild() {
	v := os.Getenv(memberEnv)
	if v == "" {
		return
	}
	var mc memberConfig
	if err := json.Unmarshal([]byte(v), &mc); err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		os.Exit(2)
	}
	cu, _ := url.Parse(mc.Client)
	pu, _ := url.Parse(mc.Peer)
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = mc.Name, mc.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster, cfg.InitialClusterToken, cfg.ClusterState = mc.InitialCluster, mc.Token, mc.State
	cfg.LogLevel = "error"
	cfg.MaxTxnOps = 1024
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = uint(DefaultTick/time.Millisecond), uint(DefaultElectionTimeout/time.Millisecond)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		os.Exit(exitCode(err))
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("ready")
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		os.Exit(exitCode(err))
	case <-sig:
		os.Exit(0)
	}
	select {
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		os.Exit(1)
	case <-sig:
		e.Close()
		os.Exit(0)
	}
}

// ProcessCluster is a set of etcd members that each run in a process of
// their own (the test binary re-executed, see RunMemberIfChild), so that a
// test can SIGKILL one as a crash would. Safe for concurrent use.
// exitInUse is a member's exit code when a port it was given is taken:
// another process bound it between ports.Free and the member's listen.
const exitInUse = 3

// errInUse: a member could not listen on a port it was given.
var errInUse = errors.New("a port was taken by another process")

func exitCode(err error) int {
	if strings.Contains(err.Error(), "address already in use") {
		return exitInUse
	}
	return 1
}

type ProcessCluster struct {
	t       testing.TB
	mu      sync.Mutex // protects members' cmd and done
	members []*procMember
}

type procMember struct {
	cfg  memberConfig
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd exits
}

// StartProcesses starts n member processes with etcd's default raft
// timings (DefaultTick, DefaultElectionTimeout: what a test of a crash
// measures should be what production sees) and waits until they serve.
// They are killed in t.Cleanup.
func StartProcesses(t testing.TB, n int) *ProcessCluster {
	t.Helper()
	c := &ProcessCluster{t: t}
	base := t.TempDir()
	t.Cleanup(c.Close)
	// A port another process bound first (ports.Free can only say it was
	// free a moment ago): the cluster starts again on fresh ports, at most
	// three times, as Start does.
	for attempt := 0; ; attempt++ {
		token := fmt.Sprintf("etcdtest-proc-%d", time.Now().UnixNano())
		var parts []string
		var members []*procMember
		for i := range n {
			m := &procMember{cfg: memberConfig{Name: fmt.Sprintf("m%d", i), Dir: filepath.Join(base, fmt.Sprintf("try%d-m%d", attempt, i)),
				Client: "http://" + ports.Addr(t), Peer: "http://" + ports.Addr(t), Token: token, State: embed.ClusterStateFlagNew}}
			parts = append(parts, m.cfg.Name+"="+m.cfg.Peer)
			members = append(members, m)
		}
		for _, m := range members {
			m.cfg.InitialCluster = strings.Join(parts, ",")
		}
		c.mu.Lock()
		c.members = members
		c.mu.Unlock()
		errs := make(chan error, n)
		for i := range members {
			go func() { errs <- c.start(i) }()
		}
		var failed error
		for range n {
			if err := <-errs; err != nil && (failed == nil || errors.Is(failed, errInUse)) {
				failed = err
			}
		}
		if failed == nil {
			return c
		}
		c.Close()
		if !errors.Is(failed, errInUse) || attempt == 2 {
			t.Fatalf("etcdtest: %v", failed)
		}
	}
}

func (c *ProcessCluster) start(i int) error {
	c.mu.Lock()
	m := c.members[i]
	b, _ := json.Marshal(m.cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no member outlives a crashed test
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("member %s: %w", m.cfg.Name, err)
	}
	done := make(chan struct{})
	m.cmd, m.done = cmd, done
	c.mu.Unlock()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := sc.Scan() && sc.Text() == "ready"
		ready <- ok
		for sc.Scan() { // keep draining until the process exits
		}
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-done
			if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == exitInUse {
				return fmt.Errorf("member %s: %w", m.cfg.Name, errInUse)
			}
			return fmt.Errorf("member %s exited before it served", m.cfg.Name)
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("member %s not ready after 60s", m.cfg.Name)
	}
}

// ElectionTimeout is the members' raft election timeout.
func (c *ProcessCluster) ElectionTimeout() time.Duration { return DefaultElectionTimeout }

// Endpoints returns every member's client URL, running or not.
func (c *ProcessCluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.cfg.Client
	}
	return eps
}

// Client returns a client of the whole cluster, closed in t.Cleanup.
func (c *ProcessCluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader asks each running member whom it follows and returns the index
// of a member that says it leads raft, or -1 (none answers so, or none
// answers within ctx).
func (c *ProcessCluster) Leader(ctx context.Context, cli *clientv3.Client) int {
	for i, m := range c.members {
		if !c.Running(i) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		st, err := cli.Status(sctx, m.cfg.Client)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// Running reports whether member i's process has not exited.
func (c *ProcessCluster) Running(i int) bool {
	c.mu.Lock()
	m := c.members[i]
	cmd, done := m.cmd, m.done
	c.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs member i and waits until its process is gone.
func (c *ProcessCluster) Kill(i int) {
	c.mu.Lock()
	m := c.members[i]
	cmd, done := m.cmd, m.done
	m.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Close kills every member.
func (c *ProcessCluster) Close() {
	for i := range c.members {
		c.Kill(i)
	}
}
