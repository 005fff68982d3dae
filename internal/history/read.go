package history

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// Run is what one process wrote from its start record to its end record,
// or to the end of its file.
type Run struct {
	File  string // the file's name
	Line  int    // the start record's line
	Start Record
	// Records are the run's records but start, end and dropped, each with
	// its Proc set.
	Records []Record
	// Ended: an end record closed the run. A run without one was cut
	// short (the process was killed, or still writes): its last records
	// may be missing.
	Ended bool
	// Dropped records the recorder could not keep up with.
	Dropped int64
	// Cut: the run's last line was cut in the middle (the process died
	// while writing it); it was left out.
	Cut bool
}

// History is the runs of one or more history files.
type History struct {
	Runs []*Run
}

// Records returns every record of every run, in run order.
func (h *History) Records() []Record {
	var out []Record
	for _, r := range h.Runs {
		out = append(out, r.Records...)
	}
	return out
}

// Read reads one history file (name is for errors and Run.File). A line
// that is not a valid record is an error, except the last line of a run
// with no end record (the tail a killed process cut), which is left out
// and marks the run Cut.
func Read(r io.Reader, name string) ([]*Run, error) {
	br := bufio.NewReaderSize(r, MaxLine+1)
	var (
		runs []*Run
		cur  *Run
		bad  error // the line before could not be decoded
	)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%s:%d: %w: a line longer than %d bytes", name, n, ErrInvalid, MaxLine)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		eof := err != nil
		whole := len(line) > 0 && line[len(line)-1] == '\n'
		text := bytes.TrimRight(line, "\r\n")
		if len(text) == 0 {
			if eof {
				break
			}
			continue // blank lines separate a cut run from the next one
		}
		rec, derr := Decode(text)
		if bad != nil {
			// Only a new run may follow a line that could not be read.
			if derr != nil || rec.Kind != KindStart || cur == nil || cur.Ended {
				return nil, bad
			}
			cur.Cut, bad = true, nil
		}
		if derr != nil {
			bad = fmt.Errorf("%s:%d: %w", name, n, derr)
			if eof && !whole && cur != nil && !cur.Ended {
				cur.Cut, bad = true, nil
			}
			if eof {
				break
			}
			continue
		}
		switch {
		case rec.Kind == KindStart:
			cur = &Run{File: name, Line: n, Start: rec}
			runs = append(runs, cur)
		case cur == nil:
			return nil, fmt.Errorf("%s:%d: %w: a %s record before the first start record", name, n, ErrInvalid, rec.Kind)
		case cur.Ended:
			return nil, fmt.Errorf("%s:%d: %w: a %s record after its run's end record", name, n, ErrInvalid, rec.Kind)
		case rec.Kind == KindEnd:
			if rec.Count != int64(len(cur.Records)) || rec.Dropped != cur.Dropped {
				return nil, fmt.Errorf("%s:%d: %w: the end record counts %d records and %d dropped, the run has %d and %d",
					name, n, ErrInvalid, rec.Count, rec.Dropped, len(cur.Records), cur.Dropped)
			}
			cur.Ended = true
		case rec.Kind == KindDropped:
			cur.Dropped += rec.Count
		default:
			if rec.Proc == "" {
				rec.Proc = cur.Start.Proc
			}
			cur.Records = append(cur.Records, rec)
		}
		if eof {
			break
		}
	}
	if bad != nil {
		return nil, bad
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("%s: %w: no start record", name, ErrInvalid)
	}
	return runs, nil
}

// Suffix is how history files are named: ReadDir reads the files of a
// directory whose names end in it.
const Suffix = ".jsonl"

// ReadFS reads the named files of fsys (each a history file), or, with no
// names, every file of its root whose name ends in Suffix.
func ReadFS(fsys fs.FS, names ...string) (*History, error) {
	if len(names) == 0 {
		ents, err := fs.ReadDir(fsys, ".")
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if e.Type().IsRegular() && strings.HasSuffix(e.Name(), Suffix) {
				names = append(names, e.Name())
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: no *%s files", fs.ErrNotExist, Suffix)
		}
	}
	sort.Strings(names)
	h := &History{}
	for _, n := range names {
		f, err := fsys.Open(n)
		if err != nil {
			return nil, err
		}
		runs, err := Read(f, path.Base(n))
		f.Close()
		if err != nil {
			return nil, err
		}
		h.Runs = append(h.Runs, runs...)
	}
	return h, nil
}
