// Package clienttest is a hand-written fake of the RegionAgent service for
// tests of the client, the HTTP middleware and the gateway: per-limit
// budgets per window on an injected clock, Check, Reserve and Release with
// the agent's semantics (a reservation is debited when made, spendable
// until its deadline, released idempotently), and hooks to inject faults.
package clienttest

import (
	"context"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// Clock is a settable clock, safe for concurrent use.
type Clock struct {
	mu sync.Mutex // protects t
	t  time.Time
}

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Reservation is the fake's record of one Reserve.
type Reservation struct {
	ID, Limit string
	Window    int64 // index of the window the tokens came from
	Granted   int64
	Made      time.Time
	Deadline  time.Time // on the agent's clock
	Released  bool
	Unspent   int64 // as released
	Returned  int64 // what went back to the window's budget
}

// WindowStats counts one (limit, window).
type WindowStats struct {
	Left            int64 // spendable
	CheckAdmitted   int64 // cost admitted by Check
	CheckDenied     int64
	Reserved        int64 // granted to reservations
	Returned        int64 // given back by Release
	ReserveRequests int
}

// Admitted is what the window counts as admitted: Checks plus
// reservations not given back.
func (w WindowStats) Admitted() int64 { return w.CheckAdmitted + w.Reserved - w.Returned }

type limit struct {
	tokens  int64
	window  time.Duration
	ttl     time.Duration
	version int64
	wins    map[int64]*WindowStats
}

// Agent is a fake RegionAgent. Configure it (SetLimit, the hooks,
// NoReserve) before serving; its methods are safe for concurrent use.
type Agent struct {
	pb.UnimplementedRegionAgentServer

	now func() time.Time

	// NoReserve makes Reserve and Release answer Unimplemented (an agent
	// from before sub-leases).
	NoReserve bool
	// DenyRetryAfter, if > 0, is the retry_after of a denial (default:
	// the time to the window's end).
	DenyRetryAfter time.Duration
	// Before* hooks run before a call is served; a non-nil error is
	// answered instead (the call has no effect). They may block.
	BeforeCheck   func(ctx context.Context, req *pb.CheckRequest) error
	BeforeReserve func(ctx context.Context, req *pb.ReserveRequest) error
	BeforeRelease func(ctx context.Context, req *pb.ReleaseRequest) error
	// AfterReserve runs after a Reserve took effect; a non-nil error is
	// answered instead of the reply (the reservation stands: a lost
	// reply).
	AfterReserve func(ctx context.Context, req *pb.ReserveRequest) error

	mu       sync.Mutex // protects the fields below
	limits   map[string]*limit
	res      map[string]*Reservation
	checks   int
	reserves int
	releases int
}

// NewAgent returns a fake agent on the clock now.
func NewAgent(now func() time.Time) *Agent {
	return &Agent{now: now, limits: map[string]*limit{}, res: map[string]*Reservation{}}
}

// SetLimit creates or replaces a limit: tokens per window, reservations
// live at most ttl (and never past their window).
func (a *Agent) SetLimit(id string, tokens int64, window, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := int64(1)
	if l := a.limits[id]; l != nil {
		v = l.version + 1
	}
	a.limits[id] = &limit{tokens: tokens, window: window, ttl: ttl, version: v, wins: map[int64]*WindowStats{}}
}

// AddTokens adds n tokens to the current window of a limit (a renewal).
func (a *Agent) AddTokens(id string, n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.limits[id]
	if l == nil {
		return
	}
	w, _ := l.win(a.now())
	w.Left += n
}

// Window returns the stats of a limit's window.
func (a *Agent) Window(id string, index int64) WindowStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.limits[id]; l != nil && l.wins[index] != nil {
		return *l.wins[index]
	}
	return WindowStats{}
}

