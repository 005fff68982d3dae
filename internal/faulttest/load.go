package faulttest

import (
	"context"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "leasehold/proto/leasehold/v1"
)

// Mode is what a Check answer said: a reason, or ERROR when the call
// itself failed (agent down, timeout).
type Mode string

// The modes a load records.
const (
	ModeOK          Mode = "OK"
	ModeOverLimit   Mode = "OVER_LIMIT"
	ModeUnavailable Mode = "UNAVAILABLE"
	ModeFallback    Mode = "FALLBACK"
	ModeError       Mode = "ERROR"
)

// Modes lists the modes in report order.
var Modes = []Mode{ModeOK, ModeOverLimit, ModeUnavailable, ModeFallback, ModeError}

// Target is one agent a load drives.
type Target struct {
	Name   string // e.g. "eu-1"; events are recorded under it
	Region string
	Addr   string // the agent's gRPC address
}

// LoadConfig configures StartLoad.
type LoadConfig struct {
	Limit   string
	Window  time.Duration // W of the limit: names windows from reset_after
	Targets []Target
	// Rate is Checks per second per target (default 20), spread over
	// Workers goroutines per target (default 2).
	Rate    float64
	Workers int
	// Cost of each Check (default 1).
	Cost int64
	// Duration bounds the load (required); Stop ends it earlier.
	Duration time.Duration
	// Timeout of one Check (default 2 s).
	Timeout time.Duration
}

// Event is one Check answer the load received.
type Event struct {
	At         time.Time // when the answer arrived
	Target     string
	Region     string
	Mode       Mode
	Window     int64 // window index, from reset_after (-1 on ERROR)
	Cost       int64
	RetryAfter time.Duration
}

// Load drives Checks at a fixed rate and counts what was admitted per
// window and region from the answers it received.
type Load struct {
	cfg    LoadConfig
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*grpc.ClientConn

	mu     sync.Mutex // protects events, rates
	events []Event
	rates  map[string]float64 // per target; changed by SetRate
}

// StartLoad starts the load; it stops after cfg.Duration, on Stop, or when
// the test ends.
func StartLoad(t testing.TB, cfg LoadConfig) *Load {
	t.Helper()
	if cfg.Duration <= 0 || cfg.Window <= 0 || cfg.Limit == "" {
		t.Fatalf("faulttest: LoadConfig needs Limit, Window and Duration")
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 20
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Cost <= 0 {
		cfg.Cost = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	l := &Load{cfg: cfg, cancel: cancel, rates: map[string]float64{}}
	for _, tg := range cfg.Targets {
		l.rates[tg.Name] = cfg.Rate // all set before any worker reads them
	}
	for _, tg := range cfg.Targets {
		conn, err := grpc.NewClient(tg.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			cancel()
			t.Fatalf("faulttest: dial %s: %v", tg.Addr, err)
		}
		l.conns = append(l.conns, conn)
		cl := pb.NewRegionAgentClient(conn)
		for range cfg.Workers {
			l.wg.Add(1)
			go l.worker(ctx, cl, tg)
		}
	}
	t.Cleanup(l.Stop)
	return l
}

// SetRate changes one target's rate (Checks/s; 0 pauses it).
func (l *Load) SetRate(target string, rate float64) {
	l.mu.Lock()
	l.rates[target] = rate
	l.mu.Unlock()
}

func (l *Load) rate(target string) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rates[target]
}

func (l *Load) worker(ctx context.Context, cl pb.RegionAgentClient, tg Target) {
	defer l.wg.Done()
	next := time.Now()
	for {
		r := l.rate(tg.Name) / float64(l.cfg.Workers)
		interval := 100 * time.Millisecond // paused: look again soon
		if r > 0 {
			interval = time.Duration(float64(time.Second) / r)
		}
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d): // the load's pace
			}
		} else {
			next = time.Now() // fell behind (a slow call): do not burst
		}
		if ctx.Err() != nil {
			return
		}
		if r <= 0 {
			continue
		}
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		resp, err := cl.Check(cctx, &pb.CheckRequest{LimitId: l.cfg.Limit, Cost: l.cfg.Cost})
		cancel()
		now := time.Now()
		ev := Event{At: now, Target: tg.Name, Region: tg.Region, Window: -1, Cost: l.cfg.Cost, Mode: ModeError}
		if err != nil {
			// The load ended during the call: not an answer. The call's
			// own deadline (the load's end) may fire before the load's
			// context says so: judge by the clock too.
			if dl, ok := ctx.Deadline(); ctx.Err() != nil || ok && !now.Before(dl) {
				return
			}
		} else {
			ev.Mode = modeOf(resp.Reason)
			// Decided between sent and now: the window is named from the
			// midpoint, so a late answer on a loaded machine moves the
			// estimate of the window's end by half its delay.
			ev.Window = WindowOf(sent.Add(now.Sub(sent)/2), resp.ResetAfter.AsDuration(), l.cfg.Window)
			ev.RetryAfter = resp.RetryAfter.AsDuration()
			if !resp.Allowed {
				ev.Cost = 0
			}
		}
		if ev.Mode == ModeError {
			ev.Cost = 0
		}
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
	}
}

