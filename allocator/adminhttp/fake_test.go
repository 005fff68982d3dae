package adminhttp

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
)

// fakeAdmin answers every Admin RPC with an empty response and records
// the calls: the RPC (as grpc.Method names it) and the request.
type fakeAdmin struct {
	pb.UnimplementedAdminServer
	mu    sync.Mutex // protects calls
	calls []fakeCall
}

type fakeCall struct {
	method string
	req    proto.Message
}

func (f *fakeAdmin) record(ctx context.Context, req proto.Message) {
	m, _ := grpc.Method(ctx)
	f.mu.Lock()
	if len(f.calls) >= 100 {
		f.calls = f.calls[:0]
	}
	f.calls = append(f.calls, fakeCall{m, proto.Clone(req)})
	f.mu.Unlock()
}

// last returns the last call, or a zero call.
func (f *fakeAdmin) last() fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return fakeCall{}
	}
	return f.calls[len(f.calls)-1]
}

func (f *fakeAdmin) PutLimit(ctx context.Context, req *pb.PutLimitRequest) (*pb.PutLimitResponse, error) {
	f.record(ctx, req)
	return &pb.PutLimitResponse{Limit: &pb.Limit{Id: req.GetLimit().GetId(), Version: 1}}, nil
}

func (f *fakeAdmin) GetLimit(ctx context.Context, req *pb.GetLimitRequest) (*pb.GetLimitResponse, error) {
	f.record(ctx, req)
	return &pb.GetLimitResponse{Limit: &pb.Limit{Id: req.Id, Version: 1}}, nil
}

func (f *fakeAdmin) ListLimits(ctx context.Context, req *pb.ListLimitsRequest) (*pb.ListLimitsResponse, error) {
	f.record(ctx, req)
	return &pb.ListLimitsResponse{}, nil
}

func (f *fakeAdmin) DeleteLimit(ctx context.Context, req *pb.DeleteLimitRequest) (*pb.DeleteLimitResponse, error) {
	f.record(ctx, req)
	return &pb.DeleteLimitResponse{}, nil
}

func (f *fakeAdmin) ListWindows(ctx context.Context, req *pb.ListWindowsRequest) (*pb.ListWindowsResponse, error) {
	f.record(ctx, req)
	return &pb.ListWindowsResponse{}, nil
}

func (f *fakeAdmin) ApplyLimits(ctx context.Context, req *pb.ApplyLimitsRequest) (*pb.ApplyLimitsResponse, error) {
	f.record(ctx, req)
	return &pb.ApplyLimitsResponse{}, nil
}

func (f *fakeAdmin) LimitHistory(ctx context.Context, req *pb.LimitHistoryRequest) (*pb.LimitHistoryResponse, error) {
	f.record(ctx, req)
	return &pb.LimitHistoryResponse{}, nil
}

func (f *fakeAdmin) ListAudit(ctx context.Context, req *pb.ListAuditRequest) (*pb.ListAuditResponse, error) {
	f.record(ctx, req)
	return &pb.ListAuditResponse{}, nil
}

func (f *fakeAdmin) WhoAmI(ctx context.Context, req *pb.WhoAmIRequest) (*pb.WhoAmIResponse, error) {
	f.record(ctx, req)
	return &pb.WhoAmIResponse{Principal: "anonymous"}, nil
}
