package allocator

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
)

// LeaderMetadataKey is the trailer in which a follower names the leader.
const LeaderMetadataKey = "leasehold-leader"

// Server serves the Allocator and Admin gRPC services of one replica.
type Server struct {
	pb.UnimplementedAllocatorServer
	pb.UnimplementedAdminServer
	a *Allocator
}

// NewServer returns the gRPC services of a.
func NewServer(a *Allocator) *Server { return &Server{a: a} }

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
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrVersionMismatch):
		code = codes.Aborted
	case errors.As(err, &nl):
		code = codes.Unavailable
		if nl.Leader != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderMetadataKey, nl.Leader))
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

// AcquireLeases implements pb.AllocatorServer.
func (s *Server) AcquireLeases(ctx context.Context, req *pb.AcquireLeasesRequest) (*pb.AcquireLeasesResponse, error) {
	if err := ValidateAcquire(req); err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.AcquireLeases(ctx, req.Region, req.Requests)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.AcquireLeasesResponse{Results: res}, nil
}

// ReturnLeases implements pb.AllocatorServer.
func (s *Server) ReturnLeases(ctx context.Context, req *pb.ReturnLeasesRequest) (*pb.ReturnLeasesResponse, error) {
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
// etcd.
func (s *Server) SyncLimits(ctx context.Context, req *pb.SyncLimitsRequest) (*pb.SyncLimitsResponse, error) {
	if err := ValidateRegion("region", req.GetRegion()); err != nil {
		return nil, toStatus(ctx, err)
	}
	rev, err := s.a.store.LimitsRevision(ctx)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	now := s.a.opt.now().UnixNano()
	if rev != 0 && rev == req.KnownRevision {
		return &pb.SyncLimitsResponse{Revision: rev, Unchanged: true, AllocatorUnixNanos: now}, nil
	}
	all, err := s.a.store.AllLimits(ctx)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &pb.SyncLimitsResponse{Revision: rev, AllocatorUnixNanos: now}
	for _, l := range all {
		for _, r := range l.Regions {
			if r == req.Region {
				out.Limits = append(out.Limits, l)
				break
			}
		}
	}
	return out, nil
}

// PutLimit implements pb.AdminServer.
func (s *Server) PutLimit(ctx context.Context, req *pb.PutLimitRequest) (*pb.PutLimitResponse, error) {
	l, err := s.a.PutLimit(ctx, req.GetLimit(), req.ExpectedVersion)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.PutLimitResponse{Limit: l}, nil
}

// GetLimit implements pb.AdminServer.
func (s *Server) GetLimit(ctx context.Context, req *pb.GetLimitRequest) (*pb.GetLimitResponse, error) {
	if err := ValidateLimitID("id", req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	l, err := s.a.store.GetLimit(ctx, req.Id)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.GetLimitResponse{Limit: l}, nil
}

// ListLimits implements pb.AdminServer.
func (s *Server) ListLimits(ctx context.Context, req *pb.ListLimitsRequest) (*pb.ListLimitsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > 1000:
		return nil, toStatus(ctx, fieldErr("page_size", "must be 0-1000, got %d", size))
	case size == 0:
		size = 100
	}
	if len(req.GetPrefix()) > maxLimitIDLen {
		return nil, toStatus(ctx, fieldErr("prefix", "longer than %d characters", maxLimitIDLen))
	}
	ls, next, err := s.a.store.ListLimits(ctx, req.GetPrefix(), size, req.GetPageToken())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.ListLimitsResponse{Limits: ls, NextPageToken: next}, nil
}

// DeleteLimit implements pb.AdminServer.
func (s *Server) DeleteLimit(ctx context.Context, req *pb.DeleteLimitRequest) (*pb.DeleteLimitResponse, error) {
	if err := ValidateLimitID("id", req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := s.a.store.DeleteLimit(ctx, req.Id, req.ExpectedVersion); err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.DeleteLimitResponse{}, nil
}

// maxReportWindows bounds ListWindows.last.
const maxReportWindows = 1000

// ListWindows implements pb.AdminServer.
func (s *Server) ListWindows(ctx context.Context, req *pb.ListWindowsRequest) (*pb.ListWindowsResponse, error) {
	if err := ValidateLimitID("limit_id", req.GetLimitId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	last := int(req.GetLast())
	switch {
	case last < 0 || last > maxReportWindows:
		return nil, toStatus(ctx, fieldErr("last", "must be 0-%d, got %d", maxReportWindows, last))
	case last == 0:
		last = 10
	}
	reps, err := s.a.Reports(req.LimitId, last)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &pb.ListWindowsResponse{Windows: make([]*pb.WindowReport, len(reps))}
	for i, r := range reps {
		out.Windows[i] = r.ToProto()
	}
	return out, nil
}
