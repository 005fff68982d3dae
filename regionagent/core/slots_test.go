package core

import (
	"testing"
	"time"
)

// TestFallbackSlots: a region installs a fallback share of its own only
// with the allocator unreachable, no share of its own in force and a
// local fallback; it holds A slots for one share ttl, under the last
// share's seq (at least 1) so that the allocator's next share replaces it.
func TestFallbackSlots(t *testing.T) {
	local := Limit{ID: "c/a", Slots: 3, TTL: 10 * time.Second, Mode: ModeBounded,
		Fallback: Fallback{Kind: FallbackLocal, LocalTokens: 2}}
	closed := local
	closed.Fallback = Fallback{Kind: FallbackClosed}
	inForce := SlotPlan{Seq: 7, N: 3, Admit: 3, Deadline: t0.Add(time.Second)}
	expired := SlotPlan{Seq: 7, N: 3, Admit: 3, Deadline: t0}
	for _, c := range []struct {
		name      string
		p         SlotPlan
		l         Limit
		allocDown bool
		ok        bool
		seq, n    int64
	}{
		{"allocator up", expired, local, false, false, 0, 0},
		{"a share of its own in force", inForce, local, true, false, 0, 0},
		{"closed fallback", expired, closed, true, false, 0, 0},
		{"unset fallback", expired, Limit{ID: "c/a", Slots: 3, TTL: time.Second}, true, false, 0, 0},
		{"local, after a share", expired, local, true, true, 7, 2},
		{"local, never a share", SlotPlan{}, local, true, true, 1, 2},
	} {
		p := c.p
		seq, n, dl, ok := p.FallbackSlots(c.l, c.allocDown, t0)
		if ok != c.ok || seq != c.seq || n != c.n {
			t.Errorf("%s: seq %d, n %d, ok %v; want %d, %d, %v", c.name, seq, n, ok, c.seq, c.n, c.ok)
		}
		if ok && !dl.Equal(t0.Add(10*time.Second)) {
			t.Errorf("%s: deadline %v, want now + the share ttl", c.name, dl)
		}
		if p != c.p {
			t.Errorf("%s: the plan changed: %+v", c.name, p)
		}
	}
}
