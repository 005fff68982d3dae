package faulttest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FallbackModeMetric is the agent's gauge of the fail mode in force per
// limit (absent while the agent runs on leases).
const FallbackModeMetric = "leasehold_agent_fallback_mode"

// ScrapeMetric reads one sample of an agent's (or allocator's) /metrics at
// httpAddr: the metric name whose labels include every label of match
// (e.g. `limit="tenant/x"`). ok is false when no such sample is exported.
func ScrapeMetric(ctx context.Context, httpAddr, name string, match ...string) (v float64, ok bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		if !strings.HasPrefix(rest, " ") {
			continue // another metric whose name starts with name
		}
		all := true
		for _, m := range match {
			if !strings.Contains(","+labels+",", ","+m+",") {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %v", line, err)
		}
		return f, true, nil
	}
	return 0, false, sc.Err()
}

// ModeSample is one change of the fail mode an agent exports for a limit:
// Kind is the gauge's value (a pb.FallbackKind: 1 closed, 2 local, 3
// open), 0 while the gauge is absent, -1 while /metrics cannot be read.
type ModeSample struct {
	At   time.Time
	Kind int
}

// ModeWatch polls an agent's fallback-mode gauge for one limit and keeps
// every change.
type ModeWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex // protects changes
	changes []ModeSample
}

// WatchMode polls httpAddr's /metrics every `every` for the fallback mode
// of limit, for at most d (or until Stop, or the end of the test).
func WatchMode(t testing.TB, httpAddr, limit string, every, d time.Duration) *ModeWatch {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	w := &ModeWatch{cancel: cancel, done: make(chan struct{})}
	go w.run(ctx, httpAddr, limit, every)
	t.Cleanup(w.Stop)
	return w
}

func (w *ModeWatch) run(ctx context.Context, addr, limit string, every time.Duration) {
	defer close(w.done)
	t := time.NewTicker(every)
	defer t.Stop()
	last := -2
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		v, ok, err := ScrapeMetric(sctx, addr, FallbackModeMetric, `limit="`+limit+`"`)
		cancel()
		if ctx.Err() != nil {
			return
		}
		kind := int(v)
		switch {
		case err != nil:
			kind = -1
		case !ok:
			kind = 0
		}
		if kind != last {
			last = kind
			w.mu.Lock()
			w.changes = append(w.changes, ModeSample{At: time.Now(), Kind: kind})
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stop ends the polling and waits for it.
func (w *ModeWatch) Stop() {
	w.cancel()
	<-w.done
}

// Changes returns the changes seen so far, oldest first (the first sample
// is the value at the start).
func (w *ModeWatch) Changes() []ModeSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ModeSample(nil), w.changes...)
}

// At returns the kind exported at instant t (-2 before the first sample).
func (w *ModeWatch) At(t time.Time) int {
	kind := -2
	for _, c := range w.Changes() {
		if c.At.After(t) {
			break
		}
		kind = c.Kind
	}
	return kind
}

// Spans returns the time spent in each kind within [from, to).
func (w *ModeWatch) Spans(from, to time.Time) map[int]time.Duration {
	out := map[int]time.Duration{}
	cs := w.Changes()
	for i, c := range cs {
		end := to
		if i+1 < len(cs) {
			end = cs[i+1].At
		}
		s, e := c.At, end
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			out[c.Kind] += e.Sub(s)
		}
	}
	return out
}

// FirstAfter returns the first instant at or after t at which the
// exported kind satisfies pred: t itself if the kind in force at t does,
// else the first change to such a kind (the zero time if none).
func (w *ModeWatch) FirstAfter(t time.Time, pred func(kind int) bool) time.Time {
	cur := w.At(t)
	if cur != -2 && pred(cur) {
		return t
	}
	for _, c := range w.Changes() {
		if !c.At.Before(t) && pred(c.Kind) {
			return c.At
		}
	}
	return time.Time{}
}
