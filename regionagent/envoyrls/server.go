package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"leasehold/lease"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// Checker decides one request against several limits, all or nothing.
// *regionagent.Agent satisfies it.
type Checker interface {
	CheckMulti(ctx context.Context, items []regionagent.CheckItem) ([]regionagent.Decision, error)
}

var _ Checker = (*regionagent.Agent)(nil)

// Bounds of one request.
const (
	maxDescriptors = 64 // descriptors of one request
	maxLimits      = 16 // distinct limits of one request (regionagent's CheckMulti bound)
)

// Server serves envoy.service.ratelimit.v3.RateLimitService from a
// Checker and a Mapping. Safe for concurrent use; the mapping can be
// swapped while it serves.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	c   Checker
	m   atomic.Pointer[Mapping]
	log *slog.Logger
	met *metrics
}

type options struct {
	reg prometheus.Registerer
	log *slog.Logger
}

// Option changes an optional setting of a Server.
type Option func(*options)

// WithRegisterer registers the server's metrics on r (default: none).
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.reg = r } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// NewServer returns the rate limit service of c with mapping m.
func NewServer(c Checker, m *Mapping, opts ...Option) *Server {
	if c == nil || m == nil {
		panic("envoyrls: NewServer needs a Checker and a Mapping")
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	s := &Server{c: c, log: o.log.With("component", "envoy-rls"), met: newMetrics(o.reg)}
	s.m.Store(m)
	return s
}

// Register registers the service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// SetMapping replaces the mapping; requests already being decided finish
// with the one they started with.
func (s *Server) SetMapping(m *Mapping) {
	if m == nil {
		panic("envoyrls: SetMapping(nil)")
	}
	s.m.Store(m)
}

// Mapping returns the mapping in force.
func (s *Server) Mapping() *Mapping { return s.m.Load() }

// plan is one request's descriptors mapped to limits, and the messages
// of its answer.
type plan struct {
	items  []regionagent.CheckItem // distinct limits, in order of first use
	names  []string                // policy name per item
	slots  []int                   // per descriptor: index in items, or -1
	reason []string                // per descriptor without a limit: why ("" if it has one)
	// Backing arrays for the common small request: one allocation.
	itemsA  [smallPlan]regionagent.CheckItem
	namesA  [smallPlan]string
	slotsA  [smallPlan]int
	reasonA [smallPlan]string
	overA   [smallPlan]bool // per item: lacked the tokens
	// The answer's messages that every answer has, in the same
	// allocation. Each answer has messages of its own: gRPC marshals
	// after the handler returns, so none is shared between answers.
	resp      rlsv3.RateLimitResponse
	statusesA [smallPlan]*rlsv3.RateLimitResponse_DescriptorStatus
	headerA   [6]corev3.HeaderValue
	headerPA  [6]*corev3.HeaderValue
	oneA      [1]itemAnswer // the one limit of most requests
}

// smallPlan descriptors fit a plan without further allocations.
const smallPlan = 4

func newPlan(n int) *plan {
	p := &plan{}
	if n <= smallPlan {
		p.items, p.names = p.itemsA[:0], p.namesA[:0]
		p.slots, p.reason = p.slotsA[:n], p.reasonA[:n]
		return p
	}
	p.items, p.names = make([]regionagent.CheckItem, 0, n), make([]string, 0, n)
	p.slots, p.reason = make([]int, n), make([]string, n)
	return p
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch kind, err := reserved(req.GetDescriptors()); {
	case err != nil:
		s.met.invalid.Inc()
		return nil, err
	case kind == KeySettle && req.GetDomain() != "":
		return s.settleLater(ctx, req)
	case kind == KeyDecision && req.GetDomain() != "":
		return s.settle(ctx, req)
	}
	p, err := s.plan(req)
	if err != nil {
		s.met.invalid.Inc()
		return nil, err
	}
	var ds []regionagent.Decision
	tooBig := -1
	for len(p.items) > 0 {
		ds, err = s.c.CheckMulti(ctx, p.items)
		if err == nil {
			break
		}
		if errors.Is(err, regionagent.ErrUnknownLimit) {
			// A template produced an id the region has no limit for: that
			// descriptor is unmapped; decide the others without it.
			if j := unknownItem(err, p.items); j >= 0 {
				p.drop(j, unmappedUnknownLimit)
				continue
			}
		}
		if j := costItem(err, len(p.items)); j >= 0 {
			tooBig = j // the cost exceeds the limit itself: it can never pass
			break
		}
		return nil, s.fail(err)
	}
	for _, why := range p.reason {
		if why != "" {
			s.met.unmapped.WithLabelValues(why).Inc()
		}
	}
	if tooBig >= 0 {
		s.met.overLimit.Inc()
		return p.costTooLarge(tooBig), nil
	}
	if len(ds) != len(p.items) {
		s.met.unavailable.Inc()
		return nil, status.Errorf(codes.Unavailable, "region agent answered %d decisions for %d limits", len(ds), len(p.items))
	}
	for j, d := range ds {
		if d.Reason == pb.Reason_REASON_UNAVAILABLE {
			// The agent cannot decide: the gateway's failure mode applies.
			s.met.unavailable.Inc()
			return nil, status.Errorf(codes.Unavailable, "region agent cannot decide limit %q now (no usable lease, and its fallback does not admit)", p.items[j].Limit)
		}
	}
	resp := p.respond(ds)
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		s.met.ok.Inc()
	} else {
		s.met.overLimit.Inc()
	}
	return resp, nil
}

