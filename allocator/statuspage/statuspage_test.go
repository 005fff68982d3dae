package statuspage

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/allocator"
	"leasehold/overshoot"
	pb "leasehold/proto/leasehold/v1"
)

// fakeSource is a Source with fixed limits and reports.
type fakeSource struct {
	mu         sync.Mutex
	limits     []*pb.Limit
	reports    map[string][]allocator.WindowReport
	buckets    map[string]allocator.BucketStatus
	slots      map[string]allocator.SlotStatus
	leader     bool
	leaderAddr string
	limitsErr  error
	reportsErr error // returned by every Reports call when set
	calls      int   // Reports calls
	lastAsked  map[string]int
}

func (f *fakeSource) Limits(context.Context) ([]*pb.Limit, error) {
	return f.limits, f.limitsErr
}

func (f *fakeSource) Reports(limit string, last int) ([]allocator.WindowReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.lastAsked == nil {
		f.lastAsked = map[string]int{}
	}
	f.lastAsked[limit] = last
	if f.reportsErr != nil {
		return nil, f.reportsErr
	}
	r, ok := f.reports[limit]
	if !ok {
		return nil, fmt.Errorf("%w: limit %q", allocator.ErrNotFound, limit)
	}
	if len(r) > last {
		r = r[len(r)-last:]
	}
	return r, nil
}

func (f *fakeSource) BucketStatus(limit string, last int) (allocator.BucketStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.reportsErr != nil {
		return allocator.BucketStatus{}, f.reportsErr
	}
	st, ok := f.buckets[limit]
	if !ok {
		return allocator.BucketStatus{}, fmt.Errorf("%w: bucket limit %q", allocator.ErrNotFound, limit)
	}
	if len(st.Intervals) > last {
		st.Intervals = st.Intervals[len(st.Intervals)-last:]
	}
	return st, nil
}

func (f *fakeSource) SlotStatus(limit string) (allocator.SlotStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.reportsErr != nil {
		return allocator.SlotStatus{}, f.reportsErr
	}
	st, ok := f.slots[limit]
	if !ok {
		return allocator.SlotStatus{}, fmt.Errorf("%w: concurrency limit %q", allocator.ErrNotFound, limit)
	}
	return st, nil
}

func (f *fakeSource) IsLeader() bool { return f.leader }
func (f *fakeSource) Leader() string { return f.leaderAddr }

var t0 = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// late draws the page an hour after t0: every closed window is final.
var late = view{now: t0.Add(time.Hour), settle: 5 * time.Second}

func limit(id string, g int64, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(time.Minute), Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Owner: "team-" + strings.ReplaceAll(id, "/", "-"), Version: 3}
}

// window builds a report through the overshoot package, as the allocator
// does: i is the window's index after t0, regions its regional usage.
func window(id string, i int, closed bool, w overshoot.Window) allocator.WindowReport {
	start := t0.Add(time.Duration(i) * time.Minute)
	rep := allocator.WindowReport{Report: overshoot.NewReport(id, start, start.Add(time.Minute), w), Closed: closed,
		Fallback: map[string]pb.FallbackKind{}}
	for _, r := range w.Regions {
		if r.Fallback != overshoot.FallbackNone {
			rep.Fallback[r.Name] = pb.FallbackKind(r.Fallback)
		}
	}
	return rep
}

// healthy is a window where eu and us admitted a and b of g, all granted.
func healthy(id string, i int, closed bool, g, a, b int64) allocator.WindowReport {
	return window(id, i, closed, overshoot.Window{Limit: g, Granted: a + b, Regions: []overshoot.Region{
		{Name: "eu", Admitted: a}, {Name: "us", Admitted: b}}})
}

func serve(t *testing.T, src Source, target string, opts ...Option) (int, http.Header, string) {
	t.Helper()
	opts = append([]Option{WithClock(func() time.Time { return t0.Add(time.Hour) })}, opts...)
	rec := httptest.NewRecorder()
	Handler(src, opts...).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	body := string(b)
	checkSVG(t, body)
	return res.StatusCode, res.Header, body
}

var svgRe = regexp.MustCompile(`(?s)<svg class="chart".*?</svg>`)

// checkSVG parses every chart as XML: well-formed, with a title.
func checkSVG(t *testing.T, body string) {
	t.Helper()
	for _, s := range svgRe.FindAllString(body, -1) {
		var doc struct {
			Title string `xml:"title"`
		}
		if err := xml.Unmarshal([]byte(s), &doc); err != nil {
			t.Fatalf("chart is not well-formed XML: %v\n%s", err, s)
		}
		if doc.Title == "" {
			t.Fatalf("chart has no title: %s", s)
		}
	}
}

