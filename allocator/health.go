package allocator

import (
	"context"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "leasehold/proto/leasehold/v1"
)

// ServeHealth keeps h current until ctx ends: the process ("") and Admin
// are SERVING on every replica; the Allocator service is SERVING only on
// the leader, so a health-checking balancer sends agents to it.
func ServeHealth(ctx context.Context, a *Allocator, h *health.Server) {
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(pb.Admin_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	for {
		ch := a.LeadershipChanged()
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if a.IsLeader() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		h.SetServingStatus(pb.Allocator_ServiceDesc.ServiceName, st)
		select {
		case <-ch:
		case <-ctx.Done():
			h.Shutdown()
			return
		}
	}
}
