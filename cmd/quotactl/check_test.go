package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

const fakeLimit = "tenant/atlas"

// fakeAgent is a RegionAgent with a rule the test controls and no clock of
// its own: in each window of length w (aligned to the Unix epoch, read from
// time.Now), it admits the first budget tokens, then the next fallback
// tokens under REASON_FALLBACK, then denies OVER_LIMIT. It records what it
// admitted per window so the test can compare quotactl's attribution.
type fakeAgent struct {
	pb.UnimplementedRegionAgentServer
	w                time.Duration
	budget, fallback int64
	unavailableEvery int64 // every n-th call is denied UNAVAILABLE (0: never)
	errorEvery       int64 // every n-th call fails RESOURCE_EXHAUSTED (0: never)
	delay            time.Duration

	mu       sync.Mutex
	calls    int64
	ids      map[string]bool
	admitted map[int64]int64 // admitted cost by window index (start / w)
	spent    map[int64]int64 // budget and fallback spent by window index
}

func (f *fakeAgent) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if req.GetLimitId() != fakeLimit {
		return nil, status.Errorf(codes.NotFound, "limit_id: unknown limit %q", req.GetLimitId())
	}
	cost := max(req.GetCost(), 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.ids[req.GetRequestId()] = true
	if f.errorEvery > 0 && f.calls%f.errorEvery == 0 {
		return nil, status.Error(codes.ResourceExhausted, "injected")
	}
	now := time.Now()
	idx := now.UnixNano() / int64(f.w)
	resp := &pb.CheckResponse{
		ResetAfter:  durationpb.New(time.Duration((idx+1)*int64(f.w) - now.UnixNano())),
		Window:      durationpb.New(f.w),
		LimitTokens: f.budget,
	}
	spent := f.spent[idx]
	switch {
	case f.unavailableEvery > 0 && f.calls%f.unavailableEvery == 0:
		resp.Reason = pb.Reason_REASON_UNAVAILABLE
	case spent+cost <= f.budget:
		resp.Allowed, resp.Reason = true, pb.Reason_REASON_OK
	case spent+cost <= f.budget+f.fallback:
		resp.Allowed, resp.Reason = true, pb.Reason_REASON_FALLBACK
	default:
		resp.Reason = pb.Reason_REASON_OVER_LIMIT
	}
	if resp.Allowed {
		f.spent[idx] = spent + cost
		f.admitted[idx] += cost
	}
	return resp, nil
}

func (f *fakeAgent) stats() (calls int64, ids int, admitted map[int64]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	admitted = map[int64]int64{}
	for k, v := range f.admitted {
		admitted[k] = v
	}
	return f.calls, len(f.ids), admitted
}

