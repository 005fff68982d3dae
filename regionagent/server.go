package regionagent

import (
	"context"
	"errors"
	"leasehold/internal/zones"
	"leasehold/lease"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Server serves the RegionAgent gRPC service.
type Server struct {
	pb.UnimplementedRegionAgentServer
	a *Agent
}

// NewServer returns the gRPC service of a.
func NewServer(a *Agent) *Server { return &Server{a: a} }

// Register registers the service on s.
func (s *Server) Register(g grpc.ServiceRegistrar) { pb.RegisterRegionAgentServer(g, s) }

// toStatus maps the package's errors to gRPC codes: the one table.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrUnknownLimit):
		return status.Error(codes.NotFound, "limit_id: "+err.Error())
	case errors.Is(err, ErrUnknownDecision):
		return status.Error(codes.NotFound, "decision_id: "+err.Error())
	case errors.Is(err, ErrSlotNotHeld):
		return status.Error(codes.NotFound, "slot_id: "+err.Error())
	case errors.Is(err, ErrSettleRefused):
		return status.Error(codes.FailedPrecondition, "decision_id: "+err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

const maxRequestID = vocab.MaxRequestIDLen

func toProto(d Decision) *pb.CheckResponse {
	// One allocation for the answer and its three durations, not four:
	// every Check makes one.
	r := new(checkResponse)
	setDuration(&r.retry, d.RetryAfter)
	setDuration(&r.reset, d.ResetAfter)
	setDuration(&r.window, d.Window)
	m := &r.msg
	m.Allowed, m.Reason, m.Remaining = d.Allowed, d.Reason, d.Remaining
	m.RetryAfter, m.ResetAfter, m.Window = &r.retry, &r.reset, &r.window
	m.LimitTokens, m.LimitVersion, m.DecisionId = d.Limit, d.Version, d.DecisionID
	m.SettleWithin, m.WouldDeny = settleWithin(d), d.WouldDeny
	m.WindowPhase, m.Calendar = phasepb(d.Phase), calpb(d.Cal)
	return m
}

// checkResponse holds a CheckResponse and the durations it points to.
type checkResponse struct {
	msg                  pb.CheckResponse
	retry, reset, window durationpb.Duration
}

// setDuration sets dst to d, as durationpb.New(d) would make it.
func setDuration(dst *durationpb.Duration, d time.Duration) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	dst.Seconds, dst.Nanos = secs, int32(nanos-secs*1e9)
}

// calpb renders a calendar limit's calendar: unset for fixed windows.
func calpb(c lease.Calendar) *pb.CalendarWindows {
	if c.Loc == nil {
		return nil
	}
	return &pb.CalendarWindows{Unit: c.Unit.String(), Zone: c.Loc.String()}
}

// calOf reads a lease's calendar through the process's zone cache (the
// zero Calendar for none, or for a zone this process cannot load: the
// grant then names its window by index and length only).
func calOf(c *pb.CalendarWindows) lease.Calendar {
	if c == nil {
		return lease.Calendar{}
	}
	cal, err := zones.Calendar(c.Unit, c.Zone)
	if err != nil {
		return lease.Calendar{}
	}
	return cal
}

// phasepb renders a window phase offset: unset for none.
func phasepb(p time.Duration) *durationpb.Duration {
	if p == 0 {
		return nil
	}
	return durationpb.New(p)
}

func settleWithin(d Decision) *durationpb.Duration {
	if d.DecisionID == "" {
		return nil
	}
	return durationpb.New(d.SettleWithin)
}

// Check implements pb.RegionAgentServer.
func (s *Server) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if len(req.RequestId) > maxRequestID {
		return nil, toStatus(fieldErr("request_id", "longer than %d characters", maxRequestID))
	}
	check := s.a.Check
	if req.SettleLater {
		check = s.a.CheckSettleLater
	}
	d, err := check(ctx, req.LimitId, req.Cost)
	if err != nil {
		return nil, toStatus(err)
	}
	return toProto(d), nil
}

