package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestWindowPhase: --window-phase sets a limit's phase offset; get,
// export, history and a dry run show it; a phase outside [0, W) is
// refused naming limit.window_phase; a change of the phase alone is
// refused for the next window (windows of two phases never start
// together) and taken with --effective now; a limits file sets it too.
func TestWindowPhase(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	set := []string{"limits", "set", "--reason", "test", "tenant/atlas", "--limit", "100", "--window", "1m",
		"--regions", "eu", "--mode", "strict"}

	r := q(append(set, "--window-phase", "17s")...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "tenant/atlas", "window": "1m", "window-phase": "17s", "version": "1"})
	checkKV(t, kv(t, q("limits", "get", "tenant/atlas").want(t, 0).stdout), map[string]string{"window-phase": "17s"})
	if out := q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout; !strings.Contains(out, "    window_phase: 17s\n") {
		t.Fatalf("export lacks the phase:\n%s", out)
	}

	for _, bad := range []string{"1m", "61s", "-1s", "1500us"} {
		r = q(append(set, "--window-phase", bad, "--effective", "now")...).want(t, 1)
		if !strings.Contains(r.stderr, "limit.window_phase") {
			t.Errorf("phase %s: %q does not name limit.window_phase", bad, r.stderr)
		}
	}
	r = q(append(set, "--window-phase", "soon")...).want(t, 2)
	if !strings.Contains(r.stderr, "--window-phase") {
		t.Errorf("a phase that is no duration: %q", r.stderr)
	}
	r = q("limits", "set", "--reason", "test", "tenant/b", "--rate", "10/s", "--burst", "5", "--regions", "eu",
		"--mode", "strict", "--window-phase", "1s").want(t, 2)
	if !strings.Contains(r.stderr, "--window-phase") {
		t.Errorf("a phase on a bucket limit: %q", r.stderr)
	}

	// Another phase of the same length never starts a window with this
	// one: only effective now. A dry run shows the change.
	r = q(append(set, "--window-phase", "30s")...).want(t, 1)
	if !strings.Contains(r.stderr, "limit.window_phase") || !strings.Contains(r.stderr, "effective NOW") {
		t.Fatalf("a change of phase for the next window: %q", r.stderr)
	}
	r = q(append(set, "--window-phase", "30s", "--effective", "now", "--dry-run")...).want(t, 0)
	if !strings.Contains(r.stdout, "window_phase") || !strings.Contains(r.stdout, "17s") || !strings.Contains(r.stdout, "30s") {
		t.Fatalf("dry run of a change of phase:\n%s", r.stdout)
	}
	r = q(append(set, "--window-phase", "30s", "--effective", "now")...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"window-phase": "30s", "version": "2"})
	// Back to aligned windows: the phase is no longer shown.
	r = q(append(set, "--effective", "now")...).want(t, 0)
	if got := kv(t, r.stdout); got["window-phase"] != "" || got["version"] != "3" {
		t.Fatalf("aligned again: %v", got)
	}
	hist := q("limits", "history", "tenant/atlas").want(t, 0).stdout
	if !strings.Contains(hist, "window_phase") || !strings.Contains(hist, "30s") {
		t.Fatalf("history lacks the phase changes:\n%s", hist)
	}

	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("limits:\n  - id: tenant/atlas\n    limit: 100\n    window: 1m\n"+
		"    window_phase: 45s\n    regions: [eu]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "test", "--effective", "now", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("limits", "get", "tenant/atlas").want(t, 0).stdout), map[string]string{"window-phase": "45s", "version": "4"})
	if err := os.WriteFile(file, []byte("limits:\n  - id: tenant/atlas\n    limit: 100\n    window: 1m\n"+
		"    window_phase: 2m\n    regions: [eu]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = q("limits", "apply", "--reason", "test", "--effective", "now", "-f", file)
	if r.code == 0 || !strings.Contains(r.stderr, "window_phase") {
		t.Fatalf("a file with a phase above W: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestCalendarLimits: --calendar and --zone set calendar windows (a bad
// unit exits 2; a bad zone, or a window beside them, is refused by the
// allocator naming the field); get, export and history show them; a
// limits file sets them (calendar: {unit: month, zone: Europe/Berlin});
// a change of zone that never starts a window with the running one is
// refused for the next window naming limit.calendar, and taken NOW.
func TestCalendarLimits(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result { return quotactl(append([]string{"--allocator", ta.addr}, args...)...) }
	set := []string{"limits", "set", "--reason", "test", "tenant/atlas", "--limit", "5000000", "--regions", "eu", "--mode", "strict"}

	r := q(append(set, "--calendar", "month", "--zone", "Europe/Berlin")...).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"id": "tenant/atlas", "calendar": "month", "zone": "Europe/Berlin", "version": "1"})
	checkKV(t, kv(t, q("limits", "get", "tenant/atlas").want(t, 0).stdout), map[string]string{"calendar": "month", "zone": "Europe/Berlin"})
	if out := q("limits", "export", "--prefix", "tenant/").want(t, 0).stdout; !strings.Contains(out, "    calendar: {unit: month, zone: Europe/Berlin}\n") {
		t.Fatalf("export lacks the calendar:\n%s", out)
	}
	r = q(append(set, "--calendar", "month", "--zone", "Mars/Olympus")...).want(t, 1)
	if !strings.Contains(r.stderr, ": limit.calendar.zone: ") {
		t.Errorf("%q does not name limit.calendar.zone", r.stderr)
	}
	// New York's months never start with Berlin's: NOW only.
	r = q(append(set, "--calendar", "month", "--zone", "America/New_York")...).want(t, 1)
	if !strings.Contains(r.stderr, "limit.calendar") || !strings.Contains(r.stderr, "effective NOW") {
		t.Fatalf("a change of zone for the next window: %q", r.stderr)
	}
	r = q(append(set, "--calendar", "month", "--zone", "America/New_York", "--effective", "now", "--dry-run")...).want(t, 0)
	if !strings.Contains(r.stdout, "calendar") || !strings.Contains(r.stdout, "month Europe/Berlin") || !strings.Contains(r.stdout, "month America/New_York") {
		t.Fatalf("dry run of a change of zone:\n%s", r.stdout)
	}
	q(append(set, "--calendar", "month", "--zone", "America/New_York", "--effective", "now")...).want(t, 0)
	hist := q("limits", "history", "tenant/atlas").want(t, 0).stdout
	if !strings.Contains(hist, "Europe/Berlin") || !strings.Contains(hist, "America/New_York") {
		t.Fatalf("history lacks the calendar change:\n%s", hist)
	}
	for _, args := range [][]string{
		{"--calendar", "fortnight", "--zone", "UTC"},
		{"--calendar", "month"}, // no zone
		{"--calendar", "month", "--zone", "UTC", "--window", "1m"},
		{"--calendar", "month", "--zone", "UTC", "--window-phase", "1s"},
	} {
		r := q(append(set, args...)...).want(t, 2)
		if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: want one line, got %q", args, r.stderr)
		}
	}
	r = q("limits", "set", "--reason", "test", "tenant/b", "--rate", "10/s", "--burst", "5", "--regions", "eu",
		"--mode", "strict", "--calendar", "month", "--zone", "UTC").want(t, 2)
	if !strings.Contains(r.stderr, "--rate") {
		t.Errorf("calendar with a rate: %q", r.stderr)
	}

	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("limits:\n  - id: tenant/c\n    limit: 5000000\n    calendar: {unit: day, zone: Europe/Berlin}\n"+
		"    regions: [eu]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q("limits", "apply", "--reason", "test", "-f", file).want(t, 0)
	checkKV(t, kv(t, q("limits", "get", "tenant/c").want(t, 0).stdout), map[string]string{"calendar": "day", "zone": "Europe/Berlin"})
	if err := os.WriteFile(file, []byte("limits:\n  - id: tenant/c\n    limit: 5000000\n    calendar: {unit: day, zone: Europe/Berlin}\n"+
		"    window: 1m\n    regions: [eu]\n    mode: strict\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = q("limits", "apply", "--reason", "test", "-f", file).want(t, 2)
	if !strings.Contains(r.stderr, "calendar or window") {
		t.Errorf("a file with calendar and window: %q", r.stderr)
	}
}

// TestCalendarWindowsShown: quotactl windows names calendar windows, in
// the table ("windows: calendar month, Europe/Berlin") and in JSON.
func TestCalendarWindowsShown(t *testing.T) {
	w := &pb.WindowReport{LimitId: "tenant/atlas", LimitTokens: 5_000_000, Closed: true,
		WindowStart: timestamppb.New(time.Date(2027, 9, 30, 22, 0, 0, 0, time.UTC)),
		WindowEnd:   timestamppb.New(time.Date(2027, 10, 31, 23, 0, 0, 0, time.UTC)),
		Calendar:    &pb.CalendarWindows{Unit: "month", Zone: "Europe/Berlin"}}
	var out strings.Builder
	e := &env{stdout: &out}
	if err := e.printWindows([]*pb.WindowReport{w}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "windows: calendar month, Europe/Berlin\n") ||
		!strings.Contains(out.String(), "2027-09-30T22:00:00.000Z") || !strings.Contains(out.String(), "2027-10-31T23:00:00.000Z") {
		t.Errorf("table:\n%s", out.String())
	}
	out.Reset()
	e.json = true
	if err := e.printWindows([]*pb.WindowReport{w}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"calendar": "calendar month, Europe/Berlin"`) {
		t.Errorf("JSON:\n%s", out.String())
	}
}