// plan validates the request and maps its descriptors.
func (s *Server) plan(req *rlsv3.RateLimitRequest) (*plan, error) {
	domain, descs := req.GetDomain(), req.GetDescriptors()
	switch {
	case domain == "":
		return nil, status.Error(codes.InvalidArgument, "domain: required")
	case len(descs) == 0:
		return nil, status.Error(codes.InvalidArgument, "descriptors: at least one is required")
	case len(descs) > maxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: at most %d, got %d", maxDescriptors, len(descs))
	}
	m := s.m.Load() // one mapping for the whole request
	p := newPlan(len(descs))
	base := int64(req.GetHitsAddend())
	for i, d := range descs {
		p.slots[i] = -1
		if d.GetIsNegativeHits() {
			p.reason[i] = unmappedNegativeHits
			continue
		}
		id, name, why := m.resolve(domain, d.GetEntries())
		if why != "" {
			p.reason[i] = why
			continue
		}
		cost := base
		if h := d.GetHitsAddend(); h != nil {
			cost = int64(min(h.GetValue(), math.MaxInt64))
		}
		cost = max(cost, 1) // unset (0) means 1, as in Envoy
		j := -1
		for k := range p.items {
			if p.items[k].Limit == id {
				j = k
				break
			}
		}
		if j >= 0 {
			// Two descriptors of one limit: charged once with both costs.
			p.items[j].Cost = satAdd(p.items[j].Cost, cost)
		} else {
			j = len(p.items)
			p.items = append(p.items, regionagent.CheckItem{Limit: id, Cost: cost})
			p.names = append(p.names, name)
		}
		p.slots[i] = j
	}
	if len(p.items) > maxLimits {
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: at most %d distinct limits per request, got %d", maxLimits, len(p.items))
	}
	return p, nil
}

