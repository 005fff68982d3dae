package envoyrls

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// The answer as the first version of the Envoy API shaped it, one
// message at a time: the naive reference that plan.respond, written for
// few allocations, must match byte for byte.

func refRespond(names []string, items []regionagent.CheckItem, slots []int, ds []regionagent.Decision) *rlsv3.RateLimitResponse {
	n := len(items)
	over := make([]bool, n)
	allowed := true
	for _, d := range ds {
		allowed = allowed && d.Allowed
	}
	if !allowed {
		found := false
		for j, d := range ds {
			if !d.Allowed && d.Remaining < items[j].Cost {
				over[j], found = true, true
			}
		}
		if !found {
			for j := range over {
				over[j] = !ds[j].Allowed
			}
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(slots))}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	per := make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	for j, d := range ds {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       refCurrentLimit(names[j], d),
			LimitRemaining:     clampU32(d.Remaining),
			DurationUntilReset: durationpb.New(max(0, d.ResetAfter)),
		}
		if over[j] {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		per[j] = st
	}
	for i, j := range slots {
		if j < 0 {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		} else {
			resp.Statuses[i] = per[j]
		}
	}
	if n > 0 {
		resp.ResponseHeadersToAdd = refHeaders(names, ds, over, !allowed)
		if v := refWouldDeny(names, ds); v != "" {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: HeaderWouldDeny, Value: v})
		}
	}
	return resp
}

func refCurrentLimit(name string, d regionagent.Decision) *rlsv3.RateLimitResponse_RateLimit {
	var unit rlsv3.RateLimitResponse_RateLimit_Unit
	if d.Cal.Loc != nil {
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
			return nil
		}
	} else {
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
			return nil
		}
	}
	if d.Limit <= 0 || d.Limit > math.MaxUint32 {
		return nil
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(d.Limit), Unit: unit}
}

func refWouldDeny(names []string, ds []regionagent.Decision) string {
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

func refHeaders(names []string, ds []regionagent.Decision, over []bool, denied bool) []*corev3.HeaderValue {
	var policy, state []byte
	tight := 0
	for j, d := range ds {
		if j > 0 {
			policy = append(policy, ", "...)
			state = append(state, ", "...)
		}
		policy = strconv.AppendQuote(policy, names[j])
		policy = append(policy, ";q="...)
		policy = strconv.AppendInt(policy, max(0, d.Limit), 10)
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, max(1, ceilSeconds(d.Window)), 10)
		state = strconv.AppendQuote(state, names[j])
		state = append(state, ";r="...)
		state = strconv.AppendInt(state, max(0, d.Remaining), 10)
		state = append(state, ";t="...)
		state = strconv.AppendInt(state, ceilSeconds(d.ResetAfter), 10)
		if j > 0 && tighter(ds, over, denied, j, tight) {
			tight = j
		}
	}
	t := ds[tight]
	out := []*corev3.HeaderValue{
		{Key: HeaderRateLimitPolicy, Value: string(policy)},
		{Key: HeaderRateLimit, Value: string(state)},
		{Key: HeaderXLimit, Value: strconv.FormatInt(max(0, t.Limit), 10)},
		{Key: HeaderXRemaining, Value: strconv.FormatInt(max(0, t.Remaining), 10)},
		{Key: HeaderXReset, Value: strconv.FormatInt(ceilSeconds(t.ResetAfter), 10)},
	}
	if denied {
		var wait time.Duration
		for j, d := range ds {
			if over[j] {
				wait = max(wait, d.RetryAfter)
			}
		}
		out = append(out, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(max(1, ceilSeconds(wait)), 10)})
	}
	return out
}

// randomAnswerCase is a request's mapped limits, its descriptors' slots
// and the agent's decisions, drawn from the values that change an answer:
// windows with and without an Envoy unit, calendars, limits beyond
// uint32, negative and huge counts, shadow-mode denials, descriptors
// sharing a limit or mapped to none.
func randomAnswerCase(r *rand.Rand) (names []string, items []regionagent.CheckItem, slots []int, ds []regionagent.Decision) {
	nItems := r.IntN(6)
	nDescs := max(nItems, 1) + r.IntN(3)
	if r.IntN(4) == 0 {
		nItems = min(nItems+smallPlan, maxLimits) // past the small plan
		nDescs = nItems + r.IntN(3)
	}
	pick := func(vs ...int64) int64 { return vs[r.IntN(len(vs))] }
	windows := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
		90 * time.Second, 1500 * time.Millisecond, 0}
	for j := range nItems {
		name := "tenant/t" + strconv.Itoa(r.IntN(1000)) + "/" + strconv.Itoa(j)
		if r.IntN(3) == 0 {
			name = "vip-plan." + strconv.Itoa(j)
		}
		names = append(names, name)
		items = append(items, regionagent.CheckItem{Limit: name, Cost: pick(1, 2, 5, math.MaxInt64)})
		d := regionagent.Decision{
			Allowed:    r.IntN(3) > 0,
			Reason:     pb.Reason_REASON_OK,
			Remaining:  pick(-3, 0, 1, 4, 1000, math.MaxUint32+1, math.MaxInt64),
			RetryAfter: time.Duration(pick(0, 1, int64(time.Millisecond), int64(1500*time.Millisecond), int64(time.Hour))),
			ResetAfter: time.Duration(pick(-int64(time.Second), 0, 1, int64(999*time.Millisecond), int64(30*time.Second), int64(26*time.Hour))),
			Limit:      pick(-1, 0, 1, 100, math.MaxUint32, math.MaxUint32+1, math.MaxInt64),
			Window:     windows[r.IntN(len(windows))],
			Version:    1,
		}
		if r.IntN(4) == 0 {
			d.Cal = lease.Calendar{Unit: lease.Unit(r.IntN(6)), Loc: time.UTC}
		}
		if r.IntN(4) == 0 {
			d.WouldDeny = []pb.Reason{pb.Reason_REASON_OVER_LIMIT, pb.Reason_REASON_UNAVAILABLE}[r.IntN(2)]
		}
		ds = append(ds, d)
	}
	for i := range nDescs {
		switch {
		case i < nItems:
			slots = append(slots, i) // every item has a descriptor
		case nItems == 0 || r.IntN(2) == 0:
			slots = append(slots, -1)
		default:
			slots = append(slots, r.IntN(nItems))
		}
	}
	r.Shuffle(len(slots), func(a, b int) { slots[a], slots[b] = slots[b], slots[a] })
	return names, items, slots, ds
}

// TestRespondMatchesReference: plan.respond answers exactly as the naive
// reference does (the same message, the same bytes on the wire) for
// 20,000 drawn cases.
func TestRespondMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	opts := proto.MarshalOptions{Deterministic: true}
	for c := range 20000 {
		names, items, slots, ds := randomAnswerCase(r)
		p := newPlan(len(slots))
		p.items = append(p.items, items...)
		p.names = append(p.names, names...)
		copy(p.slots, slots)
		got := p.respond(ds)
		want := refRespond(names, items, slots, ds)
		if !proto.Equal(got, want) {
			t.Fatalf("case %d (names %q, costs %v, slots %v, decisions %+v):\ngot  %v\nwant %v", c, names, items, slots, ds, got, want)
		}
		gb, err1 := opts.Marshal(got)
		wb, err2 := opts.Marshal(want)
		if err1 != nil || err2 != nil || string(gb) != string(wb) {
			t.Fatalf("case %d: wire bytes differ (%v, %v)", c, err1, err2)
		}
	}
}
