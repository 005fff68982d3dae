package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"leasehold/internal/history"
)

// checkHistoryFlag refuses a -history FILE that cannot be one: it must be
// named *.jsonl (what `leasehold history check DIR` reads) in a directory
// that exists, and must not be a directory.
func checkHistoryFlag(name, file string) error {
	if file == "" {
		return nil
	}
	if !strings.HasSuffix(file, history.Suffix) {
		return usagef("-%s %q: name the file *%s (leasehold history check DIR reads those)", name, file, history.Suffix)
	}
	if fi, err := os.Stat(file); err == nil && fi.IsDir() {
		return usagef("-%s %q is a directory", name, file)
	}
	if fi, err := os.Stat(filepath.Dir(file)); err != nil || !fi.IsDir() {
		return usagef("-%s %q: directory %s does not exist", name, file, filepath.Dir(file))
	}
	return nil
}

// checkHistoryDir refuses a -history-dir that exists and is not a
// directory.
func checkHistoryDir(dir string) error {
	if dir == "" {
		return nil
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return usagef("-history-dir %q is not a directory", dir)
	}
	return nil
}

// historyFile is a process's history: a recorder appending to a file.
type historyFile struct {
	rec *history.Recorder
	f   *os.File
}

// openHistory opens file for appending (a restarted process adds a run)
// and starts p's run in it; "" records nothing (a nil recorder). A file
// that a killed process left ending mid-line gets a newline first, so the
// cut line stays a line of its own.
func openHistory(file string, p history.Process) (*historyFile, error) {
	if file == "" {
		return &historyFile{}, nil
	}
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-history: %w", err)
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			_, _ = f.Write([]byte("\n"))
		}
	}
	rec, err := history.NewRecorder(f, p)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("-history %s: %w", file, err)
	}
	return &historyFile{rec: rec, f: f}, nil
}

// Close ends the run (its end record) and closes the file.
func (h *historyFile) Close() error {
	if h.f == nil {
		return nil
	}
	err := h.rec.Close()
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("history %s: %w", h.f.Name(), err)
	}
	return nil
}

// closeHistory closes h and logs a failure (a server's shutdown goes on).
func closeHistory(h *historyFile, warn func(msg string, args ...any)) {
	if err := h.Close(); err != nil {
		warn("history not closed cleanly", "err", err)
	}
}

// runHistoryCmd is `leasehold history check [flags] PATH...`.
func runHistoryCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stdout, "usage: leasehold history check [flags] DIR|FILE...")
			return errHelp
		}
		return usagef("want: leasehold history check [flags] DIR|FILE...")
	}
	flags := flag.NewFlagSet("history check", flag.ContinueOnError)
	var hc historyCheckConfig
	hc.register(flags)
	tol, strict, complete := &hc.tolerance, hc.strict, &hc.requireComplete
	paths, err := parseFlags(flags, args[1:], stdout)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		return usagef("name at least one history directory or file")
	}
	if *tol < 0 {
		return usagef("-clock-tolerance must be >= 0")
	}
	h := &history.History{}
	for _, p := range paths {
		got, err := readHistory(p)
		if err != nil {
			return usagef("%v", err)
		}
		h.Runs = append(h.Runs, got.Runs...)
	}
	limits := map[string]history.Limit{}
	for _, id := range *strict {
		limits[id] = history.Limit{Strict: true}
	}
	ct := *tol
	if ct == 0 {
		ct = -1 // Options takes 0 for its default, and a negative tolerance for none
	}
	rep := history.Options{Limits: limits, ClockTolerance: ct}.Check(h)
	fmt.Fprintln(stdout, rep.Summary())
	for _, why := range rep.Incomplete {
		fmt.Fprintln(stdout, "incomplete:", why)
	}
	for _, v := range rep.Violations {
		fmt.Fprintln(stdout, "VIOLATION", v)
	}
	switch {
	case len(rep.Violations) == 1:
		return errors.New("1 violation")
	case !rep.OK():
		return fmt.Errorf("%d violations", len(rep.Violations))
	case rep.Certified():
		fmt.Fprintln(stdout, "certified: complete, and no invariant broken")
	default:
		fmt.Fprintln(stdout, "no invariant broken, but not certified: the history is incomplete")
		if *complete {
			return errors.New("the history is incomplete (-require-complete)")
		}
	}
	return nil
}

// historyCheckConfig is what `leasehold history check` takes.
type historyCheckConfig struct {
	tolerance       time.Duration
	strict          *stringList
	requireComplete bool
}

func (c *historyCheckConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&c.tolerance, "clock-tolerance", history.DefaultClockTolerance,
		"bound on the offset between the recording hosts' clocks (processes on one host share one clock)")
	c.strict = &stringList{}
	fs.Var(c.strict, "strict", "`LIMIT` is strict: every window admits at most G, fallback admits included (repeat, or comma-separated)")
	fs.BoolVar(&c.requireComplete, "require-complete", false, "exit 1 also when the history is incomplete (a run cut short, records dropped)")
}

// readHistory reads a directory's *.jsonl files, or one file.
func readHistory(p string) (*history.History, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		h, err := history.ReadFS(os.DirFS(p))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return h, err
	}
	return history.ReadFS(os.DirFS(filepath.Dir(p)), filepath.Base(p))
}

// stringList is a flag of strings, repeated or comma-separated.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, splitList(v)...)
	return nil
}