// startFake serves f on a loopback port until the test ends.
func startFake(t *testing.T, f *fakeAgent, opts ...grpc.ServerOption) string {
	t.Helper()
	if f.w == 0 {
		f.w = 200 * time.Millisecond
	}
	f.ids, f.admitted, f.spent = map[string]bool{}, map[int64]int64{}, map[int64]int64{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	pb.RegisterRegionAgentServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// checkOut is the JSON summary, decoded strictly.
type checkOut struct {
	Limit               string             `json:"limit"`
	Agent               string             `json:"agent"`
	Cost                int64              `json:"cost"`
	Calls               int64              `json:"calls"`
	AdmittedRequests    int64              `json:"admitted_requests"`
	AdmittedCost        int64              `json:"admitted_cost"`
	Denied              map[string]int64   `json:"denied"`
	FallbackRequests    int64              `json:"fallback_requests"`
	FallbackCost        int64              `json:"fallback_cost"`
	Errors              map[string]int64   `json:"errors"`
	DurationSeconds     float64            `json:"duration_seconds"`
	CallsPerSecond      float64            `json:"calls_per_second"`
	LatencyMS           map[string]float64 `json:"latency_ms"`
	Stopped             string             `json:"stopped"`
	StopError           string             `json:"stop_error"`
	UnwindowedResponses int64              `json:"unwindowed_responses"`
	Windows             []struct {
		WindowStart      string           `json:"window_start"`
		WindowSeconds    float64          `json:"window_seconds"`
		AdmittedRequests int64            `json:"admitted_requests"`
		AdmittedCost     int64            `json:"admitted_cost"`
		Denied           map[string]int64 `json:"denied"`
		FallbackRequests int64            `json:"fallback_requests"`
		FallbackCost     int64            `json:"fallback_cost"`
	} `json:"windows"`
}

// decodeCheck parses the JSON summary and checks that every documented key
// is present.
func decodeCheck(t *testing.T, out string) checkOut {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"limit", "agent", "calls", "admitted_requests", "admitted_cost", "denied",
		"fallback_requests", "fallback_cost", "errors", "duration_seconds", "calls_per_second",
		"latency_ms", "windows", "stopped"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON lacks %q:\n%s", k, out)
		}
	}
	var lat map[string]json.RawMessage
	if err := json.Unmarshal(raw["latency_ms"], &lat); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"p50", "p90", "p99", "max"} {
		if _, ok := lat[k]; !ok {
			t.Errorf("latency_ms lacks %q", k)
		}
	}
	var ws []map[string]json.RawMessage
	if err := json.Unmarshal(raw["windows"], &ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		for _, k := range []string{"window_start", "window_seconds", "admitted_requests", "admitted_cost", "denied", "fallback_cost"} {
			if _, ok := w[k]; !ok {
				t.Errorf("window lacks %q", k)
			}
		}
	}
	var c checkOut
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	return c
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// checkWindows asserts what must hold of any run against the fake: totals
// add up, windows are distinct, sorted and aligned to w, and no window
// admitted more than the fake allows.
func checkWindows(t *testing.T, c checkOut, f *fakeAgent) {
	t.Helper()
	if got := c.AdmittedRequests + sum(c.Denied) + sum(c.Errors); got != c.Calls {
		t.Errorf("admitted %d + denied %v + errors %v != calls %d", c.AdmittedRequests, c.Denied, c.Errors, c.Calls)
	}
	if c.AdmittedCost != c.AdmittedRequests*c.Cost || c.FallbackCost != c.FallbackRequests*c.Cost {
		t.Errorf("costs %d/%d do not match requests %d/%d at cost %d", c.AdmittedCost, c.FallbackCost, c.AdmittedRequests, c.FallbackRequests, c.Cost)
	}
	if c.FallbackRequests > c.AdmittedRequests {
		t.Errorf("fallback %d > admitted %d (fallback admits are part of admitted)", c.FallbackRequests, c.AdmittedRequests)
	}
	var adm, admCost, fb, answered int64
	var prev time.Time
	seen := map[string]bool{}
	for _, w := range c.Windows {
		start, err := time.Parse(checkTime, w.WindowStart)
		if err != nil {
			t.Fatalf("window_start %q: %v", w.WindowStart, err)
		}
		if !strings.HasSuffix(w.WindowStart, "Z") || len(w.WindowStart) != len("2006-01-02T15:04:05.000Z") {
			t.Errorf("window_start %q: want RFC 3339 UTC with milliseconds", w.WindowStart)
		}
		if seen[w.WindowStart] {
			t.Errorf("window %s twice", w.WindowStart)
		}
		seen[w.WindowStart] = true
		if !prev.IsZero() && !start.After(prev) {
			t.Errorf("windows not sorted: %s after %s", w.WindowStart, prev.Format(checkTime))
		}
		prev = start
		if w.WindowSeconds != f.w.Seconds() {
			t.Errorf("window_seconds %v, want %v", w.WindowSeconds, f.w.Seconds())
		}
		if start.UnixNano()%int64(f.w) != 0 {
			t.Errorf("window %s not aligned to %v", w.WindowStart, f.w)
		}
		if w.AdmittedCost > f.budget+f.fallback || w.FallbackCost > f.fallback {
			t.Errorf("window %s admitted cost %d (fallback %d), the fake allows %d (+%d)", w.WindowStart, w.AdmittedCost, w.FallbackCost, f.budget, f.fallback)
		}
		if _, ok := w.Denied["OVER_LIMIT"]; !ok {
			t.Errorf("window %s: denied lacks OVER_LIMIT: %v", w.WindowStart, w.Denied)
		}
		adm += w.AdmittedRequests
		admCost += w.AdmittedCost
		fb += w.FallbackCost
		answered += w.AdmittedRequests + sum(w.Denied)
	}
	if adm != c.AdmittedRequests || admCost != c.AdmittedCost || fb != c.FallbackCost {
		t.Errorf("windows add up to %d requests, cost %d, fallback %d; totals %d, %d, %d", adm, admCost, fb, c.AdmittedRequests, c.AdmittedCost, c.FallbackCost)
	}
	if answered+c.UnwindowedResponses != c.Calls-sum(c.Errors) {
		t.Errorf("windows hold %d answers (+%d unwindowed), want %d", answered, c.UnwindowedResponses, c.Calls-sum(c.Errors))
	}
}