func mustContain(t *testing.T, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}

func mustNotContain(t *testing.T, body string, bad ...string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(body, b) {
			t.Errorf("page contains %q", b)
		}
	}
}

func demoSource() *fakeSource {
	f := &fakeSource{leader: true, leaderAddr: "127.0.0.1:7400", reports: map[string][]allocator.WindowReport{}}
	f.limits = []*pb.Limit{limit("tenant/small", 100, "eu", "us"), limit("tenant/atlas", 1000, "eu", "us"), limit("tenant/quiet", 500, "eu")}
	for i := range 5 {
		f.reports["tenant/atlas"] = append(f.reports["tenant/atlas"], healthy("tenant/atlas", i, i < 4, 1000, 600+int64(i), 390))
		f.reports["tenant/small"] = append(f.reports["tenant/small"], healthy("tenant/small", i, i < 4, 100, 50, 45))
	}
	return f
}

func TestIndexListsLimitsAndCharts(t *testing.T) {
	f := demoSource()
	code, hdr, body := serve(t, f, "/status")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	if ct := hdr.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
		t.Errorf("CSP %q", csp)
	}
	mustContain(t, body,
		`<table class="limits" id="limits">`, `badge leader`, "generated 2026-03-02 11:00:00 UTC",
		`href="?limit=tenant%2fatlas"`, "1,000", "1m", "eu, us", "strict", "eu: closed", "team-tenant-atlas",
		// atlas's last closed window is i=3: 603 + 390.
		`<td class="num last">993</td>`,
		`<svg class="chart"`, `<path class="g" d="M`, `<path class="bound" d="M`, `<rect class="seg"`,
		"Windows as a table", `<table class="windows">`, "(running)",
		"no closed window", // tenant/quiet has no windows
	)
	mustNotContain(t, body, "<script", `id="attention"`)
	// Largest G first.
	if a, s := strings.Index(body, `<th scope="row"><a href="?limit=tenant%2fatlas"`), strings.Index(body, `<th scope="row"><a href="?limit=tenant%2fsmall"`); a < 0 || s < 0 || a > s {
		t.Errorf("order: atlas at %d, small at %d", a, s)
	}
	// Two charts (quiet has no windows), each with its accessible table.
	if n := strings.Count(body, `<svg class="chart"`); n != 2 {
		t.Errorf("%d charts, want 2", n)
	}
	if f.lastAsked["tenant/atlas"] != 20 {
		t.Errorf("charted limit asked for %d windows, want 20", f.lastAsked["tenant/atlas"])
	}
	// Running windows are drawn faded, and the tooltips carry the numbers.
	mustContain(t, body, `class="window pending"`, "admitted 993, G 1,000 (eu 603, us 390)", "bound 0: G &#43; bound = 1,000")
}

