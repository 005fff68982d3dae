package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"leasehold/allocator"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestWindowsBucketShadow: a bucket limit set in shadow mode with
// quotactl; agents of two regions report their buckets' would-deny
// counters with their share requests (as regionagent does); windows
// shows the allocator's sums per region and the number of Checks, in the
// table (with the WOULD_DENY columns and a line saying nothing was
// denied) and in JSON.
func TestWindowsBucketShadow(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(code int, args ...string) result {
		t.Helper()
		return quotactl(append([]string{"--allocator", ta.addr}, args...)...).want(t, code)
	}
	q(0, "limits", "set", "--reason", "test", "backend/try", "--regions", "eu,us", "--mode", "strict",
		"--rate", "100/s", "--burst", "200", "--shadow")
	for deadline := time.Now().Add(10 * time.Second); ; {
		var ok bool
		_ = ta.a.View(func(_ time.Time, c *allocator.Core) { _, ok = c.Limit("backend/try") })
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the limit never reached the leader")
		}
		time.Sleep(2 * time.Millisecond) // polling the watch's effect
	}
	ctx := context.Background()
	ask := func(region, id string, wd, wdc int64) {
		t.Helper()
		res, err := ta.a.AcquireShares(ctx, region, []*pb.ShareRequest{{RequestId: id, LimitId: "backend/try", DemandPerSecond: 100,
			AdmittedTokens: 50, WouldDenyTokens: wd, WouldDenyChecks: wdc}})
		if err != nil || len(res) != 1 || res[0].GetCode() != pb.ItemCode_ITEM_CODE_OK {
			t.Fatalf("AcquireShares %s: %v, %v", region, res, err)
		}
	}
	ask("eu", "eu-1", 0, 0)
	ask("us", "us-1", 7, 3)
	ask("eu", "eu-2", 30, 12)
	st, err := ta.a.BucketStatus("backend/try", 1)
	if err != nil || len(st.Intervals) != 1 {
		t.Fatalf("BucketStatus: %+v, %v", st, err)
	}
	if iv := st.Intervals[0]; iv.WouldDeny != 37 || iv.WouldDenyChecks != 15 || iv.WouldDenyByRegion["eu"] != 30 || !iv.Shadow {
		t.Fatalf("the allocator's interval: %+v", iv)
	}
	r := q(0, "windows", "backend/try")
	lines := strings.Split(r.stdout, "\n")
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	if n := len(head); n < 2 || head[n-2] != "WOULD_DENY" || head[n-1] != "WOULD_DENY_CHECKS" ||
		len(row) != n || row[n-2] != "eu=30,us=7" || row[n-1] != "15" ||
		!strings.Contains(r.stdout, "shadow mode: nothing denied") {
		t.Fatalf("windows:\n%s", r.stdout)
	}
	r = q(0, "--json", "windows", "backend/try")
	for _, want := range []string{`"shadow": true`, `"would_deny_total": 37`, `"would_deny_checks": 15`, `"eu": 30`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("JSON lacks %q:\n%s", want, r.stdout)
		}
	}
}