// TestCheckWindows: concurrent, paced calls over several 200ms windows. The
// totals add up, every window is aligned and within the fake's budget, and
// (when latency is well under W/2) each window's admitted cost is exactly
// what the fake admitted in it.
func TestCheckWindows(t *testing.T) {
	f := &fakeAgent{budget: 10, fallback: 4, unavailableEvery: 13}
	addr := startFake(t, f)
	r := quotactl("check", "--agent", addr, "--limit", fakeLimit, "--count", "240", "--workers", "4",
		"--rate", "200", "--cost", "2", "--json").want(t, 0)
	c := decodeCheck(t, r.stdout)
	if c.Calls != 240 || c.Stopped != "count" || c.Limit != fakeLimit || c.Agent != addr || c.Cost != 2 {
		t.Errorf("calls %d, stopped %q, limit %q, agent %q, cost %d", c.Calls, c.Stopped, c.Limit, c.Agent, c.Cost)
	}
	if len(c.Errors) != 0 || c.StopError != "" {
		t.Errorf("errors %v, stop_error %q", c.Errors, c.StopError)
	}
	if c.Denied["OVER_LIMIT"] == 0 || c.Denied["UNAVAILABLE"] == 0 || c.FallbackRequests == 0 {
		t.Errorf("want some of each outcome: denied %v, fallback %d", c.Denied, c.FallbackRequests)
	}
	checkWindows(t, c, f)
	if len(c.Windows) < 3 {
		t.Errorf("%d windows in ~1.2s of 200ms windows", len(c.Windows))
	}
	calls, ids, admitted := f.stats()
	if calls != 240 || ids != 240 {
		t.Errorf("the fake saw %d calls with %d distinct request ids, want 240", calls, ids)
	}
	if c.CallsPerSecond <= 0 || c.CallsPerSecond > 260 || c.DurationSeconds < 1 {
		t.Errorf("calls_per_second %v over %vs at --rate 200", c.CallsPerSecond, c.DurationSeconds)
	}
	l := c.LatencyMS
	if !(l["p50"] <= l["p90"] && l["p90"] <= l["p99"] && l["p99"] <= l["max"] && l["max"] > 0) {
		t.Errorf("latency_ms %v", l)
	}
	if l["max"] >= f.w.Seconds()*1e3/2 {
		t.Logf("max latency %vms: skipping the exact per-window comparison", l["max"])
		return
	}
	got := map[int64]int64{}
	for _, w := range c.Windows {
		start, _ := time.Parse(checkTime, w.WindowStart)
		got[start.UnixNano()/int64(f.w)] = w.AdmittedCost
	}
	for idx, cost := range admitted {
		if got[idx] != cost {
			t.Errorf("window %d: quotactl counted admitted cost %d, the fake admitted %d", idx, got[idx], cost)
		}
	}
	for idx, cost := range got {
		if admitted[idx] != cost {
			t.Errorf("window %d: quotactl counted admitted cost %d, the fake admitted %d", idx, cost, admitted[idx])
		}
	}
}

