package core

import (
	"testing"
	"time"

	"leasehold/regionagent/store"
)

func TestPlanRenewal(t *testing.T) {
	const now = int64(1_000_000)
	open := func(id string, rem, deadlineIn int64) store.OpenLease {
		return store.OpenLease{ID: id, Remaining: rem, StartMs: 0, DeadlineMs: now + deadlineIn}
	}
	base := PlanInput{NowMs: now, Left: 30 * time.Second, Rate: 10, TTL: 15 * time.Second, Lead: 2 * time.Second, Every: 250 * time.Millisecond}
	for _, tc := range []struct {
		name string
		edit func(*PlanInput)
		want Plan
	}{
		{"empty region renews", func(in *PlanInput) {}, Plan{Low: 20, Target: 150, Acquire: true}},
		{"enough held: idle", func(in *PlanInput) {
			in.Bucket.Open = []store.OpenLease{open("a", 100, 10_000)}
		}, Plan{Held: 100, Low: 20, Target: 150}},
		{"held about to expire does not count", func(in *PlanInput) {
			in.Bucket.Open = []store.OpenLease{open("a", 100, 1_500)}
		}, Plan{Held: 0, Low: 20, Target: 150, Acquire: true}},
		{"pool spent: no renewal", func(in *PlanInput) { in.Spent = true }, Plan{Low: 20, Target: 150}},
		{"replay a pending request even when spent is unknown", func(in *PlanInput) {
			in.Pending = true
			in.Bucket.Open = []store.OpenLease{open("a", 100, 10_000)}
		}, Plan{Held: 100, Low: 20, Target: 150, Acquire: true}},
		{"a big denied cost asks for itself", func(in *PlanInput) {
			in.KickCost = 500
			in.Bucket.Open = []store.OpenLease{open("a", 100, 10_000)}
		}, Plan{Held: 100, Low: 20, Target: 150, Acquire: true, Want: 500}},
		{"low water capped by the window's end", func(in *PlanInput) {
			in.Left = 500 * time.Millisecond
			in.Bucket.Open = []store.OpenLease{open("a", 6, 10_000)}
		}, Plan{Held: 6, Low: 5, Target: 5, AcquireNext: true}},
		{"surplus returned latest first, keeping the target", func(in *PlanInput) {
			in.Bucket.Open = []store.OpenLease{open("a", 100, 5_000), open("b", 200, 9_000), open("c", 120, 12_000)}
		}, Plan{Held: 420, Low: 20, Target: 150, Surplus: []store.OpenLease{open("c", 120, 12_000), open("a", 100, 5_000)}}},
		{"expired leases are closed", func(in *PlanInput) {
			in.Bucket.Expired = []store.ExpiredLease{{ID: "x", Remaining: 3}}
			in.Bucket.Open = []store.OpenLease{open("a", 100, 10_000)}
		}, Plan{Held: 100, Low: 20, Target: 150, Close: []store.ExpiredLease{{ID: "x", Remaining: 3}}}},
		{"near the window's end, a lease lasting to about its end is held", func(in *PlanInput) {
			in.Left = time.Second // heldHorizon: 1 s - 2 s/4 = 500 ms
			in.Bucket.Open = []store.OpenLease{open("a", 100, 950)}
		}, Plan{Held: 100, Low: 10, Target: 10, AcquireNext: true}},
		{"in its last quarter lead, every spendable token is held", func(in *PlanInput) {
			in.Left = 400 * time.Millisecond
			in.Bucket.Open = []store.OpenLease{open("a", 3, 50)}
		}, Plan{Held: 3, Low: 4, Target: 4, Acquire: true, AcquireNext: true}},
		{"no demand: no next window", func(in *PlanInput) {
			in.Rate, in.Left = 0, time.Second
			in.Bucket.Open = []store.OpenLease{open("a", 1, 10_000)}
		}, Plan{Held: 1, Low: 1, Target: 0}},
	} {
		in := base
		tc.edit(&in)
		got := PlanRenewal(in)
		if got.Held != tc.want.Held || got.Low != tc.want.Low || got.Target != tc.want.Target || got.Acquire != tc.want.Acquire ||
			got.Want != tc.want.Want || got.AcquireNext != tc.want.AcquireNext || len(got.Close) != len(tc.want.Close) ||
			!sameLeases(got.Surplus, tc.want.Surplus) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestDemandFastAttackSlowDecay(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	d := NewDemand(5)
	if r := d.Rate(t0); r != 5 {
		t.Fatalf("prior: %v", r)
	}
	// 20/s for 3 s, observed every 100 ms: followed within a second.
	var count int64
	for i := 1; i <= 30; i++ {
		count += 2
		d.Observe(t0.Add(time.Duration(i)*100*time.Millisecond), 1, count)
	}
	if r := d.Rate(t0.Add(3 * time.Second)); r < 19 || r > 21 {
		t.Fatalf("after a ramp to 20/s: %v", r)
	}
	// Silence for 2 s: the smoothed rate keeps most of it.
	for i := 31; i <= 50; i++ {
		d.Observe(t0.Add(time.Duration(i)*100*time.Millisecond), 1, count)
	}
	if r := d.Rate(t0.Add(5 * time.Second)); r < 5 || r > 20 {
		t.Fatalf("2 s after the traffic stopped: %v, want a slow decay", r)
	}
	// A new window restarts its count without a negative rate.
	d.Observe(t0.Add(5100*time.Millisecond), 2, 1)
	if r := d.Rate(t0.Add(5100 * time.Millisecond)); r < 0 {
		t.Fatalf("negative rate %v", r)
	}
}

func sameLeases(a, b []store.OpenLease) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDemandSteadyRate: readings with every spend of a steady 50 tokens/s
// that arrive in bursts (5 spends within a millisecond, every 100 ms) give
// about 50/s, not the rate of the last few spends: the fast rate's samples
// stay spread over the last second.
func TestDemandSteadyRate(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	d := NewDemand(0)
	var count int64
	worst := 0.0
	for b := 1; b <= 100; b++ {
		for k := range 5 {
			at := t0.Add(time.Duration(b)*100*time.Millisecond + time.Duration(k)*200*time.Microsecond)
			count++
			d.Observe(at, 1, count)
			if b > 20 {
				worst = max(worst, d.Measured(at))
			}
		}
	}
	if worst > 60 {
		t.Fatalf("a steady 50/s measured as much as %.1f/s", worst)
	}
}
