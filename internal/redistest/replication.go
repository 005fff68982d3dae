package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// Replication helpers: a test builds a primary and a replica from two
// Servers (the replica's link may go through a fault proxy), then fails
// over by hand, as Sentinel would:
//
//	p, r := redistest.Start(t), redistest.Start(t)
//	p.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0")
//	r.ReplicaOf(linkAddr) // p.Addr(), or a proxy in front of it
//	...
//	p.Kill()
//	r.Promote()

// Do sends one command and returns its reply as text: a simple string,
// an integer or a bulk string as is, a nil bulk as "", an array as its
// elements joined by newlines. A Redis error reply is an error.
func (s *Server) Do(args ...string) (string, error) {
	return command(s.Addr(), args...)
}

// MustDo is Do that fails the test on an error.
func (s *Server) MustDo(args ...string) string {
	s.t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("redistest: %s: %v", strings.Join(args, " "), err)
	}
	return v
}

// ReplicaOf makes the server a replica of the primary at addr (host:port;
// a proxy in front of the primary works).
func (s *Server) ReplicaOf(addr string) {
	s.t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		s.t.Fatalf("redistest: replica of %q: %v", addr, err)
	}
	s.MustDo("REPLICAOF", host, port)
}

// Promote makes a replica a primary (REPLICAOF NO ONE): it keeps what it
// had replicated and starts a new replication id, whose
// master_replid2 is the old primary's.
func (s *Server) Promote() {
	s.t.Helper()
	s.MustDo("REPLICAOF", "NO", "ONE")
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("redistest: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redistest: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redistest: bulk length %q", line)
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redistest: array length %q", line)
		}
		parts := make([]string, 0, max(0, n))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}