// TestCheckHuman: the human summary has its "key: value" lines and a table
// with one aligned row per window.
func TestCheckHuman(t *testing.T) {
	f := &fakeAgent{budget: 3}
	addr := startFake(t, f)
	r := quotactl("check", "--limit", fakeLimit, "--agent", addr, "--duration", "700ms", "--rate", "50", "--workers", "2").want(t, 0)
	head, table, ok := strings.Cut(r.stdout, "\n\n")
	if !ok {
		t.Fatalf("no blank line between summary and table:\n%s", r.stdout)
	}
	m := kv(t, head)
	for _, k := range []string{"limit", "agent", "cost", "calls", "admitted", "denied", "fallback", "errors", "duration", "rate", "latency", "stopped"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary lacks %q:\n%s", k, r.stdout)
		}
	}
	calls, err := strconv.ParseInt(m["calls"], 10, 64)
	if err != nil || calls < 10 || calls > 36 {
		t.Errorf("calls %q in 700ms at --rate 50", m["calls"])
	}
	if m["stopped"] != "duration" || m["errors"] != "0" || m["limit"] != fakeLimit {
		t.Errorf("stopped %q, errors %q, limit %q", m["stopped"], m["errors"], m["limit"])
	}
	if !strings.Contains(m["denied"], "OVER_LIMIT ") || !strings.Contains(m["denied"], "UNAVAILABLE 0") {
		t.Errorf("denied %q", m["denied"])
	}
	for _, k := range []string{"p50 ", "p90 ", "p99 ", "max "} {
		if !strings.Contains(m["latency"], k) {
			t.Errorf("latency %q lacks %q", m["latency"], k)
		}
	}
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "WINDOW_START W ADMITTED ADMITTED_COST OVER_LIMIT UNAVAILABLE FALLBACK FALLBACK_COST" {
		t.Fatalf("table header %q", lines[0])
	}
	if len(lines) < 4 {
		t.Fatalf("%d windows in 700ms of 200ms windows:\n%s", len(lines)-1, table)
	}
	var total int64
	for _, line := range lines[1:] {
		fs := strings.Fields(line)
		if len(fs) != 8 {
			t.Fatalf("row %q", line)
		}
		start, err := time.Parse(checkTime, fs[0])
		if err != nil || start.UnixNano()%int64(f.w) != 0 || fs[1] != "200ms" {
			t.Errorf("row %q: start not aligned to 200ms or wrong W", line)
		}
		cost, _ := strconv.ParseInt(fs[3], 10, 64)
		if cost > f.budget {
			t.Errorf("row %q: admitted cost over the budget %d", line, f.budget)
		}
		total += cost
		if strings.Index(line, fs[1]) != strings.Index(lines[0], " W ")+1 {
			t.Errorf("row %q not aligned with the header", line)
		}
	}
	if want := "requests, cost " + strconv.FormatInt(total, 10); !strings.HasSuffix(m["admitted"], want) {
		t.Errorf("admitted %q, the windows add up to cost %d", m["admitted"], total)
	}
}

