package redistest

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// do sends one inline command and returns the first reply line.
func do(t *testing.T, addr, cmd string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(line, "$") && !strings.HasPrefix(line, "$-1") {
		line, err = r.ReadString('\n')
	}
	return strings.TrimSpace(line), err
}

func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	addr := s.Addr()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("Addr = %q, want loopback", addr)
	}
	if got, err := do(t, addr, "SET k v"); err != nil || got != "+OK" {
		t.Fatalf("SET = %q, %v", got, err)
	}

	s.Kill()
	if _, err := do(t, addr, "PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Kill() // killing a stopped server does nothing

	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %q, want %q", s.Addr(), addr)
	}
	if got, err := do(t, addr, "GET k"); err != nil || got != "$-1" {
		t.Fatalf("GET after Restart = %q, %v; want empty state ($-1)", got, err)
	}

	s.Restart() // restart while running
	if got, err := do(t, addr, "PING"); err != nil || got != "+PONG" {
		t.Fatalf("PING after second Restart = %q, %v", got, err)
	}
}

func TestParallelServers(t *testing.T) {
	for i := range 3 {
		t.Run(string(rune('a'+i)), func(t *testing.T) {
			t.Parallel()
			s := Start(t)
			if got, err := do(t, s.Addr(), "PING"); err != nil || got != "+PONG" {
				t.Fatalf("PING = %q, %v", got, err)
			}
		})
	}
}

func TestNoPersistence(t *testing.T) {
	s := Start(t)
	for _, kv := range [][2]string{{"save", ""}, {"appendonly", "no"}} {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("CONFIG GET " + kv[0] + "\r\n")); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		var lines []string
		for range 5 { // *2, $len, name, $len, value
			l, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, strings.TrimSpace(l))
		}
		c.Close()
		if lines[4] != kv[1] {
			t.Errorf("CONFIG GET %s = %q, want %q", kv[0], lines[4], kv[1])
		}
	}
}

// fatalRecorder records Fatalf instead of stopping the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestMissingBinaryFails(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	rec := &fatalRecorder{TB: t}
	if s := Start(rec); s != nil {
		t.Fatal("Start returned a server without a binary")
	}
	if !strings.Contains(rec.msg, "redis-server") || !strings.Contains(rec.msg, "install") {
		t.Fatalf("Fatalf message %q does not say what is missing", rec.msg)
	}
}

// TestStartCluster: three masters form one cluster (cluster_size:3 on
// every node); each key is stored by exactly one node (the others answer
// MOVED), and eight keys spread over all three.
func TestStartCluster(t *testing.T) {
	c := StartCluster(t, 3)
	addrs := c.Addrs()
	if len(addrs) != 3 || c.Spec() != "cluster://"+strings.Join(addrs, ",") {
		t.Fatalf("addrs %v, spec %q", addrs, c.Spec())
	}
	owners := map[string]int{}
	for _, key := range []string{"{a}", "{b}", "{c}", "{d}", "{e}", "{f}", "{g}", "{h}"} {
		var served []string
		for _, addr := range addrs {
			if _, err := command(addr, "SET", key, "v"); err == nil {
				served = append(served, addr)
			} else if !strings.Contains(err.Error(), "MOVED") {
				t.Fatalf("SET %s at %s: %v", key, addr, err)
			}
		}
		if len(served) != 1 {
			t.Fatalf("%s stored by %v, want exactly one node", key, served)
		}
		owners[served[0]]++
	}
	if len(owners) != 3 {
		t.Fatalf("8 keys landed on %d nodes, want all 3: %v", len(owners), owners)
	}
	for _, addr := range addrs {
		info, err := command(addr, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_size:3") {
			t.Fatalf("%s: %q %v", addr, info, err)
		}
	}
}
