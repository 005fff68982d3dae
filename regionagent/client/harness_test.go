package client

import (
	"context"
	"testing"
	"time"

	"leasehold/regionagent/client/clienttest"
)

// t0 is the start of a 10 s window (and of every shorter divisor).
var t0 = time.Unix(1_700_000_000, 0)

const testLimit = "tenant/a"

// rig is a client and a fake agent on one fake clock. The client has no
// background sweeper: tests call sweep with the clock.
type rig struct {
	t     *testing.T
	clock *clienttest.Clock
	agent *clienttest.Agent
	c     *Client
}

// newRig: setup configures the agent before it serves (limits, hooks).
func newRig(t *testing.T, setup func(*clienttest.Agent), opts ...Option) *rig {
	t.Helper()
	clk := clienttest.NewClock(t0)
	ag := clienttest.NewAgent(clk.Now)
	ag.SetLimit(testLimit, 1000, 10*time.Second, 5*time.Second)
	if setup != nil {
		setup(ag)
	}
	target, dialer := ag.Serve(t)
	base := []Option{WithDialOptions(dialer), WithClock(clk.Now), withoutSweeper(), WithTimeout(5 * time.Second)}
	c, err := New(target, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return &rig{t: t, clock: clk, agent: ag, c: c}
}

func (r *rig) allow(cost int64) Decision {
	r.t.Helper()
	d, err := r.c.Allow(context.Background(), testLimit, cost)
	if err != nil {
		r.t.Fatalf("Allow: %v", err)
	}
	return d
}

// settle waits for the client's background refills and releases.
func (r *rig) settle() { r.c.bg.Wait() }

// sweep runs the sweeper's usual pass (the limits listed as holding
// something) at the clock's now and waits for the releases it started.
func (r *rig) sweep() {
	r.c.sweepHeld(r.c.mono())
	r.settle()
}

// hot drives the limit at perSecond (cost 1 each, the clock advancing
// between calls) for d, settling background work after each call, and
// counts decisions by source.
func (r *rig) hot(perSecond int, d time.Duration) map[Source]int {
	r.t.Helper()
	step := time.Second / time.Duration(perSecond)
	n := int(d / step)
	out := map[Source]int{}
	for range n {
		dec := r.allow(1)
		out[dec.Source]++
		r.settle()
		r.clock.Advance(step)
	}
	return out
}

func (r *rig) reservations() []clienttest.Reservation { return r.agent.Reservations() }
