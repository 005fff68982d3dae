package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/ports"
	"leasehold/internal/syncbuf"
	pb "leasehold/proto/leasehold/v1"
)

// started is a leasehold command running in the test process.
type started struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned; exit is then set
	exit   int
	stdout *syncbuf.Buffer
	stderr *syncbuf.Buffer
}

// wait returns the exit code once the command stopped.
func (s *started) wait() int {
	<-s.done
	return s.exit
}

func startCmd(t *testing.T, args ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{cancel: cancel, done: make(chan struct{}), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}}
	go func() { defer close(s.done); s.exit = run(ctx, args, s.stdout, s.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Error("command did not stop")
		}
	})
	return s
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing waits until a gRPC health check of service says SERVING.
func waitServing(t *testing.T, conn *grpc.ClientConn, service string, s *started) {
	t.Helper()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-s.done:
			t.Fatalf("command exited %d: %s", s.exit, s.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not serving: %v %v; stderr: %s", service, resp, err, s.stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling readiness
	}
}

func TestAllocatorCommandServes(t *testing.T) {
	grpcAddr, httpAddr := ports.Addr(t), ports.Addr(t)
	dir := filepath.Join(t.TempDir(), "data")
	args := []string{"allocator", "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--data-dir", dir,
		"--etcd-client-addr", ports.Addr(t), "--etcd-peer-addr", ports.Addr(t), "--regions", "eu,us"}
	s := startCmd(t, args...)
	conn := dial(t, grpcAddr)
	waitServing(t, conn, pb.Allocator_ServiceDesc.ServiceName, s)

	ctx := context.Background()
	admin := pb.NewAdminClient(conn)
	if _, err := admin.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: &pb.Limit{
		Id: "demo/tenant", LimitTokens: 1000, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT,
	}}); err != nil {
		t.Fatal(err)
	}
	alloc := pb.NewAllocatorClient(conn)
	var res *pb.AcquireLeasesResponse
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		res, err = alloc.AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r1", LimitId: "demo/tenant", WantTokens: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Results[0].Code == pb.ItemCode_ITEM_CODE_OK || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the leader learns the new limit through its watch
	}
	if l := res.Results[0].Lease; l == nil || l.Tokens != 10 {
		t.Fatalf("lease: %v", res)
	}

	// Reflection lists the services.
	rc, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"leasehold.v1.Allocator", "leasehold.v1.Admin", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Fatalf("reflection lists %v, missing %s", names, want)
		}
	}

	body := httpGet(t, "http://"+httpAddr+"/metrics", 200)
	for _, want := range []string{"leasehold_allocator_leader 1", "leasehold_lease_grants_total{result=\"granted\"} 1", "leasehold_etcd_txn_ops_count"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "etcd_server_") {
		t.Error("/metrics exposes embedded etcd's global metrics")
	}
	if body := httpGet(t, "http://"+httpAddr+"/healthz", 200); !strings.Contains(body, "leader") {
		t.Errorf("/healthz: %q", body)
	}

	// A clean stop, then a second run on the same data directory keeps the limit.
	s.cancel()
	if code := s.wait(); code != 0 {
		t.Fatalf("exit %d: %s", code, s.stderr)
	}
	s2 := startCmd(t, args...)
	conn2 := dial(t, grpcAddr)
	waitServing(t, conn2, pb.Allocator_ServiceDesc.ServiceName, s2)
	got, err := pb.NewAdminClient(conn2).GetLimit(ctx, &pb.GetLimitRequest{Id: "demo/tenant"})
	if err != nil || got.Limit.LimitTokens != 1000 {
		t.Fatalf("after restart: %v %v", got, err)
	}
	// The replayed request id still returns its lease.
	res2, err := pb.NewAllocatorClient(conn2).AcquireLeases(ctx, &pb.AcquireLeasesRequest{Region: "eu", Requests: []*pb.LeaseRequest{{RequestId: "r1", LimitId: "demo/tenant", WantTokens: 10}}})
	if err != nil || !res2.Results[0].Replayed || res2.Results[0].Lease.LeaseId != res.Results[0].Lease.LeaseId {
		t.Fatalf("replay after restart: %v %v", res2, err)
	}
}

func httpGet(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nonsense"},
		{"allocator", "--no-such-flag"},
		{"allocator", "--regions", ""},
		{"allocator", "--regions", "EU"},
		{"allocator", "--session-ttl", "10ms"},
		{"allocator", "--session-ttl", "soon"},
		{"allocator", "--log-level", "loud"},
		{"allocator", "extra"},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), args, io.Discard, &stderr)
		lines := strings.Count(strings.TrimSpace(stderr.String()), "\n")
		if code != 2 || (len(args) > 0 && lines != 0) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with one line", args, code, stderr.String())
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"allocator", "-h"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "-grpc-addr") {
		t.Errorf("-h: exit %d, %q", code, out.String())
	}
}
