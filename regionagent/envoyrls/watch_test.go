package envoyrls

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"leasehold/internal/syncbuf"
)

func prefixMapping(prefix string) string {
	return fmt.Sprintf(`
domains:
  - domain: api
    descriptors:
      - key: tenant_id
        limit: "%s/{tenant_id}"
`, prefix)
}

// TestReloadUnderLoad rewrites the mapping file while callers hammer the
// service: no call fails or sees a half-loaded mapping (every answer
// charges the old or the new limit), each new file takes effect, and a
// bad file is refused with its line and reason while the old mapping
// keeps serving.
func TestReloadUnderLoad(t *testing.T) {
	const workers = 4
	path := filepath.Join(t.TempDir(), "mapping.yaml")
	writeFile(t, path, prefixMapping("a"))
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]*fakeLimit{}
	prefixes := []string{"a", "b", "c", "d", "e"}
	for _, p := range prefixes {
		for w := range workers {
			limits[fmt.Sprintf("%s/t%d", p, w)] = &fakeLimit{g: 1 << 31, left: 1 << 31}
		}
	}
	fake := newFake(limits)
	var logs syncbuf.Buffer
	srv := NewServer(fake, m, WithRegisterer(prometheus.NewRegistry()),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	cl := serve(t, srv)

	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); srv.Watch(ctx, path, 5*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-watchDone })

	var stop atomic.Bool
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := fmt.Sprintf("t%d", w)
			for i := 0; i < 200000 && !stop.Load(); i++ {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				r, err := cl.ShouldRateLimit(cctx, request("api", 1, desc("tenant_id", tenant)))
				ccancel()
				calls.Add(1)
				var bad string
				switch {
				case err != nil:
					bad = err.Error()
				case r.OverallCode != OK || r.Statuses[0].CurrentLimit == nil:
					bad = fmt.Sprintf("answer %v", r)
				case !strings.HasSuffix(r.Statuses[0].CurrentLimit.Name, "/"+tenant):
					bad = "charged " + r.Statuses[0].CurrentLimit.Name
				}
				if bad != "" {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, bad)
				}
			}
		}()
	}
	// applied waits until the file's content is the mapping in force,
	// then checks a fresh call charges the new limit.
	applied := func(content, prefix string) {
		t.Helper()
		want := sha256.Sum256([]byte(content))
		eventually(t, 10*time.Second, "mapping "+prefix+" applied", func() bool { return srv.Mapping().hash == want })
		r, err := cl.ShouldRateLimit(ctx, request("api", 1, desc("tenant_id", "t0")))
		if err != nil || r.Statuses[0].CurrentLimit.GetName() != prefix+"/t0" {
			t.Fatalf("after applying %s: %v %v", prefix, r, err)
		}
	}
	for round, p := range []string{"b", "c", "a", "d"} {
		content := prefixMapping(p)
		if round == 2 {
			// In place (truncate and write), not atomically.
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			writeFile(t, path, content)
		}
		applied(content, p)
		n := calls.Load() // let the callers run on this mapping a while
		eventually(t, 10*time.Second, "calls on the new mapping", func() bool { return calls.Load() >= n+200 })
	}
	// A bad file is refused; the mapping in force stays.
	// (The in-place write above may have been caught empty or half
	// written on two polls and refused: count from here.)
	before, refused := srv.Mapping(), testutil.ToFloat64(srv.met.rejected)
	writeFile(t, path, prefixMapping("d")+"        limt: oops\n")
	eventually(t, 10*time.Second, "bad mapping refused", func() bool { return testutil.ToFloat64(srv.met.rejected) == refused+1 })
	time.Sleep(30 * time.Millisecond) // several more polls: refused once, not retried
	if srv.Mapping() != before {
		t.Fatal("a bad file replaced the mapping")
	}
	if got := testutil.ToFloat64(srv.met.rejected); got != refused+1 {
		t.Fatalf("rejected counted %v, want %v (once per content)", got, refused+1)
	}
	if l := logs.String(); !strings.Contains(l, "line=7") || !strings.Contains(l, `unknown field \"limt\"`) {
		t.Fatalf("refusal log lacks line and reason:\n%s", l)
	}
	// A missing file keeps the mapping too; the next good file applies.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if srv.Mapping() != before {
		t.Fatal("a missing file replaced the mapping")
	}
	writeFile(t, path, prefixMapping("e"))
	applied(prefixMapping("e"), "e")

	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed during reloads; first: %v", n, calls.Load(), firstErr.Load())
	}
	if got := testutil.ToFloat64(srv.met.applied); got < 5 {
		t.Fatalf("applied counted %v, want at least 5", got)
	}
	t.Logf("%d calls during 5 reloads and a refused file", calls.Load())
}

// A file caught half-written is not applied even when the half parses:
// only content read the same twice in a row is.
func TestWatchWaitsForStableContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.yaml")
	writeFile(t, path, prefixMapping("a"))
	m, _ := Load(path)
	srv := NewServer(newFake(nil), m, WithLogger(quietLogger()))
	w := watcher{s: srv, path: path}
	two := prefixMapping("b") + `      - key: user
        limit: "u/{user}"
`
	writeFile(t, path, prefixMapping("b")) // the first half of two
	w.poll()
	writeFile(t, path, two)
	w.poll()
	if srv.Mapping() != m {
		t.Fatal("applied content seen once")
	}
	w.poll()
	if srv.Mapping().hash != sha256.Sum256([]byte(two)) {
		t.Fatal("stable content not applied")
	}
	if id, _ := srv.Mapping().Resolve("api", desc("user", "x")); id != "u/x" {
		t.Fatalf("resolve %q", id)
	}
}
