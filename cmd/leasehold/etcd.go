package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"leasehold/allocator/embedded"
)

// etcdConfig is everything `leasehold etcd` takes.
type etcdConfig struct {
	name, dataDir        string
	clientAddr, peerAddr string
	initialCluster       string
	clusterState, token  string
	maxTxnOps            uint
	log                  logFlags
}

func (c *etcdConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.name, "name", "leasehold", "this member's name, unique in the cluster")
	fs.StringVar(&c.dataDir, "data-dir", "leasehold-data/etcd", "the member's data directory (reused across runs)")
	fs.StringVar(&c.clientAddr, "client-addr", "127.0.0.1:2379", "client address (HOST:PORT): what allocators' -etcd-endpoints name, and /health")
	fs.StringVar(&c.peerAddr, "peer-addr", "127.0.0.1:2380", "peer address (HOST:PORT) other members reach this one at")
	fs.StringVar(&c.initialCluster, "initial-cluster", "", "every member as NAME=http://PEER-ADDR, comma-separated (default: this member alone)")
	fs.StringVar(&c.clusterState, "initial-cluster-state", "new", "new: form the cluster; existing: join a running one")
	fs.StringVar(&c.token, "initial-cluster-token", "leasehold", "tells clusters on the same hosts apart")
	fs.UintVar(&c.maxTxnOps, "max-txn-ops", 1024, "most operations in one transaction (at least the allocators' -max-txn-ops)")
	c.log.register(fs)
}

func (c *etcdConfig) validate() error {
	if c.name == "" || strings.ContainsAny(c.name, "=, ") {
		return usagef("-name %q: want a name without '=', ',' or spaces", c.name)
	}
	for _, f := range [...]struct{ name, addr string }{{"client-addr", c.clientAddr}, {"peer-addr", c.peerAddr}} {
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			return usagef("-%s %q: want HOST:PORT", f.name, f.addr)
		}
	}
	if c.clusterState != "new" && c.clusterState != "existing" {
		return usagef("-initial-cluster-state %q: want new or existing", c.clusterState)
	}
	if c.maxTxnOps < 1 {
		return usagef("-max-txn-ops must be >= 1")
	}
	if c.initialCluster == "" {
		return nil
	}
	self := false
	for _, m := range strings.Split(c.initialCluster, ",") {
		name, url, ok := strings.Cut(strings.TrimSpace(m), "=")
		if !ok || name == "" || !strings.HasPrefix(url, "http://") {
			return usagef("-initial-cluster: %q: want NAME=http://HOST:PORT", m)
		}
		if name == c.name {
			self = true
			if url != "http://"+c.peerAddr {
				return usagef("-initial-cluster names %s at %s, but -peer-addr is %s", name, url, c.peerAddr)
			}
		}
	}
	if !self {
		return usagef("-initial-cluster does not name this member (-name %s)", c.name)
	}
	return nil
}

// runEtcdCmd runs one etcd member (etcd's own server, embedded) until ctx
// ends: what `leasehold cluster` runs three of, for allocators started with
// -etcd-endpoints. It serves plaintext on loopback-style addresses; a
// production cluster is etcd's own binary with TLS (docs/deploy.md).
func runEtcdCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c etcdConfig
	log, err := setup("etcd", c.register, &c.log, c.validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	e, err := embedded.Start(ctx, embedded.Config{Dir: c.dataDir, ClientAddr: c.clientAddr, PeerAddr: c.peerAddr,
		Name: c.name, MaxTxnOps: c.maxTxnOps, InitialCluster: c.initialCluster, ClusterToken: c.token,
		ClusterState: c.clusterState})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while it waited for the other members
		}
		return err
	}
	defer e.Close()
	log.Info("etcd member serving", "name", c.name, "client", e.Endpoint(), "peer", "http://"+c.peerAddr,
		"data_dir", c.dataDir)
	select {
	case <-ctx.Done():
		log.Info("etcd member stopping", "name", c.name)
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcd member %s: %w", c.name, err)
	}
}
