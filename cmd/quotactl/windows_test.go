package main

import (
	"context"
	"encoding/json"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/allocator"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// fakeAdmin answers ListWindows from canned reports, as the leader does:
// the last N windows of a limit, oldest first (N = last, 0 meaning 10);
// NOT_FOUND for a limit it does not know. With leader set, it refuses
// like a follower: UNAVAILABLE, naming leader in the leasehold-leader
// trailer. It records every request.
type fakeAdmin struct {
	pb.UnimplementedAdminServer
	windows       map[string][]*pb.WindowReport
	buckets       map[string]*pb.ListWindowsResponse // bucket limits, answered as they are
	leader        string                             // refuse, naming this leader
	unimplemented bool                               // answer as an allocator without ListWindows

	mu   sync.Mutex
	reqs []*pb.ListWindowsRequest
}

func (f *fakeAdmin) ListWindows(ctx context.Context, req *pb.ListWindowsRequest) (*pb.ListWindowsResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	switch {
	case f.unimplemented:
		return f.UnimplementedAdminServer.ListWindows(ctx, req)
	case f.leader != "":
		_ = grpc.SetTrailer(ctx, metadata.Pairs(vocab.LeaderMetadataKey, f.leader))
		return nil, status.Error(codes.Unavailable, (&allocator.NotLeaderError{Leader: f.leader}).Error())
	}
	if b, ok := f.buckets[req.GetLimitId()]; ok {
		return b, nil
	}
	ws, ok := f.windows[req.GetLimitId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "allocator: not found: limit %q", req.GetLimitId())
	}
	n := int(req.GetLast())
	if n == 0 {
		n = 10
	}
	if len(ws) > n {
		ws = ws[len(ws)-n:]
	}
	return &pb.ListWindowsResponse{Windows: ws}, nil
}

