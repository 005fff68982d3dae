package client

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client/clienttest"
)

// TestDenialCacheSteps: after an OVER_LIMIT with retry_after 400 ms (the
// pool is spent) the limit is denied locally until then, and the agent is
// asked again after; a cost within the balance the denial reported still
// asks. A denial with a retry_after under the 250 ms floor (the region is
// briefly dry while it renews) is not cached.
func TestDenialCacheSteps(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 5, 10*time.Second, time.Second)
		a.DenyRetryAfter = 400 * time.Millisecond
	})
	r.allow(4) // 1 left
	type step struct {
		at      time.Duration // after t0
		cost    int64
		allowed bool
		src     Source
		retry   time.Duration // for cached answers
	}
	for i, s := range []step{
		{0, 2, false, SourceAgent, 0}, // denied: 1 left, retry 400ms
		{0, 2, false, SourceDenialCache, 400 * time.Millisecond},
		{100 * time.Millisecond, 3, false, SourceDenialCache, 300 * time.Millisecond},
		{399 * time.Millisecond, 2, false, SourceDenialCache, time.Millisecond},
		{399 * time.Millisecond, 1, true, SourceAgent, 0},  // within the reported balance: asks
		{400 * time.Millisecond, 2, false, SourceAgent, 0}, // expired: asks (and is denied again)
		{450 * time.Millisecond, 2, false, SourceDenialCache, 350 * time.Millisecond},
	} {
		r.clock.Set(t0.Add(s.at))
		d := r.allow(s.cost)
		if d.Allowed != s.allowed || d.Source != s.src {
			t.Fatalf("step %d (%+v): got allowed=%v source=%v", i, s, d.Allowed, d.Source)
		}
		if s.src == SourceDenialCache && (d.RetryAfter != s.retry || d.Reason != pb.Reason_REASON_OVER_LIMIT || d.Limit != 5) {
			t.Fatalf("step %d: cached answer %+v, want retry %v", i, d, s.retry)
		}
	}

	short := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 1, 10*time.Second, time.Second)
		a.DenyRetryAfter = 100 * time.Millisecond
	})
	short.allow(1)
	for i := range 3 {
		if d := short.allow(1); d.Allowed || d.Source != SourceAgent {
			t.Fatalf("short retry-after, call %d: %+v (a brief dryness must not be cached)", i, d)
		}
	}
}

// TestDenialCacheEndsAtTheWindow: the agent jitters a spent pool's
// retry_after past the window's reset; the cached denial still ends at the
// reset, so the first Check of the next window asks the agent (and is
// admitted by the new pool) instead of being refused OVER_LIMIT.
func TestDenialCacheEndsAtTheWindow(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) {
		a.SetLimit(testLimit, 1, 10*time.Second, time.Second)
		a.DenyRetryAfter = 4400 * time.Millisecond // the reset (4 s) plus a tenth
	})
	r.clock.Set(t0.Add(6 * time.Second))
	r.allow(1)
	if d := r.allow(1); d.Allowed || d.Source != SourceAgent || d.RetryAfter != 4400*time.Millisecond {
		t.Fatalf("spent pool: %+v", d)
	}
	r.clock.Set(t0.Add(9900 * time.Millisecond))
	if d := r.allow(1); d.Allowed || d.Source != SourceDenialCache || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("before the reset: %+v, want the cached denial ending at the reset", d)
	}
	r.clock.Set(t0.Add(10 * time.Second))
	if d := r.allow(1); !d.Allowed || d.Source != SourceAgent {
		t.Fatalf("the next window's first Check: %+v, want the agent's new pool to admit it", d)
	}
}

func TestWithoutDenialCache(t *testing.T) {
	r := newRig(t, func(a *clienttest.Agent) { a.SetLimit(testLimit, 1, 10*time.Second, time.Second) }, WithoutDenialCache())
	for range 5 {
		if d := r.allow(1); d.Source != SourceAgent {
			t.Fatalf("source %v", d.Source)
		}
	}
	if checks, _, _ := r.agent.Calls(); checks != 5 {
		t.Fatalf("%d checks", checks)
	}
}

// TestDenialCacheNeverAdmits is a property test against the fake agent:
// for random sequences of costs, clock steps, refills and retry-afters,
// every answer the cache gives is a denial, and everything the client
// admits the agent admitted (per window, exactly).
func TestDenialCacheNeverAdmits(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			g := 1 + rng.Int64N(40)
			retry := []time.Duration{0, 20 * time.Millisecond, 400 * time.Millisecond}[rng.IntN(3)]
			floor := []time.Duration{0, 250 * time.Millisecond, time.Second}[rng.IntN(3)]
			const W = time.Second
			r := newRig(t, func(a *clienttest.Agent) {
				a.SetLimit(testLimit, g, W, W)
				a.DenyRetryAfter = retry
			}, WithDenialCache(floor))
			admitted := map[int64]int64{}
			agentAnswers := 0
			for range 300 {
				r.clock.Advance(time.Duration(rng.Int64N(int64(120 * time.Millisecond))))
				if rng.IntN(20) == 0 {
					r.agent.AddTokens(testLimit, 1+rng.Int64N(3)) // a renewal the cache cannot know of
				}
				now := r.clock.Now()
				cost := 1 + rng.Int64N(min(g, 4))
				d := r.allow(cost)
				switch d.Source {
				case SourceDenialCache:
					if d.Allowed || d.Reason != pb.Reason_REASON_OVER_LIMIT {
						t.Fatalf("the cache answered %+v", d)
					}
				case SourceAgent:
					agentAnswers++
				default:
					t.Fatalf("source %v without sub-leases", d.Source)
				}
				if d.Allowed {
					admitted[now.UnixNano()/int64(W)] += cost
				}
			}
			for _, w := range r.agent.Windows(testLimit) {
				if got, want := admitted[w], r.agent.Window(testLimit, w).CheckAdmitted; got != want {
					t.Fatalf("window %d: client admitted %d, agent %d", w, got, want)
				}
			}
			if checks, _, _ := r.agent.Calls(); checks != agentAnswers {
				t.Fatalf("%d checks for %d agent answers", checks, agentAnswers)
			}
		})
	}
}
