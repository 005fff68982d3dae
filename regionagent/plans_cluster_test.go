package regionagent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

// TestPlanHashTagOnCluster: on a real Redis Cluster, two plans tagged
// {id} (a per-minute and a per-"month" plan of the same tenants) give a
// tenant's two limits its id's last segment as their tag: both live on
// one master and a CheckMulti of both is all or nothing (the second plan
// spent denies both, charging neither). The same two plans untagged put
// a tenant's limits under their own ids, and a CheckMulti of two that
// land on different masters is refused as invalid input.
func TestPlanHashTagOnCluster(t *testing.T) {
	cw := newClusterWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plan := func(name, bind string, g int64, tag string) *pb.Limit {
		p := limit("plans/"+name, g, time.Minute, 15*time.Second, "eu")
		p.Binds, p.HashTag = []string{bind}, tag
		return p
	}
	cw.putPlan(plan("pro", "tenant/{id}", 10, "{id}"), "tenant/probe")
	cw.putPlan(plan("promonth", "tenant-month/{id}", 5, "{id}"), "tenant-month/probe")
	cw.putPlan(plan("free", "free/{id}", 10, ""), "free/probe")
	cw.putPlan(plan("freemonth", "free-month/{id}", 10, ""), "free-month/probe")
	cw.clock.Add(time.Second)
	a := cw.agentOn(cw.rdb, "eu", "r1", nil, WithColdWait(2*time.Second))
	runWork(t, a)
	moveClockWhileWaiting(t, cw.world, a)

	// A tenant whose two limits would be on two masters without the tag.
	split := func(p1, p2 string) string {
		for i := 0; i < 1000; i++ {
			id := fmt.Sprintf("c%d", i)
			if cw.master(bucket.Key("", p1+id, 0)) != cw.master(bucket.Key("", p2+id, 0)) {
				return id
			}
		}
		t.Fatalf("no tenant with its %s and %s limits on two masters untagged", p1, p2)
		return ""
	}
	atlas := split("tenant/", "tenant-month/")
	multi := []CheckItem{{Limit: "tenant/" + atlas, Cost: 1}, {Limit: "tenant-month/" + atlas, Cost: 1}}
	for i := range 5 {
		ds, err := a.CheckMulti(ctx, multi)
		if err != nil || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("multi %d: %+v %v", i, ds, err)
		}
	}
	ds, err := a.CheckMulti(ctx, multi)
	if err != nil || ds[0].Allowed || ds[1].Allowed || ds[1].Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("multi over the month plan: %+v %v, want both denied", ds, err)
	}
	if m1, m2 := cw.master(bucket.Key(atlas, "tenant/"+atlas, 0)), cw.master(bucket.Key(atlas, "tenant-month/"+atlas, 0)); m1 != m2 {
		t.Fatalf("a tenant's tagged keys on %s and %s", m1, m2)
	}
	if b1, b2 := cw.bal(atlas, "tenant/"+atlas), cw.bal(atlas, "tenant-month/"+atlas); b1.Admitted != 5 || b2.Admitted != 5 {
		t.Fatalf("admitted %d and %d under the tag, want 5 and 5 (the denied multi charged neither)", b1.Admitted, b2.Admitted)
	}

	// Untagged: a tenant whose two limits land on two masters.
	x := split("free/", "free-month/")
	_, err = a.CheckMulti(ctx, []CheckItem{{Limit: "free/" + x, Cost: 1}, {Limit: "free-month/" + x, Cost: 1}})
	if err == nil || !strings.Contains(err.Error(), "do not share a hash tag") {
		t.Fatalf("CheckMulti of an untagged tenant's two limits on two masters: %v", err)
	}
}
