// Package etcdtest runs real etcd members in-process for tests, through
// etcd's embed package: one member, or a three-member cluster whose members
// can be hard-stopped (a crash, with no leadership hand-over) and restarted.
//
// Members listen on free loopback ports (package ports: below the
// ephemeral range, so a hard-stopped member finds its ports free again when
// restarted) and keep their data in t.TempDir().
// Raft timings are short (10 ms ticks, 100 ms election timeout) unless
// WithDefaultTimings is given, so failover tests run quickly.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
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

// Raft timings. etcd's defaults (WithDefaultTimings, StartProcesses) and
// the fast test timings. A follower that stops hearing its leader starts
// an election after a randomized timeout in [election timeout, 2 x
// election timeout), so losing the raft leader costs at most about twice
// the election timeout.
const (
	DefaultTick            = 100 * time.Millisecond
	DefaultElectionTimeout = time.Second
	FastTick               = 10 * time.Millisecond
	FastElectionTimeout    = 100 * time.Millisecond
)

// Cluster is a set of embedded etcd members. Safe for concurrent use.
type Cluster struct {
	t        testing.TB
	mu       sync.Mutex // protects members
	members  []*member
	token    string
	fast     bool
	maxTxnOp uint
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// Option changes how a cluster is started.
type Option func(*Cluster)

// WithDefaultTimings keeps etcd's default raft timings (100 ms ticks, 1 s
// election timeout) instead of the fast test timings.
func WithDefaultTimings() Option { return func(c *Cluster) { c.fast = false } }

// WithMaxTxnOps sets the server's limit on operations per transaction.
func WithMaxTxnOps(n uint) Option { return func(c *Cluster) { c.maxTxnOp = n } }

// Start starts n members (1 or 3, or any n >= 1) and waits until they serve.
// Everything is stopped in t.Cleanup.
func Start(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{t: t, token: fmt.Sprintf("etcdtest-%d", time.Now().UnixNano()), fast: true, maxTxnOp: 1024}
	for _, o := range opts {
		o(c)
	}
	base := t.TempDir()
	t.Cleanup(c.Close)
	// Ports are free when picked, but another process may bind one first
	// (ports.Free): then every member starts again on new ports.
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		c.members = c.members[:0]
		for i := 0; i < n; i++ {
			c.members = append(c.members, &member{
				name:      fmt.Sprintf("m%d", i),
				dir:       filepath.Join(base, fmt.Sprintf("try%d-m%d", attempt, i)),
				clientURL: url.URL{Scheme: "http", Host: ports.Addr(t)},
				peerURL:   url.URL{Scheme: "http", Host: ports.Addr(t)},
			})
		}
		c.mu.Unlock()
		abort := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = c.start(i, embed.ClusterStateFlagNew, abort)
				if errs[i] != nil {
					once.Do(func() { close(abort) }) // the others would wait for it
				}
			}(i)
		}
		wg.Wait()
		failed, inUse := -1, false
		for i, err := range errs {
			if err != nil && !errors.Is(err, errAborted) && failed < 0 {
				failed, inUse = i, errors.Is(err, syscall.EADDRINUSE)
			}
		}
		if failed < 0 {
			return c
		}
		c.Close()
		if !inUse || attempt == 2 {
			t.Fatalf("etcdtest: member %d: %v", failed, errs[failed])
		}
	}
}

// errAborted: a member's start was given up because another's failed.
var errAborted = errors.New("etcdtest: start aborted: another member failed")

func (c *Cluster) initialCluster() string {
	parts := make([]string, len(c.members))
	for i, m := range c.members {
		parts[i] = m.name + "=" + m.peerURL.String()
	}
	return strings.Join(parts, ",")
}

func (c *Cluster) start(i int, state string, abort <-chan struct{}) error {
	c.mu.Lock()
	m := c.members[i]
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = c.initialCluster()
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = state
	cfg.LogLevel = "error"
	cfg.MaxTxnOps = c.maxTxnOp
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if c.fast {
		cfg.TickMs, cfg.ElectionMs = uint(FastTick/time.Millisecond), uint(FastElectionTimeout/time.Millisecond)
	}
	c.mu.Unlock()

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return err
	case <-abort:
		e.Close()
		return errAborted
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("not ready after 30s")
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
}

// ElectionTimeout is the members' raft election timeout.
func (c *Cluster) ElectionTimeout() time.Duration {
	if c.fast {
		return FastElectionTimeout
	}
	return DefaultElectionTimeout
}

// Endpoints returns the client URLs of every member, running or not, so a
// client keeps trying a member that comes back.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL.String()
	}
	return eps
}

// Client returns a client of the whole cluster, closed in t.Cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader returns the index of the member that leads raft, or -1.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.members {
		if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
			return i
		}
	}
	return -1
}

// WaitLeader waits until some member leads and returns its index.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		if i := c.Leader(); i >= 0 {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// HardStop stops member i as a crash would: no leadership hand-over.
func (c *Cluster) HardStop(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.HardStop()
	e.Close()
}

// Restart starts a stopped member again on its old data and ports.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.start(i, embed.ClusterStateFlagExisting, nil); err != nil {
		c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
}

// Close stops every member.
func (c *Cluster) Close() {
	for i := range c.members {
		c.HardStop(i)
	}
}
