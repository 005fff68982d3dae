// Package redistest starts a real redis-server for tests.
//
// Each [Server] is a private redis-server process listening on 127.0.0.1 on a
// free port, with its working directory in t.TempDir() and persistence off
// (--save "" --appendonly no), so every start, and every [Server.Restart],
// begins with an empty data set and an empty script cache. The process is
// killed in t.Cleanup.
//
// redis-server must be on PATH (or named by $REDIS_SERVER). A missing binary
// fails the test with t.Fatalf: CI installs it, and a silent skip would hide
// the missing coverage.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"leasehold/internal/ports"
)

const (
	// startTries bounds how often Start picks a new port after a bind race.
	startTries = 5
	// readyTimeout bounds how long one start waits for PING to answer.
	readyTimeout = 10 * time.Second
)

// errExited reports that redis-server exited before answering PING (most
// often: another process took the port between our probe and its bind).
var errExited = errors.New("redistest: redis-server exited before it was ready")

// Server is one redis-server process owned by a test.
//
// The zero value is not usable; call [Start]. Methods are safe for
// concurrent use, but Kill and Restart are meant to be called from the test
// goroutine.
type Server struct {
	t      testing.TB
	binary string
	dir    string

	mu   sync.Mutex // protects port, cmd, done, gen
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	gen  int           // number of starts, names the log file
}

// Start launches redis-server on a free loopback port and waits until it
// answers PING. It retries with a new port when the bind races another
// process. The server is killed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatalf("redistest: %v (install the redis-server package, e.g. apt-get install redis-server, or set $REDIS_SERVER)", err)
		return nil
	}
	s := &Server{t: t, binary: bin, dir: t.TempDir()}
	t.Cleanup(s.Kill)

	var lastErr error
	for range startTries {
		port, err := ports.Free()
		if err != nil {
			t.Fatalf("redistest: no free port: %v", err)
			return nil
		}
		if lastErr = s.start(port); lastErr == nil {
			return s
		}
	}
	t.Fatalf("redistest: redis-server did not start after %d tries: %v", startTries, lastErr)
	return nil
}

// Addr returns the server's host:port on 127.0.0.1. It stays the same across
// Restart.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Kill stops the server with SIGKILL, as a crash would, and waits for the
// process to exit. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart kills the server if it is running and starts a new one on the same
// port with empty state (no data, no scripts). It fails the test if the port
// cannot be bound again within a few tries.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	var err error
	for i := range startTries {
		if err = s.start(port); err == nil {
			return
		}
		time.Sleep(time.Duration(i+1) * 50 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart on port %d failed: %v", port, err)
}

// start runs one redis-server on port and waits until it answers PING.
func (s *Server) start(port int) error {
	s.mu.Lock()
	s.gen++
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.gen))
	s.mu.Unlock()

	cmd := exec.Command(s.binary,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", logPath,
		"--databases", "1",
	)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.binary, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitReady(addr, done); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%w (log %s: %s)", err, logPath, tail(logPath))
	}
	s.mu.Lock()
	s.port, s.cmd, s.done = port, cmd, done
	s.mu.Unlock()
	return nil
}

// waitReady polls addr with PING until it answers +PONG, the process exits
// (done closes) or readyTimeout passes.
func waitReady(addr string, done <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errExited
		default:
		}
		if err = Ping(addr); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("redistest: no PONG from %s within %v: %v", addr, readyTimeout, err)
}

// Ping sends one inline PING to addr and expects +PONG (a second at most).
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// binary finds redis-server: $REDIS_SERVER, then PATH, then /usr/bin.
func binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return exec.LookPath(p)
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	const fallback = "/usr/bin/redis-server"
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", errors.New("redis-server not found on PATH or at /usr/bin/redis-server")
}

// tail returns the last lines of a log file, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}