func (f *fakeAdmin) requests() []*pb.ListWindowsRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// startFakeAdmin serves f on a loopback port until the test ends.
func startFakeAdmin(t *testing.T, f pb.AdminServer) string {
	t.Helper()
	lis := listenLoopback(t)
	serveFakeAdmin(t, lis, f)
	return lis.Addr().String()
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// serveFakeAdmin serves f on lis until the test ends.
func serveFakeAdmin(t *testing.T, lis net.Listener, f pb.AdminServer) {
	t.Helper()
	gs := grpc.NewServer()
	pb.RegisterAdminServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
}

// Four one-minute windows of tenant/atlas (G = 1000), oldest first.
var (
	winBase = time.Date(2026, 11, 29, 19, 30, 0, 0, time.UTC)
	// A quiet closed window: two regions, nothing above G; 20 of what
	// was granted are the regions' standing shares.
	winQuiet = &pb.WindowReport{
		LimitId: fakeLimit, WindowStart: winAt(0), WindowEnd: winAt(1), Closed: true,
		LimitTokens: 1000, Granted: 1000, Standing: 20, Returned: 0,
		Admitted: map[string]int64{"us": 309, "eu": 691}, AdmittedTotal: 1000,
		Terms: &pb.BoundTerms{},
	}
	// us fell back to open: the bound is +Inf, the overshoot is no bug.
	winOpen = &pb.WindowReport{
		LimitId: fakeLimit, WindowStart: winAt(1), WindowEnd: winAt(2), Closed: true,
		LimitTokens: 1000, Granted: 1000, Returned: 40,
		Admitted: map[string]int64{"eu": 500, "us": 800}, AdmittedTotal: 1300, FallbackAdmitted: 340,
		BoundInfinite: true, ObservedOvershoot: 300, Stranded: 0,
		Terms: &pb.BoundTerms{},
		Fallback: map[string]pb.FallbackKind{
			"eu": pb.FallbackKind_FALLBACK_KIND_CLOSED,
			"us": pb.FallbackKind_FALLBACK_KIND_OPEN,
			"ap": pb.FallbackKind_FALLBACK_KIND_UNSPECIFIED, // none: left out
		},
	}
	// Three regions, 80 above G against a bound of 50: a bug.
	winOver = &pb.WindowReport{
		LimitId: fakeLimit, WindowStart: winAt(2), WindowEnd: winAt(3), Closed: true,
		LimitTokens: 1000, Granted: 1100, Returned: 8,
		Admitted: map[string]int64{"eu": 600, "us": 400, "ap": 80}, AdmittedTotal: 1080, FallbackAdmitted: 20,
		Bound: 50, ObservedOvershoot: 80, Stranded: 12,
		Terms:    &pb.BoundTerms{CarryOver: 1, Fallback: 20, LostGrants: 2, RedisRollback: 25, LimitLowered: 2},
		Fallback: map[string]pb.FallbackKind{"ap": pb.FallbackKind_FALLBACK_KIND_LOCAL},
	}
	// The running window.
	winRunning = &pb.WindowReport{
		LimitId: fakeLimit, WindowStart: winAt(3), WindowEnd: winAt(4), Closed: false,
		LimitTokens: 1000, Granted: 300, Returned: 0,
		Admitted: map[string]int64{"eu": 120}, AdmittedTotal: 120,
		Terms: &pb.BoundTerms{},
	}
)

func winAt(i int) *timestamppb.Timestamp {
	return timestamppb.New(winBase.Add(time.Duration(i) * time.Minute))
}

func newWindowsFake() *fakeAdmin {
	return &fakeAdmin{windows: map[string][]*pb.WindowReport{
		fakeLimit:      {winQuiet, winOpen, winOver, winRunning},
		"tenant/quiet": {winQuiet},
		"tenant/new":   {},
	}}
}

var windowsHeader = []string{"LIMIT", "WINDOW_START", "WINDOW_END", "LIMIT_TOKENS", "GRANTED", "RETURNED",
	"ADMITTED", "ADMITTED_TOTAL", "FALLBACK_ADMITTED", "BOUND", "OBSERVED_OVERSHOOT", "STRANDED"}

const (
	footRunning = "* running window: its counts still grow"
	footOver    = "! observed_overshoot above bound: a bug, please report it (docs/overshoot.md)"
)

// windowsTable splits the human output into the table's rows (header
// first, fields split on spaces) and the footnote lines.
func windowsTable(t *testing.T, out string) (rows [][]string, foot []string) {
	t.Helper()
	table, notes, _ := strings.Cut(out, "\n\n")
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	if notes != "" {
		foot = strings.Split(strings.TrimRight(notes, "\n"), "\n")
	}
	if len(rows) == 0 || !slices.Equal(rows[0], windowsHeader) {
		t.Fatalf("header %q, want %q\n%s", rows, windowsHeader, out)
	}
	for _, r := range rows[1:] {
		if len(r) != len(windowsHeader) {
			t.Fatalf("row %q has %d fields, want %d\n%s", r, len(r), len(windowsHeader), out)
		}
	}
	return rows, foot
}

func TestWindowsTable(t *testing.T) {
	f := newWindowsFake()
	addr := startFakeAdmin(t, f)

	r := quotactl("--allocator", addr, "windows", fakeLimit).want(t, 0)
	rows, foot := windowsTable(t, r.stdout)
	want := [][]string{
		windowsHeader,
		{fakeLimit, "2026-11-29T19:30:00.000Z", "2026-11-29T19:31:00.000Z", "1000", "1000", "0", "eu=691,us=309", "1000", "0", "0", "0", "0"},
		{fakeLimit, "2026-11-29T19:31:00.000Z", "2026-11-29T19:32:00.000Z", "1000", "1000", "40", "eu=500,us=800", "1300", "340", "+Inf", "300", "0"},
		{fakeLimit, "2026-11-29T19:32:00.000Z", "2026-11-29T19:33:00.000Z", "1000", "1100", "8", "ap=80,eu=600,us=400", "1080", "20", "50", "80!", "12"},
		{fakeLimit, "2026-11-29T19:33:00.000Z", "2026-11-29T19:34:00.000Z*", "1000", "300", "0", "eu=120", "120", "0", "0", "0", "0"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("table:\n%s\nwant rows %q", r.stdout, want)
	}
	if !slices.Equal(foot, []string{footRunning, footOver}) {
		t.Errorf("footnotes %q, want %q", foot, []string{footRunning, footOver})
	}
	// The columns line up: every row is as wide as its fields and the
	// two-space gaps make it.
	lines := strings.Split(r.stdout, "\n")
	if i := strings.Index(lines[0], "BOUND"); i < 0 || lines[3][i:i+2] != "50" || lines[2][i:i+4] != "+Inf" {
		t.Errorf("BOUND column not aligned:\n%s", r.stdout)
	}
	if got := f.requests(); len(got) != 1 || got[0].GetLimitId() != fakeLimit || got[0].GetLast() != 10 {
		t.Errorf("requests %v, want one for %s with last 10", got, fakeLimit)
	}

	// No marker, no footnote.
	r = quotactl("--allocator", addr, "windows", "tenant/quiet").want(t, 0)
	rows, foot = windowsTable(t, r.stdout)
	if len(rows) != 2 || foot != nil || strings.ContainsAny(r.stdout, "*!") {
		t.Errorf("quiet window: rows %q, footnotes %q\n%s", rows, foot, r.stdout)
	}

	// Only the running window: only its footnote.
	r = quotactl("--allocator", addr, "windows", fakeLimit, "--last", "1").want(t, 0)
	rows, foot = windowsTable(t, r.stdout)
	if len(rows) != 2 || !strings.HasSuffix(rows[1][2], "*") || !slices.Equal(foot, []string{footRunning}) {
		t.Errorf("running window: rows %q, footnotes %q", rows, foot)
	}

	// No windows yet: the header alone.
	r = quotactl("--allocator", addr, "windows", "tenant/new").want(t, 0)
	if rows, foot = windowsTable(t, r.stdout); len(rows) != 1 || foot != nil {
		t.Errorf("no windows: %q", r.stdout)
	}
}

func TestWindowsJSON(t *testing.T) {
	f := newWindowsFake()
	addr := startFakeAdmin(t, f)

	// --json anywhere: before the command, or after the ID.
	for _, args := range [][]string{
		{"--json", "--allocator", addr, "windows", fakeLimit},
		{"windows", fakeLimit, "--json", "--allocator", addr},
	} {
		r := quotactl(args...).want(t, 0)
		var got []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%v: not JSON: %v\n%s", args, err, r.stdout)
		}
		if len(got) != 4 {
			t.Fatalf("%d windows, want 4\n%s", len(got), r.stdout)
		}
		keys := []string{"admitted", "admitted_total", "bound", "closed", "fallback", "fallback_admitted", "granted",
			"limit", "limit_tokens", "observed_overshoot", "returned", "stranded", "terms", "window_end", "window_start"}
		termKeys := []string{"carry_over", "fallback", "limit_lowered", "lost_grants", "redis_rollback", "settlement"}
		for i, w := range got {
			k := sortedKeys(w)
			if i == 0 {
				// standing only where there are standing shares
				k = slices.DeleteFunc(k, func(s string) bool { return s == "standing" })
			}
			if !slices.Equal(k, keys) {
				t.Errorf("window %d keys %q, want %q", i, k, keys)
			}
			terms, _ := w["terms"].(map[string]any)
			if k := sortedKeys(terms); !slices.Equal(k, termKeys) {
				t.Errorf("window %d terms keys %q, want %q", i, k, termKeys)
			}
		}
		// JSON numbers decode as float64.
		checkJSON := func(i int, want map[string]any) {
			t.Helper()
			for k, v := range want {
				if !reflect.DeepEqual(got[i][k], v) {
					t.Errorf("window %d %s = %#v, want %#v", i, k, got[i][k], v)
				}
			}
		}
		checkJSON(0, map[string]any{
			"limit": fakeLimit, "window_start": "2026-11-29T19:30:00.000Z", "window_end": "2026-11-29T19:31:00.000Z",
			"closed": true, "limit_tokens": 1000.0, "granted": 1000.0, "standing": 20.0, "returned": 0.0,
			"admitted": map[string]any{"eu": 691.0, "us": 309.0}, "admitted_total": 1000.0, "fallback_admitted": 0.0,
			"bound": 0.0, "observed_overshoot": 0.0, "stranded": 0.0, "fallback": map[string]any{},
		})
		checkJSON(1, map[string]any{
			"bound": "+Inf", "observed_overshoot": 300.0, "returned": 40.0, "fallback_admitted": 340.0,
			"fallback": map[string]any{"eu": "closed", "us": "open"},
		})
		checkJSON(2, map[string]any{
			"bound": 50.0, "observed_overshoot": 80.0, "stranded": 12.0, "granted": 1100.0,
			"admitted": map[string]any{"ap": 80.0, "eu": 600.0, "us": 400.0},
			"fallback": map[string]any{"ap": "local"},
			"terms": map[string]any{"carry_over": 1.0, "fallback": 20.0, "lost_grants": 2.0,
				"redis_rollback": 25.0, "limit_lowered": 2.0, "settlement": 0.0},
		})
		checkJSON(3, map[string]any{"closed": false, "window_end": "2026-11-29T19:34:00.000Z",
			"admitted": map[string]any{"eu": 120.0}})
	}

	// No windows: an empty array.
	r := quotactl("--json", "--allocator", addr, "windows", "tenant/new").want(t, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("no windows: %q, want []", r.stdout)
	}
}

func sortedKeys(m map[string]any) []string {
	k := make([]string, 0, len(m))
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// TestWindowsLast: --last reaches the allocator as given (default 10),
// flags before or after the ID.
func TestWindowsLast(t *testing.T) {
	f := newWindowsFake()
	addr := startFakeAdmin(t, f)
	for _, tc := range []struct {
		args []string
		last int32
		rows int
	}{
		{[]string{"windows", fakeLimit}, 10, 4},
		{[]string{"windows", fakeLimit, "--last", "2"}, 2, 2},
		{[]string{"windows", "--last=3", fakeLimit}, 3, 3},
		{[]string{"windows", "--last", "1000", "--", fakeLimit}, 1000, 4},
		{[]string{"windows", fakeLimit, "-last", "1"}, 1, 1},
	} {
		before := len(f.requests())
		r := quotactl(append([]string{"--allocator", addr}, tc.args...)...).want(t, 0)
		reqs := f.requests()[before:]
		if len(reqs) != 1 || reqs[0].GetLast() != tc.last || reqs[0].GetLimitId() != fakeLimit {
			t.Errorf("%q: requests %v, want one with last %d", tc.args, reqs, tc.last)
		}
		if rows, _ := windowsTable(t, r.stdout); len(rows)-1 != tc.rows {
			t.Errorf("%q: %d rows, want %d", tc.args, len(rows)-1, tc.rows)
		}
	}

	// The newest windows are kept if an allocator sends more than asked.
	laxAddr := startFakeAdmin(t, &laxAll{&fakeAdmin{windows: map[string][]*pb.WindowReport{
		"tenant/many": {winQuiet, winOpen, winOver, winRunning},
	}}})
	r := quotactl("--allocator", laxAddr, "windows", "tenant/many", "--last", "2").want(t, 0)
	rows, _ := windowsTable(t, r.stdout)
	if len(rows) != 3 || rows[1][1] != "2026-11-29T19:32:00.000Z" || rows[2][1] != "2026-11-29T19:33:00.000Z" {
		t.Errorf("kept rows %q, want the newest two", rows)
	}
}

// laxAll sends every window whatever last says, newest first.
type laxAll struct{ *fakeAdmin }

func (l *laxAll) ListWindows(ctx context.Context, req *pb.ListWindowsRequest) (*pb.ListWindowsResponse, error) {
	ws := slices.Clone(l.windows[req.GetLimitId()])
	slices.Reverse(ws)
	return &pb.ListWindowsResponse{Windows: ws}, nil
}

// TestWindowsUsage: bad command lines exit 2 with one line and send
// nothing.
func TestWindowsUsage(t *testing.T) {
	f := newWindowsFake()
	addr := startFakeAdmin(t, f)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"windows"}, "quotactl: windows: missing ID"},
		{[]string{"windows", ""}, "quotactl: windows: missing ID"},
		{[]string{"windows", "--last", "5"}, "quotactl: windows: missing ID"},
		{[]string{"windows", "a", "b"}, `quotactl: windows: unexpected argument "b" (one ID at a time)`},
		{[]string{"windows", fakeLimit, "--last", "0"}, `quotactl: windows: --last "0": want a whole number from 1 to 1000`},
		{[]string{"windows", fakeLimit, "--last", "1001"}, `quotactl: windows: --last "1001": want a whole number from 1 to 1000`},
		{[]string{"windows", fakeLimit, "--last", "-1"}, `--last "-1": want a whole number from 1 to 1000`},
		{[]string{"windows", fakeLimit, "--last", "ten"}, `--last "ten": want a whole number from 1 to 1000`},
		{[]string{"windows", fakeLimit, "--last", "99999999999"}, `--last "99999999999": want a whole number from 1 to 1000`},
		{[]string{"windows", fakeLimit, "--last"}, "quotactl: windows: --last needs a value"},
		{[]string{"windows", fakeLimit, "--bogus"}, "quotactl: windows: unknown flag --bogus"},
		{[]string{"windows", "bad\xffid"}, `quotactl: windows: ID "bad\xffid": want UTF-8 text`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := quotactl(append([]string{"--allocator", addr}, tc.args...)...).want(t, 2)
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tc.want)
			}
		})
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("usage errors sent %d requests", n)
	}

	r := quotactl("windows", "--help").want(t, 0)
	for _, w := range []string{"Usage: quotactl windows ID [--last N]", "--last N", "+Inf", "--allocator ADDR"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("help lacks %q:\n%s", w, r.stdout)
		}
	}
}

