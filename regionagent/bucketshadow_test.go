package regionagent

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// Bucket limits in shadow mode (docs/design.md "Shadow mode"): every
// Check is admitted; one the bucket would have denied says so and is
// counted, atomically with the take, in the region's bucket.

// shadowTally is what a test's Checks of one limit in one region said.
type shadowTally struct {
	admitted, denied, deniedChecks, wouldDeny, wouldDenyChecks int64
}

// tally counts one decision of a Check of cost.
func (s *shadowTally) tally(t *testing.T, what string, d Decision, cost int64) {
	t.Helper()
	switch {
	case d.Allowed && d.WouldDeny == pb.Reason_REASON_UNSPECIFIED:
		s.admitted += cost
	case d.Allowed:
		s.wouldDeny += cost
		s.wouldDenyChecks++
	default:
		s.denied += cost
		s.deniedChecks++
	}
	if d.Allowed && d.Reason != pb.Reason_REASON_OK || !d.Allowed && d.WouldDeny != pb.Reason_REASON_UNSPECIFIED {
		t.Fatalf("%s: %+v", what, d)
	}
}

// sortedRegions is the agents' regions in order.
func sortedRegions(agents map[string]*Agent) []string {
	var out []string
	for r := range agents {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// bucketLimit is a bucket limit of rate tokens a second, bursts of burst,
// shares of 10 s, strict, in regions.
func bucketLimit(id string, rate, burst int64, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: burst,
		RatePeriod: durationpb.New(time.Second), Regions: regions, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}}
}

// allocatorShadowCounts sums what the allocator's intervals of id hold:
// admitted and would-deny cost per region, and would-deny Checks.
func (w *world) allocatorShadowCounts(t *testing.T, id string) (admitted, wouldDeny map[string]int64, checks int64, shadow bool) {
	t.Helper()
	st, err := w.alloc.BucketStatus(id, 60)
	if err != nil {
		t.Fatal(err)
	}
	admitted, wouldDeny = map[string]int64{}, map[string]int64{}
	for _, r := range st.Intervals {
		for reg, n := range r.ByRegion {
			admitted[reg] += n
		}
		for reg, n := range r.WouldDenyByRegion {
			wouldDeny[reg] += n
		}
		checks += r.WouldDenyChecks
		shadow = shadow || r.Shadow
	}
	return admitted, wouldDeny, checks, shadow
}

// reportCounters lets every agent report its buckets' counters of ids
// as of their last take: past the renewal time, each asks for its next
// share, which carries them.
func (w *world) reportCounters(agents map[string]*Agent, ids ...string) {
	w.clock.Add(6 * time.Second)
	for _, r := range sortedRegions(agents) {
		for _, id := range ids {
			agents[r].evaluate(context.Background(), id)
		}
	}
}

// TestBucketShadowCountsExactly: a bucket limit in shadow mode (10 a
// second, bursts of 5) and the same limit enforced, in two regions under
// demand of 4x to 8x the rate, get the same Checks at the same instants
// (cost 1 to 3). The shadow limit denies nothing; its would-deny Checks
// are exactly the enforced limit's denials, per region, cost and number
// (the reference: the same bucket arithmetic, enforcing), and what it
// admitted as enforced is exactly what the enforced one admitted; the
// allocator's intervals hold the same counts.
func TestBucketShadowCountsExactly(t *testing.T) {
	const R, B = 10, 5
	w := newShareWorld(t, "eu", "us")
	sh := bucketLimit("b/shadow", R, B, "eu", "us")
	sh.Shadow = true
	w.putPlan(sh, sh.Id)
	w.putPlan(bucketLimit("b/enforced", R, B, "eu", "us"), "b/enforced")
	agents := map[string]*Agent{"eu": w.agent("eu", "eu1"), "us": w.agent("us", "us1")}
	ctx := context.Background()
	shadow := map[string]*shadowTally{"eu": {}, "us": {}}
	enforced := map[string]*shadowTally{"eu": {}, "us": {}}
	checksPerStep := map[string]int{"eu": 2, "us": 1} // every 50 ms: 40/s and 20/s Checks
	rng := rand.New(rand.NewPCG(1, 2))
	for range 600 { // 30 s
		for _, r := range sortedRegions(agents) {
			for range checksPerStep[r] {
				cost := 1 + rng.Int64N(3)
				d, err := agents[r].Check(ctx, "b/shadow", cost)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Fatalf("%s: a Check of a shadow bucket limit was denied: %+v", r, d)
				}
				shadow[r].tally(t, "shadow", d, cost)
				e, err := agents[r].Check(ctx, "b/enforced", cost)
				if err != nil {
					t.Fatal(err)
				}
				enforced[r].tally(t, "enforced", e, cost)
				if e.Allowed != (d.WouldDeny == pb.Reason_REASON_UNSPECIFIED) || !e.Allowed && e.Reason != d.WouldDeny {
					t.Fatalf("%s at %v: enforced %v %v, shadow would deny %v: the shadow decision is not the enforcing one",
						r, w.clock.Now(), e.Allowed, e.Reason, d.WouldDeny)
				}
			}
			agents[r].tick(ctx)
		}
		w.clock.Add(50 * time.Millisecond)
	}
	w.reportCounters(agents, "b/shadow", "b/enforced")

	admitted, wouldDeny, checks, isShadow := w.allocatorShadowCounts(t, "b/shadow")
	enfAdmitted, enfWouldDeny, enfChecks, enfShadow := w.allocatorShadowCounts(t, "b/enforced")
	if !isShadow || enfShadow || len(enfWouldDeny) != 0 || enfChecks != 0 {
		t.Errorf("intervals: shadow limit shadow=%v; enforced limit shadow=%v would deny %v (%d checks)", isShadow, enfShadow, enfWouldDeny, enfChecks)
	}
	var total int64
	for _, r := range sortedRegions(agents) {
		s, e := shadow[r], enforced[r]
		t.Logf("%s: shadow admitted %d, would deny %d in %d checks; enforced admitted %d, denied %d in %d checks",
			r, s.admitted, s.wouldDeny, s.wouldDenyChecks, e.admitted, e.denied, e.deniedChecks)
		if s.denied != 0 || s.wouldDeny != e.denied || s.wouldDenyChecks != e.deniedChecks || s.admitted != e.admitted {
			t.Errorf("%s: shadow %+v, enforced %+v: want would-deny = denied and the same admitted", r, *s, *e)
		}
		if s.wouldDenyChecks == 0 || s.admitted == 0 {
			t.Errorf("%s: demand above the rate gave %+v", r, *s)
		}
		if wouldDeny[r] != s.wouldDeny || admitted[r] != s.admitted || enfAdmitted[r] != e.admitted {
			t.Errorf("%s: the allocator counted admitted %d, would deny %d (enforced: admitted %d); the Checks said %d, %d (%d)",
				r, admitted[r], wouldDeny[r], enfAdmitted[r], s.admitted, s.wouldDeny, e.admitted)
		}
		total += s.wouldDenyChecks
	}
	if checks != total {
		t.Errorf("the allocator counted %d would-deny checks; the Checks said %d", checks, total)
	}

	// Over gRPC: the bucket emptied by a Check of its burst, the next one
	// is allowed with would_deny OVER_LIMIT.
	srv := NewServer(agents["eu"])
	var would int
	for range 3 {
		resp, err := srv.Check(ctx, &pb.CheckRequest{LimitId: "b/shadow", Cost: B})
		if err != nil || !resp.GetAllowed() || resp.GetReason() != pb.Reason_REASON_OK {
			t.Fatalf("gRPC Check of a shadow bucket limit: %v, %v", resp, err)
		}
		if resp.GetWouldDeny() == pb.Reason_REASON_OVER_LIMIT {
			would++
		}
	}
	if would == 0 {
		t.Fatal("gRPC: three Checks of the whole burst at one instant, none said it would be denied")
	}
}

