package envoyrls

import (
	"context"
	"errors"
	"leasehold/internal/zones"
	"leasehold/lease"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

const apiMapping = `
domains:
  - domain: api
    descriptors:
      - key: tenant_id
        limit: "tenant/{tenant_id}"
        descriptors:
          - key: path
            value: /search
            limit: "tenant/{tenant_id}/search"
          - key: path
            limit: "tenant/{tenant_id}/other"
      - key: tenant_id
        value: vip
        limit: vip
        name: vip-plan
      - key: plan
        value: free
        descriptors:
          - key: user
            limit: "free.{user}"
      - key: remote_address
        limit: "ip/{remote_address}"
`

var (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestMultiDescriptorAllOrNothing(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme":        {g: 10, left: 10},
		"tenant/acme/search": {g: 2, left: 2},
	})
	req := request("api", 0, desc("tenant_id", "acme"), desc("tenant_id", "acme", "path", "/search"))
	for i := range 2 {
		r := h.call(t, req)
		if r.OverallCode != OK || !slices.Equal(codesOf(r), []rlsv3.RateLimitResponse_Code{OK, OK}) {
			t.Fatalf("call %d: %v %v, want OK", i, r.OverallCode, codesOf(r))
		}
	}
	if got := h.fake.lastCall(); len(got) != 2 || got[0].Limit != "tenant/acme" || got[1].Limit != "tenant/acme/search" {
		t.Fatalf("checked %v, want both limits in one call", got)
	}
	// The search limit is spent: the request is over limit and the tenant
	// limit, which had tokens, is not charged either.
	r := h.call(t, req)
	if r.OverallCode != OVER {
		t.Fatalf("overall %v, want OVER_LIMIT", r.OverallCode)
	}
	if got := codesOf(r); !slices.Equal(got, []rlsv3.RateLimitResponse_Code{OK, OVER}) {
		t.Fatalf("statuses %v, want [OK OVER_LIMIT] (the denying descriptor named)", got)
	}
	if got := h.fake.left("tenant/acme"); got != 8 {
		t.Fatalf("tenant/acme has %d left, want 8: a denied request charged it", got)
	}
	if got := h.fake.left("tenant/acme/search"); got != 0 {
		t.Fatalf("tenant/acme/search has %d left, want 0", got)
	}
	// Alone, the tenant descriptor still passes.
	if r := h.call(t, request("api", 0, desc("tenant_id", "acme"))); r.OverallCode != OK {
		t.Fatalf("tenant alone: %v", r.OverallCode)
	}
	if got := testutil.ToFloat64(h.srv.met.overLimit); got != 1 {
		t.Fatalf("over_limit counted %v, want 1", got)
	}
}

func TestHitsAddend(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme":        {g: 100, left: 100},
		"tenant/acme/search": {g: 100, left: 100},
		"tenant/bob":         {g: 5, left: 5},
	})
	steps := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want map[string]int64 // left after
		code rlsv3.RateLimitResponse_Code
	}{
		{"unset is 1", request("api", 0, desc("tenant_id", "acme")), map[string]int64{"tenant/acme": 99}, OK},
		{"request level", request("api", 7, desc("tenant_id", "acme")), map[string]int64{"tenant/acme": 92}, OK},
		{"descriptor level overrides", request("api", 7, withHits(desc("tenant_id", "acme"), 2),
			desc("tenant_id", "acme", "path", "/search")), map[string]int64{"tenant/acme": 90, "tenant/acme/search": 93}, OK},
		{"descriptor level 0 is 1", request("api", 9, withHits(desc("tenant_id", "acme"), 0)), map[string]int64{"tenant/acme": 89}, OK},
		{"same limit twice: both costs, one check", request("api", 3, desc("tenant_id", "acme"), desc("tenant_id", "acme")),
			map[string]int64{"tenant/acme": 83}, OK},
		{"more than left", request("api", 6, desc("tenant_id", "bob")), map[string]int64{"tenant/bob": 5}, OVER},
		{"exactly left", request("api", 5, desc("tenant_id", "bob")), map[string]int64{"tenant/bob": 0}, OK},
	}
	for _, st := range steps {
		r := h.call(t, st.req)
		if r.OverallCode != st.code {
			t.Fatalf("%s: %v, want %v", st.name, r.OverallCode, st.code)
		}
		for id, want := range st.want {
			if got := h.fake.left(id); got != want {
				t.Fatalf("%s: %s left %d, want %d", st.name, id, got, want)
			}
		}
	}
	if got := h.fake.lastCall(); len(got) != 1 || got[0].Cost != 5 {
		t.Fatalf("last check %v, want one item of cost 5", got)
	}
	h.fake.mu.Lock()
	dup := h.fake.calls[4]
	h.fake.mu.Unlock()
	if len(dup) != 1 || dup[0] != (regionagent.CheckItem{Limit: "tenant/acme", Cost: 6}) {
		t.Fatalf("two descriptors of one limit checked as %v, want one item of cost 6", dup)
	}
}