// TestWindowsFailures: the allocator's refusals and absence exit 1 with
// one line and nothing on stdout.
func TestWindowsFailures(t *testing.T) {
	addr := startFakeAdmin(t, newWindowsFake())
	old := startFakeAdmin(t, &fakeAdmin{unimplemented: true})
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"not found", []string{"--allocator", addr, "windows", "tenant/none"},
			[]string{`quotactl: windows: no limit "tenant/none"`, "not found"}},
		{"not found json", []string{"--allocator", addr, "--json", "windows", "tenant/none"},
			[]string{`no limit "tenant/none"`}},
		{"unimplemented", []string{"--allocator", old, "windows", fakeLimit},
			[]string{"allocator " + old + " does not serve this request"}},
		{"unreachable", []string{"--allocator", closedAddr(t), "--timeout", "500ms", "windows", fakeLimit},
			[]string{"unavailable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := quotactl(tc.args...).want(t, 1)
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("took %v", el)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q", r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q, want it to contain %q", r.stderr, w)
				}
			}
		})
	}
}

// TestWindowsRedirect: a follower answers UNAVAILABLE naming the leader in
// the leasehold-leader trailer; quotactl asks the leader once.
func TestWindowsRedirect(t *testing.T) {
	leader := newWindowsFake()
	leaderAddr := startFakeAdmin(t, leader)
	follower := &fakeAdmin{leader: leaderAddr}
	followerAddr := startFakeAdmin(t, follower)

	r := quotactl("--allocator", followerAddr, "windows", fakeLimit, "--last", "3", "--json").want(t, 0)
	var got []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 3 {
		t.Fatalf("via follower: %v, %d windows\n%s", err, len(got), r.stdout)
	}
	fr, lr := follower.requests(), leader.requests()
	if len(fr) != 1 || len(lr) != 1 || lr[0].GetLast() != 3 || lr[0].GetLimitId() != fakeLimit {
		t.Errorf("follower got %v, leader got %v; want one each, last 3", fr, lr)
	}

	// The leader's NOT_FOUND is passed on.
	r = quotactl("--allocator", followerAddr, "windows", "tenant/none").want(t, 1)
	if !strings.Contains(r.stderr, `no limit "tenant/none"`) {
		t.Errorf("stderr %q", r.stderr)
	}

	// Two replicas naming each other: one redirect, then a failure naming
	// both.
	aLis := listenLoopback(t)
	aAddr := aLis.Addr().String()
	b := &fakeAdmin{leader: aAddr}
	bAddr := startFakeAdmin(t, b)
	a := &fakeAdmin{leader: bAddr}
	serveFakeAdmin(t, aLis, a)
	r = quotactl("--allocator", aAddr, "--timeout", "2s", "windows", fakeLimit).want(t, 1)
	if !strings.Contains(r.stderr, "allocator "+bAddr+" (leader named by "+aAddr+") unavailable") {
		t.Errorf("stderr %q", r.stderr)
	}
	if na, nb := len(a.requests()), len(b.requests()); na != 1 || nb != 1 {
		t.Errorf("requests: %d and %d, want 1 and 1", na, nb)
	}
}

