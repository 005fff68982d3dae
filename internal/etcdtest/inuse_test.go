package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"syscall"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"

	"leasehold/internal/ports"
)

// TestPortInUseIsRecognised: a member whose port another process holds
// fails with EADDRINUSE, which Start takes as "pick new ports and start
// again" (another process may bind a port ports.Free picked).
func TestPortInUseIsRecognised(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Cluster{t: t, token: "inuse", fast: true, maxTxnOp: 128}
	c.members = []*member{{name: "m0", dir: filepath.Join(t.TempDir(), "m0"),
		clientURL: url.URL{Scheme: "http", Host: l.Addr().String()},
		peerURL:   url.URL{Scheme: "http", Host: ports.Addr(t)}}}
	t.Cleanup(c.Close)
	err = c.start(0, embed.ClusterStateFlagNew, nil)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("start on a held port: %v (%s), want EADDRINUSE", err, fmt.Sprintf("%T", err))
	}
}
