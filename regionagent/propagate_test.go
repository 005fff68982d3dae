package regionagent

import (
	"context"
	"testing"
	"time"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
)

// TestLimitChangeReachesAgent: a change scheduled for the next window
// boundary reaches the agent's decisions only after the boundary; a change
// asked for now reaches them at the next sync.
func TestLimitChangeReachesAgent(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/prop", 100, 10*time.Second, 10*time.Second, "eu")
	v1 := w.putLimit(l)
	a := w.agent("eu", "eu-1")
	ctx := context.Background()
	check := func(step string, wantG, wantVersion int64) {
		t.Helper()
		d, err := a.Check(ctx, l.Id, 1)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if d.Limit != wantG || d.Version != wantVersion {
			t.Fatalf("%s: agent decides with G %d version %d, want G %d version %d", step, d.Limit, d.Version, wantG, wantVersion)
		}
	}
	check("created", 100, v1.Version)

	// Mid-window, lower G for the next window.
	w.clock.Add(3 * time.Second)
	next := limit(l.Id, 40, 10*time.Second, 10*time.Second, "eu")
	v2, err := w.alloc.PutLimit(ctx, next, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NEXT_WINDOW})
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != v1.Version+1 {
		t.Fatalf("stored version %d, want %d", v2.Version, v1.Version+1)
	}
	w.sync(a)
	check("scheduled, before the boundary", 100, v1.Version)

	w.clock.Add(7 * time.Second) // the next window starts
	w.sync(a)
	check("after the boundary", 40, v2.Version)

	// Now: lower G again, at once.
	now := limit(l.Id, 30, 10*time.Second, 10*time.Second, "eu")
	v3, err := w.alloc.PutLimit(ctx, now, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	w.sync(a)
	check("effective now", 30, v3.Version)
}

// TestLimitChangePropagatesWithinSeconds runs the agent's own loops on the
// wall clock: a change of fallback and G applied now is in the agent's
// decisions after its next limits sync (every second by default). The
// deadline is generous; the test logs what it measured.
func TestLimitChangePropagatesWithinSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the agent's loops on the wall clock")
	}
	w := startWorld(t, false, "eu")
	l := limit("tenant/prop-live", 1000, time.Minute, 10*time.Second, "eu")
	got, err := w.alloc.PutLimit(context.Background(), l, allocator.Change{Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	a := w.liveAgent("eu", "eu-1")
	ctx := context.Background()
	waitVersion := func(version int64) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			d, err := a.Check(ctx, l.Id, 1)
			if err == nil && d.Version == version {
				return time.Since(start)
			}
			time.Sleep(20 * time.Millisecond) // polling the sync loop's effect
		}
		t.Fatalf("the agent did not decide with version %d within 10 s", version)
		return 0
	}
	waitVersion(got.Version)

	changed := limit(l.Id, 500, time.Minute, 10*time.Second, "eu")
	changed.Mode = pb.Mode_MODE_BOUNDED
	changed.Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 20}}
	v2, err := w.alloc.PutLimit(ctx, changed, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	took := waitVersion(v2.Version)
	t.Logf("the change reached the agent's decisions after %v", took)
	a.mu.Lock()
	view, ok := a.core.Limit(l.Id)
	a.mu.Unlock()
	if !ok || view.Tokens != 500 {
		t.Fatalf("agent's view after the change: %+v", view)
	}
	if fb := view.Fallback; fb.Kind != core.FallbackLocal || fb.LocalTokens != 20 {
		t.Fatalf("agent's fallback after the change: %+v", fb)
	}
}

// liveAgent starts an agent replica on the wall clock with its loops
// running (default intervals) and waits for its first limits sync.
func (w *world) liveAgent(region, replica string) *Agent {
	w.t.Helper()
	return w.liveAgentOpts(region, replica)
}
