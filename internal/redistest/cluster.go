package redistest

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"leasehold/internal/ports"
)

// Cluster is a Redis Cluster of masters without replicas, built by a test
// out of redis-server processes (--cluster-enabled yes) on free loopback
// ports: each master serves an equal range of the 16384 slots. Every node
// has its own cluster bus port (--cluster-port), also free, so nothing
// assumes the bus at port + 10000. Persistence is off and every node is
// killed in t.Cleanup.
//
//	c := redistest.StartCluster(t, 3)
//	rdb, _ := regionagent.ParseRedis(c.Spec()) // a *redis.ClusterClient
//
// The zero value is not usable; call StartCluster.
type Cluster struct {
	nodes []*clusterNode
}

type clusterNode struct {
	proc
	bus int
}

// clusterReady bounds how long StartCluster waits for cluster_state:ok.
const clusterReady = 20 * time.Second

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// StartCluster starts masters (>= 1) cluster-enabled redis-servers, gives
// each an equal range of slots (CLUSTER ADDSLOTSRANGE) and a config epoch
// of its own, joins them (CLUSTER MEET with the bus port), and waits until
// every node reports cluster_state:ok, all slots assigned and every node
// known. It fails the test if the cluster does not form.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster(%d): want at least one master", masters)
		return nil
	}
	bin, err := binary()
	if err != nil {
		t.Fatalf("redistest: %v (install the redis-server package, e.g. apt-get install redis-server, or set $REDIS_SERVER)", err)
		return nil
	}
	dir := t.TempDir()
	c := &Cluster{}
	t.Cleanup(c.kill)
	for i := range masters {
		n, err := startNode(bin, dir, i)
		if err != nil {
			t.Fatalf("redistest: cluster node %d: %v", i, err)
			return nil
		}
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		from, to := i*slots/masters, (i+1)*slots/masters-1
		if _, err := command(n.addr(), "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to)); err != nil {
			t.Fatalf("redistest: cluster node %d: ADDSLOTSRANGE %d %d: %v", i, from, to, err)
		}
		if _, err := command(n.addr(), "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			t.Fatalf("redistest: cluster node %d: SET-CONFIG-EPOCH: %v", i, err)
		}
	}
	for i, n := range c.nodes[1:] {
		if _, err := command(c.nodes[0].addr(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.port), strconv.Itoa(n.bus)); err != nil {
			t.Fatalf("redistest: cluster node %d: MEET: %v", i+1, err)
		}
	}
	if err := c.waitOK(); err != nil {
		t.Fatalf("redistest: %v (node 0 log: %s)", err, tail(c.nodes[0].log))
	}
	return c
}

// startNode starts one cluster-enabled redis-server on free ports,
// retrying with new ports when a bind races another process.
func startNode(bin, dir string, i int) (*clusterNode, error) {
	var lastErr error
	for try := range startTries {
		port, err := ports.Free()
		if err != nil {
			return nil, err
		}
		bus, err := ports.Free()
		if err != nil {
			return nil, err
		}
		if bus == port {
			continue
		}
		n := &clusterNode{proc: proc{port: port, log: filepath.Join(dir, fmt.Sprintf("node-%d-%d.log", i, try))}, bus: bus}
		n.cmd = exec.Command(bin,
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d-%d.conf", i, try)),
			"--cluster-node-timeout", "5000",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
			"--daemonize", "no",
			"--logfile", n.log,
		)
		n.cmd.Dir = dir
		if err := n.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		n.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) {
			_ = cmd.Wait()
			close(done)
		}(n.cmd, n.done)
		if lastErr = waitReady(n.addr(), n.done); lastErr == nil {
			return n, nil
		}
		n.kill()
		lastErr = fmt.Errorf("%w (log: %s)", lastErr, tail(n.log))
	}
	return nil, fmt.Errorf("did not start after %d tries: %v", startTries, lastErr)
}

// waitOK polls CLUSTER INFO on every node until each says the cluster is
// ok, every slot assigned, and every node known.
func (c *Cluster) waitOK() error {
	deadline := time.Now().Add(clusterReady)
	want := []string{"cluster_state:ok", "cluster_slots_assigned:" + strconv.Itoa(slots),
		"cluster_known_nodes:" + strconv.Itoa(len(c.nodes))}
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, n := range c.nodes {
			info, err := command(n.addr(), "CLUSTER", "INFO")
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			for _, w := range want {
				if !strings.Contains(info, w+"\r\n") {
					ok, last = false, n.addr()+": "+strings.ReplaceAll(strings.TrimSpace(info), "\r\n", " ")
					break
				}
			}
			if !ok {
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // polling the gossip
	}
	return fmt.Errorf("cluster not ok within %v: %s", clusterReady, last)
}

// Addrs are the masters' host:port, in slot order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// Spec is the agent's --redis value for the cluster: cluster://H:P,...
func (c *Cluster) Spec() string { return "cluster://" + strings.Join(c.Addrs(), ",") }

func (c *Cluster) kill() {
	for _, n := range c.nodes {
		n.kill()
	}
}
