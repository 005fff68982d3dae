package faulttest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// ReportEnv names the file scenarios append their figures to. A relative
// path is taken from the module root (the directory of go.mod), so
// LEASEHOLD_FAULTS_REPORT=docs/faults.md writes the repository's page.
const ReportEnv = "LEASEHOLD_FAULTS_REPORT"

// ReportHeader starts the report file; the first scenario of a test
// binary truncates the file and writes it.
const ReportHeader = `# Fault scenarios: measured figures

This page is produced by the fault scenarios themselves
(the ` + "`TestScenario*`" + ` tests of ` + "`internal/faulttest`" + `): real ` + "`leasehold`" + ` binaries,
real redis-server, real etcd, faults injected by the harness's TCP proxy
and by SIGKILL / etcd hard stops. Each scenario counts the tokens admitted
per window from the Check answers it received and holds them against G and
against the bound the allocator reports. Regenerate it from the
repository's root with (about 8 minutes on a 2-core machine)

` + "```" + `
LEASEHOLD_FAULTS_REPORT=docs/faults.md go test ./internal/faulttest/ -run Scenario -count=1 -v -timeout 20m
` + "```" + `

The scenarios run in CI (` + "`make test LONG=1`" + `; ` + "`-short`" + ` skips them) with the same
assertions; the figures below are from one run, so timings vary a little
between runs.

Columns of the window tables: **G** the limit; **admitted (test)** tokens
admitted in the window per region, counted by the test from the answers
it received (a lower bound: an answer lost to a killed agent is not
counted); **admitted (alloc)** what the allocator's report says, from the
regions' usage reports; **granted - returned** the pool arithmetic of
invariant 1 (must be <= G); **bound** the overshoot the window may have
above G; **observed** the overshoot the allocator observed; **stranded**
tokens granted and neither spent nor returned (undershoot). Only windows
the load covered from start to end are listed. *Time in each mode* is,
per load target, the time attributed to each kind of answer (the time
between two answers goes to the earlier one's kind); ERROR is a failed
call (agent down or timed out). Times are wall-clock from the start of the
scenario's load.

`

var report struct {
	once     sync.Once
	mu       sync.Mutex
	path     string
	err      error
	sections map[string]string // by title: the file lists them in title order
}

// reportPath resolves $LEASEHOLD_FAULTS_REPORT ("" when unset).
func reportPath() (string, error) {
	p := os.Getenv(ReportEnv)
	if p == "" || filepath.IsAbs(p) {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, p), nil
		}
		if filepath.Dir(d) == d {
			return filepath.Join(dir, p), nil
		}
	}
}

// Report is one scenario's figures.
type Report struct {
	Title   string
	Summary string      // what the scenario does, one paragraph
	Facts   [][2]string // name, value: the scenario's own figures
	Windows []WindowRow // per full window
	Modes   map[string]map[Mode]time.Duration
	Notes   []string
}

// WindowRow is one window as the test counted it and as the allocator
// reported it.
type WindowRow struct {
	Start         time.Time
	G             int64
	AdmittedTest  map[string]int64
	AdmittedAlloc map[string]int64
	Granted       int64
	Returned      int64
	Bound         int64
	BoundInfinite bool
	Observed      int64
	Stranded      int64
	Note          string
}

// Row builds a window row from the test's tally and the allocator's report
// (r may be nil when the allocator had none).
func Row(start time.Time, g int64, tally map[string]int64, r *pb.WindowReport) WindowRow {
	row := WindowRow{Start: start, G: g, AdmittedTest: tally}
	if r != nil {
		row.AdmittedAlloc = r.Admitted
		row.Granted, row.Returned = r.Granted, r.Returned
		row.Bound, row.BoundInfinite = r.Bound, r.BoundInfinite
		row.Observed, row.Stranded = r.ObservedOvershoot, r.Stranded
	}
	return row
}

func regionsText(m map[string]int64) string {
	if m == nil {
		return "-"
	}
	keys := make([]string, 0, len(m))
	var total int64
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}

// Markdown renders the report.
func (r Report) Markdown(origin time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", r.Title)
	if r.Summary != "" {
		fmt.Fprintf(&b, "%s\n\n", r.Summary)
	}
	if len(r.Facts) > 0 {
		b.WriteString("| figure | value |\n|---|---|\n")
		for _, f := range r.Facts {
			fmt.Fprintf(&b, "| %s | %s |\n", f[0], f[1])
		}
		b.WriteString("\n")
	}
	if len(r.Windows) > 0 {
		b.WriteString("| window (s) | G | admitted (test) | admitted (alloc) | granted - returned | bound | observed | stranded | note |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
		for _, w := range r.Windows {
			bound := fmt.Sprint(w.Bound)
			if w.BoundInfinite {
				bound = "+Inf"
			}
			fmt.Fprintf(&b, "| %+.0f | %d | %s | %s | %d - %d = %d | %s | %d | %d | %s |\n",
				w.Start.Sub(origin).Seconds(), w.G, regionsText(w.AdmittedTest), regionsText(w.AdmittedAlloc),
				w.Granted, w.Returned, w.Granted-w.Returned, bound, w.Observed, w.Stranded, w.Note)
		}
		b.WriteString("\n")
	}
	if len(r.Modes) > 0 {
		b.WriteString("| time in each mode | " + strings.Join(modeNames(), " | ") + " |\n")
		b.WriteString("|---" + strings.Repeat("|---", len(Modes)) + "|\n")
		targets := make([]string, 0, len(r.Modes))
		for t := range r.Modes {
			targets = append(targets, t)
		}
		sort.Strings(targets)
		for _, t := range targets {
			fmt.Fprintf(&b, "| %s", t)
			for _, m := range Modes {
				fmt.Fprintf(&b, " | %.1f s", r.Modes[t][m].Seconds())
			}
			b.WriteString(" |\n")
		}
		b.WriteString("\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "%s\n\n", n)
	}
	return b.String()
}

func modeNames() []string {
	out := make([]string, len(Modes))
	for i, m := range Modes {
		out[i] = string(m)
	}
	return out
}

// WriteReport logs the report and, when $LEASEHOLD_FAULTS_REPORT is set,
// writes it to that file: ReportHeader, then every report of the test
// binary so far in title order ("1. ...", "2. ...": tests run in file
// order, not in scenario order). origin is the scenario's time 0.
func WriteReport(t testing.TB, r Report, origin time.Time) {
	t.Helper()
	md := r.Markdown(origin)
	t.Logf("report:\n%s", md)
	report.once.Do(func() {
		report.path, report.err = reportPath()
		if report.err != nil || report.path == "" {
			return
		}
		report.err = os.WriteFile(report.path, []byte(ReportHeader), 0o644)
	})
	if report.err != nil {
		t.Errorf("faulttest: report %s: %v", report.path, report.err)
		return
	}
	if report.path == "" {
		return
	}
	report.mu.Lock()
	defer report.mu.Unlock()
	if report.sections == nil {
		report.sections = map[string]string{}
	}
	report.sections[r.Title] = md
	titles := make([]string, 0, len(report.sections))
	for title := range report.sections {
		titles = append(titles, title)
	}
	sort.Strings(titles)
	var b strings.Builder
	b.WriteString(ReportHeader)
	for _, title := range titles {
		b.WriteString(report.sections[title])
	}
	if err := os.WriteFile(report.path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("faulttest: report: %v", err)
	}
}