// drop removes item j: its descriptors become unmapped for why.
func (p *plan) drop(j int, why string) {
	p.items = append(p.items[:j], p.items[j+1:]...)
	p.names = append(p.names[:j], p.names[j+1:]...)
	for i, k := range p.slots {
		switch {
		case k == j:
			p.slots[i], p.reason[i] = -1, why
		case k > j:
			p.slots[i]--
		}
	}
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// unknownItem finds the item named by an ErrUnknownLimit error (the agent
// quotes the id), or -1.
func unknownItem(err error, items []regionagent.CheckItem) int {
	msg := err.Error()
	for j, it := range items {
		if strings.Contains(msg, strconv.Quote(it.Limit)) {
			return j
		}
	}
	return -1
}

// costItem: the index of the item whose cost the agent refused as larger
// than the limit ("checks[i].cost"), or -1.
func costItem(err error, n int) int {
	var fe *regionagent.FieldError
	if !errors.As(err, &fe) {
		return -1
	}
	rest, ok := strings.CutPrefix(fe.Field, "checks[")
	if !ok {
		return -1
	}
	idx, ok := strings.CutSuffix(rest, "].cost")
	if !ok {
		return -1
	}
	j, err := strconv.Atoi(idx)
	if err != nil || j < 0 || j >= n {
		return -1
	}
	return j
}

// fail maps a Checker error to a gRPC status. Anything but bad input and
// the caller's own deadline is UNAVAILABLE: the agent could not decide.
func (s *Server) fail(err error) error {
	switch {
	case errors.Is(err, regionagent.ErrInvalid):
		s.met.invalid.Inc()
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		s.met.unavailable.Inc()
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		s.met.unavailable.Inc()
		return status.Error(codes.Canceled, err.Error())
	}
	s.met.unavailable.Inc()
	s.log.Debug("check failed", "err", err)
	return status.Error(codes.Unavailable, "region agent cannot decide: "+err.Error())
}

// costTooLarge answers a request one of whose costs exceeds its limit's
// size: OVER_LIMIT, nothing charged, no Retry-After (waiting never helps).
func (p *plan) costTooLarge(j int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(p.slots))}
	for i, k := range p.slots {
		code := rlsv3.RateLimitResponse_OK
		if k == j {
			code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: code}
	}
	return resp
}

// itemAnswer is the messages of one limit's status: a request's limits
// have theirs in one slice (the plan's own for one limit).
type itemAnswer struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// respond shapes the answer from the agent's decisions. The answer is
// built in the plan's own messages (plus one slice of itemAnswer for more
// than one limit) and one string for the header values (TestRespondMatchesReference holds it to
// the message-at-a-time reference). Called once per plan.
func (p *plan) respond(ds []regionagent.Decision) *rlsv3.RateLimitResponse {
	n := len(p.items)
	var over []bool
	if n <= smallPlan {
		over = p.overA[:n]
	} else {
		over = make([]bool, n)
	}
	allowed := true
	for _, d := range ds {
		allowed = allowed && d.Allowed
	}
	if !allowed {
		// All or nothing: nothing was charged. The limits that lacked the
		// tokens are OVER_LIMIT; the others would have admitted.
		found := false
		for j, d := range ds {
			if !d.Allowed && d.Remaining < p.items[j].Cost {
				over[j], found = true, true
			}
		}
		if !found {
			for j := range over {
				over[j] = !ds[j].Allowed
			}
		}
	}
	resp := &p.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if len(p.slots) <= smallPlan {
		resp.Statuses = p.statusesA[:len(p.slots)]
	} else {
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(p.slots))
	}
	per := p.oneA[:]
	if len(ds) != 1 {
		per = make([]itemAnswer, len(ds))
	}
	for j, d := range ds {
		a := &per[j]
		a.status.Code = rlsv3.RateLimitResponse_OK
		if over[j] {
			a.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if unit, ok := envoyUnit(d); ok {
			a.limit.Name, a.limit.RequestsPerUnit, a.limit.Unit = p.names[j], uint32(d.Limit), unit
			a.status.CurrentLimit = &a.limit
		}
		a.status.LimitRemaining = clampU32(d.Remaining)
		setDuration(&a.reset, max(0, d.ResetAfter))
		a.status.DurationUntilReset = &a.reset
	}
	for i, j := range p.slots {
		if j < 0 {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		} else {
			resp.Statuses[i] = &per[j].status
		}
	}
	if n > 0 {
		resp.ResponseHeadersToAdd = p.headers(ds, over, !allowed)
		if v := wouldDeny(p.names, ds); v != "" {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: HeaderWouldDeny, Value: v})
		}
	}
	return resp
}

// setDuration sets m to d, as durationpb.New(d) would make it.
func setDuration(m *durationpb.Duration, d time.Duration) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	m.Seconds, m.Nanos = secs, int32(nanos-secs*1e9)
}

