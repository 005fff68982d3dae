package regionagent

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
)

// TestPlanGroupsFirstUse: with two allocator groups, a plan written to
// both limits first-use tenants that hash to either group, strict, in two
// regions: every window of each tenant admits at most G (demand is four
// times G), and each tenant's windows are granted by its own group only.
// A plan change that has reached group a only reaches a's tenants at the
// agents (each tenant is resolved with its own group's plans, which its
// allocator grants by); once written to b too, b's tenants as well.
func TestPlanGroupsFirstUse(t *testing.T) {
	if testing.Short() {
		t.Skip("two allocator groups and two agents on the wall clock: about 10 s")
	}
	regions := []string{"eu", "us"}
	gw := startGroups(t, 5*time.Second, regions...)
	const G, W = 20, 2 * time.Second
	plan := func(g int64) *pb.Limit {
		p := limit("plans/pro", g, W, W, regions...)
		p.Binds = []string{"tenant/{id}"}
		return p
	}
	put := func(group string, p *pb.Limit) *pb.Limit {
		t.Helper()
		got, err := gw.allocs[group].PutLimit(context.Background(), p, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
		if err != nil {
			t.Fatalf("group %s: %v", group, err)
		}
		return got
	}
	put("a", plan(G))
	put("b", plan(G))
	byGroup, tenants := twoTenantsPerGroup(gw)
	agents := map[string]*Agent{}
	for _, r := range regions {
		agents[r] = gw.agent(r)
	}
	admitted := map[string]int64{} // "tenant!window"
	end := time.Now().Add(3 * W)
	for n := 0; n < 4000 && time.Now().Before(end); n++ {
		id := tenants[n%len(tenants)]
		r := regions[(n/len(tenants))%2]
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		d, err := agents[r].Check(ctx, id, 1)
		recv := time.Now()
		cancel()
		if err != nil {
			t.Fatalf("check %s in %s: %v", id, r, err)
		}
		if d.Allowed {
			w := int64(math.Round(float64(recv.Add(d.ResetAfter).UnixNano())/float64(W))) - 1
			admitted[fmt.Sprintf("%s!%d", id, w)]++
		}
		if n%8 == 0 {
			time.Sleep(2 * time.Millisecond) // pacing the demand (about 4 x G per window per tenant), not ordering
		}
	}
	perTenant := map[string]int64{}
	for k, n := range admitted {
		if n > G {
			t.Errorf("%s admitted %d > G = %d", k, n, G)
		}
		for _, tn := range tenants {
			if len(k) > len(tn) && k[:len(tn)+1] == tn+"!" {
				perTenant[tn] += n
			}
		}
	}
	for _, tn := range tenants {
		if perTenant[tn] == 0 {
			t.Errorf("%s admitted nothing", tn)
		}
	}
	groups, _ := gw.grantsByWindow()
	for k, gs := range groups {
		for _, tn := range tenants {
			if len(k) > len(tn) && k[:len(tn)+1] == tn+"!" {
				o, _, _ := gw.m.Owner(tn, time.Now())
				if len(gs) != 1 || !gs[o] {
					t.Errorf("%s granted by groups %v, want its owner %s only", k, gs, o)
				}
			}
		}
	}

	// A change that reached group a only: a's tenants get it, b's keep
	// the version their group grants by.
	put("a", plan(3*G))
	ta, tb := byGroup["a"][0], byGroup["b"][0]
	waitAgentG := func(id string, want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if agentG(agents["eu"], id) == want {
				return
			}
			time.Sleep(10 * time.Millisecond) // polling the agent's sync, not ordering
		}
		t.Fatalf("%s never had G %d at the eu agent (has %d)", id, want, agentG(agents["eu"], id))
	}
	waitAgentG(ta, 3*G)
	if got := agentG(agents["eu"], tb); got != G {
		t.Fatalf("%s (group b's, whose plan is unchanged) has G %d at the agent, want %d", tb, got, G)
	}
	put("b", plan(3*G))
	waitAgentG(tb, 3*G)
}

