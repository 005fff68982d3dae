// Command noopserver is the floor that make bench-check measures the
// region agent against: a gRPC server that answers every RegionAgent
// Check and every Envoy ShouldRateLimit OK at once, on the same gRPC
// stack and with answers of the same shape as the agent's. What it costs
// is what the RPC itself costs.
//
//	noopserver -grpc-addr 127.0.0.1:PORT
//
// It serves the gRPC health service (SERVING once it listens) and stops
// on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// agent answers Check as an agent that admits everything would.
type agent struct {
	pb.UnimplementedRegionAgentServer
}

func (agent) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 1,
		RetryAfter: durationpb.New(0), ResetAfter: durationpb.New(time.Second), LimitTokens: 1,
		Window: durationpb.New(time.Minute)}, nil
}

// envoy answers ShouldRateLimit OK, one status per descriptor, as the
// agent's Envoy service does for descriptors that all pass.
type envoy struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (envoy) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining: 1, DurationUntilReset: durationpb.New(time.Second)}
	}
	return resp, nil
}

func main() {
	addr := flag.String("grpc-addr", "127.0.0.1:0", "gRPC listen address")
	flag.Parse()
	if err := run(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "noopserver:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	pb.RegisterRegionAgentServer(s, agent{})
	rlsv3.RegisterRateLimitServiceServer(s, envoy{})
	healthpb.RegisterHealthServer(s, health.NewServer()) // SERVING from the start
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); s.Stop() }()
	return s.Serve(l)
}
