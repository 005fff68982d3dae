package explore

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"leasehold/regionagent/core"
)

// Scope bounds an exploration: the model's size and how many events of
// each kind a trace may contain. Every interleaving within it is explored.
type Scope struct {
	Name     string
	Tokens   int64  // G, at most 5
	Replicas [2]int // agent replicas in eu and us: 1 or 2
	Depth    int    // events per trace
	Checks   int    // Checks in all
	// Network faults: copies of requests or answers lost, requests sent
	// again, calls given up.
	Lose, Retry, Fail int
	// LeaderChanges also makes every commit an event of its own, so a
	// leader change can fall between a decision and its commit.
	LeaderChanges int
	RedisOutages  int // Redis down (and, at any later step, up again)
	Rollbacks     int // Redis failovers that lose unreplicated writes
	LimitChanges  int // G up or down by one
	Restarts      int // agent replicas killed and started again
	Fallback      core.Fallback
	// MaxStates, if set, stops the exploration once that many distinct
	// states are reached (Result.Truncated): a bound on a large scope's
	// time and memory.
	MaxStates int
	// Instants is how many of the next instants an advance may stop at
	// (the next timer, a boundary, deadlines and the millisecond before
	// them); 0 means 3.
	Instants int
}

func (sc *Scope) instants() int {
	if sc.Instants <= 0 {
		return 3
	}
	return sc.Instants
}

func (sc *Scope) validate() error {
	switch {
	case sc.Tokens < 1 || sc.Tokens > 5:
		return fmt.Errorf("explore: scope %s: tokens %d, want 1..5", sc.Name, sc.Tokens)
	case sc.Replicas[0] < 1 || sc.Replicas[0] > 2 || sc.Replicas[1] < 1 || sc.Replicas[1] > 2:
		return fmt.Errorf("explore: scope %s: replicas %v, want 1 or 2 per region", sc.Name, sc.Replicas)
	case sc.Depth < 1 || sc.Depth > 40:
		return fmt.Errorf("explore: scope %s: depth %d, want 1..40", sc.Name, sc.Depth)
	}
	return nil
}

// Result is what an exploration found.
type Result struct {
	Scope       string
	States      int // distinct states reached (by digest)
	Transitions int // events applied
	MaxDepth    int // the longest trace explored
	Elapsed     time.Duration
	// Truncated: MaxStates was reached; the depth MaxDepth was not
	// explored in full.
	Truncated bool
	// Violation is the first invariant broken, nil if none; Trace is the
	// shortest sequence of events that leads to it (breadth first).
	Violation *Violation
	Trace     []Event
}

// Replayable is the violation as a test case a developer can paste.
func (r *Result) Replayable() string {
	if r.Violation == nil {
		return ""
	}
	return fmt.Sprintf("// %s\nv, err := explore.Replay(explore.%sScope, %q)", r.Violation, r.Scope, FormatTrace(r.Trace))
}

// Replay runs a trace in a scope and returns the violation it leads to
// (nil if none), or an error if an event of it is not possible.
func Replay(sc Scope, trace string) (*Violation, error) {
	tr, err := ParseTrace(trace)
	if err != nil {
		return nil, err
	}
	if err := sc.validate(); err != nil {
		return nil, err
	}
	w, err := run(&sc, tr, true)
	if err != nil {
		return nil, err
	}
	return w.bad, nil
}

// run builds the initial state and applies a trace. The invariants of
// each step are checked as it happens; those of a whole state after the
// last event only, or after every event when all is set (Replay: the
// explorer checked the states of the prefix when it reached them).
func run(sc *Scope, tr []Event, all bool) (*world, error) {
	w := newWorld(sc)
	for i, e := range tr {
		if err := w.apply(e); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if w.bad == nil && (all || i == len(tr)-1) {
			w.verify()
		}
		if w.bad != nil {
			return w, nil
		}
	}
	return w, nil
}

// Explore enumerates every trace of the scope breadth first, each state
// once (by digest), checking the invariants in every state reached. It
// stops at the first violation, whose trace is then one of the shortest.
// Each state is rebuilt by replaying its trace from the initial state: the
// real cores have no copy operation, and replay needs none. The states of
// one depth are expanded by GOMAXPROCS workers and merged in frontier
// order, so the result does not depend on how many there are.
func Explore(sc Scope) (Result, error) {
	if err := sc.validate(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	res := Result{Scope: sc.Name}
	w0 := newWorld(&sc)
	w0.verify()
	if w0.bad != nil {
		res.Violation = w0.bad
		return res, nil
	}
	var h hasher
	seen := map[digest]bool{h.digest(w0): true}
	res.States = 1
	frontier := [][]Event{nil}
	workers := runtime.GOMAXPROCS(0)
	for depth := 1; depth <= sc.Depth && len(frontier) > 0 && !res.Truncated; depth++ {
		var next [][]Event
		// The frontier is expanded a slice at a time, so that MaxStates
		// stops an exploration within one slice of the bound.
		for lo := 0; lo < len(frontier) && !res.Truncated; lo += expandSlice {
			part := frontier[lo:min(lo+expandSlice, len(frontier))]
			out := make([][]child, len(part))
			errs := make([]error, workers)
			var wg sync.WaitGroup
			for k := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var h hasher
					for j := k; j < len(part); j += workers {
						out[j], errs[k] = expand(&sc, part[j], &h)
						if errs[k] != nil {
							return
						}
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return res, err
			}
			for _, cs := range out {
				for _, c := range cs {
					res.Transitions++
					res.MaxDepth = depth
					if c.bad != nil {
						res.Violation, res.Trace = c.bad, c.trace
						res.Elapsed = time.Since(start)
						return res, nil
					}
					if seen[c.d] {
						continue
					}
					seen[c.d] = true
					res.States++
					next = append(next, c.trace)
				}
			}
			res.Truncated = sc.MaxStates > 0 && res.States >= sc.MaxStates
		}
		frontier = next
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// expandSlice is how many states of a frontier are expanded between two
// looks at MaxStates.
const expandSlice = 4096

// child is one event's outcome from a state: the trace that reaches it,
// its digest, and the violation it shows, if any.
type child struct {
	trace []Event
	d     digest
	bad   *Violation
}

// expand replays trace tr and returns the state's children in event order.
func expand(sc *Scope, tr []Event, h *hasher) ([]child, error) {
	w, err := run(sc, tr, false)
	if err != nil {
		return nil, fmt.Errorf("explore: replaying %q: %w", FormatTrace(tr), err)
	}
	evs := w.events()
	out := make([]child, 0, len(evs))
	for _, e := range evs {
		c := child{trace: append(tr[:len(tr):len(tr)], e)}
		cw, err := run(sc, c.trace, false)
		if err != nil {
			return nil, fmt.Errorf("explore: replaying %q: %w", FormatTrace(c.trace), err)
		}
		if cw.bad != nil {
			c.bad = cw.bad
			out = append(out, c)
			return out, nil // a violation ends the exploration at this state's turn
		}
		cw.nextTimer() // drops stale timers, so equal states digest alike
		c.d = h.digest(cw)
		out = append(out, c)
	}
	return out, nil
}
