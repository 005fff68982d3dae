package regionagent

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var b breaker
	for i := range breakerTrip {
		if !b.allow(t0) {
			t.Fatalf("call %d refused before the breaker tripped", i)
		}
		changed, up := b.done(t0, false)
		if tripped := i == breakerTrip-1; changed != tripped || up == tripped {
			t.Fatalf("failure %d: health changed %v, up %v", i, changed, up)
		}
	}
	steps := []struct {
		at      time.Duration
		allow   bool
		ok      bool // outcome when allowed
		open    bool // after
		changed bool // the allocator's health changed
	}{
		{0, false, false, true, false},                      // open: fail fast
		{249 * time.Millisecond, false, false, true, false}, // still cooling down (250ms)
		{250 * time.Millisecond, true, false, true, false},  // half-open probe fails: cooldown doubles to 500ms
		{700 * time.Millisecond, false, false, true, false}, // open until 750ms
		{750 * time.Millisecond, true, false, true, false},  // fails: 1s, the cap
		{1749 * time.Millisecond, false, false, true, false},
		{1750 * time.Millisecond, true, false, true, false}, // fails: still 1s
		{2750 * time.Millisecond, true, true, false, true},  // probe succeeds: closed, the allocator is back
		{2751 * time.Millisecond, true, true, false, false},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		got := b.allow(now)
		if got != s.allow {
			t.Fatalf("step %d at +%v: allow %v, want %v", i, s.at, got, s.allow)
		}
		if got {
			changed, _ := b.done(now, s.ok)
			if changed != s.changed {
				t.Fatalf("step %d at +%v: health changed %v, want %v", i, s.at, changed, s.changed)
			}
		}
		if o := b.open(now); o != s.open {
			t.Fatalf("step %d at +%v: open %v, want %v", i, s.at, o, s.open)
		}
	}
	// Only one probe at a time while half-open.
	var c breaker
	for range breakerTrip {
		c.allow(t0)
		c.done(t0, false)
	}
	later := t0.Add(breakerMax)
	if !c.allow(later) || c.allow(later) {
		t.Fatal("two probes admitted at once")
	}
}