// A cost above the limit's size can never pass: OVER_LIMIT, nothing
// charged, no Retry-After.
func TestCostAboveLimit(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme": {g: 10, left: 10},
		"ip/10.0.0.1": {g: 1000, left: 1000},
	})
	r := h.call(t, request("api", 11, desc("remote_address", "10.0.0.1"), desc("tenant_id", "acme")))
	if r.OverallCode != OVER || !slices.Equal(codesOf(r), []rlsv3.RateLimitResponse_Code{OK, OVER}) {
		t.Fatalf("got %v %v", r.OverallCode, codesOf(r))
	}
	if h.fake.left("ip/10.0.0.1") != 1000 || h.fake.left("tenant/acme") != 10 {
		t.Fatal("something was charged")
	}
	if len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers %v, want none", headerList(r))
	}
	// Huge descriptor-level costs saturate instead of wrapping.
	r = h.call(t, request("api", 0, withHits(desc("tenant_id", "acme"), math.MaxUint64)))
	if r.OverallCode != OVER {
		t.Fatalf("MaxUint64 hits: %v", r.OverallCode)
	}
}

func TestUnmappedDescriptorsAllowedAndCounted(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme": {g: 10, left: 10},
	})
	r := h.call(t, request("api", 0,
		desc("tenant_id", "acme"),                         // mapped
		desc("country", "fr"),                             // no key at the top level
		desc("plan", "paid", "user", "u1"),                // value matches no node
		desc("plan", "free"),                              // node without a limit
		desc("tenant_id", "acme", "path", "/x", "k", "v"), // deeper than the tree
		desc("tenant_id", "a/b"),                          // would leave the segment
		desc("tenant_id", "ghost"),                        // the region has no tenant/ghost
	))
	if r.OverallCode != OK || len(r.Statuses) != 7 {
		t.Fatalf("got %v with %d statuses", r.OverallCode, len(r.Statuses))
	}
	for i, s := range r.Statuses {
		if s.Code != OK {
			t.Fatalf("status %d: %v", i, s.Code)
		}
		if mapped := i == 0; mapped != (s.CurrentLimit != nil) {
			t.Fatalf("status %d: current_limit %v", i, s.CurrentLimit)
		}
	}
	if got := h.fake.left("tenant/acme"); got != 9 {
		t.Fatalf("tenant/acme left %d, want 9", got)
	}
	// Unknown domain: nothing is checked at all.
	calls := h.fake.callCount()
	r = h.call(t, request("web", 0, desc("tenant_id", "acme")))
	if r.OverallCode != OK || len(r.Statuses) != 1 || r.Statuses[0].Code != OK || len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("unknown domain: %v", r)
	}
	if h.fake.callCount() != calls {
		t.Fatal("an unmapped request reached the checker")
	}
	// A refund descriptor is not charged.
	d := desc("tenant_id", "acme")
	d.IsNegativeHits = true
	if r := h.call(t, request("api", 3, d)); r.OverallCode != OK || h.fake.left("tenant/acme") != 9 {
		t.Fatalf("negative hits: %v, left %d", r.OverallCode, h.fake.left("tenant/acme"))
	}
	want := map[string]float64{
		unmappedNoMatch: 4, unmappedInvalidValue: 1, unmappedUnknownLimit: 1, unmappedUnknownDomain: 1, unmappedNegativeHits: 1,
	}
	for reason, n := range want {
		if got := testutil.ToFloat64(h.srv.met.unmapped.WithLabelValues(reason)); got != n {
			t.Errorf("unmapped{reason=%s} = %v, want %v", reason, got, n)
		}
	}
	if n, err := testutil.GatherAndCount(h.reg, "leasehold_envoy_unmapped_descriptors_total"); err != nil || n != 5 {
		t.Fatalf("registered series %d, %v", n, err)
	}
}

