package core

import (
	"testing"
	"time"
)

// TestPhasedWindows: a limit with a phase offset of 17 s next to an
// aligned one, both of one-minute windows. The agent names each limit's
// windows from its own schedule, its estimate of the allocator's clock
// (taken from the phased grant's window end less window_left) stays
// exact, leases are clamped to each window's own end, and the phased
// limit's budget comes back at t0+17s while the aligned one's does not.
func TestPhasedWindows(t *testing.T) {
	const s = time.Second
	aligned := strictLimit("aligned", 10, time.Minute, time.Minute)
	phased := strictLimit("phased", 10, time.Minute, time.Minute)
	phased.Phase = 17 * s
	w := newWorld(t, 1000, phased, aligned)
	w.advance(5 * s)
	// The phased limit's grant comes first: it sets the clock estimate.
	for _, l := range []Limit{phased, aligned} {
		for i := range 10 {
			wantAnswer(t, l.ID+" within G", w.check(l.ID, 1), true, ReasonOK)
			if i == 0 {
				if got, want := w.c.WindowOf(w.now, &phased), phased.Windows().Of(w.now); got != want {
					t.Fatalf("agent names phased window %+v, want %+v", got, want)
				}
			}
		}
		a := w.check(l.ID, 1)
		wantAnswer(t, l.ID+" over G", a, false, ReasonOverLimit)
		end := l.Windows().Of(w.now).End()
		if a.ResetAfter != end.Sub(w.now) {
			t.Errorf("%s: reset_after %v, want %v (to its own window's end)", l.ID, a.ResetAfter, end.Sub(w.now))
		}
	}
	if got, want := w.c.WindowOf(w.now, &aligned), aligned.Windows().Of(w.now); got != want {
		t.Fatalf("agent names aligned window %+v, want %+v", got, want)
	}
	for _, d := range w.deposits {
		l := aligned
		if d.Limit == phased.ID {
			l = phased
		}
		if win := l.Windows().ByIndex(d.Key.Window); d.Deadline.After(win.End()) {
			t.Errorf("%s lease deadline %v after its window's end %v", d.Limit, d.Deadline.Sub(t0), win.End().Sub(t0))
		}
	}
	// At t0+17s the phased limit resets; the aligned one does not.
	w.advance(11 * s) // t0+16s
	wantAnswer(t, "phased 1 s before its boundary", w.check("phased", 1), false, ReasonOverLimit)
	w.advance(s + time.Millisecond) // t0+17s+1ms
	wantAnswer(t, "phased after its boundary", w.check("phased", 1), true, ReasonOK)
	wantAnswer(t, "aligned before its boundary", w.check("aligned", 1), false, ReasonOverLimit)
	last := w.deposits[len(w.deposits)-1]
	if last.Limit != "phased" || last.Key.Window != phased.Windows().Of(w.now).Index ||
		last.Deadline.After(t0.Add(77*s)) {
		t.Fatalf("the phased window's lease: %+v", last)
	}
	// At t0+60s the aligned limit resets.
	w.advance(43 * s) // t0+60s+1ms
	wantAnswer(t, "aligned after its boundary", w.check("aligned", 1), true, ReasonOK)
}
