package history

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	recs := []Record{
		{Kind: KindStart, T: 1, Proc: "eu-1", Role: RoleAgent, Region: "eu", V: Version},
		admit("eu", 3, time.Second),
		fallback("us", FallbackLocal, 40, 1),
		grant("eu", "e1", 60, 5*time.Second),
		ret("eu", "e1", 10, 10),
		{Kind: KindReport, T: 5, Region: "eu", Limit: lim, Window: k, WindowLen: W, Reporter: "bucket-x", Admitted: 7, Released: 1},
		{Kind: KindReserve, T: 5, Region: "eu", Limit: lim, Window: k, WindowLen: W, Reservation: "r1", Tokens: 4, Replayed: true},
		{Kind: KindRelease, T: 6, Region: "eu", Limit: lim, Window: k, Reservation: "r1", Unspent: 2, Returned: 2},
		{Kind: KindDropped, T: 7, Count: 3},
		{Kind: KindEnd, T: 8, Count: 7, Dropped: 3},
	}
	for _, r := range recs {
		line := Encode(nil, r)
		if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("%s: not one line: %q", r.Kind, line)
		}
		got, err := Decode(line[:len(line)-1])
		if err != nil {
			t.Fatalf("%s: %v (%s)", r.Kind, err, line)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", r.Kind, got, r)
		}
	}
}

func TestEncodeCapsStrings(t *testing.T) {
	r := admit("eu", 1, time.Second)
	r.Limit = strings.Repeat("x", 10_000)
	line := Encode(nil, r)
	got, err := Decode(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Limit) > MaxString || !strings.HasSuffix(got.Limit, "(10000 bytes cut)") {
		t.Errorf("limit of %d bytes: %q", len(got.Limit), got.Limit[len(got.Limit)-30:])
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, line := range []string{
		``, `{`, `[]`, `null`, `{"kind":"decision"}`, `{"kind":"nope","t":1}`,
		`{"kind":"decision","t":1,"limit":"a","cost":1,"answer":"maybe","path":"redis"}`,
		`{"kind":"decision","t":1,"limit":"a","cost":1,"answer":"ok","path":"chunk"}`,
		`{"kind":"decision","t":1,"limit":"a","cost":1,"answer":"over_limit","path":"redis","fallback":"open"}`,
		`{"kind":"decision","t":1,"limit":"a","cost":-1,"answer":"ok","path":"redis"}`,
		`{"kind":"grant","t":1,"limit":"a","region":"eu","request":"r","lease":"l","tokens":0,"wlen":1}`,
		`{"kind":"start","t":1,"proc":"p","v":2}`,
		`{"kind":"end","t":1} {"kind":"end","t":1}`,
		`{"kind":"end","t":1,"extra":true}`,
		`{"kind":"dropped","t":1}`,
		`{"kind":"return","t":1,"limit":"` + strings.Repeat("x", MaxString+1) + `","lease":"l"}`,
	} {
		if _, err := Decode([]byte(line)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Decode(%.80q): %v, want ErrInvalid", line, err)
		}
	}
}

// FuzzDecode: any line decodes to a valid record or fails with
// ErrInvalid, never panics; what decodes encodes back to the same record.
func FuzzDecode(f *testing.F) {
	for _, r := range []Record{admit("eu", 1, time.Second), grant("eu", "e1", 60, time.Second), ret("eu", "e1", 1, 1),
		fallback("us", FallbackOpen, 0, 2), {Kind: KindStart, T: 1, Proc: "p", V: Version}} {
		line := Encode(nil, r)
		f.Add(line[:len(line)-1])
	}
	f.Add([]byte(`{"kind":"decision","t":1e400}`))
	f.Add([]byte(`{"kind":"decision","t":"1"}`))
	f.Add([]byte("{\"kind\":\"report\",\"limit\":\"\xff\"}"))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Decode(line)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again := Encode(nil, r)
		r2, err := Decode(again[:len(again)-1])
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-encoded %q: %v, %+v != %+v", again, err, r2, r)
		}
	})
}