// TestCheckBounds: --count stops at N exactly; --duration stops in time;
// whichever comes first wins; without either, one call.
func TestCheckBounds(t *testing.T) {
	f := &fakeAgent{budget: 1 << 40}
	addr := startFake(t, f)
	for _, tc := range []struct {
		name    string
		args    []string
		calls   int64 // exact, or 0 to check max
		max     int64
		stopped string
		within  time.Duration
	}{
		{"default one call", nil, 1, 0, "count", 5 * time.Second},
		{"count", []string{"--count", "37", "--workers", "5"}, 37, 0, "count", 5 * time.Second},
		{"count below workers, by --workers' former name", []string{"--count", "3", "--concurrency", "64"}, 3, 0, "count", 5 * time.Second},
		{"count before duration", []string{"--count", "5", "--duration", "1h"}, 5, 0, "count", 5 * time.Second},
		{"duration before count", []string{"--count", "1000000000", "--duration", "300ms", "--workers", "8"}, 0, 999_999_999, "duration", 5 * time.Second},
		{"duration default count", []string{"--duration", "300ms", "--workers", "3"}, 0, 1_000_000, "duration", 5 * time.Second},
		{"duration at a rate", []string{"--duration", "500ms", "--rate", "40", "--workers", "4"}, 0, 21, "duration", 5 * time.Second},
		{"rate below one call per run", []string{"--duration", "300ms", "--rate", "0.001"}, 1, 0, "duration", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _, _ := f.stats()
			start := time.Now()
			args := append([]string{"check", "--json", "--agent", addr, "--limit", fakeLimit}, tc.args...)
			c := decodeCheck(t, quotactl(args...).want(t, 0).stdout)
			el := time.Since(start)
			after, _, _ := f.stats()
			if el > tc.within {
				t.Errorf("took %v", el)
			}
			if tc.calls > 0 && c.Calls != tc.calls {
				t.Errorf("calls %d, want %d", c.Calls, tc.calls)
			}
			if tc.max > 0 && (c.Calls > tc.max || c.Calls < 1) {
				t.Errorf("calls %d, want 1 to %d", c.Calls, tc.max)
			}
			if after-before != c.Calls {
				t.Errorf("the fake saw %d calls, quotactl counted %d", after-before, c.Calls)
			}
			if c.Stopped != tc.stopped {
				t.Errorf("stopped %q, want %q", c.Stopped, tc.stopped)
			}
			if tc.stopped == "duration" && (c.DurationSeconds < 0.25 || c.DurationSeconds > 3) {
				t.Errorf("duration_seconds %v", c.DurationSeconds)
			}
			checkWindows(t, c, f)
		})
	}
}

// TestCheckErrors: errors by gRPC code are counted and the run goes on;
// admitted + denied + errors == calls.
func TestCheckErrors(t *testing.T) {
	f := &fakeAgent{budget: 1000, errorEvery: 4}
	addr := startFake(t, f)
	c := decodeCheck(t, quotactl("check", "--json", "--agent", addr, "--limit", fakeLimit, "--count", "40").want(t, 0).stdout)
	if c.Calls != 40 || c.Errors["ResourceExhausted"] != 10 || c.AdmittedRequests != 30 || len(c.Errors) != 1 {
		t.Errorf("calls %d, admitted %d, errors %v; want 40, 30, ResourceExhausted 10", c.Calls, c.AdmittedRequests, c.Errors)
	}
	checkWindows(t, c, f)

	r := quotactl("check", "--agent", addr, "--limit", fakeLimit, "--count", "8").want(t, 0)
	if m := kv(t, strings.SplitN(r.stdout, "\n\n", 2)[0]); m["errors"] != "2 (ResourceExhausted 2)" {
		t.Errorf("errors %q", m["errors"])
	}
}

