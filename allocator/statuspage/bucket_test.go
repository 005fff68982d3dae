package statuspage

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
)

func bucketLimit(id string, rate, burst int64, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, RatePeriod: durationpb.New(time.Second),
		BurstTokens: burst, Regions: regions, Mode: pb.Mode_MODE_STRICT, Owner: "team-backend", Version: 2}
}

// interval is the i-th reporting interval after t0 of a bucket limit of
// 100/s, burst 200 (slack 11 s: bound 7,300).
func interval(id string, i int, closed bool, adm map[string]int64) allocator.BucketReport {
	r := allocator.BucketReport{Limit: id, Interval: t0.Add(time.Duration(i)*time.Minute).UnixNano() / int64(time.Minute),
		Length: time.Minute, Bound: 7300, ByRegion: adm, Rate: 100, Period: time.Second, Burst: 200, Slack: 11 * time.Second, Closed: closed}
	for _, n := range adm {
		r.Admitted += n
	}
	return r
}

func bucketSource() *fakeSource {
	return &fakeSource{leader: true,
		limits:  []*pb.Limit{limit("tenant/atlas", 1000, "eu", "us"), bucketLimit("backend/search", 100, 200, "eu", "us"), bucketLimit("backend/bug", 100, 200, "eu")},
		reports: map[string][]allocator.WindowReport{"tenant/atlas": {healthy("tenant/atlas", 0, true, 1000, 600, 300)}},
		buckets: map[string]allocator.BucketStatus{
			"backend/search": {
				Intervals: []allocator.BucketReport{
					interval("backend/search", 0, true, map[string]int64{"eu": 4000, "us": 2000}),
					interval("backend/search", 1, true, map[string]int64{"eu": 5900}),
					interval("backend/search", 2, false, map[string]int64{"eu": 1200, "ap": 3}),
				},
				Shares: []allocator.ShareInForce{
					{Region: "eu", Rate: 66_667, Burst: 133, ExpiresAt: t0.Add(2*time.Minute + 25*time.Second), Seq: 7},
					{Region: "us", Holder: "us-1", Rate: 33_333, Burst: 67, ExpiresAt: t0.Add(2*time.Minute + 21*time.Second), Seq: 2},
				},
			},
			"backend/bug": {Intervals: []allocator.BucketReport{
				interval("backend/bug", 0, true, map[string]int64{"eu": 7301}),
				interval("backend/bug", 1, false, nil),
			}},
		}}
}

// TestBucketLimitsOnStatus: a bucket limit (no windows, no G) is listed
// with its rate and burst and its last closed reporting interval beside
// the bound, one above its bound is critical; its page shows the shares
// in force and the intervals, newest first, per region; no chart, no
// window table, and Reports is never asked for a bucket limit.
func TestBucketLimitsOnStatus(t *testing.T) {
	src := bucketSource()
	code, _, body := serve(t, src, "/status")
	if code != http.StatusOK {
		t.Fatalf("index: %d\n%s", code, body)
	}
	mustContain(t, body, "bucket 100/s, burst 200", `title="last closed reporting interval">5,900</td>`, "≤ 7,300",
		`title="last closed reporting interval">7,301</td>`, "admitted &gt; bound", "1 limit needs attention", "bucket limits last")
	if i, j := strings.Index(body, "tenant/atlas"), strings.Index(body, "backend/search"); i < 0 || j < i {
		t.Errorf("the window limit is not listed first")
	}
	for _, id := range []string{"backend/search", "backend/bug"} {
		if _, asked := src.lastAsked[id]; asked {
			t.Errorf("Reports asked for bucket limit %s", id)
		}
	}

	code, _, body = serve(t, src, "/status?limit=backend/search")
	if code != http.StatusOK {
		t.Fatalf("detail: %d\n%s", code, body)
	}
	mustContain(t, body, "bucket: 100/s, burst 200, all regions together", "rate shares, ttl 10s",
		`id="shares"`, "66.667/s", "33.333/s", "us-1", "region bucket", "2026-03-02 10:02:25",
		`id="intervals"`, "2026-03-02 10:02:00 (running)", "<th scope=\"col\" class=\"num\">ap</th>", "6,000", "5,900", "11s")
	mustNotContain(t, body, `<svg class="chart"`, `id="windows"`, "G + bound", `id="no-windows"`)
	// Newest first.
	if i, j := strings.Index(body, "10:02:00 (running)"), strings.Index(body, "2026-03-02 10:00:00"); i < 0 || j < i {
		t.Errorf("intervals not newest first")
	}

	// Nothing yet (no share asked): says so.
	src.buckets["backend/quiet"] = allocator.BucketStatus{}
	src.limits = append(src.limits, bucketLimit("backend/quiet", 5, 5, "eu"))
	_, _, body = serve(t, src, "/status?limit=backend/quiet")
	mustContain(t, body, `id="no-shares"`, `id="no-intervals"`)

	// A follower: no intervals, says the leader shows them.
	src.reportsErr = &allocator.NotLeaderError{Leader: "10.0.0.7:7400"}
	code, _, body = serve(t, src, "/status?limit=backend/search")
	if code != http.StatusOK {
		t.Fatalf("follower detail: %d", code)
	}
	mustContain(t, body, `id="follower"`, "10.0.0.7:7400", "Shares are shown by the leader only", "Intervals are shown by the leader only")
	_, _, body = serve(t, src, "/status")
	mustContain(t, body, "no closed interval")
	if !errors.Is(src.reportsErr, allocator.ErrNotLeader) {
		t.Fatal("the fake's error is not a not-leader error")
	}
}

func TestShareRate(t *testing.T) {
	for _, c := range []struct {
		milli  int64
		period time.Duration
		want   string
	}{{100_000, time.Second, "100/s"}, {333, time.Second, "0.333/s"}, {1_500, time.Minute, "1.5/m"}, {10, 250 * time.Millisecond, "0.01/250ms"}} {
		if got := shareRate(c.milli, c.period); got != c.want {
			t.Errorf("shareRate(%d, %v) = %q, want %q", c.milli, c.period, got, c.want)
		}
	}
}

// TestBucketPlanTenantOnStatus: a tenant of a bucket plan is listed as a
// bucket limit, naming its plan beside its mode, on the index and on its
// page.
func TestBucketPlanTenantOnStatus(t *testing.T) {
	src := bucketSource()
	tenant := bucketLimit("free/newco", 10, 50, "eu", "us")
	tenant.Plan = "plans/free"
	src.limits = append(src.limits, tenant)
	src.buckets["free/newco"] = src.buckets["backend/search"]
	_, _, body := serve(t, src, "/status")
	mustContain(t, body, "free/newco", "bucket 10/s, burst 50", "strict · plans/free")
	_, _, body = serve(t, src, "/status?limit=free/newco")
	mustContain(t, body, "bucket: 10/s, burst 50, all regions together", "plans/free")
}