// FuzzRead: any file reads to runs or an error, never a panic.
func FuzzRead(f *testing.F) {
	var b bytes.Buffer
	rec, _ := NewRecorder(&b, Process{Name: "eu-1", Role: RoleAgent, Region: "eu"})
	_ = rec.Durable(admit("eu", 1, time.Second), denied("eu"))
	_ = rec.Close()
	f.Add(bytes.Clone(b.Bytes()))
	f.Add(append(bytes.Clone(b.Bytes()), `{"kind":"decision","t":`...))
	f.Add(append(append(bytes.Clone(b.Bytes()[:40]), '\n'), b.Bytes()...))
	f.Fuzz(func(t *testing.T, data []byte) {
		runs, err := Read(bytes.NewReader(data), "f")
		if err == nil && len(runs) == 0 {
			t.Fatal("no runs and no error")
		}
		if err == nil {
			Check(&History{Runs: runs}, nil) // never panics either
		}
	})
}

func TestReadRestartedAfterACut(t *testing.T) {
	p := Process{Name: "eu-1", Role: RoleAgent, Region: "eu"}
	first := file(t, p, true, admit("eu", 1, time.Second))
	first = append(first, `{"kind":"decision","t":12`...)
	// The next run of the process appends to the same file, after the
	// newline the opener adds to a file that does not end in one.
	data := append(append(first, '\n'), file(t, p, false, admit("eu", 2, 2*time.Second))...)
	runs, err := Read(bytes.NewReader(data), "eu.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || !runs[0].Cut || runs[0].Ended || !runs[1].Ended || len(runs[0].Records) != 1 || len(runs[1].Records) != 1 {
		t.Fatalf("runs: %+v", runs)
	}
	if runs[0].Records[0].Proc != "eu-1" {
		t.Errorf("proc %q", runs[0].Records[0].Proc)
	}
	// A bad line that is not the end of a run is an error.
	bad := append(append(bytes.Clone(first), '\n'), `{"kind":"decision"}`+"\n"...)
	if _, err := Read(bytes.NewReader(bad), "eu.jsonl"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "eu.jsonl:3") {
		t.Errorf("a bad line mid-file: %v", err)
	}
	// So is a bad last line with its newline, and records after the end.
	for _, data := range [][]byte{
		append(bytes.Clone(first), '\n'),
		append(file(t, p, false), Encode(nil, admit("eu", 1, time.Second))...),
		Encode(nil, admit("eu", 1, time.Second)),
	} {
		if _, err := Read(bytes.NewReader(data), "eu.jsonl"); !errors.Is(err, ErrInvalid) {
			t.Errorf("Read(%.60q...): %v, want ErrInvalid", data, err)
		}
	}
}

// slowWriter blocks every write, once stalled, until release is closed.
type slowWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	stalled atomic.Bool
	release chan struct{}
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.stalled.Load() {
		<-w.release
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// TestRecorderDropsAndSaysSo: a recorder whose writer stalls never blocks
// Record; what it could not keep is counted in the history, and the
// history is not certified.
func TestRecorderDropsAndSaysSo(t *testing.T) {
	w := &slowWriter{release: make(chan struct{})}
	rec, err := NewRecorder(w, Process{Name: "eu-1", Role: RoleAgent}, WithQueue(4))
	if err != nil {
		t.Fatal(err)
	}
	w.stalled.Store(true) // the writer stalls from here
	// The writer goroutine may take one record before it stalls, on a
	// write of its buffer only at a flush: fill it past its buffer.
	big := admit("eu", 1, time.Second)
	big.Limit = strings.Repeat("l", MaxString)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			rec.Record(big)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Record blocked on a stalled writer")
	}
	close(w.release)
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	st := rec.Stats()
	if st.Dropped == 0 || st.Written+st.Dropped != 1000 {
		t.Fatalf("stats %+v", st)
	}
	runs, err := Read(bytes.NewReader(w.buf.Bytes()), "eu.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || !runs[0].Ended || runs[0].Dropped != st.Dropped || int64(len(runs[0].Records)) != st.Written {
		t.Fatalf("run: ended %v dropped %d records %d, stats %+v", runs[0].Ended, runs[0].Dropped, len(runs[0].Records), st)
	}
	rep := Check(&History{Runs: runs}, nil)
	if rep.Certified() || !strings.Contains(strings.Join(rep.Incomplete, ";"), "records dropped") {
		t.Errorf("incomplete: %q", rep.Incomplete)
	}
}