// agentG is G of id's limit at agent a, resolving it if need be (0 when
// it has none).
func agentG(a *Agent, id string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := a.Check(ctx, id, 1); err != nil {
		return 0
	}
	var g int64
	a.withCore(func(c *core.Core) {
		l, _ := c.Limit(id)
		g = l.Tokens
	})
	return g
}

// TestBucketPlanGroupsFirstUse: with two allocator groups, a bucket plan
// written to both limits first-use tenants of either group in two
// regions: each tenant admits at most B + R x the run (demand is several
// times R), and each tenant's rate shares are granted and kept by its own
// group only (the agents route each tenant's share requests to its group,
// and a group resolves only the tenants it owns).
func TestBucketPlanGroupsFirstUse(t *testing.T) {
	if testing.Short() {
		t.Skip("two allocator groups and two agents on the wall clock: about 5 s")
	}
	regions := []string{"eu", "us"}
	gw := startGroups(t, 5*time.Second, regions...)
	const R, B = 20, 10
	plan := &pb.Limit{Id: "plans/free", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: R, BurstTokens: B,
		RatePeriod: durationpb.New(time.Second), Regions: regions, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(2 * time.Second)}, Binds: []string{"tenant/{id}"}}
	for _, g := range []string{"a", "b"} {
		if _, err := gw.allocs[g].PutLimit(context.Background(), plan, allocator.Change{Reason: "test"}); err != nil {
			t.Fatalf("group %s: %v", g, err)
		}
	}
	_, tenants := twoTenantsPerGroup(gw)
	agents := map[string]*Agent{}
	for _, r := range regions {
		agents[r] = gw.agent(r)
	}
	admitted, denied := map[string]int64{}, 0
	start := time.Now()
	end := start.Add(4 * time.Second)
	for n := 0; n < 4000 && time.Now().Before(end); n++ {
		id := tenants[n%len(tenants)]
		r := regions[(n/len(tenants))%2]
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		d, err := agents[r].Check(ctx, id, 1)
		cancel()
		if err != nil {
			t.Fatalf("check %s in %s: %v", id, r, err)
		}
		if d.Allowed {
			admitted[id]++
		} else {
			denied++
		}
		if n%4 == 0 {
			time.Sleep(2 * time.Millisecond) // pacing the demand (several times R per tenant), not ordering
		}
	}
	elapsed := time.Since(start)
	bound := lease.BucketBound(R, time.Second, B, elapsed+time.Second, 0) // a second for the checks' own latency
	for _, id := range tenants {
		t.Logf("%s: admitted %d in %v (bound %d)", id, admitted[id], elapsed.Round(time.Millisecond), bound)
		if admitted[id] == 0 || admitted[id] > bound {
			t.Errorf("%s admitted %d in %v, want some and at most B + R x (run + 1 s) = %d", id, admitted[id], elapsed, bound)
		}
	}
	if denied == 0 {
		t.Errorf("no Check was denied: the demand was not above the rate")
	}
	for _, id := range tenants {
		owner, _, _ := gw.m.Owner(id, time.Now())
		for g, a := range gw.allocs {
			var kept bool
			_ = a.View(func(_ time.Time, c *allocator.Core) { kept = c.SharesKept(id) })
			if kept != (g == owner) {
				t.Errorf("group %s keeps share state of %s: %v (its owner is %s)", g, id, kept, owner)
			}
		}
	}
}

// twoTenantsPerGroup picks the first two ids tenant/t<i> that group a
// owns now and the first two that group b owns: byGroup by group, and
// tenants, a's then b's.
func twoTenantsPerGroup(gw *groupWorld) (byGroup map[string][]string, tenants []string) {
	byGroup = map[string][]string{}
	for i := 0; len(byGroup["a"]) < 2 || len(byGroup["b"]) < 2; i++ {
		id := fmt.Sprintf("tenant/t%d", i)
		o, _, _ := gw.m.Owner(id, time.Now())
		if len(byGroup[o]) < 2 {
			byGroup[o] = append(byGroup[o], id)
		}
	}
	return byGroup, append(append([]string{}, byGroup["a"]...), byGroup["b"]...)
}
