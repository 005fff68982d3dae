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
		b.done(t0, false)
	}
	steps := []struct {
		at    time.Duration
		allow bool
		ok    bool // outcome when allowed
		open  bool // after
	}{
		{0, false, false, true},                       // open: fail fast
		{499 * time.Millisecond, false, false, true},  // still cooling down (500ms)
		{500 * time.Millisecond, true, false, true},   // half-open probe fails: cooldown doubles to 1s
		{1400 * time.Millisecond, false, false, true}, // open until 1.5s
		{1500 * time.Millisecond, true, true, false},  // probe succeeds: closed
		{1501 * time.Millisecond, true, true, false},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		got := b.allow(now)
		if got != s.allow {
			t.Fatalf("step %d at +%v: allow %v, want %v", i, s.at, got, s.allow)
		}
		if got {
			b.done(now, s.ok)
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
	later := t0.Add(time.Second)
	if !c.allow(later) || c.allow(later) {
		t.Fatal("two probes admitted at once")
	}
}
