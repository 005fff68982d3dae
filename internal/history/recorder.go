package history

import (
	"bufio"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Process names the process a Recorder writes for (its start record).
type Process struct {
	Name   string // e.g. the replica id; required
	Role   string // RoleAllocator, RoleAgent, RoleGateway
	Region string // an agent's or a gateway's region, if it has one
}

type recorderOptions struct {
	queue      int
	flushEvery time.Duration
	now        func() time.Time
}

// RecorderOption changes an optional setting of a Recorder.
type RecorderOption func(*recorderOptions)

// WithQueue sets how many records may wait to be written before Record
// drops them (default 8192).
func WithQueue(n int) RecorderOption { return func(o *recorderOptions) { o.queue = max(1, n) } }

// WithFlushEvery sets how often what was recorded is written out (default
// 200 ms): what a killed process loses.
func WithFlushEvery(d time.Duration) RecorderOption {
	return func(o *recorderOptions) {
		if d > 0 {
			o.flushEvery = d
		}
	}
}

// WithRecorderClock replaces time.Now for the recorder's own records
// (start, end, dropped).
func WithRecorderClock(now func() time.Time) RecorderOption {
	return func(o *recorderOptions) { o.now = now }
}

// Recorder writes one process's history: JSON lines, a start record first
// and an end record on Close. Record never blocks: it queues (bounded) and
// drops what does not fit, counting it in the history. Durable writes at
// once, for the records a truncated history must not lose (the
// allocator's grants and returns). The zero value is not usable; a nil
// *Recorder records nothing. Safe for concurrent use.
type Recorder struct {
	q          chan Record
	stop, done chan struct{}
	opt        recorderOptions
	proc       string

	cmu    sync.RWMutex // protects closed against sends on q
	closed bool

	dropped atomic.Int64 // dropped since the last dropped record

	mu      sync.Mutex // protects w, line, err, written, lost
	w       *bufio.Writer
	line    []byte
	err     error
	written int64
	lost    int64 // dropped in all
}

// NewRecorder writes the start record of p to w (a file opened for
// appending, typically) and returns a recorder that writes p's records to
// it until Close. It fails if the start record cannot be written.
func NewRecorder(w io.Writer, p Process, opts ...RecorderOption) (*Recorder, error) {
	o := recorderOptions{queue: 8192, flushEvery: 200 * time.Millisecond, now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	if p.Name == "" {
		return nil, invalid("a Recorder needs a process name")
	}
	r := &Recorder{
		q: make(chan Record, o.queue), stop: make(chan struct{}), done: make(chan struct{}),
		opt: o, proc: p.Name, w: bufio.NewWriterSize(w, 64<<10),
	}
	start := Record{Kind: KindStart, T: o.now().UnixNano(), Proc: p.Name, Role: p.Role, Region: p.Region, V: Version}
	if err := r.Durable(start); err != nil {
		return nil, err
	}
	go r.loop()
	return r, nil
}

// Record queues rec to be written (rec.Proc defaults to the process's
// name). It never blocks: when the queue is full rec is dropped, and the
// history says how many were (as it does of a record that is not valid,
// see Record.Validate). After Close it does nothing.
func (r *Recorder) Record(rec Record) {
	if r == nil {
		return
	}
	r.cmu.RLock()
	defer r.cmu.RUnlock()
	if r.closed {
		return
	}
	select {
	case r.q <- rec:
	default:
		r.dropped.Add(1)
	}
}

// Durable writes recs and everything queued before them that the writer
// has taken, and hands them to the underlying writer before it returns
// (a file's page cache: a process killed afterwards does not lose them).
// It blocks for that write; it returns the first write error the recorder
// had.
func (r *Recorder) Durable(recs ...Record) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range recs {
		r.writeLocked(rec)
	}
	r.flushLocked()
	return r.err
}

// Stats are what a recorder wrote and dropped so far.
type Stats struct {
	Written, Dropped int64
}

// Stats returns what r wrote and dropped so far.
func (r *Recorder) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Written: r.written, Dropped: r.lost + r.dropped.Load()}
}

// Close writes what is queued and the end record, flushes, and returns the
// first write error. Records after Close are ignored.
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	r.cmu.Lock()
	was := r.closed
	r.closed = true
	r.cmu.Unlock()
	if !was {
		close(r.stop)
	}
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// loop is the writer: it takes queued records, writes them through the
// buffer and flushes every flushEvery, and on Close drains the queue and
// ends the run.
func (r *Recorder) loop() {
	defer close(r.done)
	t := time.NewTicker(r.opt.flushEvery)
	defer t.Stop()
	for {
		select {
		case rec := <-r.q:
			r.mu.Lock()
			r.writeLocked(rec)
			r.drainLocked(256) // a burst under one lock, bounded so Durable waits little
			r.mu.Unlock()
		case <-t.C:
			r.mu.Lock()
			r.noteDropsLocked()
			r.flushLocked()
			r.mu.Unlock()
		case <-r.stop:
			r.mu.Lock()
			r.drainLocked(-1) // no sender is left: Close took cmu
			r.noteDropsLocked()
			r.writeLocked(Record{Kind: KindEnd, T: r.opt.now().UnixNano(), Count: r.written, Dropped: r.lost})
			r.flushLocked()
			r.mu.Unlock()
			return
		}
	}
}

// drainLocked writes up to n queued records (n < 0: all); r.mu is held.
func (r *Recorder) drainLocked(n int) {
	for ; n != 0; n-- {
		select {
		case rec := <-r.q:
			r.writeLocked(rec)
		default:
			return
		}
	}
}

// noteDropsLocked writes a dropped record if records were dropped since the
// last one; r.mu is held.
func (r *Recorder) noteDropsLocked() {
	if n := r.dropped.Swap(0); n > 0 {
		r.lost += n
		r.writeLocked(Record{Kind: KindDropped, T: r.opt.now().UnixNano(), Count: n})
	}
}

// writeLocked encodes rec into the buffer; r.mu is held. After a write
// error nothing more is written (the history ends there, without an end
// record: incomplete).
func (r *Recorder) writeLocked(rec Record) {
	if r.err != nil {
		return
	}
	if rec.Proc == "" {
		rec.Proc = r.proc
	}
	rec.capStrings()
	if rec.Validate() != nil {
		// A record the format refuses would make the whole file unreadable:
		// it is counted as dropped instead (a bug of the recording code).
		r.dropped.Add(1)
		return
	}
	r.line = Encode(r.line[:0], rec)
	if _, err := r.w.Write(r.line); err != nil {
		r.err = err
		return
	}
	if rec.Kind != KindStart && rec.Kind != KindEnd && rec.Kind != KindDropped {
		r.written++
	}
}

func (r *Recorder) flushLocked() {
	if r.err == nil {
		r.err = r.w.Flush()
	}
}