// Windows returns the indexes of a limit's windows that saw traffic.
func (a *Agent) Windows(id string) []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int64
	if l := a.limits[id]; l != nil {
		for w := range l.wins {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Calls returns how many Check, Reserve and Release calls reached the
// fake (hooks included).
func (a *Agent) Calls() (check, reserve, release int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checks, a.reserves, a.releases
}

// Reservations returns copies of every reservation, oldest first.
func (a *Agent) Reservations() []Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Reservation, 0, len(a.res))
	for _, r := range a.res {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Made.Equal(out[j].Made) {
			return out[i].Made.Before(out[j].Made)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// win returns the window of now (created full) and its end.
func (l *limit) win(now time.Time) (*WindowStats, time.Time) {
	i := now.UnixNano() / int64(l.window)
	w := l.wins[i]
	if w == nil {
		w = &WindowStats{Left: l.tokens}
		l.wins[i] = w
	}
	return w, time.Unix(0, (i+1)*int64(l.window))
}

func (a *Agent) lookup(id string, cost int64) (*limit, error) {
	l := a.limits[id]
	if l == nil {
		return nil, status.Errorf(codes.NotFound, "limit_id: %q is not a limit", id)
	}
	if cost < 0 || cost > l.tokens {
		return nil, status.Errorf(codes.InvalidArgument, "cost: must be 1..%d, got %d", l.tokens, cost)
	}
	return l, nil
}

// Check implements pb.RegionAgentServer.
func (a *Agent) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	a.mu.Lock()
	a.checks++
	a.mu.Unlock()
	if h := a.BeforeCheck; h != nil {
		if err := h(ctx, req); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	cost := max(req.Cost, 1)
	l, err := a.lookup(req.LimitId, req.Cost)
	if err != nil {
		return nil, err
	}
	now := a.now()
	w, end := l.win(now)
	resp := &pb.CheckResponse{Reason: pb.Reason_REASON_OK, ResetAfter: durationpb.New(end.Sub(now)),
		RetryAfter: durationpb.New(0), LimitTokens: l.tokens, Window: durationpb.New(l.window), LimitVersion: l.version}
	if w.Left >= cost {
		w.Left -= cost
		w.CheckAdmitted += cost
		resp.Allowed = true
	} else {
		w.CheckDenied += cost
		resp.Reason = pb.Reason_REASON_OVER_LIMIT
		resp.RetryAfter = durationpb.New(a.retryAfter(end.Sub(now)))
	}
	resp.Remaining = w.Left
	return resp, nil
}

func (a *Agent) retryAfter(reset time.Duration) time.Duration {
	if a.DenyRetryAfter > 0 {
		return a.DenyRetryAfter
	}
	return reset
}

// CheckMulti implements pb.RegionAgentServer: all or nothing.
func (a *Agent) CheckMulti(ctx context.Context, req *pb.CheckMultiRequest) (*pb.CheckMultiResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	out := &pb.CheckMultiResponse{Allowed: true}
	var ws []*WindowStats
	for _, c := range req.Checks {
		l, err := a.lookup(c.LimitId, c.Cost)
		if err != nil {
			return nil, err
		}
		w, end := l.win(now)
		ws = append(ws, w)
		out.Allowed = out.Allowed && w.Left >= max(c.Cost, 1)
		out.Results = append(out.Results, &pb.CheckResponse{Reason: pb.Reason_REASON_OK, Remaining: w.Left,
			ResetAfter: durationpb.New(end.Sub(now)), RetryAfter: durationpb.New(0), LimitTokens: l.tokens,
			Window: durationpb.New(l.window), LimitVersion: l.version})
	}
	for i, c := range req.Checks {
		r := out.Results[i]
		if out.Allowed {
			ws[i].Left -= max(c.Cost, 1)
			ws[i].CheckAdmitted += max(c.Cost, 1)
			r.Allowed, r.Remaining = true, ws[i].Left
		} else {
			r.Reason = pb.Reason_REASON_OVER_LIMIT
			r.RetryAfter = durationpb.New(a.retryAfter(r.ResetAfter.AsDuration()))
		}
	}
	return out, nil
}

// Reserve implements pb.RegionAgentServer.
func (a *Agent) Reserve(ctx context.Context, req *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	a.mu.Lock()
	a.reserves++
	a.mu.Unlock()
	if a.NoReserve {
		return nil, status.Error(codes.Unimplemented, "method Reserve not implemented")
	}
	if h := a.BeforeReserve; h != nil {
		if err := h(ctx, req); err != nil {
			return nil, err
		}
	}
	resp, err := a.reserve(req)
	if err == nil && a.AfterReserve != nil {
		if err := a.AfterReserve(ctx, req); err != nil {
			return nil, err
		}
	}
	return resp, err
}

func (a *Agent) reserve(req *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if req.Tokens < 1 || req.MinTokens < 1 || req.MinTokens > req.Tokens || req.ReservationId == "" {
		return nil, status.Error(codes.InvalidArgument, "tokens, min_tokens or reservation_id")
	}
	l, err := a.lookup(req.LimitId, 0)
	if err != nil {
		return nil, err
	}
	now := a.now()
	w, end := l.win(now)
	resp := &pb.ReserveResponse{Reason: pb.Reason_REASON_OK, ResetAfter: durationpb.New(end.Sub(now)),
		RetryAfter: durationpb.New(0), LimitTokens: l.tokens, Window: durationpb.New(l.window),
		LimitVersion: l.version, ExpiresIn: durationpb.New(0)}
	if r := a.res[req.ReservationId]; r != nil { // a retry: the same reservation
		resp.Granted = r.Granted
		resp.ExpiresIn = durationpb.New(max(0, r.Deadline.Sub(now)))
		resp.Remaining = w.Left
		return resp, nil
	}
	w.ReserveRequests++
	if w.Left < req.MinTokens {
		resp.Reason = pb.Reason_REASON_OVER_LIMIT
		resp.RetryAfter = durationpb.New(a.retryAfter(end.Sub(now)))
		resp.Remaining = w.Left
		return resp, nil
	}
	g := min(req.Tokens, w.Left)
	w.Left -= g
	w.Reserved += g
	deadline := now.Add(l.ttl)
	if deadline.After(end) {
		deadline = end
	}
	a.res[req.ReservationId] = &Reservation{ID: req.ReservationId, Limit: req.LimitId,
		Window: now.UnixNano() / int64(l.window), Granted: g, Made: now, Deadline: deadline}
	resp.Granted = g
	resp.ExpiresIn = durationpb.New(deadline.Sub(now))
	resp.Remaining = w.Left
	return resp, nil
}

// Release implements pb.RegionAgentServer.
func (a *Agent) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	a.mu.Lock()
	a.releases++
	a.mu.Unlock()
	if a.NoReserve {
		return nil, status.Error(codes.Unimplemented, "method Release not implemented")
	}
	if h := a.BeforeRelease; h != nil {
		if err := h(ctx, req); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.res[req.ReservationId]
	if r == nil || r.Released {
		return &pb.ReleaseResponse{}, nil
	}
	if req.Unspent < 0 || req.Unspent > r.Granted {
		return nil, status.Errorf(codes.InvalidArgument, "unspent: must be 0..%d", r.Granted)
	}
	r.Released, r.Unspent = true, req.Unspent
	if !a.now().Before(r.Deadline) {
		return &pb.ReleaseResponse{}, nil // expired: counted as spent
	}
	l := a.limits[r.Limit]
	w := l.wins[r.Window]
	w.Left += req.Unspent
	w.Returned += req.Unspent
	r.Returned = req.Unspent
	return &pb.ReleaseResponse{Returned: req.Unspent}, nil
}

// Serve serves the fake over an in-memory connection until the test ends
// and returns the target and dial option for it.
func (a *Agent) Serve(t testing.TB) (target string, dialer grpc.DialOption) {
	t.Helper()
	target, dialer, stop := a.Listen()
	t.Cleanup(stop)
	return target, dialer
}

// Listen serves the fake over an in-memory connection until stop is
// called (examples; tests use Serve).
func (a *Agent) Listen() (target string, dialer grpc.DialOption, stop func()) {
	lis := bufconn.Listen(1 << 20)
	stop = a.start(lis)
	return "passthrough:///fake-agent", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), stop
}

// ServeTCP serves the fake on a loopback port until the test ends and
// returns its address.
func (a *Agent) ServeTCP(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.start(lis))
	return lis.Addr().String()
}

func (a *Agent) start(lis net.Listener) (stop func()) {
	s := grpc.NewServer()
	pb.RegisterRegionAgentServer(s, a)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	return func() { s.Stop(); <-done }
}

// Dial returns a raw RegionAgent client of target (tests that look past
// the client).
func Dial(t testing.TB, target string, opts ...grpc.DialOption) pb.RegionAgentClient {
	t.Helper()
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRegionAgentClient(conn)
}
