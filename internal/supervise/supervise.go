// Package supervise runs child processes for `leasehold cluster` and the
// tests that start real processes: each child runs in a process group of
// its own (a Ctrl-C at the terminal reaches the supervisor only, which
// stops its children in order) and is killed by the kernel when the
// supervisor dies (Pdeathsig), so no child outlives it, whatever ends it.
// It also waits until a child serves: gRPC health or an HTTP GET.
//
// A Process is safe for concurrent use.
package supervise

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec says how to start a process.
type Spec struct {
	Name string   // in logs, e.g. "agent-eu-1"
	Path string   // the executable
	Args []string // its arguments, without argv[0]
	Env  []string // added to the supervisor's environment
	// Log is a file the process's stdout and stderr are appended to; if
	// empty, Output is used (nil: discarded).
	Log    string
	Output io.Writer
}

// Process is a supervised child process: started by Start, possibly
// started again on the same Spec by Restart.
type Process struct {
	spec Spec

	mu     sync.Mutex // protects cmd, done, err, starts, log
	cmd    *exec.Cmd
	done   chan struct{} // closed when the current run has exited
	err    error         // the current run's exit status, once done
	starts int
	log    *os.File // the current run's log file (nil: Output)
}

// Start starts the process described by s.
func Start(s Spec) (*Process, error) {
	p := &Process{spec: s}
	if err := p.start(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	// Setpgid: a terminal's SIGINT goes to the foreground group, the
	// supervisor's, not to the children, which the supervisor stops in
	// order. Pdeathsig: if the supervisor dies (even by SIGKILL), the
	// kernel kills the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var log *os.File
	if p.spec.Log != "" {
		f, err := os.OpenFile(p.spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("%s: log: %w", p.spec.Name, err)
		}
		log = f
		cmd.Stdout, cmd.Stderr = f, f
	} else if p.spec.Output != nil {
		cmd.Stdout, cmd.Stderr = p.spec.Output, p.spec.Output
	}
	if err := cmd.Start(); err != nil {
		if log != nil {
			log.Close()
		}
		return fmt.Errorf("%s: start %s: %w", p.spec.Name, p.spec.Path, err)
	}
	p.cmd, p.log = cmd, log
	p.starts++
	done := make(chan struct{})
	p.done, p.err = done, nil
	go func() {
		err := cmd.Wait()
		if log != nil {
			log.Close()
		}
		p.mu.Lock()
		if p.cmd == cmd {
			p.err = err
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Name is the Spec's name.
func (p *Process) Name() string { return p.spec.Name }

// Log is the Spec's log file ("" when it has none).
func (p *Process) Log() string { return p.spec.Log }

// Args are the Spec's arguments.
func (p *Process) Args() []string { return append([]string(nil), p.spec.Args...) }

// Pid is the process id of the current run.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Starts is how many times the process was started.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Exited is closed when the current run exits.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Running reports whether the current run has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.Exited():
		return false
	default:
		return true
	}
}

// ExitErr is how the current run ended (nil: exit status 0, or still
// running).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// ExitStatus describes how the current run ended, e.g. "exit status 1" or
// "signal: killed".
func (p *Process) ExitStatus() string {
	if p.Running() {
		return "running"
	}
	if err := p.ExitErr(); err != nil {
		return err.Error()
	}
	return "exit status 0"
}

// Restart starts the process again on its Spec once its current run has
// exited; it does nothing to a running process.
func (p *Process) Restart() error {
	if p.Running() {
		return nil
	}
	return p.start()
}

// Signal sends sig to the process's group: the process and anything it
// started.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	if !p.Running() {
		return nil
	}
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Kill sends SIGKILL, as a crash would, and waits until the process has
// exited.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.Exited()
}

// Stop sends SIGTERM and waits until the process exits; after grace it
// sends SIGKILL. Whatever the process left in its group is killed too.
func (p *Process) Stop(grace time.Duration) {
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Exited():
	case <-t.C:
		_ = p.Signal(syscall.SIGKILL)
		<-p.Exited()
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // stragglers in its group, if any
}

// LogTail is the last n bytes of the process's log file, trimmed to whole
// lines ("" when it has none or it cannot be read).
func (p *Process) LogTail(n int64) string {
	if p.spec.Log == "" {
		return ""
	}
	f, err := os.Open(p.spec.Log)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	s := string(b)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.TrimRight(s, "\n")
}
