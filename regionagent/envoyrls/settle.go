package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// Settle-later requests over Envoy's API (docs/envoy.md): two reserved
// descriptor entries, each the last entry of its descriptor, the entries
// before it mapped as usual.
const (
	// KeySettle with the value "later" on the request path makes the
	// descriptor's cost (hits_addend) an estimate: an admitted request's
	// decision id comes back in the response's dynamic metadata, under
	// KeyDecision.
	KeySettle = "leasehold_settle"
	// KeyDecision on the response path (Envoy's apply_on_stream_done,
	// its value read from that metadata) settles the decision with the
	// actual cost, hits_addend (0 is 0 here).
	KeyDecision = "leasehold_decision"
)

// Settler decides settle-later requests and settles them.
// *regionagent.Agent satisfies it.
type Settler interface {
	CheckSettleLater(ctx context.Context, limit string, estimate int64) (regionagent.Decision, error)
	Settle(ctx context.Context, limit, decision string, actual int64) (regionagent.Settlement, error)
}

var _ Settler = (*regionagent.Agent)(nil)

// reserved says which reserved entry ends a request's descriptors: "" for
// none, KeySettle or KeyDecision; it fails when they are mixed.
func reserved(descs []*rlv3.RateLimitDescriptor) (string, error) {
	kind := ""
	for i, d := range descs {
		es := d.GetEntries()
		k := ""
		if n := len(es); n > 0 && (es[n-1].GetKey() == KeySettle || es[n-1].GetKey() == KeyDecision) {
			k = es[n-1].GetKey()
		}
		if i > 0 && k != kind {
			return "", status.Errorf(codes.InvalidArgument, "descriptors[%d]: %s and %s entries must end every descriptor of a request or none", i, KeySettle, KeyDecision)
		}
		kind = k
	}
	return kind, nil
}

// settleLater answers a request-path call whose one descriptor ends with
// leasehold_settle=later.
func (s *Server) settleLater(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st, ok := s.c.(Settler)
	descs := req.GetDescriptors()
	switch {
	case !ok:
		return nil, status.Error(codes.Unimplemented, "this agent does not take settle-later requests")
	case len(descs) != 1:
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: a settle-later request has exactly one descriptor, got %d", len(descs))
	}
	d := descs[0]
	es := d.GetEntries()
	if v := es[len(es)-1].GetValue(); v != "later" {
		return nil, status.Errorf(codes.InvalidArgument, "descriptors[0]: %s must be \"later\", got %q", KeySettle, v)
	}
	m := s.m.Load()
	id, name, why := m.resolve(req.GetDomain(), es[:len(es)-1])
	if why != "" {
		s.met.unmapped.WithLabelValues(why).Inc()
		s.met.ok.Inc()
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}, nil
	}
	cost := max(hits(req, d), 1)
	dec, err := st.CheckSettleLater(ctx, id, cost)
	if errors.Is(err, regionagent.ErrUnknownLimit) {
		s.met.unmapped.WithLabelValues(unmappedUnknownLimit).Inc()
		s.met.ok.Inc()
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}, nil
	}
	if err != nil {
		return nil, s.fail(err)
	}
	if dec.Reason == pb.Reason_REASON_UNAVAILABLE {
		s.met.unavailable.Inc()
		return nil, status.Errorf(codes.Unavailable, "region agent cannot decide limit %q now", id)
	}
	p := newPlan(1)
	p.items = append(p.items, regionagent.CheckItem{Limit: id, Cost: cost})
	p.names = append(p.names, name)
	p.slots[0] = 0
	resp := p.respond([]regionagent.Decision{dec})
	if dec.Allowed {
		s.met.ok.Inc()
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{KeyDecision: structpb.NewStringValue(dec.DecisionID)}}
	} else {
		s.met.overLimit.Inc()
	}
	return resp, nil
}

// settle answers a response-path call whose descriptors end with
// leasehold_decision=<id>: each settles its decision with hits_addend.
// The answer is OK whatever became of the settle (the response is
// served; Envoy ignores it): a refused or unknown decision is counted
// (leasehold_envoy_settles_total) and its estimate stands.
func (s *Server) settle(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st, ok := s.c.(Settler)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this agent does not take settle-later requests")
	}
	m := s.m.Load()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
	for i, d := range req.GetDescriptors() {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		es := d.GetEntries()
		id, _, why := m.resolve(req.GetDomain(), es[:len(es)-1])
		if why != "" {
			s.met.unmapped.WithLabelValues(why).Inc()
			continue
		}
		_, err := st.Settle(ctx, id, es[len(es)-1].GetValue(), hits(req, d))
		switch {
		case err == nil:
			s.met.settles.WithLabelValues("settled").Inc()
		case errors.Is(err, regionagent.ErrInvalid):
			s.met.invalid.Inc()
			return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("descriptors[%d]: %v", i, err))
		case errors.Is(err, regionagent.ErrUnknownDecision), errors.Is(err, regionagent.ErrUnknownLimit):
			s.met.settles.WithLabelValues("unknown").Inc()
		case errors.Is(err, regionagent.ErrSettleRefused):
			s.met.settles.WithLabelValues("refused").Inc()
		default:
			s.met.settles.WithLabelValues("failed").Inc()
			return nil, s.fail(err)
		}
	}
	s.met.ok.Inc()
	return resp, nil
}

// hits is a descriptor's hits_addend, or the request's.
func hits(req *rlsv3.RateLimitRequest, d *rlv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), math.MaxInt64))
	}
	return int64(req.GetHitsAddend())
}
