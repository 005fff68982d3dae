package faulttest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"leasehold/internal/history"
	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// Every process a test starts (StartAllocator, StartAgent, StartGateway)
// records its history (--history) to a file of its own in a directory of
// the test; restarts append runs to the same file. When the test ends,
// after its processes stopped, the files are checked against the
// per-window invariants (package internal/history): a violation fails the
// test, the counts are logged. Killed processes leave runs without an end
// record: the check still holds the invariants (the allocator writes its
// grants and returns before answering, so a truncated history never
// invents a violation) but does not certify the history.

// testHistory is one test's history directory.
type testHistory struct {
	dir string

	mu     sync.Mutex // protects names, limits
	names  map[string]int
	limits map[string]history.Limit
}

var histories sync.Map // testing.TB -> *testHistory

// historyOf returns t's history directory, making it on first use and
// registering the check. It must be called before the first process's
// own cleanup is registered, so that the check runs after every process
// of t stopped (cleanups run last registered first).
func historyOf(t testing.TB) *testHistory {
	if v, ok := histories.Load(t); ok {
		return v.(*testHistory)
	}
	h := &testHistory{dir: t.TempDir(), names: map[string]int{}, limits: map[string]history.Limit{}}
	histories.Store(t, h)
	t.Cleanup(func() {
		histories.Delete(t)
		h.check(t)
	})
	return h
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// historyFile names the history file of a process called name (unique in
// the test).
func historyFile(t testing.TB, name string) string {
	h := historyOf(t)
	base := strings.Trim(unsafeName.ReplaceAllString(name, "-"), "-")
	h.mu.Lock()
	h.names[base]++
	if n := h.names[base]; n > 1 {
		base = fmt.Sprintf("%s.%d", base, n)
	}
	h.mu.Unlock()
	return filepath.Join(h.dir, base+history.Suffix)
}

// HistoryLimit states l for the test's history check: its G, whether it
// is strict and each region's fallback, held against what the processes
// recorded (rather than the fallbacks the agents said they applied).
func HistoryLimit(t testing.TB, l *pb.Limit) {
	hl := history.Limit{G: l.LimitTokens, Window: l.Window.AsDuration(), Strict: l.Mode == pb.Mode_MODE_STRICT,
		Fallback: map[string]string{}}
	for region, fb := range l.Fallback {
		hl.Fallback[region] = limitspec.FallbackName(fb) // closed, local:A, open: what history.Limit reads
	}
	h := historyOf(t)
	h.mu.Lock()
	h.limits[l.Id] = hl
	h.mu.Unlock()
}

// check reads the test's history files and holds them against the
// invariants. On a violation the files are kept (the path is logged).
func (h *testHistory) check(t testing.TB) {
	hist, err := history.ReadFS(os.DirFS(h.dir))
	if err != nil {
		t.Errorf("history check: %v", err)
		return
	}
	h.mu.Lock()
	limits := h.limits
	h.mu.Unlock()
	rep := history.Check(hist, limits)
	t.Logf("history check: %s", rep.Summary())
	for _, why := range rep.Incomplete {
		t.Logf("history check: incomplete: %s", why)
	}
	if rep.OK() {
		if rep.Certified() {
			t.Logf("history check: certified")
		}
		return
	}
	for i, v := range rep.Violations {
		if i == 20 {
			t.Errorf("history check: ... and %d more violations", len(rep.Violations)-i)
			break
		}
		t.Errorf("history check: %s", v)
	}
	keep, err := os.MkdirTemp("", "leasehold-history-"+unsafeName.ReplaceAllString(t.Name(), "-")+"-")
	if err == nil {
		err = os.CopyFS(keep, os.DirFS(h.dir))
	}
	if err != nil {
		t.Logf("history check: keeping the files: %v", err)
		return
	}
	t.Logf("history check: the files are kept in %s (leasehold history check %s)", keep, keep)
}
