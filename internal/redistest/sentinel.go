package redistest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"leasehold/internal/ports"
)

// Sentinel helpers: a test runs Redis Sentinel (redis-server --sentinel)
// over Servers it built into a primary and replicas, so failovers are
// Sentinel's own (detection, election, promotion, +switch-master):
//
//	p, r := redistest.Start(t), redistest.Start(t)
//	r.ReplicaOf(p.Addr())                   // wait until it is online
//	s := redistest.StartSentinels(t, p.Addr(), redistest.SentinelOptions{...})
//	s.WaitMonitoring(1)
//	rdb, _ := regionagent.ParseRedis(s.Spec())
//	p.Kill()
//	s.WaitMaster(r.Addr(), 15*time.Second)
//
// Start the sentinels once the replicas are online: a sentinel learns the
// replicas from the primary's INFO, which it reads at once and then only
// every 10 s.

// SentinelOptions configure a group of sentinels monitoring one master.
type SentinelOptions struct {
	Master          string        // the master's name; "mymaster" if empty
	Count           int           // sentinels; 3 if zero
	Quorum          int           // sentinels that must agree the master is down; 2 if zero
	DownAfter       time.Duration // down-after-milliseconds; 500 ms if zero
	FailoverTimeout time.Duration // failover-timeout; 10 s if zero
}

// Sentinels is a group of sentinel processes owned by a test, killed in
// t.Cleanup.
type Sentinels struct {
	t      testing.TB
	opt    SentinelOptions
	dir    string
	procs  []*sentinelProc
	master string // the monitored master's address at start
}

type sentinelProc struct {
	proc
	id string // sentinel myid
}

// proc is a redis-server or redis-sentinel process the test started.
type proc struct {
	port int
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// kill stops the process with SIGKILL and waits for it; idempotent.
func (p *proc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// StartSentinels starts o.Count sentinels on free loopback ports, all
// monitoring the master at primary (host:port) under o.Master and knowing
// each other from the start (no wait for their hello messages). It waits
// until each answers PING; the group is killed when the test ends.
func StartSentinels(t testing.TB, primary string, o SentinelOptions) *Sentinels {
	t.Helper()
	if o.Master == "" {
		o.Master = "mymaster"
	}
	if o.Count == 0 {
		o.Count = 3
	}
	if o.Quorum == 0 {
		o.Quorum = 2
	}
	if o.DownAfter == 0 {
		o.DownAfter = 500 * time.Millisecond
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	bin, err := binary()
	if err != nil {
		t.Fatalf("redistest: %v (install the redis-server package, or set $REDIS_SERVER)", err)
		return nil
	}
	s := &Sentinels{t: t, opt: o, dir: t.TempDir(), master: primary}
	t.Cleanup(s.Kill)
	var lastErr error
	for try := range startTries {
		if lastErr = s.start(bin, try); lastErr == nil {
			return s
		}
		s.Kill() // a port was taken between the probe and the bind: start the group again
	}
	t.Fatalf("redistest: sentinels did not start after %d tries: %v", startTries, lastErr)
	return nil
}

// start writes one configuration per sentinel and runs them all.
func (s *Sentinels) start(bin string, try int) error {
	host, port, err := net.SplitHostPort(s.master)
	if err != nil {
		return fmt.Errorf("primary %q: %w", s.master, err)
	}
	s.procs = make([]*sentinelProc, s.opt.Count)
	for i := range s.procs {
		p, err := ports.Free()
		if err != nil {
			return err
		}
		id := make([]byte, 20)
		_, _ = rand.Read(id)
		s.procs[i] = &sentinelProc{id: hex.EncodeToString(id),
			proc: proc{port: p, log: filepath.Join(s.dir, fmt.Sprintf("sentinel-%d-%d.log", try, i))}}
	}
	for i, p := range s.procs {
		var b strings.Builder
		fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\nlogfile %s\n", p.port, s.dir, p.log)
		fmt.Fprintf(&b, "sentinel myid %s\n", p.id)
		fmt.Fprintf(&b, "sentinel monitor %s %s %s %d\n", s.opt.Master, host, port, s.opt.Quorum)
		fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", s.opt.Master, s.opt.DownAfter.Milliseconds())
		fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", s.opt.Master, s.opt.FailoverTimeout.Milliseconds())
		fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", s.opt.Master)
		for j, o := range s.procs {
			if j != i {
				fmt.Fprintf(&b, "sentinel known-sentinel %s 127.0.0.1 %d %s\n", s.opt.Master, o.port, o.id)
			}
		}
		conf := filepath.Join(s.dir, fmt.Sprintf("sentinel-%d-%d.conf", try, i)) // Sentinel rewrites it
		if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
			return err
		}
		cmd := exec.Command(bin, conf, "--sentinel")
		cmd.Dir = s.dir
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s --sentinel: %w", bin, err)
		}
		p.cmd, p.done = cmd, make(chan struct{})
		go func(done chan struct{}) {
			_ = cmd.Wait()
			close(done)
		}(p.done)
	}
	for _, p := range s.procs {
		if err := waitReady(p.addr(), p.done); err != nil {
			return fmt.Errorf("sentinel %s: %w (log %s: %s)", p.addr(), err, p.log, tail(p.log))
		}
	}
	return nil
}

// Kill stops every sentinel with SIGKILL and waits for them.
func (s *Sentinels) Kill() {
	for _, p := range s.procs {
		p.kill()
	}
}

// Master is the monitored master's name.
func (s *Sentinels) Master() string { return s.opt.Master }

// Addrs are the sentinels' host:port on 127.0.0.1.
func (s *Sentinels) Addrs() []string {
	out := make([]string, len(s.procs))
	for i, p := range s.procs {
		out[i] = p.addr()
	}
	return out
}

// Spec is the group as a regionagent --redis value:
// sentinel://MASTER@H1:P1,H2:P2,...
func (s *Sentinels) Spec() string {
	return "sentinel://" + s.opt.Master + "@" + strings.Join(s.Addrs(), ",")
}

// Do sends one command to sentinel i; the reply as [Server.Do].
func (s *Sentinels) Do(i int, args ...string) (string, error) {
	return command(s.procs[i].addr(), args...)
}

// MasterAddr is the master's address according to sentinel i
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinels) MasterAddr(i int) (string, error) {
	v, err := s.Do(i, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.opt.Master)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(v, "\n")
	if !ok {
		return "", fmt.Errorf("redistest: sentinel %s: no master address in %q", s.procs[i].addr(), v)
	}
	return net.JoinHostPort(host, port), nil
}

