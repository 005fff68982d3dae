package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture Go supports.
const userHZ = 100

// proc is one child process: a server the benchmark started.
type proc struct {
	name string
	log  string // its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

// procs are the children of one run; kill ends them all.
type procs struct {
	dir  string
	list []*proc
}

// start runs bin with args, its output in DIR/NAME.log. The child gets
// SIGKILL if this process dies first (Pdeathsig), and sits in its own
// process group so that a Ctrl-C reaches only us: we kill it in order.
func (ps *procs) start(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(ps.dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = ps.dir
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	ps.list = append(ps.list, p)
	return p, nil
}

// kill ends every child (SIGKILL: nothing they hold is kept) and waits.
func (ps *procs) kill() {
	for _, p := range ps.list {
		_ = p.cmd.Process.Kill()
	}
	for _, p := range ps.list {
		<-p.done
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// failed describes a child that did not come up: its error and the end of
// its log.
func (p *proc) failed(err error) error {
	select {
	case <-p.done:
		err = fmt.Errorf("%s exited: %v", p.name, p.cmd.ProcessState)
	default:
	}
	return fmt.Errorf("%w\n--- %s (last lines of %s)\n%s", err, p.name, p.log, tail(p.log, 15))
}

// cpu is the process's utime+stime so far, all threads.
func (p *proc) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime+stime from the text of /proc/PID/stat. The
// command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so the fields are counted from the last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')' after the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want >= 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// waitFor polls ready every 50 ms until it returns nil, p exits, ctx ends
// or timeout passes.
func (p *proc) waitFor(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	for {
		if err = ready(ctx); err == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.failed(err)
		case <-ctx.Done():
			return p.failed(fmt.Errorf("%s not ready within %v: %v", p.name, timeout, err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serving asks addr's gRPC health service whether service is SERVING.
func serving(addr, service string) func(context.Context) error {
	return func(ctx context.Context) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return err
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health of %q: %v", service, resp.Status)
		}
		return nil
	}
}

// tail returns the last n lines of file.
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