// TestBucketPlanShadow: a bucket plan in shadow mode limits nothing for
// a tenant no admin call created, from its first Check, and counts what
// it would deny; a contract shadow=false on the plan enforces it for its
// tenant. Both driven at the same demand in two regions. The allocator
// counts a plan tenant's counters from its first report on (they may be
// from before it forgot the tenant: allocator/bucketusage.go), so its
// intervals hold everything after each region's first Check, exactly.
func TestBucketPlanShadow(t *testing.T) {
	const R, B = 10, 5
	w := newShareWorld(t, "eu", "us")
	p := freePlan(R, B, "eu", "us")
	p.Shadow = true
	p.Contracts = map[string]*pb.Contract{"tenant/strict": {Shadow: new(false)}}
	w.putPlan(p, "tenant/probe")
	agents := map[string]*Agent{"eu": w.agent("eu", "eu1"), "us": w.agent("us", "us1")}
	ctx := context.Background()
	tried := map[string]*shadowTally{"eu": {}, "us": {}}
	strict := map[string]*shadowTally{"eu": {}, "us": {}}
	first := map[string]*shadowTally{} // each region's first Check of tenant/newco
	// 20 s, 40 Checks of 1 a second per region and tenant.
	for range 400 {
		for _, r := range sortedRegions(agents) {
			for range 2 {
				d, err := agents[r].Check(ctx, "tenant/newco", 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Fatalf("%s: a first-use tenant of a shadow plan was denied: %+v", r, d)
				}
				tried[r].tally(t, "tenant/newco", d, 1)
				if first[r] == nil {
					first[r] = &shadowTally{}
					first[r].tally(t, "tenant/newco", d, 1)
				}
				e, err := agents[r].Check(ctx, "tenant/strict", 1)
				if err != nil {
					t.Fatal(err)
				}
				strict[r].tally(t, "tenant/strict", e, 1)
			}
			agents[r].tick(ctx)
		}
		w.clock.Add(50 * time.Millisecond)
	}
	w.reportCounters(agents, "tenant/newco", "tenant/strict")
	_, wouldDeny, checks, isShadow := w.allocatorShadowCounts(t, "tenant/newco")
	_, strictWould, strictChecks, strictShadow := w.allocatorShadowCounts(t, "tenant/strict")
	if !isShadow || strictShadow || len(strictWould) != 0 || strictChecks != 0 {
		t.Errorf("intervals: newco shadow=%v; strict shadow=%v would deny %v (%d)", isShadow, strictShadow, strictWould, strictChecks)
	}
	var total int64
	for _, r := range sortedRegions(agents) {
		s, e := tried[r], strict[r]
		t.Logf("%s: newco admitted %d, would deny %d; strict admitted %d, denied %d", r, s.admitted, s.wouldDeny, e.admitted, e.denied)
		if s.denied != 0 || s.wouldDenyChecks == 0 || e.denied == 0 || e.wouldDenyChecks != 0 {
			t.Errorf("%s: newco %+v (want nothing denied, would-deny counted), strict %+v (want denials)", r, *s, *e)
		}
		if wouldDeny[r] != s.wouldDeny-first[r].wouldDeny {
			t.Errorf("%s: the allocator counted %d would deny; the Checks said %d, the first %d", r, wouldDeny[r], s.wouldDeny, first[r].wouldDeny)
		}
		total += s.wouldDenyChecks - first[r].wouldDenyChecks
	}
	if checks != total {
		t.Errorf("the allocator counted %d would-deny checks; the Checks said %d", checks, total)
	}
}
