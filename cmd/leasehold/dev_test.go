package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// devArgs runs `leasehold dev` on free loopback ports in dir.
func devArgs(t *testing.T, dir string) (args []string, alloc, eu, us, euHTTP string) {
	alloc, eu, us, euHTTP = ports.Addr(t), ports.Addr(t), ports.Addr(t), ports.Addr(t)
	args = []string{"dev", "--data-dir", dir, "--allocator-grpc", alloc, "--allocator-http", ports.Addr(t),
		"--etcd-client-addr", ports.Addr(t), "--etcd-peer-addr", ports.Addr(t),
		"--eu-grpc", eu, "--eu-http", euHTTP, "--us-grpc", us, "--us-http", ports.Addr(t),
		"--eu-gateway", ports.Addr(t), "--us-gateway", ports.Addr(t),
		"--eu-gateway-metrics", ports.Addr(t), "--us-gateway-metrics", ports.Addr(t)}
	return
}

// argValue returns the value of flag name in args.
func argValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// waitDemoAdmitted waits until each agent serves and admits the demo
// limit (it syncs limits and leases in the background), G = 1000.
func waitDemoAdmitted(t *testing.T, s *started, agents ...string) {
	t.Helper()
	for _, addr := range agents {
		conn := dial(t, addr)
		waitServing(t, conn, pb.RegionAgent_ServiceDesc.ServiceName, s)
		cl := pb.NewRegionAgentClient(conn)
		var resp *pb.CheckResponse
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; {
			resp, err = cl.Check(context.Background(), &pb.CheckRequest{LimitId: demoLimit, Cost: 1})
			if err == nil && resp.Allowed || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // polling the agent's background sync
		}
		if err != nil || !resp.Allowed || resp.LimitTokens != 1000 {
			t.Fatalf("agent %s: %v %v", addr, resp, err)
		}
	}
}

func TestDevServesTheDemoLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	args, alloc, eu, us, euHTTP := devArgs(t, dir)
	s := startCmd(t, args...)
	ctx := context.Background()
	waitDemoAdmitted(t, s, eu, us)
	lim, err := pb.NewAdminClient(dial(t, alloc)).GetLimit(ctx, &pb.GetLimitRequest{Id: demoLimit})
	if err != nil || lim.Limit.Version != 1 {
		t.Fatalf("demo limit: %v %v", lim, err)
	}
	if body := httpGet(t, "http://"+euHTTP+"/metrics", 200); !strings.Contains(body, `leasehold_agent_checks_total{result="ok"}`) {
		t.Error("agent metrics lack leasehold_agent_checks_total")
	}
	// Through the eu gateway: a limit of 3 per minute admits three requests
	// and then answers 429 with Retry-After.
	if _, err := pb.NewAdminClient(dial(t, alloc)).PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: &pb.Limit{
		Id: "demo/small", LimitTokens: 3, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{MinChunk: 3}}}); err != nil {
		t.Fatal(err)
	}
	waitAgentKnows(t, pb.NewRegionAgentClient(dial(t, eu)), "demo/small", 4)
	got, last := gatewayGets(t, "http://"+argValue(args, "--eu-gateway")+"/orders", "small", 4)
	if retryAfter := last.Get("Retry-After"); fmt.Sprint(got) != "[200 200 200 429]" || retryAfter == "" {
		t.Fatalf("through the gateway: %v (Retry-After %q), want 3 x 200 then 429", got, retryAfter)
	}
	// The gateway counted them on its own /metrics.
	m := scrape(t, "http://"+argValue(args, "--eu-gateway-metrics")+"/metrics")
	if ok, over := m[`leasehold_gateway_decisions_total{result="ok",source="agent"}`]+m[`leasehold_gateway_decisions_total{result="ok",source="sublease"}`],
		m[`leasehold_gateway_decisions_total{result="429",source="agent"}`]+m[`leasehold_gateway_decisions_total{result="429",source="denial_cache"}`]; ok != 3 || over != 1 {
		t.Fatalf("gateway eu counted %v ok and %v 429: %v", ok, over, m)
	}

	s.cancel()
	if code := s.wait(); code != 0 {
		t.Fatalf("dev exit %d: %s", code, s.stderr)
	}
	// A second run on the same data directory starts and keeps the limit.
	args2, alloc2, eu2, _, _ := devArgs(t, dir)
	s2 := startCmd(t, args2...)
	waitServing(t, dial(t, eu2), pb.RegionAgent_ServiceDesc.ServiceName, s2)
	lim, err = pb.NewAdminClient(dial(t, alloc2)).GetLimit(ctx, &pb.GetLimitRequest{Id: demoLimit})
	if err != nil || lim.Limit.Version != 1 {
		t.Fatalf("second run: demo limit %v %v", lim, err)
	}
}

func TestAgentUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"agent"},
		{"agent", "--region", "EU"},
		{"agent", "--region", "eu", "--redis", "memcache://x:1"},
		{"agent", "--region", "eu", "--allocator", ""},
		{"agent", "--region", "eu", "--renew-lead", "0s"},
		{"dev", "--redis", "mars=1.2.3.4:5"},
		{"dev", "--traffic-eu", "-5"},
		{"agent", "--region", "eu", "--chunk-hot-rate", "-1"},
		{"agent", "--region", "eu", "--chunk-hot-rate", "NaN"},
		{"dev", "--chunk-hot-rate", "+Inf"},
	} {
		var stderr syncbuf.Buffer
		if code := run(context.Background(), args, nil, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// TestDevGroups: `leasehold dev --groups 2` runs two allocator groups on
// the embedded etcd, writes the group map naming both, and the agents
// (configured with the first group's address only) learn it and admit the
// demo limit, which lives in the group that owns it.
func TestDevGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("a whole dev system with two allocator groups")
	}
	dir := filepath.Join(t.TempDir(), "dev")
	args, _, eu, us, _ := devArgs(t, dir)
	args = append(args, "--groups", "2")
	s := startCmd(t, args...)
	ctx := context.Background()
	waitDemoAdmitted(t, s, eu, us)
	if !strings.Contains(s.stdout.String(), "2 allocator groups (g1, g2)") {
		t.Errorf("dev's output does not name the groups:\n%s", s.stdout.String())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{argValue(args, "--etcd-client-addr")}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m, _, err := allocator.NewMapStore(cli, "", 0).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := m.Current()
	if len(v.Groups) != 2 || v.Groups[0].Name != "g1" || v.Groups[1].Name != "g2" || v.Groups[0].Allocators[0] != argValue(args, "--allocator-grpc") {
		t.Fatalf("group map %+v: want g1 on -allocator-grpc and g2", v)
	}
	owner, _, _ := m.Owner(demoLimit, time.Now())
	resp, err := cli.Get(ctx, "/leasehold/g/"+owner+"/limits/"+demoLimit)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the demo limit is not stored in its owner group %s: %v %v", owner, resp, err)
	}
	s.cancel()
	if code := s.wait(); code != 0 {
		t.Fatalf("dev exit %d: %s", code, s.stderr)
	}
}

// TestDevCalendarLimit: a calendar limit through the real processes of
// leasehold dev. A limit of 3 a day in Pacific/Kiritimati (UTC+14, no
// daylight saving, so its day is 24 h and ends at 10:00 UTC) is written
// to the allocator; the eu gateway admits three requests and answers the
// fourth 429, its RateLimit-Policy naming the day's 86400 s; the eu
// agent's Check says the window is that calendar day and resets at the
// next local midnight.
func TestDevCalendarLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	args, alloc, eu, us, _ := devArgs(t, dir)
	s := startCmd(t, args...)
	ctx := context.Background()
	waitDemoAdmitted(t, s, eu, us)
	const zone = "Pacific/Kiritimati"
	if _, err := pb.NewAdminClient(dial(t, alloc)).PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: &pb.Limit{
		Id: "demo/daily", LimitTokens: 3, Calendar: &pb.CalendarWindows{Unit: "day", Zone: zone}, Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{MinChunk: 3}}}); err != nil {
		t.Fatal(err)
	}
	euAgent := pb.NewRegionAgentClient(dial(t, eu))
	waitAgentKnows(t, euAgent, "demo/daily", 4)
	got, last := gatewayGets(t, "http://"+argValue(args, "--eu-gateway")+"/orders", "daily", 4)
	if policy := last.Get("RateLimit-Policy"); fmt.Sprint(got) != "[200 200 200 429]" || !strings.Contains(policy, "q=3") || !strings.Contains(policy, "w=86400") {
		t.Fatalf("through the gateway: %v, RateLimit-Policy %q; want 3 x 200 then 429, q=3, w=86400", got, last.Get("RateLimit-Policy"))
	}

	before := time.Now()
	resp, err := euAgent.Check(ctx, &pb.CheckRequest{LimitId: "demo/daily", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	y, m, d := before.In(loc).Date()
	midnight := time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	if resp.Allowed || resp.Reason != pb.Reason_REASON_OVER_LIMIT || resp.GetCalendar().GetUnit() != "day" ||
		resp.GetCalendar().GetZone() != zone || resp.GetWindow().AsDuration() != 24*time.Hour {
		t.Fatalf("the agent's answer after the day's 3: %v, want OVER_LIMIT in a 24 h calendar day of %s", resp, zone)
	}
	// reset_after is measured on the agent's clock from its answer: within
	// a few seconds of the test's own reckoning of the next local midnight.
	if want, reset := midnight.Sub(before), resp.GetResetAfter().AsDuration(); reset > want+time.Second || reset < want-5*time.Second {
		t.Fatalf("reset_after %v, want about %v (to %s's next midnight, %v)", reset, want, zone, midnight.UTC())
	}
}

// waitAgentKnows waits until an agent knows limit id, without spending
// from it: a Check of a cost above its G is refused as invalid once the
// limit is known.
func waitAgentKnows(t *testing.T, agent pb.RegionAgentClient, id string, aboveG int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err := agent.Check(context.Background(), &pb.CheckRequest{LimitId: id, Cost: aboveG})
		if status.Code(err) == codes.InvalidArgument {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never learned %s: %v", id, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the agent's limit sync
	}
}

// gatewayGets sends n GETs to url through a gateway with X-Tenant:
// tenant, one after another, and returns their statuses and the last
// answer's headers.
func gatewayGets(t *testing.T, url, tenant string, n int) (statuses []int, last http.Header) {
	t.Helper()
	for range n {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses, last = append(statuses, resp.StatusCode), resp.Header
	}
	return statuses, last
}