// MasterState is SENTINEL MASTER of sentinel i as field -> value
// (flags, num-slaves, num-other-sentinels, ...).
func (s *Sentinels) MasterState(i int) (map[string]string, error) {
	v, err := s.Do(i, "SENTINEL", "MASTER", s.opt.Master)
	if err != nil {
		return nil, err
	}
	f := strings.Split(v, "\n")
	out := make(map[string]string, len(f)/2)
	for j := 0; j+1 < len(f); j += 2 {
		out[f[j]] = f[j+1]
	}
	return out, nil
}

// WaitMonitoring waits until every sentinel sees the master up, knows
// replicas replicas and every other sentinel: a failover can then be
// agreed on and the replicas promoted. It fails the test after 10 s.
func (s *Sentinels) WaitMonitoring(replicas int) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := range s.procs {
		for {
			m, err := s.MasterState(i)
			if err == nil && m["flags"] == "master" && m["num-slaves"] == strconv.Itoa(replicas) &&
				m["num-other-sentinels"] == strconv.Itoa(len(s.procs)-1) {
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("redistest: sentinel %s does not monitor %s with %d replicas and %d other sentinels after 10s: %v %v\n%s",
					s.procs[i].addr(), s.opt.Master, replicas, len(s.procs)-1, m, err, s.Logs())
			}
			time.Sleep(20 * time.Millisecond) // polling the sentinel's INFO of the master
		}
	}
}

// WaitMaster waits until a quorum of sentinels names addr as the master
// (a failover to addr is over) or timeout passes.
func (s *Sentinels) WaitMaster(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n := 0
		var last []string
		for i := range s.procs {
			a, err := s.MasterAddr(i)
			if err == nil && a == addr {
				n++
			}
			last = append(last, fmt.Sprintf("%s -> %s %v", s.procs[i].addr(), a, err))
		}
		if n >= s.opt.Quorum {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: %d of %d sentinels name %s as master after %v (want %d): %s",
				n, len(s.procs), addr, timeout, s.opt.Quorum, strings.Join(last, "; "))
		}
		time.Sleep(20 * time.Millisecond) // polling the sentinels' view
	}
}

// Logs returns the tail of every sentinel's log, for failure messages.
func (s *Sentinels) Logs() string {
	var b strings.Builder
	for _, p := range s.procs {
		fmt.Fprintf(&b, "--- sentinel %s:\n%s\n", p.addr(), tail(p.log))
	}
	return b.String()
}

// command sends one command to addr; the reply as [Server.Do].
func command(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}
