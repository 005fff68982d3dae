package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"leasehold/allocator"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestWindowsOverride: windows names the override in force, for a
// window limit, a bucket limit, a concurrency limit and a tenant of a
// plan of each kind: its end, reason, what it returns to and the
// settings it changes (the line under the tables, "override" in JSON);
// without an override, nothing; from --end on, nothing again.
func TestWindowsOverride(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	ctx := context.Background()
	q := func(code int, args ...string) result {
		t.Helper()
		return quotactl(append([]string{"--allocator", ta.addr}, args...)...).want(t, code)
	}
	// waitVersion waits (bounded) for the leader's core to hold id at
	// version v (the watch brings a change).
	waitVersion := func(id string, v int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			var got int64
			_ = ta.a.View(func(_ time.Time, c *allocator.Core) {
				if l, ok := c.Limit(id); ok {
					got = l.Proto.GetVersion()
				}
			})
			if got == v {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never reached version %d on the leader (at %d)", id, v, got)
			}
			time.Sleep(2 * time.Millisecond) // polling the watch's effect
		}
	}
	lease := func(id string) {
		t.Helper()
		res, err := ta.a.AcquireLeases(ctx, "eu", []*pb.LeaseRequest{{RequestId: "r-" + id, LimitId: id, WantTokens: 10}})
		if err != nil || res[0].GetCode() != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("lease of %s: %v %v", id, res, err)
		}
	}
	share := func(id string, slots int64) {
		t.Helper()
		res, err := ta.a.AcquireShares(ctx, "eu", []*pb.ShareRequest{{RequestId: "s-" + id, LimitId: id, DemandPerSecond: 10, HeldSlots: slots}})
		if err != nil || res[0].GetCode() != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("share of %s: %v %v", id, res, err)
		}
	}

	q(0, "limits", "set", "--reason", "contract", "tenant/atlas", "--limit", "1000", "--window", "1h", "--regions", "eu,us", "--mode", "strict")
	q(0, "limits", "set", "--reason", "contract", "b/api", "--rate", "100/s", "--burst", "200", "--regions", "eu,us", "--mode", "strict")
	q(0, "limits", "set", "--reason", "contract", "c/exports", "--concurrency", "2", "--regions", "eu,us", "--mode", "strict")
	q(0, "plans", "set", "pro", "--limit", "100", "--window", "1h", "--regions", "eu,us", "--mode", "strict", "--bind", "tenant/{id}",
		"--contract", "tenant/vip=500", "--reason", "pro")
	q(0, "plans", "set", "free", "--rate", "10/s", "--burst", "50", "--regions", "eu,us", "--mode", "strict", "--bind", "free/{id}", "--reason", "free")
	q(0, "plans", "set", "jobs", "--concurrency", "3", "--regions", "eu,us", "--mode", "strict", "--bind", "jobs/{id}", "--reason", "jobs")
	for _, id := range []string{"tenant/atlas", "b/api", "c/exports"} {
		waitVersion(id, 1)
	}
	for _, id := range []string{"tenant/newco", "tenant/vip", "free/newco", "jobs/newco"} {
		waitVersion(id, 1)
	}
	lease("tenant/atlas")
	lease("tenant/newco")
	lease("tenant/vip")
	share("b/api", 0)
	share("free/newco", 0)
	share("c/exports", 1)
	share("jobs/newco", 1)

	// No override: no line, no "override" in JSON.
	for _, id := range []string{"tenant/atlas", "b/api", "c/exports", "tenant/newco", "free/newco", "jobs/newco"} {
		if r := q(0, "windows", id); strings.Contains(r.stdout, "override") {
			t.Fatalf("windows %s without an override:\n%s", id, r.stdout)
		}
		if r := q(0, "--json", "windows", id); strings.Contains(r.stdout, "override") {
			t.Fatalf("windows --json %s without an override:\n%s", id, r.stdout)
		}
	}

	for _, c := range []struct {
		id        string // the limit (or plan) overridden
		args      []string
		tenants   []string // the ids windows is asked about
		changes   string   // the line's list of changes
		returnsTo string
		json      []fieldDiff
	}{
		{"tenant/atlas", []string{"--limit", "3000", "--mode", "bounded"}, []string{"tenant/atlas"},
			"limit 1000 -> 3000, mode strict -> bounded", "limit 1000",
			[]fieldDiff{{"limit", "1000", "3000"}, {"mode", "strict", "bounded"}}},
		{"b/api", []string{"--rate", "300/s", "--ttl", "5s"}, []string{"b/api"},
			"rate 100/s -> 300/s, lease.ttl 10s -> 5s", "rate 100/s burst 200",
			[]fieldDiff{{"rate", "100/s", "300/s"}, {"lease.ttl", "10s", "5s"}}},
		{"c/exports", []string{"--concurrency", "6"}, []string{"c/exports"},
			"limit 2 -> 6", "slots 2", []fieldDiff{{"limit", "2", "6"}}},
		{"plans/pro", []string{"--limit", "200", "--shadow"}, []string{"tenant/newco"},
			"limit 100 -> 200, shadow (none) -> true", "limit 100", []fieldDiff{{"limit", "100", "200"}, {"shadow", "", "true"}}},
		// A tenant whose contract keeps its own G: the override of the
		// plan's G changes nothing of it (still shown, with its end).
		{"plans/pro", []string{"--limit", "250"}, []string{"tenant/vip"}, "nothing", "limit 500", []fieldDiff{}},
		{"plans/free", []string{"--burst", "80"}, []string{"free/newco", "free/other"},
			"burst 50 -> 80", "rate 10/s burst 50", []fieldDiff{{"burst", "50", "80"}}},
		{"plans/jobs", []string{"--concurrency", "8"}, []string{"jobs/newco"},
			"limit 3 -> 8", "slots 3", []fieldDiff{{"limit", "3", "8"}}},
	} {
		r := q(0, append([]string{"limits", "override", c.id, "--for", "2h", "--reason", "launch day"}, c.args...)...)
		version, _ := strconv.ParseInt(kv(t, r.stdout)["version"], 10, 64)
		ends := strings.Fields(kv(t, r.stdout)["override"])[3] // "in force until T (...)"
		for _, id := range c.tenants {
			if id == "free/other" {
				share(id, 0) // first used under the override
			} else {
				waitVersion(id, version)
			}
			want := "override in force until " + ends + " (launch day); then " + c.returnsTo + "; it changes " + c.changes + "\n"
			r := q(0, "windows", id)
			if !strings.Contains(r.stdout, want) {
				t.Errorf("windows %s under the override of %s: want the line %q in\n%s", id, c.id, want, r.stdout)
			}
			r = q(0, "--json", "windows", id)
			if len(c.json) == 0 && !strings.Contains(r.stdout, `"changes": []`) {
				t.Errorf("windows --json %s: want \"changes\": [] in\n%s", id, r.stdout)
			}
			var o *overrideJSON
			var obj struct {
				Override *overrideJSON `json:"override"`
			}
			if strings.HasPrefix(r.stdout, "[") {
				var arr []struct {
					Override *overrideJSON `json:"override"`
				}
				if err := json.Unmarshal([]byte(r.stdout), &arr); err != nil || len(arr) == 0 {
					t.Fatalf("windows --json %s: %v\n%s", id, err, r.stdout)
				}
				for i, w := range arr {
					if w.Override != nil && i != len(arr)-1 {
						t.Errorf("windows --json %s: an override on window %d of %d", id, i, len(arr))
					}
				}
				o = arr[len(arr)-1].Override
			} else {
				if err := json.Unmarshal([]byte(r.stdout), &obj); err != nil {
					t.Fatalf("windows --json %s: %v\n%s", id, err, r.stdout)
				}
				o = obj.Override
			}
			if o == nil || o.EndsAt != ends || o.Reason != "launch day" || o.ReturnsTo != c.returnsTo || !equalDiffs(o.Changes, c.json) {
				t.Errorf("windows --json %s: override %+v, want ends %s, changes %v", id, o, ends, c.json)
			}
		}
		q(0, "limits", "override", c.id, "--end", "--reason", "over")
		for _, id := range c.tenants {
			waitVersion(id, version+1)
			if r := q(0, "windows", id); strings.Contains(r.stdout, "override") {
				t.Errorf("windows %s after --end:\n%s", id, r.stdout)
			}
		}
	}
}

func equalDiffs(a, b []fieldDiff) bool {
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
