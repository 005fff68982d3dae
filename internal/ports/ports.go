// Package ports hands tests free loopback TCP ports: for servers a test
// starts in its own process or as child processes (redis-server, embedded
// etcd, leasehold binaries).
//
// The ports lie below the kernel's ephemeral range, so that a server that
// is killed and restarted on its port finds it free again: no port the
// kernel numbers by itself (a client's, or another test's ":0" listener)
// can take it meanwhile.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Free returns a loopback TCP port that is free now and lies below the
// kernel's ephemeral range: no port the kernel numbers by itself (a
// client's, or another test's ":0" listener) can take it while the server
// that owns it is down for a restart. Another process may still bind it
// first (rarely: it must pick the same port); callers that start a server
// on it retry then.
func Free() (int, error) {
	const base = 10000
	if top := ephemeralStart(); top > base+1000 {
		for range 200 {
			p := base + rand.IntN(top-base)
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err == nil {
				l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is Free as a "127.0.0.1:PORT" address, for a test: it fails the
// test when no port is free.
func Addr(t testing.TB) string {
	t.Helper()
	p, err := Free()
	if err != nil {
		t.Fatalf("ports: no free port: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (32768 when it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 1024 {
		return 32768
	}
	return n
}