func TestEscaping(t *testing.T) {
	f := demoSource()
	f.limits[1].Owner = `<b>ops</b> & "friends"`
	f.limits[1].Description = `<script>alert("x")</script>`
	f.limits[1].Tags = map[string]string{"note": `<img src=x onerror=alert(1)>`}
	_, _, body := serve(t, f, "/status")
	mustNotContain(t, body, "<b>ops</b>", "<script>", `"friends"`)
	mustContain(t, body, "&lt;b&gt;ops&lt;/b&gt; &amp; &#34;friends&#34;", `title="&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"`)

	_, _, body = serve(t, f, "/status?limit=tenant%2fatlas")
	mustNotContain(t, body, "<script>", "<img", "<b>ops")
	mustContain(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;", "note=&lt;img src=x onerror=alert(1)&gt;")

	// Query parameters echoed back are escaped too.
	_, _, body = serve(t, f, "/status?q="+url.QueryEscape(`"><script>x</script>`))
	mustNotContain(t, body, "<script>x")
	mustContain(t, body, `value="&#34;&gt;&lt;script&gt;x&lt;/script&gt;"`)
	code, _, body := serve(t, f, "/status?limit="+url.QueryEscape(`<i>nope</i>`))
	if code != http.StatusNotFound {
		t.Errorf("unknown limit: %d", code)
	}
	mustNotContain(t, body, "<i>nope")
	mustContain(t, body, "&lt;i&gt;nope&lt;/i&gt;")
	// A limit id is a query value in links, escaped as one.
	f.limits = append(f.limits, limit("a&b/c", 1, "eu"))
	_, _, body = serve(t, f, "/status")
	mustContain(t, body, `href="?limit=a%26b%2fc"`)
}

func TestFollowerNamesTheLeader(t *testing.T) {
	f := demoSource()
	f.leader, f.leaderAddr = false, ""
	f.reportsErr = &allocator.NotLeaderError{Leader: "10.1.2.3:7400"}
	code, _, body := serve(t, f, "/status")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	mustContain(t, body, `badge follower`, `id="follower"`, "<code>10.1.2.3:7400</code>", "tenant/atlas", "no closed window")
	mustNotContain(t, body, `<svg class="chart"`)
	if f.calls != 1 {
		t.Errorf("Reports called %d times after it said not leader", f.calls)
	}

	// IsLeader may lag behind: Reports decides.
	f.leader, f.leaderAddr = true, "self:7400"
	_, _, body = serve(t, f, "/status")
	mustContain(t, body, `badge follower`, "self:7400")

	// No leader at all.
	f.leader, f.leaderAddr, f.reportsErr = false, "", &allocator.NotLeaderError{}
	_, _, body = serve(t, f, "/status?limit=tenant%2fatlas")
	mustContain(t, body, "no leader elected", "no leader is elected right now", "Windows are shown by the leader only", `id="definition"`)
}

func TestInfiniteBound(t *testing.T) {
	f := &fakeSource{leader: true, reports: map[string][]allocator.WindowReport{}}
	l := limit("tenant/open", 1000, "eu", "us")
	l.Mode = pb.Mode_MODE_BOUNDED
	l.Fallback = map[string]*pb.Fallback{"us": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}, "eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 50}}
	f.limits = []*pb.Limit{l}
	open := overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{
		{Name: "eu", Admitted: 600}, {Name: "us", Admitted: 400, FallbackAdmitted: 700, Fallback: overshoot.FallbackOpen}}}
	f.reports["tenant/open"] = []allocator.WindowReport{
		healthy("tenant/open", 0, true, 1000, 500, 400),
		window("tenant/open", 1, true, open),
		healthy("tenant/open", 2, false, 1000, 10, 0),
	}
	_, _, body := serve(t, f, "/status")
	mustContain(t, body,
		`<td class="num">∞</td>`, // bound of the last closed window
		`<td class="num">700</td>`,
		`<tr class="crit">`, `<span class="tag crit">us OPEN</span>`, "us: open · ", "eu: local:50",
		`<path class="inf" d="M`, `class="infmark"`, "bound ∞: a region was OPEN", "bound ∞ (a region OPEN)")
	// The infinite window is drawn at the top edge; the finite ones below it.
	ch := newChart(late, 0, "tenant/open", f.reports["tenant/open"], []string{"eu", "us"}, newColors([]string{"eu", "us"}), smallChart, 20)
	if !strings.HasPrefix(ch.InfPath, "M") || !strings.Contains(ch.InfPath, " "+px(ch.Top)+"H") {
		t.Errorf("infinite bound path %q not at the top edge %v", ch.InfPath, ch.Top)
	}
	if strings.Count(ch.BoundPath, "M") != 2 {
		t.Errorf("finite bound path %q: want two runs around the infinite window", ch.BoundPath)
	}
	_, _, body = serve(t, f, "/status?limit=tenant/open")
	mustContain(t, body, `<td class="num">∞</td><td class="num">∞</td>`, "us OPEN")
}