// TestRecorderDurable: Durable's records are in the writer when it
// returns, with no Close (a process killed then loses none of them);
// queued ones reach it within a flush interval.
func TestRecorderDurable(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	rec, err := NewRecorder(w, Process{Name: "alloc-1", Role: RoleAllocator}, WithFlushEvery(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if err := rec.Durable(grant("eu", "e1", 60, time.Second)); err != nil {
		t.Fatal(err)
	}
	read := func() []*Run {
		mu.Lock()
		defer mu.Unlock()
		runs, err := Read(bytes.NewReader(bytes.Clone(buf.Bytes())), "a.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		return runs
	}
	if runs := read(); len(runs[0].Records) != 1 || runs[0].Records[0].Kind != KindGrant || runs[0].Ended {
		t.Fatalf("after Durable: %+v", runs[0])
	}
	rec.Record(Record{Kind: KindReport, T: 1, Region: "eu", Limit: lim, Window: k, WindowLen: W, Reporter: "b", Admitted: 1})
	deadline := time.Now().Add(5 * time.Second)
	for len(read()[0].Records) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("a queued record was not written within 5 s")
		}
		time.Sleep(10 * time.Millisecond) // polling the flush
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	rec.Record(admit("eu", 1, time.Second)) // after Close: ignored
	if runs := read(); !runs[0].Ended || len(runs[0].Records) != 2 {
		t.Fatalf("after Close: %+v", runs[0])
	}
	var nilRec *Recorder
	nilRec.Record(admit("eu", 1, time.Second))
	if err := nilRec.Durable(); err != nil || nilRec.Close() != nil {
		t.Error("a nil recorder must do nothing")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRecorderWriteError: after a write error nothing more is written
// (no end record: the run reads as cut short).
func TestRecorderWriteError(t *testing.T) {
	var buf bytes.Buffer
	var fail atomic.Bool
	w := writerFunc(func(p []byte) (int, error) {
		if fail.Load() {
			return 0, io.ErrShortWrite
		}
		return buf.Write(p)
	})
	rec, err := NewRecorder(w, Process{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	if err := rec.Durable(grant("eu", "e1", 1, time.Second)); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("Durable: %v", err)
	}
	if err := rec.Close(); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("Close: %v", err)
	}
	runs, err := Read(bytes.NewReader(buf.Bytes()), "a.jsonl")
	if err != nil || len(runs) != 1 || runs[0].Ended {
		t.Fatalf("runs %+v, %v", runs, err)
	}
}

// TestRecorderCountsInvalidRecordsAsDropped: a record the format refuses
// is never written (it would make the file unreadable); it is counted as
// dropped.
func TestRecorderCountsInvalidRecordsAsDropped(t *testing.T) {
	var buf bytes.Buffer
	rec, err := NewRecorder(&buf, Process{Name: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	bad := admit("eu", 1, time.Second)
	bad.Cost = -1
	rec.Record(bad)
	if err := rec.Durable(admit("eu", 1, time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	runs, err := Read(bytes.NewReader(buf.Bytes()), "eu.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs[0].Records) != 1 || runs[0].Dropped != 1 || !runs[0].Ended {
		t.Fatalf("run %+v", runs[0])
	}
}
