package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// -screenshot makes TestStatusPageInChromium also write a PNG of /status
// (make screenshots: docs/images/status.png).
var screenshot = flag.String("screenshot", "", "TestStatusPageInChromium: also write a screenshot of /status to this PNG file")

// chromium finds Debian's chromium. Without it the test is skipped,
// except in CI (CI set) or when a screenshot was asked for.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "" && *screenshot == "" {
		t.Skip("chromium not installed (apt-get install -y chromium); .ci/run installs it")
	}
	t.Fatal("chromium not found on PATH (apt-get install -y chromium)")
	return ""
}

// runChromium runs headless Chromium on url with extra flags and returns
// its stdout and its log (stderr). Loopback only: no network features.
func runChromium(t *testing.T, bin, url string, extra ...string) (stdout, log string) {
	t.Helper()
	profile, err := os.MkdirTemp("", "leasehold-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	// Chromium's helpers may still be writing the profile as it exits.
	defer func() {
		for i := 0; i < 50 && os.RemoveAll(profile) != nil; i++ {
			time.Sleep(20 * time.Millisecond) // bounded retry of the cleanup
		}
	}()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-dev-shm-usage",
		"--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0"}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, errb.String())
	}
	return out.String(), errb.String()
}

// consoleErrors returns the page's console lines from Chromium's log. The
// page has no JavaScript, so any console line (an error, a blocked
// resource, a CSP violation) is a failure. Chromium logs them as
// "...:CONSOLE(line)] "message", source: url (line)" whatever the level.
func consoleErrors(log string) []string {
	var bad []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, ":CONSOLE") || strings.Contains(l, "Uncaught") {
			bad = append(bad, l)
		}
	}
	return bad
}

// getPage GETs url and returns its body and status code.
func getPage(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), resp.StatusCode
}

// flagValue returns the value after name in args.
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("%s not in %v", name, args)
	return ""
}

