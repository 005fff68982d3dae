package main

import (
	"strings"
	"testing"
	"time"
)

// TestUnreachable: an allocator that cannot be reached fails the operation
// (exit 1) with one line naming it, within --timeout.
func TestUnreachable(t *testing.T) {
	// A port nobody listens on: connection refused.
	refused := closedAddr(t)

	// A port that accepts TCP and never speaks: only the deadline ends the
	// wait, so this checks that --timeout covers connecting.
	silent := silentAddr(t)

	for _, tc := range []struct{ name, addr, want string }{
		{"refused", refused, "unavailable"},
		{"silent", silent, "--timeout 500ms"},
	} {
		for _, args := range [][]string{
			{"limits", "get", "tenant/atlas"},
			{"limits", "list"},
			{"windows", "tenant/atlas", "--last", "5"},
			{"--json", "limits", "delete", "--reason", "test", "tenant/atlas"},
			{"limits", "set", "--reason", "test", "tenant/atlas", "--limit", "5", "--window", "1m", "--regions", "eu", "--mode", "strict"},
		} {
			t.Run(tc.name+" "+strings.Join(args, " "), func(t *testing.T) {
				start := time.Now()
				r := quotactl(append([]string{"--allocator", tc.addr, "--timeout", "500ms"}, args...)...).want(t, 1)
				if el := time.Since(start); el > 5*time.Second {
					t.Errorf("took %v with --timeout 500ms", el)
				}
				if !strings.Contains(r.stderr, "allocator "+tc.addr) || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("stderr %q, want it to name allocator %s and %q", r.stderr, tc.addr, tc.want)
				}
				if r.stdout != "" {
					t.Errorf("stdout %q", r.stdout)
				}
			})
		}
	}
}
