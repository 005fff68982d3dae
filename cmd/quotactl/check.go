package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
)

const (
	// defaultAgent is where a region agent listens by default.
	defaultAgent = "127.0.0.1:7410"
	// checkMaxRun caps every check run, whatever --count and --rate say.
	checkMaxRun = time.Hour
	// checkMaxConcurrency bounds --workers.
	checkMaxConcurrency = 1024
	// checkDurationCount is the default --count when --duration is given.
	checkDurationCount = 1_000_000
)

var checkCmd = &command{
	name:    "check",
	args:    "--limit ID [--agent ADDR] [--cost C] [--count N] [--workers K] [--duration D] [--rate R]",
	summary: "send checks to a region agent and summarise its answers per window",
	detail: `check calls leasehold.v1.RegionAgent/Check on one agent, from K workers at
once, until N calls were made or D has passed, whichever comes first (never
longer than 1h). Without --duration it makes N calls (default 1); with
--duration, N defaults to 1000000. --rate paces the calls over all workers.
Each call has its own deadline, --timeout.

It prints totals (admitted, denied by reason, fallback admits, errors by
gRPC code), the achieved rate, latency percentiles and a per-window table.
Each answer is counted in the window that ends at the multiple of W nearest
to its arrival plus reset_after, so windows start at multiples of W since
the Unix epoch. Denials are results: the exit code is 0 when the run
completes. Until the first answer, any error ends the run (exit 1).`,
	flags: func(f *flagSet) action {
		o := checkOpts{agent: defaultAgent, cost: 1, concurrency: 1}
		f.value("agent", "`ADDR`: host:port of the region agent (default "+defaultAgent+")", func(s string) error {
			if err := checkAddr(s); err != nil {
				return err
			}
			o.agent = s
			return nil
		})
		f.value("limit", "`ID`: the limit to check, e.g. tenant/atlas (required)", func(s string) error {
			if s == "" {
				return errors.New("want a limit id")
			}
			o.limit = s
			return nil
		})
		f.tokensVar(&o.cost, "cost", "`C`: tokens each call asks for, >= 1 (default 1)", 1)
		f.value("count", "`N`: calls to make in total, >= 1 (default 1, or 1000000 with --duration)", func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 1 {
				return errors.New("want a whole number, 1 or more")
			}
			o.count = n
			return nil
		})
		workers := func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 1 || n > checkMaxConcurrency {
				return fmt.Errorf("want a whole number from 1 to %d", checkMaxConcurrency)
			}
			o.concurrency = int(n)
			return nil
		}
		f.value("workers", "`K`: workers calling at once, 1-1024 (default 1)", workers)
		// The name it had before concurrency limits (limits set
		// --concurrency N) existed: kept so that scripts go on working.
		f.value("concurrency", "`K`: the former name of --workers", workers)
		f.value("duration", "`D`: stop after D, at most 1h, e.g. 30s (default: when N calls are done, at most 1h)", func(s string) error {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > checkMaxRun {
				return errors.New("want a positive duration with a unit, at most 1h, such as 500ms or 30s")
			}
			o.duration = d
			return nil
		})
		f.value("rate", "`R`: calls per second over all workers; 0 means as fast as possible (default 0)", func(s string) error {
			r, err := strconv.ParseFloat(s, 64)
			if err != nil || r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
				return errors.New("want a number of calls per second, 0 or more")
			}
			o.rate = r
			return nil
		})
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if err := f.require("limit"); err != nil {
				return err
			}
			if o.count == 0 {
				o.count = 1
				if o.duration > 0 {
					o.count = checkDurationCount
				}
			}
			if o.duration == 0 {
				o.duration = checkMaxRun
			}
			o.timeout = e.timeout
			return e.check(ctx, o)
		}
	},
}

// checkOpts is one check run's settings, validated.
type checkOpts struct {
	agent, limit string
	cost, count  int64
	concurrency  int
	duration     time.Duration // always set: --duration or the 1h cap
	rate         float64       // calls/s over all workers; 0: unpaced
	timeout      time.Duration // each call
}

// Why a run stopped.
const (
	stopCount       = "count"
	stopDuration    = "duration"
	stopInterrupted = "interrupted"
	stopError       = "error"
)

// checkRun is the state the workers share.
type checkRun struct {
	checkOpts
	client   pb.RegionAgentClient
	parent   context.Context // the caller's: Ctrl-C cancels calls in flight
	stopCtx  context.Context // done when no new call may start
	cancel   context.CancelFunc
	start    time.Time
	idPrefix string
	// noClientCert: TLS without a client certificate (an agent that
	// verifies callers drops such connections).
	noClientCert bool

	next     atomic.Int64 // index of the next call to claim
	started  atomic.Int64 // calls made
	answered atomic.Int64 // calls that got a CheckResponse

	mu       sync.Mutex
	tally    *tally // every call's outcome
	stopErr  error  // the error that stopped the run early, if any
	firstErr error  // the first error of any call
	reason   string // why the run stopped, set when it has
}