// TestStatusPageInChromium runs leasehold dev, sets three limits with 2 s
// windows and a bucket limit, drives Checks into both regions for a few windows, then loads
// the allocator's /status in headless Chromium: the DOM has the limits
// table and the charts, and the console stays empty.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	args, alloc, eu, us, _ := devArgs(t, filepath.Join(t.TempDir(), "dev"))
	allocHTTP := flagValue(t, args, "--allocator-http")
	s := startCmd(t, append(args, "--no-demo")...)
	conn := dial(t, alloc)
	waitServing(t, conn, pb.Allocator_ServiceDesc.ServiceName, s)
	ctx := context.Background()

	type load struct {
		region string
		every  time.Duration
	}
	limits := []struct {
		limit *pb.Limit
		load  []load
	}{
		{&pb.Limit{Id: "tenant/atlas", LimitTokens: 150, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
			Owner: "payments <sre@example.com>", Description: `Atlas "gold" contract & <b>friends</b>`},
			[]load{{"eu", 8 * time.Millisecond}, {"us", 16 * time.Millisecond}}}, // up to 375 asked per window
		{&pb.Limit{Id: "tenant/globex", LimitTokens: 120, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_BOUNDED,
			Fallback: map[string]*pb.Fallback{"us": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 20}},
			Owner:    "logistics"},
			[]load{{"eu", 30 * time.Millisecond}, {"us", 40 * time.Millisecond}}}, // up to 117 asked per window
		{&pb.Limit{Id: "tenant/initech", LimitTokens: 50, Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, Owner: "reports"},
			[]load{{"eu", 15 * time.Millisecond}}}, // up to 133 asked per window
	}
	// A bucket limit: no windows, no chart; its page shows its shares and
	// its reporting intervals.
	bucketLimit := &pb.Limit{Id: "backend/search", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: 50, BurstTokens: 20,
		Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Owner: "search"}
	limits = append(limits, struct {
		limit *pb.Limit
		load  []load
	}{bucketLimit, []load{{"eu", 10 * time.Millisecond}, {"us", 20 * time.Millisecond}}})
	admin := pb.NewAdminClient(conn)
	for _, l := range limits {
		if l.limit.Kind != pb.LimitKind_LIMIT_KIND_BUCKET {
			l.limit.Window = durationpb.New(2 * time.Second)
		}
		if _, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l.limit}); err != nil {
			t.Fatalf("put %s: %v", l.limit.Id, err)
		}
	}

	// Drive Checks until the leader has three final windows of
	// tenant/atlas (closed, usage reports in; eight for a screenshot),
	// within a deadline, and on until the test ends.
	agents := map[string]pb.RegionAgentClient{}
	for r, addr := range map[string]string{"eu": eu, "us": us} {
		c := dial(t, addr)
		waitServing(t, c, pb.RegionAgent_ServiceDesc.ServiceName, s)
		agents[r] = pb.NewRegionAgentClient(c)
	}
	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for _, l := range limits {
		for _, ld := range l.load {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(ld.every)
				defer tick.Stop()
				for {
					select {
					case <-tctx.Done():
						return
					case <-tick.C:
					}
					cctx, cancel := context.WithTimeout(tctx, 2*time.Second)
					_, _ = agents[ld.region].Check(cctx, &pb.CheckRequest{LimitId: l.limit.Id, Cost: 1})
					cancel()
				}
			}()
		}
	}
	statusURL := "http://" + allocHTTP + "/status"
	want, wait := 3, 45*time.Second
	if *screenshot != "" {
		want, wait = 8, 75*time.Second // a fuller chart
	}
	deadline := time.Now().Add(wait)
	for {
		body, code := getPage(t, statusURL+"?limit=tenant/atlas")
		if code == http.StatusNotFound && !strings.Contains(body, "tenant/atlas") {
			t.Fatalf("GET /status: 404 %q: is statuspage.Handler mounted in cmd/leasehold/allocator.go?", body)
		}
		if code != http.StatusOK {
			t.Fatalf("GET /status?limit=tenant/atlas: %d %s", code, body)
		}
		final := strings.Count(body, `<th scope="row">`) - strings.Count(body, "(running)") - strings.Count(body, "(settling)")
		if final >= want && strings.Contains(body, `class="seg"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant/atlas has %d final windows after %v; page:\n%s", final, wait, body)
		}
		time.Sleep(250 * time.Millisecond) // polling the reports
	}
	// Traffic goes on while Chromium loads the page: the last windows are
	// busy ones. The screenshot first: the windows it shows were not
	// slowed down by the other Chromium runs.
	if *screenshot != "" {
		path, err := filepath.Abs(*screenshot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		_, _ = runChromium(t, bin, statusURL, "--screenshot="+path, "--window-size=1280,900", "--hide-scrollbars")
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Fatalf("screenshot %s: not a PNG (%v)", path, err)
		}
		t.Logf("wrote %s (%d bytes)", path, len(b))
	}
	dom, log := runChromium(t, bin, statusURL, "--dump-dom")
	for _, want := range []string{`id="limits"`, "tenant/atlas", "tenant/globex", "tenant/initech", "backend/search", "bucket 50/s, burst 20", `<svg class="chart"`,
		`class="seg"`, `<path class="g"`, `class="windows"`, "badge leader",
		// The owner and description are text, not markup.
		"payments &lt;sre@example.com&gt;"} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM lacks %q", want)
		}
	}
	if strings.Contains(dom, "<b>friends</b>") || strings.Contains(dom, "<script") {
		t.Error("DOM has markup from limit fields, or a script")
	}
	if n := strings.Count(dom, `<svg class="chart"`); n != 3 {
		t.Errorf("%d charts in the DOM, want 3", n)
	}
	if bad := consoleErrors(log); len(bad) > 0 {
		t.Errorf("console messages:\n%s", strings.Join(bad, "\n"))
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	detail, log := runChromium(t, bin, statusURL+"?limit=tenant/atlas", "--dump-dom")
	if !strings.Contains(detail, `id="windows"`) || !strings.Contains(detail, `<svg class="chart"`) {
		t.Errorf("detail page DOM lacks the windows table or the chart:\n%s", detail)
	}
	if bad := consoleErrors(log); len(bad) > 0 {
		t.Errorf("console messages on the detail page:\n%s", strings.Join(bad, "\n"))
	}

	// The bucket limit's page: its shares in force (both regions have
	// Checks) and its intervals, the running one at least; no chart.
	bucketPage, log := runChromium(t, bin, statusURL+"?limit=backend/search", "--dump-dom")
	for _, want := range []string{"bucket: 50/s, burst 20", `id="shares"`, `id="intervals"`, "(running)"} {
		if !strings.Contains(bucketPage, want) {
			t.Errorf("bucket limit's page DOM lacks %q:\n%s", want, bucketPage)
		}
	}
	if strings.Contains(bucketPage, `<svg class="chart"`) {
		t.Error("a chart on the bucket limit's page")
	}
	if bad := consoleErrors(log); len(bad) > 0 {
		t.Errorf("console messages on the bucket limit's page:\n%s", strings.Join(bad, "\n"))
	}
}