// Two unknown limits in one request: each is dropped in turn and the rest
// is still decided all or nothing.
func TestSeveralUnknownLimits(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{"ip/1.2.3.4": {g: 10, left: 10}})
	r := h.call(t, request("api", 0, desc("tenant_id", "x"), desc("remote_address", "1.2.3.4"), desc("tenant_id", "y")))
	if r.OverallCode != OK || r.Statuses[1].CurrentLimit == nil || r.Statuses[0].CurrentLimit != nil || r.Statuses[2].CurrentLimit != nil {
		t.Fatalf("got %v", r)
	}
	if h.fake.left("ip/1.2.3.4") != 9 {
		t.Fatal("the known limit was not charged once")
	}
	if got := h.fake.callCount(); got != 3 {
		t.Fatalf("%d checks, want 3 (two refused, one decided)", got)
	}
}

func TestExactValueBeatsWildcard(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"vip":                {g: 100, left: 100},
		"tenant/acme/other":  {g: 100, left: 100},
		"tenant/acme/search": {g: 100, left: 100},
		"free.u-1":           {g: 100, left: 100},
	})
	for _, c := range []struct {
		d    []string
		want string
	}{
		{[]string{"tenant_id", "vip"}, "vip"},
		{[]string{"tenant_id", "acme", "path", "/search"}, "tenant/acme/search"},
		{[]string{"tenant_id", "acme", "path", "/login"}, "tenant/acme/other"},
		{[]string{"plan", "free", "user", "u-1"}, "free.u-1"},
	} {
		h.call(t, request("api", 0, desc(c.d...)))
		if got := h.fake.lastCall(); len(got) != 1 || got[0].Limit != c.want {
			t.Errorf("%v checked %v, want %s", c.d, got, c.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme":        {g: 1000, left: 500, window: time.Minute, reset: 17200 * time.Millisecond},
		"tenant/acme/search": {g: 10, left: 3, window: time.Second, reset: 400 * time.Millisecond, retry: 2100 * time.Millisecond},
		"vip":                {g: 50, left: 50, window: 90 * time.Second, reset: 89 * time.Second},
	})
	// OK: both listed; X-RateLimit-* is the one with fewest tokens left.
	r := h.call(t, request("api", 1, desc("tenant_id", "acme"), desc("tenant_id", "acme", "path", "/search")))
	want := []string{
		`RateLimit-Policy: "tenant/acme";q=1000;w=60, "tenant/acme/search";q=10;w=1`,
		`RateLimit: "tenant/acme";r=499;t=18, "tenant/acme/search";r=2;t=1`,
		`X-RateLimit-Limit: 10`,
		`X-RateLimit-Remaining: 2`,
		`X-RateLimit-Reset: 1`,
	}
	if got := headerList(r); !slices.Equal(got, want) {
		t.Fatalf("OK headers\n got %q\nwant %q", got, want)
	}
	st := r.Statuses[1]
	if st.LimitRemaining != 2 || st.DurationUntilReset.AsDuration() != 400*time.Millisecond ||
		st.CurrentLimit.GetRequestsPerUnit() != 10 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND ||
		st.CurrentLimit.GetName() != "tenant/acme/search" {
		t.Fatalf("status %v", st)
	}
	if got := r.Statuses[0].CurrentLimit; got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || got.GetRequestsPerUnit() != 1000 {
		t.Fatalf("tenant current_limit %v", got)
	}
	// OVER_LIMIT: the denying limit, and Retry-After rounded up.
	r = h.call(t, request("api", 3, desc("tenant_id", "acme"), desc("tenant_id", "acme", "path", "/search")))
	want = []string{
		`RateLimit-Policy: "tenant/acme";q=1000;w=60, "tenant/acme/search";q=10;w=1`,
		`RateLimit: "tenant/acme";r=499;t=18, "tenant/acme/search";r=2;t=1`,
		`X-RateLimit-Limit: 10`,
		`X-RateLimit-Remaining: 2`,
		`X-RateLimit-Reset: 1`,
		`Retry-After: 3`,
	}
	if r.OverallCode != OVER {
		t.Fatalf("overall %v", r.OverallCode)
	}
	if got := headerList(r); !slices.Equal(got, want) {
		t.Fatalf("OVER_LIMIT headers\n got %q\nwant %q", got, want)
	}
	// A named policy; a 90 s window has no Envoy unit.
	r = h.call(t, request("api", 0, desc("tenant_id", "vip")))
	want = []string{
		`RateLimit-Policy: "vip-plan";q=50;w=90`,
		`RateLimit: "vip-plan";r=49;t=89`,
		`X-RateLimit-Limit: 50`,
		`X-RateLimit-Remaining: 49`,
		`X-RateLimit-Reset: 89`,
	}
	if got := headerList(r); !slices.Equal(got, want) {
		t.Fatalf("named headers\n got %q\nwant %q", got, want)
	}
	if r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("90s window: current_limit %v, want none", r.Statuses[0].CurrentLimit)
	}
}