// envoyUnit is the unit of the limit as Envoy states it (current_limit:
// requests per one unit), and whether it has one: the window is exactly
// one second, minute, hour, day or week, or a calendar day, week, month
// or year (whatever the length of the current one: a calendar day of
// 23 h is still DAY), and the limit fits a uint32.
func envoyUnit(d regionagent.Decision) (rlsv3.RateLimitResponse_RateLimit_Unit, bool) {
	var unit rlsv3.RateLimitResponse_RateLimit_Unit
	switch {
	case d.Cal.Loc != nil:
		switch d.Cal.Unit {
		case lease.Day:
			unit = rlsv3.RateLimitResponse_RateLimit_DAY
		case lease.Week:
			unit = rlsv3.RateLimitResponse_RateLimit_WEEK
		case lease.Month:
			unit = rlsv3.RateLimitResponse_RateLimit_MONTH
		case lease.Year:
			unit = rlsv3.RateLimitResponse_RateLimit_YEAR
		default:
			return 0, false
		}
	default:
		switch d.Window {
		case time.Second:
			unit = rlsv3.RateLimitResponse_RateLimit_SECOND
		case time.Minute:
			unit = rlsv3.RateLimitResponse_RateLimit_MINUTE
		case time.Hour:
			unit = rlsv3.RateLimitResponse_RateLimit_HOUR
		case 24 * time.Hour:
			unit = rlsv3.RateLimitResponse_RateLimit_DAY
		case 7 * 24 * time.Hour:
			unit = rlsv3.RateLimitResponse_RateLimit_WEEK
		default:
			return 0, false
		}
	}
	if d.Limit <= 0 || d.Limit > math.MaxUint32 {
		return 0, false
	}
	return unit, true
}

func clampU32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }

// ceilSeconds rounds d up to whole seconds (0 stays 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Response header names.
const (
	HeaderRateLimit       = "RateLimit"
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderXLimit          = "X-RateLimit-Limit"
	HeaderXRemaining      = "X-RateLimit-Remaining"
	HeaderXReset          = "X-RateLimit-Reset"
	HeaderRetryAfter      = "Retry-After"
	// HeaderWouldDeny lists the limits in shadow mode that would have
	// denied an admitted request, each with the reason:
	// "tenant/atlas";reason=over_limit (or unavailable).
	HeaderWouldDeny = "Leasehold-Would-Deny"
)

// wouldDeny is the value of HeaderWouldDeny for ds ("" when no limit in
// shadow mode would have denied).
func wouldDeny(names []string, ds []regionagent.Decision) string {
	var buf []byte
	for j, d := range ds {
		if d.WouldDeny == 0 {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		buf = strconv.AppendQuote(buf, names[j])
		buf = append(buf, ";reason="...)
		buf = append(buf, reasonToken(d.WouldDeny)...)
	}
	return string(buf)
}

// reasonToken names a reason in a header: over_limit, unavailable.
func reasonToken(r pb.Reason) string {
	if r == pb.Reason_REASON_OVER_LIMIT {
		return "over_limit"
	}
	return "unavailable"
}

// headers are the response headers: RateLimit-Policy and RateLimit list
// every limit of the request (draft-ietf-httpapi-ratelimit-headers-09/10
// structured form); X-RateLimit-* state the most restrictive one: on
// OVER_LIMIT the denying limit that resets last, otherwise the one with
// the fewest tokens left. Retry-After only on OVER_LIMIT. The values are
// cut from one string, the headers are the plan's: one allocation.
func (p *plan) headers(ds []regionagent.Decision, over []bool, denied bool) []*corev3.HeaderValue {
	names := p.names
	// Room for every value: quoted names and five numbers per limit, and
	// four numbers; an int64 is at most 20 characters.
	size := 4 * 20
	for j := range ds {
		size += 2*(len(names[j])+2+len(", ")) + 4*(len(";q=")+20)
	}
	var b strings.Builder
	b.Grow(size)
	var num [20]byte // an int64's digits
	var ends [6]int  // end of each value in b
	tight := 0
	for j, d := range ds {
		if j > 0 {
			b.WriteString(", ")
		}
		writeQuoted(&b, names[j])
		b.WriteString(";q=")
		b.Write(strconv.AppendInt(num[:0], max(0, d.Limit), 10))
		b.WriteString(";w=")
		b.Write(strconv.AppendInt(num[:0], max(1, ceilSeconds(d.Window)), 10))
		if j > 0 && tighter(ds, over, denied, j, tight) {
			tight = j
		}
	}
	ends[0] = b.Len()
	for j, d := range ds {
		if j > 0 {
			b.WriteString(", ")
		}
		writeQuoted(&b, names[j])
		b.WriteString(";r=")
		b.Write(strconv.AppendInt(num[:0], max(0, d.Remaining), 10))
		b.WriteString(";t=")
		b.Write(strconv.AppendInt(num[:0], ceilSeconds(d.ResetAfter), 10))
	}
	ends[1] = b.Len()
	t := ds[tight]
	b.Write(strconv.AppendInt(num[:0], max(0, t.Limit), 10))
	ends[2] = b.Len()
	b.Write(strconv.AppendInt(num[:0], max(0, t.Remaining), 10))
	ends[3] = b.Len()
	b.Write(strconv.AppendInt(num[:0], ceilSeconds(t.ResetAfter), 10))
	ends[4] = b.Len()
	n := 5
	if denied {
		var wait time.Duration
		for j, d := range ds {
			if over[j] {
				wait = max(wait, d.RetryAfter)
			}
		}
		b.Write(strconv.AppendInt(num[:0], max(1, ceilSeconds(wait)), 10))
		ends[5] = b.Len()
		n = 6
	}
	all := b.String()
	keys := [6]string{HeaderRateLimitPolicy, HeaderRateLimit, HeaderXLimit, HeaderXRemaining, HeaderXReset, HeaderRetryAfter}
	from := 0
	for i := range n {
		p.headerA[i].Key, p.headerA[i].Value = keys[i], all[from:ends[i]]
		p.headerPA[i] = &p.headerA[i]
		from = ends[i]
	}
	return p.headerPA[:n]
}

// writeQuoted writes s as strconv.Quote does, without its allocation for
// the names a mapping allows (printable ASCII without quote or
// backslash: nothing to escape).
func writeQuoted(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			b.WriteString(strconv.Quote(s))
			return
		}
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
}