func TestHighlightRules(t *testing.T) {
	id := "tenant/x"
	l := limit(id, 1000, "eu", "us")
	mk := func(w overshoot.Window) []allocator.WindowReport {
		return []allocator.WindowReport{window(id, 0, true, w), healthy(id, 1, false, 1000, 1, 1)}
	}
	for _, tc := range []struct {
		name   string
		reps   []allocator.WindowReport
		level  string
		alerts []string
	}{
		{"healthy", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 950}}}), "", nil},
		{"stranded exactly 10%", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 900}}}), "", nil},
		{"stranded above 10%", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 899}}}), "warn", []string{"stranded > 10% of G"}},
		{"observed above bound", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 1000}, {Name: "us", FallbackAdmitted: 5}}}), "crit", []string{"observed > bound"}},
		{"observed within a local bound", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 1000}, {Name: "us", FallbackAdmitted: 5, Fallback: overshoot.FallbackLocal, LocalAllowance: 10}}}), "", nil},
		{"open in the last closed window", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 1000}, {Name: "us", FallbackAdmitted: 5, Fallback: overshoot.FallbackOpen}}}), "crit", []string{"us OPEN"}},
		{"open in the running window", []allocator.WindowReport{healthy(id, 0, true, 1000, 500, 500), window(id, 1, false, overshoot.Window{Limit: 1000, Regions: []overshoot.Region{{Name: "eu", FallbackAdmitted: 3, Fallback: overshoot.FallbackOpen}}})}, "crit", []string{"eu OPEN"}},
		{"lost grants", mk(overshoot.Window{Limit: 1000, Granted: 1200, Regions: []overshoot.Region{{Name: "eu", Admitted: 1200}}}), "crit", []string{"lost grants: allocator bug"}},
		{"closed fallback is not highlighted", mk(overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 1000}, {Name: "us", Fallback: overshoot.FallbackClosed}}}), "", nil},
		{"only a running window", []allocator.WindowReport{healthy(id, 0, false, 1000, 1, 1)}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rw := newRow(late, l, tc.reps)
			var got []string
			for _, a := range rw.Alerts {
				got = append(got, a.Text)
			}
			if rw.Level != tc.level || strings.Join(got, "|") != strings.Join(tc.alerts, "|") {
				t.Errorf("level %q alerts %q; want %q %q", rw.Level, got, tc.level, tc.alerts)
			}
		})
	}

	// In the page: the highlighted row and the count above the table.
	f := demoSource()
	f.reports["tenant/small"][3] = window("tenant/small", 3, true, overshoot.Window{Limit: 100, Granted: 100, Regions: []overshoot.Region{{Name: "eu", Admitted: 100}, {Name: "us", FallbackAdmitted: 9}}})
	_, _, body := serve(t, f, "/status")
	mustContain(t, body, `<tr class="crit">`+"\n"+`<th scope="row"><a href="?limit=tenant%2fsmall"`, `<span class="tag crit">observed &gt; bound</span>`,
		`<span class="tag crit" id="attention">1 limit needs attention</span>`, `<rect class="over"`, "OBSERVED ABOVE BOUND")
}

func TestSettlingWindows(t *testing.T) {
	f := demoSource()
	// 10:04:00-10:05:00 is over, but usage reports may still arrive for 5 s.
	f.reports["tenant/atlas"] = append(f.reports["tenant/atlas"][:4],
		window("tenant/atlas", 4, true, overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 10}}}),
		healthy("tenant/atlas", 5, false, 1000, 1, 0))
	// A stranded-looking settling window does not highlight the row.
	clock := WithClock(func() time.Time { return t0.Add(5*time.Minute + 2*time.Second) })
	_, _, body := serve(t, f, "/status", clock)
	// The table shows 10:03 (603 + 390), not the settling 10:04.
	mustContain(t, body, `<td class="num last">993</td>`, "(settling)", "(just closed: usage reports may still come in)",
		`class="window pending"`)
	mustNotContain(t, body, `id="attention"`)
	// Once settled, it is the last window.
	_, _, body = serve(t, f, "/status", WithClock(func() time.Time { return t0.Add(5*time.Minute + 6*time.Second) }))
	mustContain(t, body, `<td class="num last">10</td>`, `<span class="tag warn" id="attention">1 limit needs attention</span>`)
	mustNotContain(t, body, "(settling)")
	// WithSettle(0): final as soon as closed.
	_, _, body = serve(t, f, "/status", clock, WithSettle(0))
	mustContain(t, body, `<td class="num last">10</td>`)
}

func TestEmptyStates(t *testing.T) {
	f := &fakeSource{leader: true}
	code, _, body := serve(t, f, "/status")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	mustContain(t, body, `id="empty"`, "No limits yet", ">0 limits<")
	mustNotContain(t, body, `id="limits"`, "<svg class")

	f = demoSource()
	_, _, body = serve(t, f, "/status?q=nothing-like-this")
	mustContain(t, body, "No limit matches “nothing-like-this”", "0 matching limits (3 in all)", `href="?">clear</a>`)
	_, _, body = serve(t, f, "/status?q=ATLAS")
	mustContain(t, body, "1 matching limits (3 in all)", "tenant/atlas")
	mustNotContain(t, body, "tenant/small")
	// The owner matches too.
	_, _, body = serve(t, f, "/status?q=team-tenant-small")
	mustContain(t, body, `href="?limit=tenant%2fsmall"`)

	// A limit without windows, on its own page.
	_, _, body = serve(t, f, "/status?limit=tenant/quiet")
	mustContain(t, body, `id="no-windows"`, "No windows yet")
}

