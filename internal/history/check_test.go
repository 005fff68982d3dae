package history

import (
	"bytes"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// The hand-built histories: limit "t/a", G = 100 per 10 s, window k = 100
// ([1000 s, 1010 s) on the allocator's clock), regions eu and us. The
// recorders' own clocks stand at 900 s: the allocator recorded from a
// whole window before k.
const (
	lim = "t/a"
	G   = 100
	k   = 100
)

var (
	W      = int64(10 * time.Second)
	kStart = k * W
	kEnd   = (k + 1) * W
	t0     = time.Unix(900, 0)
)

func at(d time.Duration) int64 { return kStart + int64(d) }

func grant(region, req string, tokens int64, expiresAfter time.Duration) Record {
	return Record{Kind: KindGrant, T: at(0), Region: region, Limit: lim, Window: k, WindowLen: W, G: G, Request: req,
		Lease: "100/" + region + "/" + req, Tokens: tokens, Start: kStart, Expiry: at(expiresAfter), End: kEnd}
}

func ret(region, req string, unspent, credited int64) Record {
	return Record{Kind: KindReturn, T: at(6 * time.Second), Region: region, Limit: lim, Window: k,
		Lease: "100/" + region + "/" + req, Unspent: unspent, Credited: credited, Code: "ok"}
}

func admit(region string, cost int64, after time.Duration) Record {
	return Record{Kind: KindDecision, T: at(after), Spend: at(after - time.Millisecond), Region: region, Limit: lim,
		Window: k, WindowLen: W, G: G, Cost: cost, Answer: AnswerOK, Path: PathRedis}
}

func denied(region string) Record {
	return Record{Kind: KindDecision, T: at(9 * time.Second), Region: region, Limit: lim, Window: k, WindowLen: W, G: G,
		Cost: 1, Answer: AnswerOverLimit, Path: PathRedis}
}

func fallback(region, kind string, a, cost int64) Record {
	r := admit(region, cost, 8*time.Second)
	r.Fallback, r.Cap = kind, a
	return r
}

// file is what a recorder of p writes with recs, closed (an end record)
// unless open.
func file(t *testing.T, p Process, open bool, recs ...Record) []byte {
	t.Helper()
	var b bytes.Buffer
	r, err := NewRecorder(&b, p, WithRecorderClock(func() time.Time { return t0 }))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Durable(recs...); err != nil {
		t.Fatal(err)
	}
	if open {
		return bytes.Clone(b.Bytes()) // killed: no end record
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// baseline is a clean window: eu granted 60 (returns 10 unspent) and
// admits 50, us granted 40 and admits 40.
func baseline() (alloc, eu, us []Record) {
	alloc = []Record{grant("eu", "e1", 60, 5*time.Second), grant("us", "u1", 40, 5*time.Second), ret("eu", "e1", 10, 10)}
	eu = []Record{admit("eu", 30, time.Second), admit("eu", 20, 4*time.Second), denied("eu")}
	us = []Record{admit("us", 40, 2*time.Second)}
	return alloc, eu, us
}

func historyOf(t *testing.T, alloc, eu, us []Record) *History {
	t.Helper()
	fsys := fstest.MapFS{
		"allocator.jsonl": {Data: file(t, Process{Name: "alloc-1", Role: RoleAllocator}, false, alloc...)},
		"eu.jsonl":        {Data: file(t, Process{Name: "eu-1", Role: RoleAgent, Region: "eu"}, false, eu...)},
		"us.jsonl":        {Data: file(t, Process{Name: "us-1", Role: RoleAgent, Region: "us"}, false, us...)},
	}
	h, err := ReadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCheckCleanHistoryIsCertified(t *testing.T) {
	alloc, eu, us := baseline()
	rep := Check(historyOf(t, alloc, eu, us), nil)
	if !rep.Certified() {
		t.Fatalf("not certified: %v %v", rep.Violations, rep.Incomplete)
	}
	if rep.Runs != 3 || rep.Ended != 3 || rep.Decisions != 4 || rep.Admits != 3 || rep.Grants != 2 || rep.Returns != 1 ||
		rep.Windows != 1 || rep.Uncovered != 0 {
		t.Errorf("counts: %s", rep.Summary())
	}
	// The same window, stated strict: still certified.
	rep = Check(historyOf(t, alloc, eu, us), map[string]Limit{lim: {G: G, Window: 10 * time.Second, Strict: true}})
	if !rep.Certified() {
		t.Fatalf("strict: not certified: %v", rep.Violations)
	}
}

// TestCheckViolations breaks each invariant in turn on the baseline.
func TestCheckViolations(t *testing.T) {
	type edit func(alloc, eu, us *[]Record)
	cases := []struct {
		name   string
		edit   edit
		limits map[string]Limit
		want   []Invariant
		detail string // in the first violation
	}{
		{name: "budget: a grant past G", want: []Invariant{Budget},
			edit:   func(a, _, _ *[]Record) { *a = append(*a, grant("us", "u2", 20, 5*time.Second)) },
			detail: "net granted 110 (granted 120 - credited 10) > G 100"},
		{name: "budget: credited more than unspent", want: []Invariant{Budget},
			edit:   func(a, _, _ *[]Record) { (*a)[2].Credited = 20 },
			detail: `lease "100/eu/e1" of 60 tokens returned 10 unspent, 20 credited`},
		{name: "idempotency: one request id, two token counts", want: []Invariant{Idempotency},
			edit: func(a, _, _ *[]Record) {
				g := grant("us", "u1", 39, 5*time.Second)
				g.Replayed = true
				*a = append(*a, g)
			}},
		{name: "idempotency: one request id, two leases", want: []Invariant{Idempotency},
			edit: func(a, _, _ *[]Record) {
				g := grant("us", "u1", 40, 5*time.Second)
				g.Lease, g.Window, g.Start, g.Expiry, g.End = "101/us/u1", k+1, kEnd, kEnd+int64(5*time.Second), kEnd+W
				*a = append(*a, g)
			}},
		{name: "idempotency: a return credited twice", want: []Invariant{Idempotency},
			edit: func(a, _, _ *[]Record) { *a = append(*a, ret("eu", "e1", 10, 10)) }},
		{name: "idempotency: a retried return answers otherwise", want: []Invariant{Idempotency},
			edit: func(a, _, _ *[]Record) {
				r := ret("eu", "e1", 10, 0)
				r.Duplicate = true
				*a = append(*a, r)
			}},
		{name: "clamp: a lease outlives its window", want: []Invariant{Clamp},
			edit:   func(a, _, _ *[]Record) { (*a)[1].Expiry = kEnd + 1 },
			detail: "1ns after its window's end"},
		{name: "clamp: a lease starts before its window", want: []Invariant{Clamp},
			edit: func(a, _, _ *[]Record) { (*a)[1].Start = kStart - int64(time.Second) }},
		{name: "leased: a region spends past its leases", want: []Invariant{Leased},
			edit:   func(_, eu, _ *[]Record) { *eu = append(*eu, admit("eu", 1, 4*time.Second)) },
			detail: "admitted 51 from leases; granted 60 in 1 leases, 10 returned unspent: 50 leased"},
		{name: "leased: a region with no lease admits", want: []Invariant{Leased},
			edit: func(a, _, us *[]Record) { *a = (*a)[:1:1]; *a = append(*a, ret("eu", "e1", 10, 10)) }},
		{name: "deadline: an admit after the last lease expired", want: []Invariant{Deadline},
			edit: func(_, eu, _ *[]Record) {
				(*eu)[1].T, (*eu)[1].Spend = at(5*time.Second+time.Second), at(5*time.Second+20*time.Millisecond)
			},
			detail: "1 admits after the region's last lease expired"},
		{name: "deadline: an admit before the first lease started", want: []Invariant{Deadline},
			edit: func(a, _, _ *[]Record) {
				(*a)[1].Start = at(3 * time.Second) // us's lease starts at 3 s, us admitted at 2 s
			}},
		{name: "promise: a strict limit admits under a fallback", want: []Invariant{Promise, Promise},
			limits: map[string]Limit{lim: {G: G, Strict: true}},
			edit:   func(_, _, us *[]Record) { *us = append(*us, fallback("us", FallbackOpen, 0, 15)) }},
		{name: "promise: past a local fallback's A", want: []Invariant{Promise},
			edit:   func(_, _, us *[]Record) { *us = append(*us, fallback("us", FallbackLocal, 10, 15)) },
			detail: "admitted 15 under its fallback, which allows 10"},
		{name: "promise: the stated fallback, not the agent's", want: []Invariant{Promise},
			limits: map[string]Limit{lim: {G: G, Fallback: map[string]string{"us": "local:5"}}},
			edit:   func(_, _, us *[]Record) { *us = append(*us, fallback("us", FallbackOpen, 0, 15)) }},
		{name: "promise: admitted past G although each region kept to its leases", want: []Invariant{Budget, Promise},
			edit: func(a, eu, us *[]Record) {
				*a = append(*a, grant("us", "u2", 30, 5*time.Second))
				*us = append(*us, admit("us", 30, 3*time.Second))
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			alloc, eu, us := baseline()
			c.edit(&alloc, &eu, &us)
			rep := Check(historyOf(t, alloc, eu, us), c.limits)
			var got []Invariant
			for _, v := range rep.Violations {
				got = append(got, v.Invariant)
			}
			if !equalSets(got, c.want) {
				t.Fatalf("violations %v, want %v: %v", got, c.want, rep.Violations)
			}
			if c.detail != "" && !strings.Contains(rep.Violations[0].String(), c.detail) {
				t.Errorf("violation %q, want it to say %q", rep.Violations[0], c.detail)
			}
			if rep.Certified() {
				t.Error("certified")
			}
		})
	}
}

func equalSets(a, b []Invariant) bool {
	if len(a) != len(b) {
		return false
	}
	n := map[Invariant]int{}
	for _, x := range a {
		n[x]++
	}
	for _, x := range b {
		n[x]--
	}
	for _, c := range n {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestCheckTolerance(t *testing.T) {
	alloc, eu, us := baseline()
	// eu's last spend was sent 5 ms after its lease's expiry (on another
	// host's clock): within the default tolerance, not within 1 ms.
	eu[1].T, eu[1].Spend = at(5*time.Second+6*time.Millisecond), at(5*time.Second+5*time.Millisecond)
	h := historyOf(t, alloc, eu, us)
	if rep := Check(h, nil); !rep.OK() {
		t.Errorf("default tolerance: %v", rep.Violations)
	}
	rep := Options{ClockTolerance: time.Millisecond}.Check(h)
	if len(rep.Violations) != 1 || rep.Violations[0].Invariant != Deadline {
		t.Errorf("1 ms tolerance: %v, want one deadline violation", rep.Violations)
	}
}

// TestCheckSubLeases: decisions from a chunk count in the window and
// region of their reservation, and never past it.
func TestCheckSubLeases(t *testing.T) {
	alloc, eu, us := baseline()
	res := Record{Kind: KindReserve, T: at(time.Second), Region: "eu", Limit: lim, Window: k, WindowLen: W, G: G,
		Reservation: "ag-eu-1", Tokens: 5, Expiry: at(4 * time.Second)}
	chunk := func(cost int64) Record {
		return Record{Kind: KindDecision, T: at(2 * time.Second), Region: "eu", Limit: lim, WindowLen: W, G: G, Cost: cost,
			Answer: AnswerOK, Path: PathChunk, Reservation: "ag-eu-1"}
	}
	eu[0].Cost = 25 // 25 + 5 from the chunk + 20 = 50, what eu was leased
	eu = append(eu, res, chunk(3), chunk(2))
	if rep := Check(historyOf(t, alloc, eu, us), nil); !rep.Certified() {
		t.Fatalf("%v %v", rep.Violations, rep.Incomplete)
	}
	// One more from the chunk: past the reservation, and past eu's leases.
	eu = append(eu, chunk(1))
	rep := Check(historyOf(t, alloc, eu, us), nil)
	if got := invariants(rep); !equalSets(got, []Invariant{Leased, Leased}) {
		t.Fatalf("violations %v", rep.Violations)
	}
	// A gateway's sub-lease decision whose reservation the history lost.
	us = append(us, Record{Kind: KindDecision, T: at(2 * time.Second), Limit: lim, WindowLen: W, G: G, Cost: 1,
		Answer: AnswerOK, Path: PathSubLease, Reservation: "gw-x-1"})
	rep = Check(historyOf(t, alloc, eu[:len(eu)-1], us), nil)
	if !rep.OK() || len(rep.Incomplete) != 1 || !strings.Contains(rep.Incomplete[0], "1 sub-lease admits") {
		t.Errorf("unresolved sub-lease decision: %v %v", rep.Violations, rep.Incomplete)
	}
}

func invariants(rep Report) []Invariant {
	var out []Invariant
	for _, v := range rep.Violations {
		out = append(out, v.Invariant)
	}
	return out
}

// TestCheckTruncated: a killed process's history has no end record (and
// may end in a cut line); the checker finds what it can and does not
// certify.
func TestCheckTruncated(t *testing.T) {
	alloc, eu, us := baseline()
	euFile := file(t, Process{Name: "eu-1", Role: RoleAgent, Region: "eu"}, true, eu...)
	euFile = append(euFile, `{"kind":"decision","t":17`...) // cut mid-line
	fsys := fstest.MapFS{
		"allocator.jsonl": {Data: file(t, Process{Name: "alloc-1", Role: RoleAllocator}, false, alloc...)},
		"eu.jsonl":        {Data: euFile},
		"us.jsonl":        {Data: file(t, Process{Name: "us-1", Role: RoleAgent, Region: "us"}, false, us...)},
	}
	h, err := ReadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(h, nil)
	if !rep.OK() || rep.Certified() || rep.Ended != 2 || len(rep.Incomplete) != 1 ||
		!strings.Contains(rep.Incomplete[0], "eu-1 (eu.jsonl:1)") {
		t.Errorf("ok %v certified %v ended %d incomplete %q", rep.OK(), rep.Certified(), rep.Ended, rep.Incomplete)
	}
}

// TestCheckUncovered: a window that began less than one W after the
// allocators began to record may have leases granted before: what its
// regions were leased is not checked (the promise still is).
func TestCheckUncovered(t *testing.T) {
	_, eu, us := baseline() // no grant recorded ...
	var b bytes.Buffer
	r, _ := NewRecorder(&b, Process{Name: "alloc-1", Role: RoleAllocator},
		WithRecorderClock(func() time.Time { return time.Unix(0, kStart-W/2) })) // ... and recording began mid-window k-1
	_ = r.Close()
	fsys := fstest.MapFS{
		"allocator.jsonl": {Data: b.Bytes()},
		"eu.jsonl":        {Data: file(t, Process{Name: "eu-1", Role: RoleAgent, Region: "eu"}, false, eu...)},
		"us.jsonl":        {Data: file(t, Process{Name: "us-1", Role: RoleAgent, Region: "us"}, false, us...)},
	}
	h, err := ReadFS(fsys)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(h, nil)
	if !rep.Certified() || rep.Uncovered != 1 {
		t.Errorf("uncovered window: %v, %s", rep.Violations, rep.Summary())
	}
	us = append(us, admit("us", 11, 3*time.Second)) // 101 > G: the promise is checked
	fsys["us.jsonl"] = &fstest.MapFile{Data: file(t, Process{Name: "us-1", Role: RoleAgent, Region: "us"}, false, us...)}
	h, _ = ReadFS(fsys)
	if rep := Check(h, nil); !equalSets(invariants(rep), []Invariant{Promise}) {
		t.Errorf("uncovered window past G: %v", rep.Violations)
	}
}