// TestWindowsShadow: a limit in shadow mode gets the WOULD_DENY columns
// (per region, and the number of requests), in the table and in JSON;
// other limits' output is as before (TestWindowsTable).
func TestWindowsShadow(t *testing.T) {
	shadow := &pb.WindowReport{
		LimitId: "tenant/try", WindowStart: winAt(0), WindowEnd: winAt(1), Closed: true,
		LimitTokens: 1000, Granted: 1000, Admitted: map[string]int64{"eu": 700, "us": 300}, AdmittedTotal: 1000,
		Terms: &pb.BoundTerms{}, Shadow: true,
		WouldDeny: map[string]int64{"us": 40, "eu": 210}, WouldDenyTotal: 250, WouldDenyChecks: 125,
	}
	addr := startFakeAdmin(t, &fakeAdmin{windows: map[string][]*pb.WindowReport{"tenant/try": {shadow}}})
	r := quotactl("--allocator", addr, "windows", "tenant/try").want(t, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("output:\n%s", r.stdout)
	}
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	wantHead := append(slices.Clone(windowsHeader), "WOULD_DENY", "WOULD_DENY_CHECKS")
	wantRow := []string{"tenant/try", "2026-11-29T19:30:00.000Z", "2026-11-29T19:31:00.000Z", "1000", "1000", "0",
		"eu=700,us=300", "1000", "0", "0", "0", "0", "eu=210,us=40", "125"}
	if !slices.Equal(head, wantHead) || !slices.Equal(row, wantRow) {
		t.Fatalf("table:\n%s\nwant %q\n     %q", r.stdout, wantHead, wantRow)
	}
	r = quotactl("--allocator", addr, "windows", "tenant/try", "--json").want(t, 0)
	for _, want := range []string{`"shadow": true`, `"would_deny": {` + "\n" + `      "eu": 210,` + "\n" + `      "us": 40` + "\n    }",
		`"would_deny_total": 250`, `"would_deny_checks": 125`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("JSON lacks %q:\n%s", want, r.stdout)
		}
	}
}
