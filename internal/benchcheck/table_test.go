package main

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCompare(t *testing.T) {
	floor := result{decisions: 50000, elapsed: time.Second, p50: 100 * time.Microsecond, cpu: time.Second}
	agent := result{decisions: 25000, elapsed: time.Second, p50: 150 * time.Microsecond, cpu: 750 * time.Millisecond}
	got := compare(agent, floor)
	want := ratios{throughput: 0.5, p50: 1.5, cpu: 1.5} // 30 µs against 20 µs per decision
	if math.Abs(got.throughput-want.throughput) > 1e-9 || math.Abs(got.p50-want.p50) > 1e-9 || math.Abs(got.cpu-want.cpu) > 1e-9 {
		t.Errorf("compare = %+v, want %+v", got, want)
	}
	// A floor that measured nothing gives no ratio rather than +Inf or 0.
	if got := compare(agent, result{}); !math.IsNaN(got.throughput) || !math.IsNaN(got.p50) || !math.IsNaN(got.cpu) {
		t.Errorf("compare against an empty floor = %+v, want NaNs", got)
	}
	if got := (result{decisions: 10}).cpuPer(); got != 0 {
		t.Errorf("cpuPer with no CPU = %v", got)
	}
	if got := (result{}).rate(); got != 0 {
		t.Errorf("rate of nothing = %v", got)
	}
}