func modeOf(r pb.Reason) Mode {
	switch r {
	case pb.Reason_REASON_OK:
		return ModeOK
	case pb.Reason_REASON_OVER_LIMIT:
		return ModeOverLimit
	case pb.Reason_REASON_UNAVAILABLE:
		return ModeUnavailable
	case pb.Reason_REASON_FALLBACK:
		return ModeFallback
	}
	return ModeError
}

// WindowOf names the window an answer received at now belongs to: the
// window ends reset_after from now, so its index is round((now +
// reset_after) / W) - 1 (as in fallback_e2e_test.go).
func WindowOf(now time.Time, resetAfter, w time.Duration) int64 {
	end := now.Add(resetAfter)
	return int64(math.Round(float64(end.UnixNano())/float64(w))) - 1
}

// Stop ends the load and waits for its goroutines.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// Wait waits until the load's duration is over.
func (l *Load) Wait() { l.wg.Wait() }

// Events returns a copy of the answers received so far, in arrival order
// per worker (sorted by time).
func (l *Load) Events() []Event {
	l.mu.Lock()
	out := append([]Event(nil), l.events...)
	l.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Tally is what a load counted.
type Tally struct {
	// Admitted tokens per window and region (OK and FALLBACK answers).
	Admitted map[int64]map[string]int64
	// Fallback tokens per window and region (FALLBACK answers).
	Fallback map[int64]map[string]int64
	// Answers per mode.
	Answers map[Mode]int64
}

// Count tallies events.
func Count(events []Event) Tally {
	c := Tally{Admitted: map[int64]map[string]int64{}, Fallback: map[int64]map[string]int64{}, Answers: map[Mode]int64{}}
	for _, e := range events {
		c.Answers[e.Mode]++
		if e.Mode != ModeOK && e.Mode != ModeFallback {
			continue
		}
		if c.Admitted[e.Window] == nil {
			c.Admitted[e.Window] = map[string]int64{}
		}
		c.Admitted[e.Window][e.Region] += e.Cost
		if e.Mode == ModeFallback {
			if c.Fallback[e.Window] == nil {
				c.Fallback[e.Window] = map[string]int64{}
			}
			c.Fallback[e.Window][e.Region] += e.Cost
		}
	}
	return c
}

// Total is the tokens admitted in window w, all regions.
func (c Tally) Total(w int64) int64 {
	var n int64
	for _, v := range c.Admitted[w] {
		n += v
	}
	return n
}

// maxGap caps the time one answer accounts for in TimeInModes: a longer
// gap means the target's load was paused.
const maxGap = 2500 * time.Millisecond

// TimeInModes attributes the time between consecutive answers of each
// target to the mode of the earlier answer (at most 2.5 s: a longer gap is
// a paused load), and sums per target. The last answer of a target counts
// until end.
func TimeInModes(events []Event, end time.Time) map[string]map[Mode]time.Duration {
	out := map[string]map[Mode]time.Duration{}
	last := map[string]Event{}
	add := func(e Event, until time.Time) {
		if out[e.Target] == nil {
			out[e.Target] = map[Mode]time.Duration{}
		}
		if d := min(until.Sub(e.At), maxGap); d > 0 {
			out[e.Target][e.Mode] += d
		}
	}
	for _, e := range events {
		if p, ok := last[e.Target]; ok {
			add(p, e.At)
		}
		last[e.Target] = e
	}
	for _, e := range last {
		add(e, end)
	}
	return out
}

// Between returns the events that arrived in [from, to).
func Between(events []Event, from, to time.Time) []Event {
	var out []Event
	for _, e := range events {
		if !e.At.Before(from) && e.At.Before(to) {
			out = append(out, e)
		}
	}
	return out
}