func TestIndexIsCapped(t *testing.T) {
	f := &fakeSource{leader: true, reports: map[string][]allocator.WindowReport{}}
	for i := range 1000 {
		id := fmt.Sprintf("tenant/t%04d", i)
		f.limits = append(f.limits, limit(id, int64(1+i), "eu", "us"))
		f.reports[id] = []allocator.WindowReport{healthy(id, 0, true, int64(1+i), 1, 0)}
	}
	code, _, body := serve(t, f, "/status", WithMaxLimits(100), WithMaxCharts(7))
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	if n := strings.Count(body, `<th scope="row"><a href="?limit=`); n != 100 {
		t.Errorf("%d rows, want 100", n)
	}
	if n := strings.Count(body, `<svg class="chart"`); n != 7 {
		t.Errorf("%d charts, want 7", n)
	}
	if f.calls != 100 {
		t.Errorf("Reports called %d times for 100 rows", f.calls)
	}
	// Largest G first; the cap is said.
	mustContain(t, body, `id="truncated"`, "Only the 100 limits with the largest G are listed, of 1,000", "100 of 1,000 limits", "tenant/t0999")
	mustNotContain(t, body, "tenant/t0899<")
	if f.lastAsked["tenant/t0999"] != 20 || f.lastAsked["tenant/t0900"] != 2 {
		t.Errorf("windows asked: charted %d, listed %d", f.lastAsked["tenant/t0999"], f.lastAsked["tenant/t0900"])
	}
	// The default cap is 200.
	_, _, body = serve(t, f, "/status")
	if n := strings.Count(body, `<th scope="row"><a href="?limit=`); n != 200 {
		t.Errorf("default: %d rows", n)
	}
	// The filter reaches the others.
	_, _, body = serve(t, f, "/status?q=t0003")
	mustContain(t, body, `href="?limit=tenant%2ft0003"`)
}

func TestDetailPage(t *testing.T) {
	f := demoSource()
	f.limits[1].Description = "Atlas contract"
	f.limits[1].Lease = &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 5}
	code, _, body := serve(t, f, "/status?limit=tenant%2fatlas")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	mustContain(t, body, "<title>tenant/atlas · Leasehold status</title>", "Atlas contract", "1,000 tokens per 1m",
		"ttl 15s, min chunk 5, max chunk none", `<table class="windows" id="windows">`, "lost grants", "redis rollback", "settlement",
		"2026-03-02 10:04:00 (running)", "2026-03-02 10:00:00", `<svg class="chart"`)
	mustNotContain(t, body, "Windows as a table") // the full table is on the page
	if f.lastAsked["tenant/atlas"] != 60 {
		t.Errorf("detail asked for %d windows", f.lastAsked["tenant/atlas"])
	}
	// Newest first.
	if a, b := strings.Index(body, "2026-03-02 10:04:00"), strings.Index(body, "2026-03-02 10:00:00"); a > b {
		t.Error("windows not newest first")
	}

	// A deleted limit whose windows remain.
	f.limits = f.limits[:1]
	code, _, body = serve(t, f, "/status?limit=tenant%2fatlas")
	if code != 200 {
		t.Fatalf("deleted limit: %d", code)
	}
	mustContain(t, body, `id="gone"`, `<table class="windows" id="windows">`)

	code, _, body = serve(t, f, "/status?limit=no/such")
	if code != 404 {
		t.Errorf("unknown: %d", code)
	}
	mustContain(t, body, "No limit &#34;no/such&#34;.", `<a href="?">All limits</a>`)
}

func TestErrors(t *testing.T) {
	f := demoSource()
	f.limitsErr = errors.New("etcd: context deadline exceeded")
	code, _, body := serve(t, f, "/status")
	if code != http.StatusServiceUnavailable {
		t.Errorf("limits error: %d", code)
	}
	mustContain(t, body, "cannot read the limits: etcd: context deadline exceeded")

	f = demoSource()
	f.reportsErr = allocator.ErrStopped
	code, _, body = serve(t, f, "/status")
	if code != 200 || f.calls != 1 {
		t.Errorf("reports error: %d after %d calls", code, f.calls)
	}
	mustContain(t, body, `id="reports-error"`, "allocator: stopped", "tenant/atlas")

	rec := httptest.NewRecorder()
	Handler(f).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/status", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d %v", rec.Code, rec.Header())
	}
	code, _, _ = serve(t, f, "/status?q="+strings.Repeat("x", 300))
	if code != http.StatusBadRequest {
		t.Errorf("long query: %d", code)
	}
}