func TestWriteTable(t *testing.T) {
	bc := benchCase{api: "Check", kind: "warm", keys: 10000, callers: 64}
	floor := result{decisions: 200000, elapsed: 4 * time.Second, p50: 1200 * time.Microsecond,
		p99: 3 * time.Millisecond, cpu: 4 * time.Second}
	agent := result{decisions: 120000, notOK: 3, elapsed: 4 * time.Second, p50: 2 * time.Millisecond,
		p99: 9 * time.Millisecond, cpu: 3 * time.Second, redis: 1200 * time.Millisecond, alloc: 400 * time.Millisecond,
		redisCmds: 30000, grants: 12}
	vs := compare(agent, floor)
	var b strings.Builder
	if err := writeTable(&b, []row{{c: bc, server: "noop", r: floor}, {c: bc, server: "agent", r: agent, vs: &vs}}); err != nil {
		t.Fatal(err)
	}
	want := `| api   | keys        | callers | server | decisions | decisions/s | p50      | p99      | CPU/decision | Redis CPU/dec | alloc CPU/dec | Redis cmds/dec | grants/dec | not OK | throughput vs noop | p50 vs noop | CPU vs noop |
|-------|-------------|---------|--------|-----------|-------------|----------|----------|--------------|---------------|---------------|----------------|------------|--------|--------------------|-------------|-------------|
| Check | 10,000 warm | 64      | noop   | 200,000   | 50,000/s    | 1,200 µs | 3,000 µs | 20.0 µs      | -             | -             | -              | -          | 0.00 % | -                  | -           | -           |
| Check | 10,000 warm | 64      | agent  | 120,000   | 30,000/s    | 2,000 µs | 9,000 µs | 25.0 µs      | 10.0 µs       | 3.3 µs        | 0.250          | 0.000      | 0.00 % | 60 %               | 1.67x       | 1.25x       |
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{thousands(0), "0"},
		{thousands(999.6), "1,000"},
		{thousands(1234567), "1,234,567"},
		{thousands(-12345), "-12,345"},
		{micros(18500 * time.Nanosecond), "18.5 µs"},
		{micros(1234 * time.Microsecond), "1,234 µs"},
		{percent(1, 400), "0.25 %"},
		{percent(0, 0), "-"},
		{pct(0.554), "55 %"},
		{pct(math.NaN()), "n/a"},
		{times(1.456), "1.46x"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	stat := "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 1234 0 0\n"
	got, err := parseStatCPU([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want { // 325 ticks of 10 ms
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 2"} {
		if _, err := parseStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseStatCPU(%q) took it", bad)
		}
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if p50, p99 := quantile(ds, 0.5), quantile(ds, 0.99); p50 != 51 || p99 != 100 {
		t.Errorf("p50, p99 = %v, %v; want 51, 100", p50, p99)
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing")
	}
}

func TestCasesAndKeySets(t *testing.T) {
	c := config{keys: 3, callers: []int{1, 64}, apis: []string{"check", "envoy"}}
	cs := cases(c)
	if len(cs) != 16 {
		t.Fatalf("%d cases, want 16: %v", len(cs), cs)
	}
	if cs[0] != (benchCase{api: "Check", kind: "hot", keys: 1, callers: 1}) || cs[15] != (benchCase{api: "Envoy", kind: "cold", keys: 3, callers: 64}) {
		t.Errorf("cases %v", cs)
	}
	if busy := cs[4]; busy.kind != "busy" || busy.keys != 3 || busy.set() != "warm" || cs[14].set() != "cold-envoy-1" {
		t.Errorf("busy case %v uses set %q; Envoy's cold case uses %q", busy, busy.set(), cs[14].set())
	}
	sets := keySets(c)
	if len(sets) != 6 { // hot, warm, and four cold sets
		t.Fatalf("sets %v", sets)
	}
	seen := map[string]bool{}
	for _, ks := range sets {
		for _, k := range ks {
			if seen[k] {
				t.Errorf("key %s in two sets", k)
			}
			seen[k] = true
		}
	}
	if got := sets["cold-envoy-64"]; len(got) != 3 || got[2] != "cold-envoy-64-00002" {
		t.Errorf("cold-envoy-64 = %v", got)
	}
}

// TestDriveBounds runs the driver against deciders that answer at once:
// it stops at its count, uses each key once when asked, stops at its time
// bound, and counts denials and errors as not OK.
func TestDriveBounds(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	used := map[string]int{}
	record := func(_ context.Context, k string) (bool, error) {
		mu.Lock()
		used[k]++
		mu.Unlock()
		return true, nil
	}
	r, err := drive(ctx, []decider{record}, load{keys: []string{"a", "b", "c"}, callers: 4, max: 1000, dur: time.Minute, once: true})
	if err != nil || r.decisions != 3 || used["a"] != 1 || used["b"] != 1 || used["c"] != 1 {
		t.Errorf("once: %+v, %v, used %v", r, err, used)
	}
	r, _ = drive(ctx, []decider{record}, load{keys: []string{"a"}, callers: 3, max: 500, dur: time.Minute})
	if r.decisions != 500 {
		t.Errorf("count bound: %d decisions, want 500", r.decisions)
	}

	var calls atomic.Int64
	slow := func(context.Context, string) (bool, error) {
		time.Sleep(time.Millisecond)
		// The first call fails, and every second one after it: a loaded
		// machine may fit a single call in the time bound.
		if calls.Add(1)%2 == 1 {
			return false, errors.New("boom")
		}
		return false, nil
	}
	start := time.Now()
	r, err = drive(ctx, []decider{slow, slow}, load{keys: []string{"a"}, callers: 2, max: 1 << 30, dur: 50 * time.Millisecond})
	if time.Since(start) > 2*time.Second || r.decisions == 0 || r.notOK != r.decisions || r.errors == 0 || err == nil {
		t.Errorf("time bound: %+v, %v after %v", r, err, time.Since(start))
	}
}

func TestCommandCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=2400,usec_per_call=20.00,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hgetall:calls=30,usec=30,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n"
	got, by, err := commandCalls(info)
	if err != nil || got != 150 || by["evalsha"] != 120 || by["hgetall"] != 30 || by["info"] != 0 {
		t.Errorf("commandCalls = %d, %v, %v; want 150 (INFO left out)", got, by, err)
	}
	if top := topCommands(map[string]int64{"evalsha": 20}, by, 100, 1); top != "evalsha 1.000" {
		t.Errorf("topCommands = %q", top)
	}
	if _, _, err := commandCalls("cmdstat_get:calls=x,usec=1\r\n"); err == nil {
		t.Error("commandCalls of a bad count: no error")
	}
}

func TestMetricSum(t *testing.T) {
	text := `# HELP leasehold_lease_grants_total Leases granted.
# TYPE leasehold_lease_grants_total counter
leasehold_lease_grants_total{region="eu"} 40
leasehold_lease_grants_total{region="us"} 2
leasehold_lease_grants_total_other 1000
leasehold_lease_granted_tokens_total{region="eu"} 7
`
	got, err := metricSum(strings.NewReader(text), "leasehold_lease_grants_total")
	if err != nil || got != 42 {
		t.Errorf("metricSum = %d, %v; want 42", got, err)
	}
	if _, err := metricSum(strings.NewReader("leasehold_lease_grants_total{a=\"b\"} x\n"), "leasehold_lease_grants_total"); err == nil {
		t.Error("metricSum of a bad value: no error")
	}
}