// tighter reports whether limit j is more restrictive than limit k.
func tighter(ds []regionagent.Decision, over []bool, denied bool, j, k int) bool {
	a, b := ds[j], ds[k]
	if denied {
		if over[j] != over[k] {
			return over[j]
		}
		if over[j] {
			return a.RetryAfter > b.RetryAfter
		}
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Limit < b.Limit
}

// metrics of the Envoy API.
type metrics struct {
	ok, overLimit, unavailable, invalid prometheus.Counter
	unmapped                            *prometheus.CounterVec
	applied, rejected                   prometheus.Counter
	settles                             *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_envoy_requests_total",
		Help: "Envoy ShouldRateLimit calls, by result: ok, over_limit, unavailable (answered with a gRPC error), invalid.",
	}, []string{"result"})
	unmapped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_envoy_unmapped_descriptors_total",
		Help: "Descriptors allowed without charging a limit, by reason: no_match, unknown_domain, invalid_value, unknown_limit, negative_hits.",
	}, []string{"reason"})
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_envoy_mapping_reloads_total",
		Help: "Changed mapping files seen by the watcher, by result: applied, rejected (the previous mapping stays).",
	}, []string{"result"})
	settles := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leasehold_envoy_settles_total",
		Help: "Response-path settles of settle-later decisions, by result: settled, unknown (no such decision: its estimate stands), refused (after the settle grace, or another actual cost), failed (answered with a gRPC error).",
	}, []string{"result"})
	for _, r := range []string{"settled", "unknown", "refused", "failed"} {
		settles.WithLabelValues(r)
	}
	for _, r := range []string{unmappedNoMatch, unmappedUnknownDomain, unmappedInvalidValue, unmappedUnknownLimit, unmappedNegativeHits} {
		unmapped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(reqs, unmapped, reloads, settles)
	}
	return &metrics{
		ok: reqs.WithLabelValues("ok"), overLimit: reqs.WithLabelValues("over_limit"),
		unavailable: reqs.WithLabelValues("unavailable"), invalid: reqs.WithLabelValues("invalid"),
		unmapped: unmapped, settles: settles,
		applied: reloads.WithLabelValues("applied"), rejected: reloads.WithLabelValues("rejected"),
	}
}

// String describes the mapping (its domains and content hash).
func (m *Mapping) String() string {
	return fmt.Sprintf("envoy mapping %x (domains %s)", m.hash[:6], strings.Join(m.Domains(), ", "))
}