func TestChartGeometry(t *testing.T) {
	id := "tenant/g"
	reps := []allocator.WindowReport{
		healthy(id, 0, true, 1000, 300, 200),
		// G raised, local fallback: bound 100.
		window(id, 1, true, overshoot.Window{Limit: 2000, Granted: 2000, Regions: []overshoot.Region{
			{Name: "eu", Admitted: 2000}, {Name: "us", FallbackAdmitted: 80, Fallback: overshoot.FallbackLocal, LocalAllowance: 100}}}),
		// A huge bound is drawn at the top edge, off scale.
		window(id, 2, true, overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{
			{Name: "eu", Admitted: 1000}, {Name: "us", Fallback: overshoot.FallbackLocal, LocalAllowance: 1 << 40}}}),
	}
	c := newChart(late, 0, id, reps, []string{"eu", "us"}, newColors([]string{"eu", "us"}), smallChart, 20)
	if len(c.Cols) != 3 || c.Cols[0].X <= c.Left || c.Cols[2].X+c.Cols[2].W > c.Right+0.01 {
		t.Fatalf("columns %+v", c.Cols)
	}
	// Newest on the right: the last slot ends at the plot's right edge.
	if d := c.Right - (c.Cols[2].X + c.Cols[2].W); d > 0.01 || d < -0.01 {
		t.Errorf("last column ends %v before the right edge", d)
	}
	// Stacked: eu below us, touching.
	s := c.Cols[0].Segs
	if len(s) != 2 || s[0].Color != palette[0] || s[1].Color != palette[1] || s[1].Y+s[1].H-s[0].Y > 0.01 {
		t.Errorf("segments %+v", s)
	}
	// The scale's top leaves room for a bound up to 1.5 times the largest
	// of G and admitted (2,000): 3,000 x 1.05, rounded up.
	if len(c.Grid) != 3 || c.Grid[2].Label != "4k" || c.Grid[1].Label != "2k" || c.Grid[0].Label != "0" {
		t.Errorf("grid %+v", c.Grid)
	}
	// G steps from 1,000 to 2,000 and back; the bound is 100 above G in
	// window 1 and at the top edge in window 2.
	if strings.Count(c.GPath, "V") != 2 || strings.Count(c.BoundPath, "M") != 1 || !strings.Contains(c.BoundPath, "V"+px(c.Top)) {
		t.Errorf("G path %q, bound path %q", c.GPath, c.BoundPath)
	}
	if c.InfPath != "" || c.AnyInfinite {
		t.Errorf("no infinite bound expected: %q", c.InfPath)
	}
	// Three windows at the right of 20 slots leave room for one time label,
	// the newest; filling the chart, two.
	if len(c.XLabels) != 1 || c.XLabels[0].Text != "10:02:00" {
		t.Errorf("x labels %+v", c.XLabels)
	}
	c3 := newChart(late, 0, id, reps, []string{"eu", "us"}, newColors([]string{"eu", "us"}), smallChart, 3)
	if len(c3.XLabels) != 2 || c3.XLabels[0].Text != "10:00:00" || c3.XLabels[1].Text != "10:02:00" || c3.Cols[0].X != c3.Left {
		t.Errorf("x labels %+v", c3.XLabels)
	}
	// Zero windows, or all zero: no division by zero.
	z := newChart(late, 0, id, []allocator.WindowReport{healthy(id, 0, false, 0, 0, 0)}, []string{"eu"}, newColors(nil), bigChart, 1)
	if len(z.Cols) != 1 || z.Grid[2].Label == "NaN" {
		t.Errorf("zero chart %+v", z)
	}
}