// TestCheckFailures: an agent that cannot be reached, or does not know the
// limit, fails the run (exit 1) with one line, within about --timeout, and
// prints no summary.
func TestCheckFailures(t *testing.T) {
	refused := closedAddr(t)
	silent := silentAddr(t)
	f := &fakeAgent{budget: 5}
	agent := startFake(t, f)

	for _, tc := range []struct {
		name, addr, limit string
		extra             []string
		want              []string
	}{
		{"refused", refused, fakeLimit, nil, []string{"agent " + refused + " unavailable"}},
		// The first failure stops the run: how many of the 16 workers had a
		// call in flight by then varies (TestFailureCountsCalls words it).
		{"refused long run", refused, fakeLimit, []string{"--duration", "1h", "--workers", "16"}, []string{"agent " + refused + " unavailable"}},
		{"silent", silent, fakeLimit, []string{"--duration", "1m", "--workers", "4"}, []string{"agent " + silent, "no answer within --timeout 500ms"}},
		{"unknown limit", agent, "tenant/missing", []string{"--count", "50", "--workers", "4"}, []string{`limit "tenant/missing" is unknown to agent ` + agent, "NOT_FOUND"}},
		{"unknown limit json", agent, "tenant/missing", []string{"--json", "--duration", "1m"}, []string{`limit "tenant/missing" is unknown`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			args := append([]string{"--timeout", "500ms", "check", "--agent", tc.addr, "--limit", tc.limit}, tc.extra...)
			r := quotactl(args...).want(t, 1)
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("took %v with --timeout 500ms", el)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if !strings.HasPrefix(r.stderr, "quotactl: check: ") {
				t.Errorf("stderr %q", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q", r.stdout)
			}
		})
	}
}

// TestCheckInterrupt: cancelling the context (Ctrl-C) stops the run
// promptly and still prints the summary.
func TestCheckInterrupt(t *testing.T) {
	f := &fakeAgent{budget: 2, delay: 20 * time.Millisecond}
	addr := startFake(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(400*time.Millisecond, cancel)
	defer cancel()
	var o, e bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"check", "--json", "--agent", addr, "--limit", fakeLimit, "--duration", "1m", "--workers", "4"}, &o, &e)
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v after cancel at 400ms", el)
	}
	checkStderr(t, result{o.String(), e.String(), code})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, e.String())
	}
	c := decodeCheck(t, o.String())
	if c.Stopped != "interrupted" || c.Calls < 4 {
		t.Errorf("stopped %q after %d calls", c.Stopped, c.Calls)
	}
	checkWindows(t, c, f)

	// Cancelled before anything was answered: exit 1, one line.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	r := result{}
	var o2, e2 bytes.Buffer
	r.code = run(ctx2, []string{"check", "--agent", addr, "--limit", fakeLimit}, &o2, &e2)
	r.stdout, r.stderr = o2.String(), e2.String()
	r.want(t, 1)
	if !strings.Contains(r.stderr, "interrupted") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestCheckUsage: bad command lines exit 2 with one line and send nothing.