func TestCurrentLimitUnits(t *testing.T) {
	for _, c := range []struct {
		w    time.Duration
		g    int64
		want rlsv3.RateLimitResponse_RateLimit_Unit // UNKNOWN: no current_limit
	}{
		{time.Second, 5, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{time.Minute, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Hour, 5, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{24 * time.Hour, 5, rlsv3.RateLimitResponse_RateLimit_DAY},
		{7 * 24 * time.Hour, 5, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{10 * time.Second, 5, rlsv3.RateLimitResponse_RateLimit_UNKNOWN},
		{2 * time.Hour, 5, rlsv3.RateLimitResponse_RateLimit_UNKNOWN},
		{time.Minute, 1 << 33, rlsv3.RateLimitResponse_RateLimit_UNKNOWN}, // does not fit requests_per_unit
	} {
		got := currentLimit("n", regionagent.Decision{Window: c.w, Limit: c.g})
		if (got == nil) != (c.want == rlsv3.RateLimitResponse_RateLimit_UNKNOWN) || got.GetUnit() != c.want {
			t.Errorf("window %v G %d: %v, want unit %v", c.w, c.g, got, c.want)
		}
	}
}

// TestCurrentLimitCalendar: a calendar limit states its unit, whatever
// the length of the current window (a 25-hour day is DAY, a month of 745
// hours MONTH).
func TestCurrentLimitCalendar(t *testing.T) {
	berlin, err := zones.Load("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		u    lease.Unit
		w    time.Duration
		want rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{lease.Day, 25 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{lease.Day, 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{lease.Week, 167 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{lease.Month, 745 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{lease.Year, 8760 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	} {
		got := currentLimit("n", regionagent.Decision{Window: c.w, Limit: 5_000_000, Cal: lease.Calendar{Unit: c.u, Loc: berlin}})
		if got.GetUnit() != c.want || got.GetRequestsPerUnit() != 5_000_000 {
			t.Errorf("calendar %v of %v: %v, want unit %v", c.u, c.w, got, c.want)
		}
	}
}

func TestFallbackAdmitsAsOK(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{"tenant/acme": {g: 10, left: 10, fallback: true}})
	if r := h.call(t, request("api", 0, desc("tenant_id", "acme"))); r.OverallCode != OK {
		t.Fatalf("fallback admission: %v", r.OverallCode)
	}
}

func TestUnavailableAndErrors(t *testing.T) {
	h := newHarness(t, apiMapping, map[string]*fakeLimit{
		"tenant/acme": {g: 10, left: 10},
		"tenant/down": {g: 10, left: 10, unavailable: true},
	})
	ctx := context.Background()
	codeOf := func(req *rlsv3.RateLimitRequest) codes.Code {
		_, err := h.cl.ShouldRateLimit(ctx, req)
		return status.Code(err)
	}
	// The agent cannot decide one limit of the request: UNAVAILABLE, and
	// nothing charged.
	if got := codeOf(request("api", 0, desc("tenant_id", "acme"), desc("tenant_id", "down"))); got != codes.Unavailable {
		t.Fatalf("unavailable limit: %v", got)
	}
	if h.fake.left("tenant/acme") != 10 {
		t.Fatal("charged while unavailable")
	}
	// Errors from the agent.
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{errors.New("redis: connection refused"), codes.Unavailable},
		{&regionagent.FieldError{Field: "checks[0].limit_id", Reason: "longer than 200 characters"}, codes.InvalidArgument},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{regionagent.ErrUnknownLimit, codes.Unavailable}, // names no limit: cannot tell which descriptor
	} {
		h.fake.mu.Lock()
		h.fake.err = c.err
		h.fake.mu.Unlock()
		if got := codeOf(request("api", 0, desc("tenant_id", "acme"))); got != c.want {
			t.Errorf("agent error %v: %v, want %v", c.err, got, c.want)
		}
	}
	h.fake.mu.Lock()
	h.fake.err = nil
	h.fake.mu.Unlock()
	// Bad requests.
	many := make([]string, 0, 40)
	for i := range 17 {
		many = append(many, string(rune('a'+i)))
	}
	req17 := request("api", 0)
	for _, v := range many {
		req17.Descriptors = append(req17.Descriptors, desc("remote_address", v))
	}
	req65 := request("api", 0)
	for range 65 {
		req65.Descriptors = append(req65.Descriptors, desc("tenant_id", "acme"))
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"no domain":          request("", 0, desc("tenant_id", "acme")),
		"no descriptors":     request("api", 0),
		"17 distinct limits": req17,
		"65 descriptors":     req65,
	} {
		if got := codeOf(req); got != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, got)
		}
	}
	// The caller's deadline.
	h.fake.mu.Lock()
	h.fake.delay = 200 * time.Millisecond
	h.fake.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := h.cl.ShouldRateLimit(dctx, request("api", 0, desc("tenant_id", "acme")))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("deadline: %v", err)
	}
	if got := testutil.ToFloat64(h.srv.met.unavailable); got < 3 {
		t.Fatalf("unavailable counted %v", got)
	}
	if !strings.Contains(status.Convert(func() error {
		_, err := h.cl.ShouldRateLimit(ctx, request("api", 0, desc("tenant_id", "down")))
		return err
	}()).Message(), `"tenant/down"`) {
		t.Fatal("UNAVAILABLE does not name the limit")
	}
}

// The real agent's error for an unknown limit names it the way
// unknownItem expects.
func TestUnknownItemParsing(t *testing.T) {
	items := []regionagent.CheckItem{{Limit: "tenant/a"}, {Limit: "tenant/a/b"}}
	err := errors.Join(regionagent.ErrUnknownLimit, errors.New(`"tenant/a/b" is not a limit of region eu`))
	if got := unknownItem(err, items); got != 1 {
		t.Fatalf("got %d, want 1", got)
	}
	if got := costItem(&regionagent.FieldError{Field: "checks[1].cost"}, 2); got != 1 {
		t.Fatalf("costItem %d", got)
	}
	for _, f := range []string{"checks[2].cost", "checks[x].cost", "checks[0].limit_id", "cost"} {
		if got := costItem(&regionagent.FieldError{Field: f}, 2); got != -1 {
			t.Fatalf("costItem(%q) = %d", f, got)
		}
	}
}

// TestWouldDenyHeader: the limits in shadow mode that would have denied an
// admitted request, each with its reason, in one header; none otherwise.
func TestWouldDenyHeader(t *testing.T) {
	names := []string{"tenant/acme", "tenant/acme/search", "vip"}
	ds := []regionagent.Decision{{Allowed: true, WouldDeny: pb.Reason_REASON_OVER_LIMIT}, {Allowed: true},
		{Allowed: true, WouldDeny: pb.Reason_REASON_UNAVAILABLE}}
	if got, want := wouldDeny(names, ds), `"tenant/acme";reason=over_limit, "vip";reason=unavailable`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := wouldDeny(names[1:2], ds[1:2]); got != "" {
		t.Fatalf("no shadow denial: got %q", got)
	}
}

// currentLimit is the current limit an answer states for a limit named
// name (envoyUnit), or nil, as respond builds it.
func currentLimit(name string, d regionagent.Decision) *rlsv3.RateLimitResponse_RateLimit {
	unit, ok := envoyUnit(d)
	if !ok {
		return nil
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(d.Limit), Unit: unit}
}
