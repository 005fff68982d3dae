package allocator

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"leasehold/allocator/auth"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Server serves the Allocator and Admin gRPC services of one replica.
type Server struct {
	pb.UnimplementedAllocatorServer
	pb.UnimplementedAdminServer
	a *Allocator
	// authRequired: a call with no principal in its context is refused
	// (authentication is on); otherwise it acts as auth.Anonymous.
	authRequired bool
}

// ServerOption changes an optional setting of a Server.
type ServerOption func(*Server)

// WithAuthRequired says whether authentication is on: the transports then
// put a principal in every authenticated call's context, and a call with
// none is refused (Unauthenticated), never served as auth.Anonymous.
func WithAuthRequired(on bool) ServerOption { return func(s *Server) { s.authRequired = on } }

// NewServer returns the gRPC services of a.
func NewServer(a *Allocator, opts ...ServerOption) *Server {
	s := &Server{a: a}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Register registers both services on s.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	pb.RegisterAllocatorServer(g, s)
	pb.RegisterAdminServer(g, s)
}

// toStatus maps the package's errors to gRPC status codes: the one table.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var nl *NotLeaderError
	var wg *WrongGroupError
	code := codes.Internal
	switch {
	case errors.Is(err, vocab.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrVersionMismatch), errors.Is(err, ErrMapChanged):
		code = codes.Aborted
	case errors.Is(err, auth.ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, auth.ErrDenied):
		code = codes.PermissionDenied
	case errors.As(err, &nl):
		code = codes.Unavailable
		if nl.Leader != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(vocab.LeaderMetadataKey, nl.Leader))
		}
	case errors.As(err, &wg):
		code = codes.FailedPrecondition
		if wg.Group != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(vocab.GroupMetadataKey, wg.Group, vocab.GroupAllocatorMetadataKey, wg.Allocator))
		}
	case errors.Is(err, ErrFenced), errors.Is(err, ErrStopped), errors.Is(err, errTermEnded):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			return err
		}
		code = codes.Unavailable // etcd unreachable and the like
	}
	return status.Error(code, err.Error())
}

// allowLease authorizes a call of the Allocator service: only region's
// own agent, whose region comes from its certificate, may lease, return,
// report or sync limits for it. Refusals are logged, not audited (no
// limit changes). The region is validated first, so that what is logged
// (and said back) of it is at most vocab.MaxRegionLen bytes: a SyncLimits
// naming a 4 MB region once wrote an 8.4 MB log line.
func (s *Server) allowLease(ctx context.Context, rpc, region string) error {
	p, err := s.principal(ctx, rpc)
	if err != nil {
		return err
	}
	if err := vocab.ValidateRegion("region", region); err != nil {
		return err
	}
	if err := p.Allow(auth.ActionLease, "", region); err != nil {
		s.a.log.Warn("allocator: Allocator service call refused", "rpc", rpc, "principal", p.Name, "region", region, "err", err)
		return err
	}
	return nil
}

// AcquireLeases implements pb.AllocatorServer.
func (s *Server) AcquireLeases(ctx context.Context, req *pb.AcquireLeasesRequest) (*pb.AcquireLeasesResponse, error) {
	if err := s.allowLease(ctx, "AcquireLeases", req.GetRegion()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := ValidateAcquire(req); err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.AcquireLeases(ctx, req.Region, req.Requests)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.AcquireLeasesResponse{Results: res}, nil
}

// AcquireShares implements pb.AllocatorServer.
func (s *Server) AcquireShares(ctx context.Context, req *pb.AcquireSharesRequest) (*pb.AcquireSharesResponse, error) {
	if err := s.allowLease(ctx, "AcquireShares", req.GetRegion()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := ValidateAcquireShares(req); err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.AcquireShares(ctx, req.Region, req.Requests)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.AcquireSharesResponse{Results: res}, nil
}

// ReturnLeases implements pb.AllocatorServer.
func (s *Server) ReturnLeases(ctx context.Context, req *pb.ReturnLeasesRequest) (*pb.ReturnLeasesResponse, error) {
	if err := s.allowLease(ctx, "ReturnLeases", req.GetRegion()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := ValidateReturn(req); err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.ReturnLeases(ctx, req.Region, req.Returns)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.ReturnLeasesResponse{Results: res}, nil
}

// ReportUsage implements pb.AllocatorServer.
func (s *Server) ReportUsage(ctx context.Context, req *pb.ReportUsageRequest) (*pb.ReportUsageResponse, error) {
	if err := s.allowLease(ctx, "ReportUsage", req.GetRegion()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := ValidateReport(req); err != nil {
		return nil, toStatus(ctx, err)
	}
	n, err := s.a.ReportUsage(ctx, req.Region, req.Reporter, req.Usage)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.ReportUsageResponse{Accepted: n}, nil
}

// SyncLimits implements pb.AllocatorServer. Any replica answers it from
// etcd, with the version of each limit in force now (Allocator.SyncLimits).
func (s *Server) SyncLimits(ctx context.Context, req *pb.SyncLimitsRequest) (*pb.SyncLimitsResponse, error) {
	if err := s.allowLease(ctx, "SyncLimits", req.GetRegion()); err != nil { // validates the region too
		return nil, toStatus(ctx, err)
	}
	out, err := s.a.SyncLimits(ctx, req.Region, req.KnownRevision)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := s.a.addGroupMap(out, req.KnownGroupMapRevision); err != nil {
		return nil, toStatus(ctx, err)
	}
	return out, nil
}
