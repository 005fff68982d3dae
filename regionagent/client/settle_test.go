package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// settleAgent answers settle-later Checks and Settles as the agent does
// (regionagent's TestSettleLater drives the real one): a canned answer,
// or the error the agent gives.
type settleAgent struct {
	pb.RegionAgentClient // nil: other calls are not made
	check                *pb.CheckRequest
	settle               *pb.SettleRequest
	err                  error
}

func (s *settleAgent) Check(_ context.Context, r *pb.CheckRequest, _ ...grpc.CallOption) (*pb.CheckResponse, error) {
	s.check = r
	return &pb.CheckResponse{Allowed: true, Reason: pb.Reason_REASON_OK, Remaining: 60, LimitTokens: 100,
		DecisionId: "s7-abc", SettleWithin: durationpb.New(30 * time.Second)}, nil
}

func (s *settleAgent) Settle(_ context.Context, r *pb.SettleRequest, _ ...grpc.CallOption) (*pb.SettleResponse, error) {
	s.settle = r
	if s.err != nil {
		return nil, s.err
	}
	return &pb.SettleResponse{Estimate: 40, Refunded: 30, Replayed: true}, nil
}

// TestSettleLaterClient: the client sends the estimate as a settle-later
// Check, hands back the decision id, settles with it, and maps the
// agent's refusals to its sentinels; bad input never reaches the agent.
func TestSettleLaterClient(t *testing.T) {
	ag := &settleAgent{}
	c := NewInProcess(ag, "test")
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	p, err := c.AllowSettleLater(ctx, "tenant/llm", 40)
	if err != nil || !p.Allowed || p.SettleID != "s7-abc" || p.SettleWithin != 30*time.Second || p.Remaining != 60 {
		t.Fatalf("AllowSettleLater: %+v %v", p, err)
	}
	if !ag.check.SettleLater || ag.check.Cost != 40 {
		t.Fatalf("sent %v", ag.check)
	}
	s, err := c.Settle(ctx, "tenant/llm", p.SettleID, 10)
	if err != nil || s != (Settlement{Estimate: 40, Refunded: 30, Replayed: true}) || ag.settle.Actual != 10 || ag.settle.DecisionId != "s7-abc" {
		t.Fatalf("Settle: %+v %v (sent %v)", s, err, ag.settle)
	}
	for _, tc := range []struct {
		err  error
		want error
	}{
		{status.Error(codes.FailedPrecondition, "decision_id: settle refused"), ErrSettleRefused},
		{status.Error(codes.NotFound, "decision_id: unknown decision"), ErrUnknownDecision},
		{status.Error(codes.NotFound, "limit_id: unknown limit"), ErrUnknownLimit},
		{status.Error(codes.InvalidArgument, "actual: must be 0..100"), ErrInvalid},
		{status.Error(codes.Unavailable, "redis down"), ErrUnavailable},
	} {
		ag.err = tc.err
		if _, err := c.Settle(ctx, "tenant/llm", "s7-abc", 1); !errors.Is(err, tc.want) {
			t.Errorf("agent says %v: %v, want %v", tc.err, err, tc.want)
		}
	}
	ag.settle = nil
	for _, bad := range []struct {
		limit, id string
		actual    int64
	}{{"", "s7-abc", 1}, {"tenant/llm", "", 1}, {"tenant/llm", "s7-abc", -1}} {
		if _, err := c.Settle(ctx, bad.limit, bad.id, bad.actual); !errors.Is(err, ErrInvalid) {
			t.Errorf("Settle(%q, %q, %d): %v, want ErrInvalid", bad.limit, bad.id, bad.actual, err)
		}
	}
	if _, err := c.AllowSettleLater(ctx, "tenant/llm", -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a negative estimate: %v", err)
	}
	if ag.settle != nil {
		t.Fatalf("bad input reached the agent: %v", ag.settle)
	}
}
