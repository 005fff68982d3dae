// Package embedded runs an etcd member inside a leasehold process: a
// single member inside the allocator, so `leasehold allocator` and
// `leasehold dev` need no etcd installed, or one member of a cluster of
// several (`leasehold etcd`, as `leasehold cluster` runs three). For
// production, point the allocator at a 3- or 5-member etcd cluster.
package embedded

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config of the embedded member.
type Config struct {
	Dir        string // data directory; created if missing, reused if present
	ClientAddr string // host:port for clients, e.g. 127.0.0.1:2379
	PeerAddr   string // host:port for raft peers, e.g. 127.0.0.1:2380
	Name       string // member name; default "leasehold"
	MaxTxnOps  uint   // ops per transaction; default 1024

	// A member of a cluster of several (leasehold etcd): every member's
	// NAME=http://PEER-ADDR, comma-separated; default this member alone.
	InitialCluster string
	// ClusterToken tells clusters apart on the same hosts; default etcd's.
	ClusterToken string
	// ClusterState is "new" (the default) while the cluster is formed, or
	// "existing" for a member that joins a running cluster.
	ClusterState string
}

// Etcd is a running embedded member.
type Etcd struct {
	e *embed.Etcd
}

// Start starts the member and waits until it serves (or ctx ends).
func Start(ctx context.Context, c Config) (*Etcd, error) {
	if c.Name == "" {
		c.Name = "leasehold"
	}
	if c.MaxTxnOps == 0 {
		c.MaxTxnOps = 1024
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: data dir: %w", err)
	}
	cu, err := url.Parse("http://" + c.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: client address %q: %w", c.ClientAddr, err)
	}
	pu, err := url.Parse("http://" + c.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: peer address %q: %w", c.PeerAddr, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = c.Name + "=" + pu.String()
	if c.InitialCluster != "" {
		cfg.InitialCluster = c.InitialCluster
	}
	if c.ClusterToken != "" {
		cfg.InitialClusterToken = c.ClusterToken
	}
	if c.ClusterState != "" {
		cfg.ClusterState = c.ClusterState
	}
	cfg.MaxTxnOps = c.MaxTxnOps
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Etcd{e: e}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready after 60s")
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
}

// Endpoint returns the client URL.
func (e *Etcd) Endpoint() string { return e.e.Config().AdvertiseClientUrls[0].String() }

// Err reports a fatal server error.
func (e *Etcd) Err() <-chan error { return e.e.Err() }

// Close stops the member gracefully.
func (e *Etcd) Close() { e.e.Close() }
