package simulations

import (
	"container/heap"
	"time"
)

// Epoch is true time zero of every simulation: a minute boundary, so that
// windows of whole seconds start at t = 0 on a clock with no offset.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// Engine is a discrete-event scheduler on virtual time. Events run in order
// of (time, sequence): two events at the same instant run in the order they
// were scheduled, so a run is a pure function of its inputs.
//
// The zero value is ready to use. Not safe for concurrent use: a simulation
// runs in one goroutine.
type Engine struct {
	now    time.Duration // true time since Epoch
	seq    uint64
	q      eventQueue
	events uint64 // events run
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return e
}

// Now returns the current true time since Epoch.
func (e *Engine) Now() time.Duration { return e.now }

// At schedules fn at true time at (never before now).
func (e *Engine) At(at time.Duration, fn func()) {
	e.seq++
	heap.Push(&e.q, event{at: max(at, e.now), seq: e.seq, fn: fn})
}

// After schedules fn d after now.
func (e *Engine) After(d time.Duration, fn func()) { e.At(e.now+d, fn) }

// Run runs events until the queue is empty or the next event is after
// until; the clock then reads until.
func (e *Engine) Run(until time.Duration) {
	for len(e.q) > 0 && e.q[0].at <= until {
		ev := heap.Pop(&e.q).(event)
		e.now = ev.at
		e.events++
		ev.fn()
	}
	e.now = max(e.now, until)
}

// Clock is a host's clock: it reads (1 + DriftPPM/1e6) x t + Offset at true
// time t after Epoch.
type Clock struct {
	Offset   time.Duration
	DriftPPM float64
}

// At returns the clock's reading at true time t.
func (c Clock) At(t time.Duration) time.Time {
	return Epoch.Add(c.elapsed(t))
}

// Ms returns the clock's reading at t in Unix milliseconds, floored (what
// Redis TIME gives a script).
func (c Clock) Ms(t time.Duration) int64 {
	ns := c.At(t).UnixNano()
	return ns / int64(time.Millisecond) // Epoch is after 1970: no negative floor
}

func (c Clock) elapsed(t time.Duration) time.Duration {
	return t + time.Duration(float64(t)*c.DriftPPM/1e6) + c.Offset
}

// When returns the earliest true time at which the clock reads t or later:
// the instant a host that waits for its clock to reach t wakes up. It is
// the inverse of At: At(When(t)) >= t, and At(When(t) - 1ns) < t. The clock
// is monotonic (|DriftPPM| < 1e6).
func (c Clock) When(t time.Time) time.Duration {
	target := t.Sub(Epoch)
	x := time.Duration(float64(target-c.Offset) / (1 + c.DriftPPM/1e6))
	// The float estimate is off by a few ns at most; step to the exact one.
	for c.elapsed(x) < target {
		x++
	}
	for c.elapsed(x-1) >= target {
		x--
	}
	return x
}
