//go:build leasehold_seeded

package explore

import (
	"slices"
	"testing"

	"leasehold/internal/seeded"
)

// Every seeded bug must be found by exploring a CI scope, as a violation
// of the invariant it breaks, with a shortest trace that replays to the
// same violation. The clean build's exploration (TestCIScopes) must find
// none: together they show the invariants are checked, not assumed.
func TestSeededBugsFound(t *testing.T) {
	cases := []struct {
		bug   seeded.Bug
		scope Scope
		want  []string // the invariants that may report it first
	}{
		{seeded.NoClamp, LossyScope, []string{"clamp"}},
		{seeded.SpendAtDeadline, LossyScope, []string{"spend-before-deadline"}},
		{seeded.RegrantRetry, LossyScope, []string{"idempotency", "pool"}},
		{seeded.NoFence, LeaderScope, []string{"fencing"}},
		{seeded.DoubleCredit, LossyScope, []string{"pool"}},
		{seeded.UncountedFallback, FallbackScope, []string{"bound"}},
	}
	if len(cases) != len(seeded.All()) {
		t.Fatalf("%d cases for %d seeded bugs", len(cases), len(seeded.All()))
	}
	for _, c := range cases {
		t.Run(c.bug.String(), func(t *testing.T) {
			seeded.Arm(c.bug)
			defer seeded.Arm(seeded.None)
			res, err := Explore(c.scope)
			if err != nil {
				t.Fatal(err)
			}
			if res.Violation == nil {
				t.Fatalf("%s: not found in scope %s (%d states)", c.bug, c.scope.Name, res.States)
			}
			t.Logf("%s: found in %s after %d states, %v, trace of %d events:\n%s", c.bug, c.scope.Name, res.States,
				res.Elapsed.Round(1e6), len(res.Trace), res.Replayable())
			if !slices.Contains(c.want, res.Violation.Invariant) {
				t.Fatalf("%s: reported as %s, want one of %v", c.bug, res.Violation, c.want)
			}
			v, err := Replay(c.scope, FormatTrace(res.Trace))
			if err != nil {
				t.Fatal(err)
			}
			if v == nil || *v != *res.Violation {
				t.Fatalf("the trace replays to %v, want %v", v, res.Violation)
			}
		})
	}
}