func TestCheckUsage(t *testing.T) {
	f := &fakeAgent{budget: 5}
	addr := startFake(t, f)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "quotactl: check: --limit is required"},
		{[]string{"--cost", "5"}, "quotactl: check: --limit is required"},
		{[]string{"--limit", ""}, `--limit "": want a limit id`},
		{[]string{"--limit", "x", "--cost", "0"}, `quotactl: check: --cost "0": want a whole number from 1 to 1125899906842624`},
		{[]string{"--limit", "x", "--cost", "-3"}, `--cost "-3": want a whole number from 1 to 1125899906842624`},
		{[]string{"--limit", "x", "--cost", "1125899906842625"}, `--cost "1125899906842625": want a whole number from 1 to 1125899906842624`},
		{[]string{"--limit", "x", "--cost", "1.5"}, `--cost "1.5"`},
		{[]string{"--limit", "x", "--count", "0"}, `--count "0": want a whole number, 1 or more`},
		{[]string{"--limit", "x", "--count", "many"}, `--count "many"`},
		{[]string{"--limit", "x", "--workers", "0"}, `--workers "0": want a whole number from 1 to 1024`},
		{[]string{"--limit", "x", "--workers", "1025"}, `--workers "1025": want a whole number from 1 to 1024`},
		{[]string{"--limit", "x", "--concurrency", "0"}, `--concurrency "0": want a whole number from 1 to 1024`},
		{[]string{"--limit", "x", "--duration", "5"}, `--duration "5": want a positive duration`},
		{[]string{"--limit", "x", "--duration", "0s"}, `--duration "0s"`},
		{[]string{"--limit", "x", "--duration", "-1s"}, `--duration "-1s"`},
		{[]string{"--limit", "x", "--duration", "61m"}, `--duration "61m": want a positive duration with a unit, at most 1h`},
		{[]string{"--limit", "x", "--rate", "-1"}, `--rate "-1": want a number of calls per second, 0 or more`},
		{[]string{"--limit", "x", "--rate", "NaN"}, `--rate "NaN"`},
		{[]string{"--limit", "x", "--rate", "Inf"}, `--rate "Inf"`},
		{[]string{"--limit", "x", "--rate", "fast"}, `--rate "fast"`},
		{[]string{"--limit", "x", "--agent", ""}, `--agent "": want host:port`},
		{[]string{"--limit", "x", "extra"}, `quotactl: check: unexpected argument "extra"`},
		{[]string{"--limit", "x", "--bogus"}, "quotactl: check: unknown flag --bogus"},
		{[]string{"--limit"}, "quotactl: check: --limit needs a value"},
		{[]string{"--limit", "x", "--timeout", "0s"}, `--timeout "0s": want a positive duration`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := quotactl(append([]string{"check", "--agent", addr}, tc.args...)...)
			if strings.Contains(strings.Join(tc.args, " "), "--agent") {
				r = quotactl(append([]string{"check"}, tc.args...)...)
			}
			r.want(t, 2)
			if r.stdout != "" {
				t.Errorf("stdout %q", r.stdout)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tc.want)
			}
		})
	}
	if calls, _, _ := f.stats(); calls != 0 {
		t.Errorf("usage errors sent %d calls", calls)
	}
	r := quotactl("check", "--help").want(t, 0)
	for _, w := range []string{"Usage: quotactl check --limit ID", "--agent ADDR", "--workers K", "--rate R", "--timeout DUR"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("help lacks %q", w)
		}
	}
}