func TestFormatting(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 9223372036854775807: "9,223,372,036,854,775,807"} {
		if got := fmtInt(in); got != want {
			t.Errorf("fmtInt(%d) = %q", in, got)
		}
	}
	for in, want := range map[time.Duration]string{time.Minute: "1m", 2 * time.Second: "2s", 90 * time.Minute: "1h30m", time.Hour: "1h", 1500 * time.Millisecond: "1.5s", 0: "-"} {
		if got := fmtDuration(in); got != want {
			t.Errorf("fmtDuration(%v) = %q", in, got)
		}
	}
	for in, want := range map[float64]string{0: "0", 600: "600", 1200: "1.2k", 2500000: "2.5M"} {
		if got := fmtCompact(in); got != want {
			t.Errorf("fmtCompact(%v) = %q", in, got)
		}
	}
	for in, want := range map[float64]float64{0: 1, 1: 1, 1.05: 1.2, 1050: 1200, 2100: 2500, 7: 8, 9: 10} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v", in, got)
		}
	}
}

// BenchmarkIndex100kLimits renders the index page over 100,000 limits
// (the Source's own cost aside): 200 rows, 50 charts of 20 windows.
func BenchmarkIndex100kLimits(b *testing.B) {
	f := &fakeSource{leader: true, reports: map[string][]allocator.WindowReport{}}
	var reps []allocator.WindowReport
	for i := range 20 {
		reps = append(reps, healthy("tenant/x", i, i < 19, 1000, 500, 400))
	}
	for i := range 100_000 {
		id := fmt.Sprintf("tenant/t%06d", i)
		f.limits = append(f.limits, limit(id, int64(1+i%5000), "eu", "us"))
		f.reports[id] = reps
	}
	h := Handler(f, WithClock(func() time.Time { return t0.Add(time.Hour) }))
	b.ResetTimer()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
		b.SetBytes(int64(rec.Body.Len()))
	}
}

func TestTopLimitsIsTheSortedPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		var ls []*pb.Limit
		for i := range r.IntN(300) {
			ls = append(ls, limit(fmt.Sprintf("t/%03d", i), int64(r.IntN(20)), "eu"))
		}
		n := r.IntN(40) + 1
		orig := slices.Clone(ls)
		got := topLimits(ls, n)
		want := slices.Clone(ls)
		slices.SortFunc(want, byG)
		want = want[:min(n, len(want))]
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d: got %v, want %v", n, got, want)
		}
		if !slices.Equal(ls, orig) {
			t.Fatal("topLimits modified its input")
		}
	}
}

// TestShadowShown: a limit in shadow mode reads so in its mode, its last
// window's would-deny requests are an attention tag (not a warning: the
// limit is being tried), and the window's row says them per region.
func TestShadowShown(t *testing.T) {
	id := "tenant/try"
	l := limit(id, 1000, "eu", "us")
	l.Shadow = true
	last := window(id, 0, true, overshoot.Window{Limit: 1000, Granted: 1000, Regions: []overshoot.Region{{Name: "eu", Admitted: 950}}})
	last.Shadow, last.WouldDeny, last.WouldDenyTotal, last.WouldDenyChecks = true, map[string]int64{"eu": 30, "us": 12}, 42, 21
	rw := newRow(late, l, []allocator.WindowReport{last, healthy(id, 1, false, 1000, 1, 1)})
	if rw.Mode != "strict · shadow" || rw.Level != "" || len(rw.Alerts) != 1 || rw.Alerts[0].Text != "shadow: would deny 21 checks" {
		t.Fatalf("mode %q level %q alerts %+v", rw.Mode, rw.Level, rw.Alerts)
	}
	if got := newWindowRow(late, last, []string{"eu", "us"}).Fallback; got != "would deny 21 checks (eu 30, us 12 tokens)" {
		t.Fatalf("window row %q", got)
	}
}

// TestBucketShadowShown: a bucket limit in shadow mode reads so in its
// mode; its last closed interval's would-deny Checks are an attention tag
// and each interval's row says them.
func TestBucketShadowShown(t *testing.T) {
	b := &pb.Limit{Id: "b/try", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 100, BurstTokens: 200, Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Shadow: true}
	iv := allocator.BucketReport{Limit: "b/try", Length: allocator.BucketInterval, Closed: true, Admitted: 6000,
		ByRegion: map[string]int64{"eu": 6000}, Bound: 7300, Rate: 100, Period: time.Second, Burst: 200,
		WouldDeny: 37, WouldDenyChecks: 15, WouldDenyByRegion: map[string]int64{"eu": 30, "us": 7}, Shadow: true}
	rw := newRow(late, b, nil)
	bucketRow(rw, b, allocator.BucketStatus{Intervals: []allocator.BucketReport{iv}})
	if rw.Mode != "strict · shadow" || rw.Level != "" || len(rw.Alerts) != 1 || rw.Alerts[0].Text != "shadow: would deny 15 checks" {
		t.Fatalf("mode %q level %q alerts %+v", rw.Mode, rw.Level, rw.Alerts)
	}
	if got := newIntervalRow(iv, []string{"eu", "us"}).WouldDeny; got != "15 checks (37 tokens)" {
		t.Fatalf("interval row %q", got)
	}
}