func (e *env) check(ctx context.Context, o checkOpts) error {
	// The agent gets the TLS settings, never the admin token.
	opts, err := e.sec.dialOptions(false)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(o.agent, opts...)
	if err != nil {
		return fmt.Errorf("agent address %q: %v", o.agent, err)
	}
	defer conn.Close()

	r := &checkRun{
		checkOpts:    o,
		client:       pb.NewRegionAgentClient(conn),
		parent:       ctx,
		start:        time.Now(),
		noClientCert: e.sec.on() && e.sec.cert == "",
		// Unique per call: a random run id and the call's index.
		idPrefix: "quotactl-check-" + rand.Text() + "-",
		tally:    newTally(),
	}
	r.stopCtx, r.cancel = context.WithDeadline(ctx, r.start.Add(o.duration))
	defer r.cancel()

	var wg sync.WaitGroup
	for range min(int64(o.concurrency), o.count) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker()
		}()
	}
	wg.Wait()
	elapsed := time.Since(r.start)
	r.reason = r.stopReason()

	total := r.tally
	if total.answered == 0 {
		return r.failure(total)
	}
	if err := e.printCheck(r, total, elapsed); err != nil {
		return err
	}
	if r.reason == stopError {
		return fmt.Errorf("%s; stopped after %d calls", r.describe(r.stopErr), total.calls)
	}
	return nil
}

// worker makes calls until the run stops. A panic becomes an error that
// stops the run, never a crash.
func (r *checkRun) worker() {
	defer func() {
		if p := recover(); p != nil {
			r.stop(fmt.Errorf("internal error: %v", p))
		}
	}()
	for r.stopCtx.Err() == nil {
		i := r.next.Add(1) - 1
		if i >= r.count || !r.pace(i) {
			return
		}
		r.started.Add(1)
		r.call(i)
	}
}

// pace waits until call i is due (--rate): call i is due i/R seconds after
// the start, over all workers. It reports false when the run stopped first.
func (r *checkRun) pace(i int64) bool {
	if r.rate == 0 {
		return true
	}
	off := float64(i) / r.rate * float64(time.Second)
	if off >= float64(r.duration) {
		// Due after the end: wait for the end, so the run lasts D.
		<-r.stopCtx.Done()
		return false
	}
	wait := time.Until(r.start.Add(time.Duration(off)))
	if wait <= 0 {
		return true
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-r.stopCtx.Done():
		return false
	}
}

// call makes call i and counts its outcome. A call started before the
// end of the run finishes (within --timeout) even if the run ends meanwhile,
// so the agent's count and ours agree; Ctrl-C cancels it.
func (r *checkRun) call(i int64) {
	ctx, cancel := context.WithTimeout(r.parent, r.timeout)
	defer cancel()
	req := &pb.CheckRequest{LimitId: r.limit, Cost: r.cost, RequestId: r.idPrefix + strconv.FormatInt(i, 10)}
	sent := time.Now()
	resp, err := r.client.Check(ctx, req)
	arrived := time.Now()
	if err != nil {
		code := status.Code(err)
		r.mu.Lock()
		r.tally.error(code)
		if r.firstErr == nil {
			r.firstErr = err
		}
		r.mu.Unlock()
		if r.parent.Err() != nil {
			return // interrupted: not the agent's fault
		}
		if r.answered.Load() == 0 || permanent(code) {
			r.stop(err)
		}
		return
	}
	r.answered.Add(1)
	r.mu.Lock()
	r.tally.answer(resp, r.cost, arrived, arrived.Sub(sent))
	r.mu.Unlock()
}

// permanent codes end the run even after answers: repeating the call would
// only repeat the refusal.
func permanent(c codes.Code) bool {
	switch c {
	case codes.NotFound, codes.InvalidArgument, codes.Unimplemented,
		codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
		return true
	}
	return false
}

// stop ends the run because of err: no new call starts. The first error
// wins.
func (r *checkRun) stop(err error) {
	r.mu.Lock()
	if r.stopErr == nil {
		r.stopErr = err
	}
	r.mu.Unlock()
	r.cancel()
}

// stopReason says why the run ended, once every worker has returned.
func (r *checkRun) stopReason() string {
	switch {
	case r.stopErr != nil:
		return stopError
	case r.parent.Err() != nil:
		return stopInterrupted // even if every call had started: some were cut off
	case r.started.Load() >= r.count:
		return stopCount
	}
	return stopDuration
}

// failure is the error of a run in which no call was answered.
func (r *checkRun) failure(t *tally) error {
	if r.firstErr == nil {
		return errors.New("interrupted before any call completed")
	}
	msg := r.describe(r.firstErr).Error()
	if t.calls > 1 {
		msg += fmt.Sprintf(" (all %d calls failed)", t.calls)
	}
	return errors.New(msg)
}

// describe words a Check error for the user, in one line.
func (r *checkRun) describe(err error) error {
	where := "agent " + r.agent
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Canceled:
		if r.parent.Err() != nil {
			return fmt.Errorf("interrupted: %v", r.parent.Err())
		}
	case codes.NotFound:
		return fmt.Errorf("limit %q is unknown to %s (NOT_FOUND): %s", r.limit, where, msg)
	case codes.InvalidArgument:
		return fmt.Errorf("%s refused the check (INVALID_ARGUMENT): %s", where, msg)
	case codes.Unavailable:
		if r.noClientCert {
			return fmt.Errorf("%s unavailable: %s (an agent with a client CA requires a client certificate: --tls-cert, --tls-key)", where, msg)
		}
		return fmt.Errorf("%s unavailable: %s", where, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: no answer within --timeout %v: %s", where, r.timeout, msg)
	case codes.Unimplemented:
		return fmt.Errorf("%s does not serve leasehold.v1.RegionAgent/Check (not a region agent?): %s", where, msg)
	}
	return fmt.Errorf("%s: %s: %s", where, st.Code(), msg)
}
