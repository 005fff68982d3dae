package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// devArgs runs `leasehold dev` on free loopback ports in dir.
func devArgs(t *testing.T, dir string) (args []string, alloc, eu, us, euHTTP string) {
	alloc, eu, us, euHTTP = freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	args = []string{"dev", "--data-dir", dir, "--allocator-grpc", alloc, "--allocator-http", freeAddr(t),
		"--etcd-client-addr", freeAddr(t), "--etcd-peer-addr", freeAddr(t),
		"--eu-grpc", eu, "--eu-http", euHTTP, "--us-grpc", us, "--us-http", freeAddr(t)}
	return
}

func TestDevServesTheDemoLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	args, alloc, eu, us, euHTTP := devArgs(t, dir)
	s := startCmd(t, args...)
	ctx := context.Background()
	for _, addr := range []string{eu, us} {
		conn := dial(t, addr)
		waitServing(t, conn, pb.RegionAgent_ServiceDesc.ServiceName, s)
		cl := pb.NewRegionAgentClient(conn)
		var resp *pb.CheckResponse
		deadline := time.Now().Add(20 * time.Second)
		for {
			var err error
			resp, err = cl.Check(ctx, &pb.CheckRequest{LimitId: demoLimit, Cost: 1})
			if err == nil && resp.Allowed || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // the agent syncs limits and leases in the background
		}
		if !resp.Allowed || resp.LimitTokens != 1000 {
			t.Fatalf("agent %s: %v", addr, resp)
		}
	}
	lim, err := pb.NewAdminClient(dial(t, alloc)).GetLimit(ctx, &pb.GetLimitRequest{Id: demoLimit})
	if err != nil || lim.Limit.Version != 1 {
		t.Fatalf("demo limit: %v %v", lim, err)
	}
	if body := httpGet(t, "http://"+euHTTP+"/metrics", 200); !strings.Contains(body, `leasehold_agent_checks_total{result="ok"}`) {
		t.Error("agent metrics lack leasehold_agent_checks_total")
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
	} {
		var stderr syncBuffer
		if code := run(context.Background(), args, nil, &stderr); code != 2 || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}