// TestOverrideShown: an override in force is an attention tag with its
// end and the G (R and B, N) it returns to.
func TestOverrideShown(t *testing.T) {
	l := limit("tenant/o", 300, "eu")
	l.Override = &pb.LimitOverride{Reason: "incident", EndsAt: timestamppb.New(time.Date(2026, 12, 3, 9, 30, 0, 0, time.UTC)),
		After: limit("tenant/o", 100, "eu")}
	rw := newRow(late, l, nil)
	if rw.Level != "warn" || len(rw.Alerts) != 1 || rw.Alerts[0].Text != "override until 2026-12-03 09:30:00 UTC, then G 100" {
		t.Fatalf("level %q alerts %+v", rw.Level, rw.Alerts)
	}
	// A bucket and a concurrency limit name what they return to.
	b := &pb.Limit{Id: "b/o", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 300, BurstTokens: 600, Regions: []string{"eu"}}
	b.Override = &pb.LimitOverride{Reason: "incident", EndsAt: l.Override.EndsAt,
		After: &pb.Limit{Id: "b/o", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 100, BurstTokens: 200, Regions: []string{"eu"}}}
	rw = newRow(late, b, nil)
	bucketRow(rw, b, allocator.BucketStatus{})
	if rw.Level != "warn" || len(rw.Alerts) != 1 || rw.Alerts[0].Text != "override until 2026-12-03 09:30:00 UTC, then rate 100/s, burst 200" {
		t.Fatalf("bucket: level %q alerts %+v", rw.Level, rw.Alerts)
	}
	c := &pb.Limit{Id: "c/o", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 5, Regions: []string{"eu"}}
	c.Override = &pb.LimitOverride{Reason: "incident", EndsAt: l.Override.EndsAt,
		After: &pb.Limit{Id: "c/o", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 2, Regions: []string{"eu"}}}
	rw = newRow(late, c, nil)
	slotsRow(rw, allocator.SlotStatus{}, false)
	if rw.Level != "warn" || len(rw.Alerts) != 1 || rw.Alerts[0].Text != "override until 2026-12-03 09:30:00 UTC, then N 2" {
		t.Fatalf("concurrency: level %q alerts %+v", rw.Level, rw.Alerts)
	}
}

// TestPhasedLimit: a limit with a phase offset shows it beside its window
// on the index and on its own page; an aligned one shows the window alone.
func TestPhasedLimit(t *testing.T) {
	f := demoSource()
	f.limits[1].WindowPhase = durationpb.New(17 * time.Second)
	_, _, body := serve(t, f, "/status")
	mustContain(t, body, "1m (phase 17s)")
	if n := strings.Count(body, "(phase "); n != 1 {
		t.Errorf("%d limits shown with a phase, want 1 (tenant/atlas)", n)
	}
	_, _, body = serve(t, f, "/status?limit=tenant/atlas")
	mustContain(t, body, "tokens per 1m (phase 17s)")
}

// TestPlanTenantNamesItsPlan: a tenant's limit resolved from a plan shows
// the plan beside its mode.
func TestPlanTenantNamesItsPlan(t *testing.T) {
	f := demoSource()
	tenant := limit("tenant/newco", 100, "eu")
	tenant.Plan = "plans/pro"
	f.limits = append(f.limits, tenant)
	_, _, body := serve(t, f, "/status")
	mustContain(t, body, "strict · plans/pro")
}

// TestCalendarLimitShown: a limit with calendar windows shows them as
// "calendar month, Europe/Berlin" on the index and on its own page.
func TestCalendarLimitShown(t *testing.T) {
	f := demoSource()
	f.limits[1].Window = nil
	f.limits[1].Calendar = &pb.CalendarWindows{Unit: "month", Zone: "Europe/Berlin"}
	_, _, body := serve(t, f, "/status")
	mustContain(t, body, "calendar month, Europe/Berlin")
	_, _, body = serve(t, f, "/status?limit=tenant/atlas")
	mustContain(t, body, "tokens per calendar month, Europe/Berlin")
}