// CheckMulti implements pb.RegionAgentServer.
func (s *Server) CheckMulti(ctx context.Context, req *pb.CheckMultiRequest) (*pb.CheckMultiResponse, error) {
	items := make([]CheckItem, len(req.Checks))
	for i, c := range req.Checks {
		if len(c.RequestId) > maxRequestID {
			return nil, toStatus(fieldErr("checks["+strconv.Itoa(i)+"].request_id", "longer than %d characters", maxRequestID))
		}
		if c.SettleLater {
			return nil, toStatus(fieldErr("checks["+strconv.Itoa(i)+"].settle_later", "only Check takes settle-later requests"))
		}
		items[i] = CheckItem{Limit: c.LimitId, Cost: c.Cost}
	}
	ds, err := s.a.CheckMulti(ctx, items)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.CheckMultiResponse{Allowed: true, Results: make([]*pb.CheckResponse, len(ds))}
	for i, d := range ds {
		out.Results[i] = toProto(d)
		out.Allowed = out.Allowed && d.Allowed
	}
	return out, nil
}

// Reserve implements pb.RegionAgentServer.
func (s *Server) Reserve(ctx context.Context, req *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	r, err := s.a.Reserve(ctx, req.LimitId, req.Tokens, req.MinTokens, req.ReservationId)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReserveResponse{
		Granted: r.Granted, ExpiresIn: durationpb.New(r.ExpiresIn), Reason: r.Reason,
		RetryAfter: durationpb.New(r.RetryAfter), ResetAfter: durationpb.New(r.ResetAfter),
		LimitTokens: r.Limit, Window: durationpb.New(r.Window), LimitVersion: r.Version, Remaining: r.Remaining,
	}, nil
}

// Release implements pb.RegionAgentServer.
func (s *Server) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	n, err := s.a.Release(ctx, req.LimitId, req.ReservationId, req.Unspent)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReleaseResponse{Returned: n}, nil
}

// Settle implements pb.RegionAgentServer.
func (s *Server) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	r, err := s.a.Settle(ctx, req.LimitId, req.DecisionId, req.Actual)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.SettleResponse{Estimate: r.Estimate, Charged: r.Charged, Refunded: r.Refunded, Overrun: r.Overrun,
		Debt: r.Debt, Replayed: r.Replayed}, nil
}

// AcquireSlot implements pb.RegionAgentServer.
func (s *Server) AcquireSlot(ctx context.Context, req *pb.AcquireSlotRequest) (*pb.AcquireSlotResponse, error) {
	if req.Ttl == nil {
		return nil, toStatus(fieldErr("ttl", "required"))
	}
	if err := req.Ttl.CheckValid(); err != nil {
		return nil, toStatus(fieldErr("ttl", "%v", err))
	}
	d, err := s.a.AcquireSlot(ctx, req.LimitId, req.HolderId, req.Ttl.AsDuration())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.AcquireSlotResponse{Allowed: d.Allowed, Reason: d.Reason, SlotId: d.SlotID, ExpiresIn: durationpb.New(d.ExpiresIn),
		RetryAfter: durationpb.New(d.RetryAfter), LimitSlots: d.Limit, Held: d.Held, Slots: d.Slots, LimitVersion: d.Version}, nil
}

// HeartbeatSlot implements pb.RegionAgentServer.
func (s *Server) HeartbeatSlot(ctx context.Context, req *pb.HeartbeatSlotRequest) (*pb.HeartbeatSlotResponse, error) {
	if req.Ttl == nil {
		return nil, toStatus(fieldErr("ttl", "required"))
	}
	if err := req.Ttl.CheckValid(); err != nil {
		return nil, toStatus(fieldErr("ttl", "%v", err))
	}
	left, err := s.a.HeartbeatSlot(ctx, req.LimitId, req.SlotId, req.Ttl.AsDuration())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.HeartbeatSlotResponse{ExpiresIn: durationpb.New(left)}, nil
}

// ReleaseSlot implements pb.RegionAgentServer.
func (s *Server) ReleaseSlot(ctx context.Context, req *pb.ReleaseSlotRequest) (*pb.ReleaseSlotResponse, error) {
	ok, err := s.a.ReleaseSlot(ctx, req.LimitId, req.SlotId)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReleaseSlotResponse{Released: ok}, nil
}