// TestWindowOf: attribution rounds arrival + reset_after to the nearest
// multiple of W, and refuses what it cannot place.
func TestWindowOf(t *testing.T) {
	w := 200 * time.Millisecond
	base := time.Unix(1_700_000_000, 0) // a multiple of 200ms
	resp := func(w, reset time.Duration) *pb.CheckResponse {
		return &pb.CheckResponse{Window: durationpb.New(w), ResetAfter: durationpb.New(reset)}
	}
	for _, tc := range []struct {
		arrival time.Duration // after base
		reset   time.Duration
		start   time.Duration // after base
	}{
		{0, w, 0}, // the window just began
		{150 * time.Millisecond, 50 * time.Millisecond, 0},
		{150*time.Millisecond + 30*time.Millisecond, 50 * time.Millisecond, 0}, // 30ms late: still this window
		{150*time.Millisecond - 30*time.Millisecond, 50 * time.Millisecond, 0}, // 30ms early
		{199 * time.Millisecond, 1 * time.Millisecond, 0},
		{201 * time.Millisecond, 199 * time.Millisecond, w},
	} {
		k, ok := windowOf(resp(w, tc.reset), base.Add(tc.arrival))
		if !ok || time.Duration(k.start()-base.UnixNano()) != tc.start || k.w != int64(w) {
			t.Errorf("arrival +%v reset %v: start +%v ok %v, want +%v", tc.arrival, tc.reset, time.Duration(k.start()-base.UnixNano()), ok, tc.start)
		}
	}
	// A phased window (phase 70ms): [base+70ms, base+270ms).
	for _, tc := range []struct{ arrival, reset time.Duration }{
		{70 * time.Millisecond, w},
		{260 * time.Millisecond, 10 * time.Millisecond},
		{100 * time.Millisecond, 140*time.Millisecond + 30*time.Millisecond}, // 30ms late
	} {
		r := resp(w, tc.reset)
		r.WindowPhase = durationpb.New(70 * time.Millisecond)
		k, ok := windowOf(r, base.Add(tc.arrival))
		if got := time.Duration(k.start() - base.UnixNano()); !ok || got != 70*time.Millisecond {
			t.Errorf("phased: arrival +%v reset %v: start +%v ok %v, want +70ms", tc.arrival, tc.reset, got, ok)
		}
	}
	// Calendar months in Berlin: October 2027 lasts 745 h and ends at
	// 2027-10-31T23:00Z; answers a little early or late land in it.
	oct := time.Date(2027, 9, 30, 22, 0, 0, 0, time.UTC)
	end := time.Date(2027, 10, 31, 23, 0, 0, 0, time.UTC)
	for _, skew := range []time.Duration{0, 30 * time.Millisecond, -30 * time.Millisecond} {
		arrival := time.Date(2027, 10, 31, 1, 30, 0, 0, time.UTC)
		r := resp(745*time.Hour, end.Sub(arrival)+skew)
		r.Calendar = &pb.CalendarWindows{Unit: "month", Zone: "Europe/Berlin"}
		k, ok := windowOf(r, arrival)
		if !ok || k.start() != oct.UnixNano() || k.w != int64(745*time.Hour) {
			t.Errorf("calendar, skew %v: start %v w %v ok %v, want %v", skew, time.Unix(0, k.start()).UTC(), time.Duration(k.w), ok, oct)
		}
	}
	for _, r := range []*pb.CheckResponse{
		{},
		{Window: durationpb.New(w)},
		{Window: durationpb.New(w), ResetAfter: durationpb.New(w), Calendar: &pb.CalendarWindows{Unit: "month", Zone: "Mars/Olympus"}},
		{ResetAfter: durationpb.New(w)},
		resp(0, w),
		resp(-w, w),
		resp(w, -time.Millisecond),
		resp(w, 1<<62),
		resp(1<<62, w),
	} {
		if _, ok := windowOf(r, base); ok {
			t.Errorf("windowOf(%v) placed it", r)
		}
	}
}

// TestLatencies: quantiles within 1% and never above the maximum.
func TestLatencies(t *testing.T) {
	var l latencies
	if l.quantile(0.5) != 0 {
		t.Error("empty histogram")
	}
	for i := 1; i <= 1000; i++ {
		l.add(time.Duration(i) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.9, 900 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}} {
		got := l.quantile(tc.q)
		if d := got - tc.want; d < -tc.want/100 || d > tc.want/100 || got > l.max {
			t.Errorf("q%v = %v, want %v within 1%%", tc.q, got, tc.want)
		}
	}
	for _, d := range []time.Duration{0, 1, 127, 128, 255, 256, 1<<40 + 12345, 1<<63 - 1} {
		if v := latValue(latBucket(d)); v < d-d/100 || v-d > d/100+1 {
			t.Errorf("bucket of %v holds %v", d, v)
		}
	}
	l.add(-time.Second) // a clock step: counted as 0, no panic
}

// TestFailureCountsCalls: a run in which no call was answered names the
// first error, and how many calls failed when there were several.
func TestFailureCountsCalls(t *testing.T) {
	r := &checkRun{checkOpts: checkOpts{agent: "127.0.0.1:1"}, parent: context.Background(),
		firstErr: status.Error(codes.Unavailable, "connection refused")}
	for _, tc := range []struct {
		calls int64
		want  string
	}{
		{1, "agent 127.0.0.1:1 unavailable: connection refused"},
		{7, "agent 127.0.0.1:1 unavailable: connection refused (all 7 calls failed)"},
	} {
		if got := r.failure(&tally{calls: tc.calls}).Error(); got != tc.want {
			t.Errorf("%d calls: %q, want %q", tc.calls, got, tc.want)
		}
	}
}
