package explore

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

var (
	large     = flag.Bool("explore.large", false, "explore the large scopes too (minutes to hours)")
	maxStates = flag.Int("explore.max-states", 0, "stop each large scope at this many distinct states (0: explore it all)")
)

func exploreClean(t *testing.T, sc Scope) {
	t.Helper()
	res, err := Explore(sc)
	if err != nil {
		t.Fatal(err)
	}
	cut := ""
	if res.Truncated {
		cut = fmt.Sprintf(" (stopped at %d states: depth %d not explored in full)", sc.MaxStates, res.MaxDepth)
	}
	t.Logf("scope %s: %d distinct states, %d transitions, depth %d, %v%s", sc.Name, res.States, res.Transitions,
		res.MaxDepth, res.Elapsed.Round(1e6), cut)
	if res.Violation != nil {
		t.Fatalf("%v\nshortest trace (%d events):\n%s", res.Violation, len(res.Trace), res.Replayable())
	}
	if res.MaxDepth != sc.Depth && !res.Truncated {
		t.Fatalf("explored to depth %d of %d: the scope ran out of events", res.MaxDepth, sc.Depth)
	}
}

// The clean build breaks no invariant in any state of the CI scopes.
func TestCIScopes(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector slows exploration tenfold: make test explores the CI scopes in a build without it")
	}
	for _, sc := range CIScopes {
		t.Run(sc.Name, func(t *testing.T) { exploreClean(t, sc) })
	}
}

// Under the race detector: every CI scope, shallower (the explorer's own
// code and the cores it drives, raced).
func TestCIScopesShallow(t *testing.T) {
	for _, sc := range CIScopes {
		sc.Depth = min(sc.Depth, 5)
		t.Run(sc.Name, func(t *testing.T) { exploreClean(t, sc) })
	}
}

func TestLargeScopes(t *testing.T) {
	if !*large {
		t.Skip("run with -explore.large")
	}
	for _, sc := range LargeScopes {
		sc.MaxStates = *maxStates
		t.Run(sc.Name, func(t *testing.T) { exploreClean(t, sc) })
	}
}

// The first violation the explorer found in the product (LeaderDeep): a
// return's credit went back to the pool at once, a grant made from it
// committed in a later batch before the return's own, and etcd held 3
// tokens granted net of returns for G = 2 (had the return's commit been
// lost with the term, for good). Credits now reach the pool only once
// durable (allocator.Core.Credit); the trace must replay clean.
func TestCreditAfterCommit(t *testing.T) {
	v, err := Replay(LeaderDeepScope, "check eu/0; serve eu-0#1; advance t0+500ms; advance t0+2000ms; check eu/0; "+
		"commit 0; deliver eu-0#1; serve eu-0#2; serve eu-0#3; commit 2")
	if err != nil {
		t.Fatal(err)
	}
	if v != nil {
		t.Fatal(v)
	}
}

// MaxStates stops an exploration and says so.
func TestMaxStates(t *testing.T) {
	sc := LossyScope
	sc.MaxStates = 500
	res, err := Explore(sc)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || res.States < 500 || res.MaxDepth >= sc.Depth {
		t.Fatalf("%+v", res)
	}
}

// Exploring twice gives the same counts: nothing depends on map order,
// timing or the number of workers.
func TestExploreDeterministic(t *testing.T) {
	sc := LossyScope
	sc.Depth = 5
	a, err := Explore(sc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Explore(sc)
	if err != nil {
		t.Fatal(err)
	}
	if a.States != b.States || a.Transitions != b.Transitions || a.States < 100 {
		t.Fatalf("two explorations: %d/%d and %d/%d states/transitions", a.States, a.Transitions, b.States, b.Transitions)
	}
}

// Equal states reached by different orders are explored once: two Checks
// in different regions commute.
func TestStatesMerge(t *testing.T) {
	sc := LossyScope
	d := func(trace string) digest {
		t.Helper()
		w, err := run(&sc, mustParse(t, trace), false)
		if err != nil {
			t.Fatal(err)
		}
		w.nextTimer()
		return digestOf(w)
	}
	if d("check eu/0; check us/0") != d("check us/0; check eu/0") {
		t.Fatal("two independent Checks in either order reach different digests")
	}
	if d("check eu/0; serve eu-0#1") == d("check eu/0") {
		t.Fatal("serving a call did not change the state")
	}
}

func TestTraceRoundTrip(t *testing.T) {
	tr := "check eu/0; advance t0+4999ms; serve eu-0#1; commit 1; deliver eu-0#1; drop-request us-0#2; drop-answer eu-1#3; retry eu-0#4; fail us-0#5; " +
		"leader; redis-down us; redis-up us; redis-timeout eu; rollback eu; limit 3; restart eu/1; sync eu/1"
	evs, err := ParseTrace(tr)
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatTrace(evs); got != tr {
		t.Fatalf("round trip:\n%s\n%s", got, tr)
	}
	for _, bad := range []string{"jump", "check xx/0", "check eu", "advance soon", "serve x", "serve 3", "redis-down mars"} {
		if _, err := ParseTrace(bad); err == nil {
			t.Errorf("ParseTrace(%q) accepted it", bad)
		}
	}
}

// Replay refuses events the state does not allow, naming the event.
func TestReplayRefusesImpossible(t *testing.T) {
	for _, tr := range []string{"serve eu-0#1", "check eu/1", "check eu/0; deliver eu-0#1", "advance t0+1ms", "redis-up eu",
		"check eu/0; serve eu-0#1; retry eu-0#1; retry eu-0#1", "check eu/0; serve eu-0#1; deliver eu-0#1; retry eu-0#1"} {
		if _, err := Replay(LossyScope, tr); err == nil || !strings.Contains(err.Error(), "not possible") {
			t.Errorf("Replay(%q) = %v, want an event that is not possible", tr, err)
		}
	}
	if v, err := Replay(LossyScope, "check eu/0; serve eu-0#1; deliver eu-0#1; check us/0; serve us-0#1; deliver us-0#1"); err != nil || v != nil {
		t.Fatalf("a clean trace: %v, %v", v, err)
	}
}

func mustParse(t *testing.T, s string) []Event {
	t.Helper()
	tr, err := ParseTrace(s)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}
