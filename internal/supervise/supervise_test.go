package supervise

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopTakesTheGroup: Stop ends the process and what it started (its
// process group); the log file has the output; a restart appends to it.
func TestStopTakesTheGroup(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start(Spec{Name: "sh", Path: "/bin/sh", Args: []string{"-c", `trap "" TERM; sleep 60 & echo child=$!; wait`}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	var child int
	err = within(t, 10*time.Second, func(context.Context) error {
		for _, l := range strings.Split(p.LogTail(200), "\n") {
			if v, ok := strings.CutPrefix(l, "child="); ok {
				child, _ = strconv.Atoi(v)
				return nil
			}
		}
		return errors.New("no child= line yet")
	})
	if err != nil || child <= 0 {
		t.Fatalf("child pid: %d, %v", child, err)
	}
	p.Stop(200 * time.Millisecond) // both ignore SIGTERM: SIGKILL after the grace
	if p.Running() || !strings.Contains(p.ExitStatus(), "killed") {
		t.Fatalf("after Stop: running %v, status %q", p.Running(), p.ExitStatus())
	}
	if err := within(t, 5*time.Second, func(context.Context) error {
		if syscall.Kill(child, 0) == nil && !zombie(child) {
			return errors.New("the shell's child still runs")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := within(t, 10*time.Second, func(context.Context) error {
		if strings.Count(p.LogTail(1000), "child=") != 2 {
			return errors.New("the second run's line is not in the log")
		}
		return nil
	}); err != nil || p.Starts() != 2 {
		t.Fatalf("starts %d, log %q: %v", p.Starts(), p.LogTail(1000), err)
	}
	p.Kill()
	if p.Running() {
		t.Fatal("running after Kill")
	}
}

func TestStartFails(t *testing.T) {
	if _, err := Start(Spec{Name: "none", Path: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("Start of a missing binary: no error")
	}
}

// TestWaitHTTP: polls until 200; gives up when the process exits or the
// context ends.
func TestWaitHTTP(t *testing.T) {
	ready := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := WaitHTTP(ctx, srv.URL, nil); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("not ready: %v", err)
	}
	exited := make(chan struct{})
	close(exited)
	if err := WaitHTTP(context.Background(), srv.URL, exited); err == nil || !strings.Contains(err.Error(), "process exited") {
		t.Fatalf("exited: %v", err)
	}
	close(ready)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := WaitHTTP(ctx2, srv.URL, nil); err != nil {
		t.Fatal(err)
	}
}

func within(t *testing.T, d time.Duration, check func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return Wait(ctx, nil, check)
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
