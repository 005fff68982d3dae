package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"leasehold/internal/history"
)

// writeHistory writes one process's history file into dir: its records,
// then an end record unless killed.
func writeHistory(t *testing.T, dir, name string, p history.Process, killed bool, recs ...history.Record) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec, err := history.NewRecorder(f, p, history.WithRecorderClock(func() time.Time { return time.Unix(900, 0) }))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Durable(recs...); err != nil {
		t.Fatal(err)
	}
	if !killed {
		if err := rec.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// historyDir is a history of one window (G = 10 per 10 s, window 100): eu
// granted 10, then admitting admitted tokens; killed: the agent's run has
// no end record.
func historyDir(t *testing.T, admitted int64, killed bool) string {
	t.Helper()
	dir := t.TempDir()
	const w = int64(10 * time.Second)
	writeHistory(t, dir, "allocator.jsonl", history.Process{Name: "a1", Role: history.RoleAllocator}, false,
		history.Record{Kind: history.KindGrant, T: 100 * w, Region: "eu", Limit: "t/x", Window: 100, WindowLen: w, G: 10,
			Request: "r1", Lease: "100/eu/r1", Tokens: 10, Start: 100 * w, Expiry: 100*w + w/2, End: 101 * w})
	writeHistory(t, dir, "agent-eu.jsonl", history.Process{Name: "eu-1", Role: history.RoleAgent, Region: "eu"}, killed,
		history.Record{Kind: history.KindDecision, T: 100*w + 1, Region: "eu", Limit: "t/x", Window: 100, WindowLen: w, G: 10,
			Cost: admitted, Answer: history.AnswerOK, Path: history.PathRedis})
	return dir
}

func TestHistoryCheckCommand(t *testing.T) {
	runCheck := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"history", "check"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	clean := historyDir(t, 10, false)
	if code, out, _ := runCheck(clean); code != 0 || !strings.Contains(out, "certified: complete") ||
		!strings.Contains(out, "1 decisions") || !strings.Contains(out, "1 grant records") {
		t.Errorf("clean: exit %d\n%s", code, out)
	}
	// A file named on the command line reads the same as its directory.
	if code, out, _ := runCheck(filepath.Join(clean, "allocator.jsonl"), filepath.Join(clean, "agent-eu.jsonl")); code != 0 ||
		!strings.Contains(out, "certified") {
		t.Errorf("files: exit %d\n%s", code, out)
	}
	over := historyDir(t, 11, false)
	if code, out, errs := runCheck(over); code != 1 || !strings.Contains(out, "VIOLATION leased: t/x window 100") ||
		!strings.Contains(out, "VIOLATION promise") || !strings.Contains(errs, "2 violations") {
		t.Errorf("violation: exit %d\n%s%s", code, out, errs)
	}
	killed := historyDir(t, 10, true)
	if code, out, _ := runCheck(killed); code != 0 || !strings.Contains(out, "not certified") || !strings.Contains(out, "incomplete: 1 runs") {
		t.Errorf("killed: exit %d\n%s", code, out)
	}
	if code, _, _ := runCheck("--require-complete", killed); code != 1 {
		t.Errorf("killed, -require-complete: exit %d", code)
	}
	// -strict holds a fallback admit against G alone.
	fb := historyDir(t, 10, false)
	writeHistory(t, fb, "agent-us.jsonl", history.Process{Name: "us-1", Role: history.RoleAgent, Region: "us"}, false,
		history.Record{Kind: history.KindDecision, T: 1000*int64(time.Second) + 1, Region: "us", Limit: "t/x", Window: 100,
			WindowLen: int64(10 * time.Second), G: 10, Cost: 3, Answer: history.AnswerOK, Path: history.PathRedis,
			Fallback: history.FallbackOpen})
	if code, _, _ := runCheck(fb); code != 0 {
		t.Errorf("open fallback admits: exit %d, want 0", code)
	}
	if code, out, _ := runCheck("--strict", "t/x", fb); code != 1 || !strings.Contains(out, "VIOLATION promise") {
		t.Errorf("-strict: exit %d\n%s", code, out)
	}

	// Bad input: exit 2, one line.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "x.jsonl"), []byte("{\"kind\":\"start\",\"t\":1,\"proc\":\"p\",\"v\":1}\nnot json\n{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{}, {t.TempDir()}, {filepath.Join(t.TempDir(), "missing")}, {bad}, {"--clock-tolerance", "-1s", clean}, {"--nope", clean},
	} {
		code, _, errs := runCheck(args...)
		if code != 2 || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 with one line", args, code, errs)
		}
	}
	if code := run(context.Background(), []string{"history"}, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("history without check: exit %d", code)
	}
}

func TestHistoryFlagUsageErrors(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"agent", "--region", "eu", "--history", filepath.Join(dir, "h.txt")},
		{"agent", "--region", "eu", "--history", filepath.Join(dir, "missing", "h.jsonl")},
		{"allocator", "--history", filepath.Join(dir, "missing", "h.jsonl")},
		{"allocator", "--history", dir + "/.jsonl/"},
		{"gateway", "--upstream", "http://127.0.0.1:1", "--key-header", "X-Tenant", "--history", "h"},
		{"dev", "--history-dir", notDir},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, nil, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 with one line", args, code, stderr.String())
		}
	}
}

// TestOpenHistoryAppends: a restarted process appends a run to its file,
// after a newline if the killed one left a cut line.
func TestOpenHistoryAppends(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.jsonl")
	p := history.Process{Name: "eu-1", Role: history.RoleAgent, Region: "eu"}
	h, err := openHistory(file, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.rec.Durable(history.Record{Kind: history.KindDecision, T: 1, Region: "eu", Limit: "t/x", Cost: 1,
		Answer: history.AnswerUnavailable, Path: history.PathNone}); err != nil {
		t.Fatal(err)
	}
	_ = h.f.Close() // killed: no end record ...
	f, _ := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString(`{"kind":"decision","t":`) // ... in the middle of a line
	f.Close()
	h, err = openHistory(file, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	hist, err := readHistory(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist.Runs) != 2 || !hist.Runs[0].Cut || len(hist.Runs[0].Records) != 1 || !hist.Runs[1].Ended {
		t.Fatalf("runs %+v", hist.Runs)
	}
	if none, err := openHistory("", p); err != nil || none.rec != nil || none.Close() != nil {
		t.Errorf("no -history: %+v %v", none, err)
	}
}
