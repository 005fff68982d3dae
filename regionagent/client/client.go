package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// SubLeaseConfig sets how the client reserves chunks of hot limits. Zero
// fields take their defaults.
type SubLeaseConfig struct {
	// HotRate: a limit is hot when this client asks it for more than this
	// much cost per second (its own rate, not the region's). Below it every
	// call is a plain Check. Default 50.
	HotRate float64
	// Horizon: a chunk covers this much of the client's own rate (capped
	// by what is left of the window). Default 1s.
	Horizon time.Duration
	// MaxChunk caps a chunk (0: no cap besides the limit's G and what the
	// region holds).
	MaxChunk int64
	// IdleAfter: a chunk unused this long is released. Default 2s.
	IdleAfter time.Duration
	// WarmRate, when > 0, lets a limit below HotRate be decided from
	// chunks too, from this rate (cost per second) on: a warm chunk
	// covers WarmHorizon of the client's rate (DefaultWarmHorizon), and takes at
	// most 1/64 of the limit's G (a limit whose G is below 128 is never
	// warm: a chunk of 1 token saves nothing, and a larger one would hold
	// a large part of a small budget). It is released after
	// max(IdleAfter, WarmHorizon/2) unused. Default 0: off.
	WarmRate    float64
	WarmHorizon time.Duration
}

// warmShare: a warm chunk takes at most 1/warmShare of the limit's G.
const warmShare = 64

// DefaultWarmHorizon is SubLeaseConfig.WarmHorizon when unset.
const DefaultWarmHorizon = 4 * time.Second

// WithDefaults returns s with its zero fields set to their defaults.
func (s SubLeaseConfig) WithDefaults() SubLeaseConfig {
	s.defaults()
	return s
}

func (s *SubLeaseConfig) defaults() {
	if s.HotRate <= 0 {
		s.HotRate = 50
	}
	if s.Horizon <= 0 {
		s.Horizon = time.Second
	}
	if s.IdleAfter <= 0 {
		s.IdleAfter = 2 * time.Second
	}
	s.MaxChunk = max(0, s.MaxChunk)
	s.WarmRate = max(0, s.WarmRate)
	if s.WarmHorizon <= 0 {
		s.WarmHorizon = DefaultWarmHorizon
	}
}

// chunkable reports whether a limit at the client's rate is decided from
// chunks: hot (at least HotRate), or warm (at least WarmRate, with a G
// that allows a warm chunk of 2 tokens or more).
func (c *Client) chunkable(st *limitState, rate float64) bool {
	sub := c.opt.sub
	return rate >= sub.HotRate || (sub.WarmRate > 0 && rate >= sub.WarmRate && st.warmCap() >= 2)
}

// warmCap is the largest warm chunk of st's limit: 1/warmShare of its G
// (0 while G is unknown).
func (st *limitState) warmCap() int64 {
	g := st.limitTokens
	if g <= 0 {
		g = st.gHint.Load()
	}
	return g / warmShare
}

type options struct {
	dial        []grpc.DialOption
	timeout     time.Duration
	denial      bool
	denialFloor time.Duration
	sub         *SubLeaseConfig // nil: no sub-leases
	now         func() time.Time
	retryFor    time.Duration // Reserve/Release retry budget
	reprobe     time.Duration // how long Reserve is not tried after Unimplemented
	sweepEvery  time.Duration // 0: no background sweeper (tests call sweep)
	// releaseObserver, if set, sees every release's outcome.
	releaseObserver func(unspent, returned int64, err error)
	margin          time.Duration // fixed part of a chunk's safety margin
	releaseLead     time.Duration // a chunk ends this long before its lease (WithReleaseLead)
	driftPPM        float64       // clock rate error covered, per million
	stateTTL        time.Duration // an idle limit's state is forgotten after this
	// localObserver, if set, sees every decision made without the agent.
	localObserver func(LocalDecision)
}

// Option changes an optional setting.
type Option func(*options)

// WithDialOptions adds gRPC dial options. The default is insecure
// transport credentials (loopback or a trusted network; see WithTLS);
// a credentials option given here replaces it.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithTLS calls the agent over TLS with cfg: RootCAs to verify the
// agent's certificate (nil: the system's roots) and, when the agent asks
// for one, a client certificate (Certificates or GetClientCertificate).
func WithTLS(cfg *tls.Config) Option {
	return WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// WithTimeout sets the deadline of each call to the agent (a Check, or one
// attempt of a Reserve or Release). Default 250ms.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithDenialCache sets the denial cache's floor: after an OVER_LIMIT
// denial, the limit is denied locally for max(retry_after, floor). Default
// on, floor 250ms.
func WithDenialCache(floor time.Duration) Option {
	return func(o *options) { o.denial, o.denialFloor = true, max(0, floor) }
}

// WithoutDenialCache asks the agent on every call that has no sub-lease.
func WithoutDenialCache() Option { return func(o *options) { o.denial = false } }

// WithSubLeases turns on local sub-leases for hot limits.
func WithSubLeases(cfg SubLeaseConfig) Option {
	return func(o *options) {
		cfg.defaults()
		o.sub = &cfg
	}
}

// WithRetry bounds how long a Reserve or Release is retried (with the
// same reservation id, jittered exponential backoff). Default 1s.
func WithRetry(maxElapsed time.Duration) Option {
	return func(o *options) { o.retryFor = max(0, maxElapsed) }
}

// WithReleaseLead ends every chunk d before the lease it came from, so
// that what is left of it goes back while that lease is still open
// (spendable by the rest of the region, and returned to the allocator
// with the lease) rather than after it, when it is lost to the window.
// d should cover the sweep interval (a quarter of IdleAfter, at most
// 250 ms) plus a Release's round trip. Default 0.
func WithReleaseLead(d time.Duration) Option {
	return func(o *options) { o.releaseLead = max(0, d) }
}

// WithReleaseObserver calls f after each release of a chunk's unspent
// tokens (from the goroutine that released them; f must not block):
// returned is what the region can spend again. Less than unspent means the
// rest was lost to the window: the leases it came from had closed and the
// chunk's deadline had passed. A failed release (err non-nil, returned 0)
// leaves all of unspent counted as spent.
func WithReleaseObserver(f func(unspent, returned int64, err error)) Option {
	return func(o *options) { o.releaseObserver = f }
}

// LocalDecision is a decision the client made itself, without asking the
// agent: from a sub-lease it holds (Source SubLease, an admit), or from
// its denial cache (Source DenialCache, a denial).
type LocalDecision struct {
	Limit string
	Cost  int64
	// At is when it was decided, on the client's clock (WithClock's, or
	// time.Now), read as the decision is observed: the wall time other
	// records are compared with. (The client's own time, monotonic since
	// it started, drifts from the wall clock by every step the wall clock
	// takes: a 4 s step put chunk decisions 4 s before the reservations
	// they spent in a history.)
	At time.Time
	// Reservation is the sub-lease's reservation id ("" for a cached
	// denial): the agent's Reserve answered it.
	Reservation string
	Decision    Decision
}

// WithLocalDecisionObserver calls f with every decision the client makes
// without asking the agent (the agent knows those it made), from the
// goroutine that decided: f must be quick and must not block (a history
// recorder's queue). Without it the fast path pays one nil check.
func WithLocalDecisionObserver(f func(LocalDecision)) Option {
	return func(o *options) { o.localObserver = f }
}

// observe hands a local decision to the observer; callers check that
// there is one (c.opt.localObserver != nil), so the fast path without it
// pays one load and compare.
func (c *Client) observe(limit string, cost int64, reservation string, d Decision) {
	at := time.Now()
	if c.opt.now != nil {
		at = c.opt.now()
	}
	c.opt.localObserver(LocalDecision{Limit: limit, Cost: cost, At: at, Reservation: reservation, Decision: d})
}

// WithClock replaces the client's clock (tests). Chunk deadlines and the
// denial cache are measured on it; the default is time.Now's monotonic
// clock.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// withoutSweeper stops the background sweeper: tests call sweep with their
// clock.
func withoutSweeper() Option { return func(o *options) { o.sweepEvery = 0 } }

// reprobeAfter is how long the client uses plain Checks after the agent
// answered Reserve with Unimplemented.
const reprobeAfter = time.Minute

// Client asks a region agent for decisions. It is safe for concurrent use.
// The zero value is not usable: create it with New, and Close it when done
// (Close gives back what its sub-leases hold).
type Client struct {
	conn *grpc.ClientConn
	rpc  pb.RegionAgentClient
	opt  options
	base time.Time // the clock's origin: times are ns since base

	states sync.Map // limit id -> *limitState

	// held lists the limits that hold something (a chunk, a Reserve in
	// flight, a denial; limitState.listed): the sweep visits them each
	// time and every limit only each fullSweep-th time, to forget the
	// idle ones, so its cost follows the limits in use, not those known.
	heldMu sync.Mutex
	held   []*limitState

	counts counters // decisions by source and result (Stats)

	// noReserveUntil: Reserve is not tried before this time (the agent
	// answered Unimplemented).
	noReserveUntil atomic.Int64

	idPrefix string        // random per client: reservation ids
	seq      atomic.Uint64 // reservation id sequence

	bgMu   sync.RWMutex   // protects closed transitions against bg.Add
	closed atomic.Bool    // written under bgMu
	bg     sync.WaitGroup // refills and releases in the background
	stop   chan struct{}  // closed by Close: the sweeper ends
	swept  chan struct{}  // closed when the sweeper ended

	// Releases in the background wait here for one of at most
	// maxReleaseWorkers goroutines (goRelease).
	relMu      sync.Mutex
	relQueue   []queuedRelease
	relWorkers int

	// onRelease, if set (tests, before the first call), sees every
	// Release: when it was sent, what was unspent and what the agent
	// returned (-1: the call failed).
	onRelease func(r *reservation, sentAt, unspent, returned int64)
	// onRetire, if set (tests, before the first call), sees every chunk
	// given up: what was left and when.
	onRetire func(r *reservation, unspent, now int64)
}

// New returns a client of the agents at target (a gRPC target, e.g.
// "127.0.0.1:7410" or "dns:///agent.eu.internal:7410"). It does not wait
// for a connection.
func New(target string, opts ...Option) (*Client, error) {
	o := defaultOptions(opts)
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A service config from the resolver could add a retry policy,
		// and a retried Check is a second debit: only the caller's
		// WithDialOptions may set one.
		grpc.WithDisableServiceConfig(),
	}, o.dial...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return start(conn, pb.NewRegionAgentClient(conn), "gw-"+hex.EncodeToString(b[:])+"-", o), nil
}

// NewInProcess returns a client that calls rpc directly, with no
// connection: the agent itself uses one to decide hot limits from chunks
// it reserves from its region's bucket. Reservation ids start with
// idPrefix (unique per process). Close does not close rpc.
func NewInProcess(rpc pb.RegionAgentClient, idPrefix string, opts ...Option) *Client {
	return start(nil, rpc, idPrefix, defaultOptions(opts))
}

// StateTTL is how long a client keeps what it knows of a limit (its
// rate, its denial) once the limit holds nothing and is unused.
const StateTTL = time.Minute

func defaultOptions(opts []Option) options {
	o := options{
		timeout: 250 * time.Millisecond, denial: true, denialFloor: 250 * time.Millisecond,
		retryFor: time.Second, reprobe: reprobeAfter, sweepEvery: 250 * time.Millisecond,
		margin: 2 * time.Millisecond, driftPPM: 1000, stateTTL: StateTTL,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.sub != nil && o.sweepEvery > 0 {
		o.sweepEvery = min(o.sweepEvery, max(o.sub.IdleAfter/4, 10*time.Millisecond))
	}
	return o
}

func start(conn *grpc.ClientConn, rpc pb.RegionAgentClient, idPrefix string, o options) *Client {
	c := &Client{
		conn: conn, rpc: rpc, opt: o, idPrefix: idPrefix,
		stop: make(chan struct{}), swept: make(chan struct{}),
	}
	if o.now != nil {
		c.base = o.now()
	} else {
		c.base = time.Now()
	}
	if o.sweepEvery > 0 {
		go c.sweeper()
	} else {
		close(c.swept)
	}
	return c
}

// mono is the client's clock: ns since base. With the default clock it
// reads only the monotonic clock.
func (c *Client) mono() int64 {
	if c.opt.now == nil {
		return int64(time.Since(c.base))
	}
	return int64(c.opt.now().Sub(c.base))
}

// Conn returns the client's gRPC connection (its state, for health pages;
// nil for an in-process client).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// limitState is the client's view of one limit.
type limitState struct {
	id string

	cur     atomic.Pointer[reservation] // the chunk being spent (nil: none)
	deny    atomic.Pointer[denial]      // the cached denial (nil: none)
	lastUse atomic.Int64                // last Allow, coarse (see touchEvery)
	asked   atomic.Int64                // cost asked through Checks (rate input)
	pending atomic.Bool                 // a Reserve is in flight or next waits
	listed  atomic.Bool                 // in Client.held
	gHint   atomic.Int64                // the limit's G as AskedOf was told (0: never)

	mu           sync.Mutex // protects the fields below, and changes of cur
	next         *reservation
	retired      int64 // cost spent from chunks no longer held (rate input)
	rate         rateEst
	limitTokens  int64
	resetAt      int64 // end of the window as last answered (0: unknown)
	reserveAfter int64 // no Reserve before this (a failed one backs off)
	dead         bool  // removed from the client's map
}

// touchEvery: the fast path records use at most this often (one shared
// write per millisecond instead of one per decision).
const touchEvery = int64(time.Millisecond)

func (c *Client) state(limit string) *limitState {
	if v, ok := c.states.Load(limit); ok {
		return v.(*limitState)
	}
	v, _ := c.states.LoadOrStore(limit, &limitState{id: limit})
	return v.(*limitState)
}

// observeLocked samples the client's own rate of the limit (st.mu held):
// Checks asked plus what chunks spent.
func (st *limitState) observeLocked(now int64) float64 {
	total := st.asked.Load() + st.retired
	if r := st.cur.Load(); r != nil {
		total += r.spent()
	}
	if st.next != nil {
		total += st.next.spent()
	}
	return st.rate.observe(now, total)
}

// Allow decides whether a request of the given cost may pass limit. cost 0
// means 1.
//
// The decision comes from a sub-lease this client holds (Source
// SubLease), from a denial the agent gave recently (Source DenialCache,
// always a denial), or from a Check (Source Agent). An error means no
// decision: the agent could not be asked, or did not answer in time (the
// returned Decision then has Reason UNAVAILABLE and an ID, for the
// caller's report). A Check that failed is never sent again.
func (c *Client) Allow(ctx context.Context, limit string, cost int64) (Decision, error) {
	if cost == 0 {
		cost = 1
	}
	if cost < 0 || limit == "" {
		return Decision{}, invalid(limit, cost)
	}
	if c.closed.Load() {
		return Decision{}, ErrClosed
	}
	st := c.state(limit)
	now := c.mono()
	if d, ok := c.fromChunk(st, now, cost); ok {
		return d, nil
	}
	st.lastUse.Store(now)
	if c.opt.denial {
		if dn := st.deny.Load(); dn != nil && now < dn.until && cost > dn.remaining {
			d := dn.answer(now)
			c.counts.denialCache.Add(1)
			if c.opt.localObserver != nil {
				c.observe(limit, cost, "", d)
			}
			return d, nil
		}
	}
	if c.opt.sub != nil && now >= c.noReserveUntil.Load() {
		if d, ok := c.subSlow(ctx, st, now, cost); ok {
			c.counts.subLease.Add(1)
			return d, nil
		}
	}
	return c.check(ctx, st, cost)
}

// AllowSubLease decides from a sub-lease only: from the chunk this client
// holds, or, if the limit is hot and nothing is on its way, from one it
// reserves now. ok false: no sub-lease could decide, and the caller
// decides otherwise (then tells Asked). It knows only limits Asked named
// before: an unknown id costs one map read and leaves nothing behind. No
// Check is sent and no denial is cached.
func (c *Client) AllowSubLease(ctx context.Context, limit string, cost int64) (d Decision, ok bool) {
	if cost == 0 {
		cost = 1
	}
	if cost < 0 || c.opt.sub == nil || c.closed.Load() {
		return Decision{}, false
	}
	v, found := c.states.Load(limit)
	if !found {
		return Decision{}, false
	}
	st := v.(*limitState)
	now := c.mono()
	if d, ok := c.fromChunk(st, now, cost); ok {
		return d, true
	}
	st.lastUse.Store(now)
	if now >= c.noReserveUntil.Load() {
		d, ok = c.subSlow(ctx, st, now, cost)
		if ok {
			c.counts.subLease.Add(1)
		}
		return d, ok
	}
	return Decision{}, false
}

// Asked tells the client that cost of limit was decided without it (its
// rate decides when the limit is hot), after AllowSubLease said it could
// not: that call already marked a known limit used, so only a limit new
// here reads the clock.
func (c *Client) Asked(limit string, cost int64) { c.asked(limit, cost) }

// AskedOf is Asked for a caller that knows the limit's G (the agent
// does, from its Check's answer): G lets a limit below HotRate be warm
// (SubLeaseConfig.WarmRate) before any chunk of it was reserved.
func (c *Client) AskedOf(limit string, cost, limitTokens int64) {
	if st := c.asked(limit, cost); st != nil && limitTokens > 0 && st.gHint.Load() != limitTokens {
		st.gHint.Store(limitTokens)
	}
}

// asked is Asked; it returns the limit's state (nil: nothing recorded).
func (c *Client) asked(limit string, cost int64) *limitState {
	if cost == 0 {
		cost = 1
	}
	if cost <= 0 || limit == "" || c.closed.Load() {
		return nil
	}
	if v, ok := c.states.Load(limit); ok {
		st := v.(*limitState)
		st.asked.Add(cost)
		return st
	}
	now := c.mono()
	st := &limitState{id: limit}
	st.lastUse.Store(now)
	// Its rate is measured from now on, this call's cost included: the
	// next call a quarter of a second or more later knows it (a limit
	// checked a few times a second is warm from its second or third call,
	// not its fourth).
	st.rate = rateEst{started: true, at: now}
	v, _ := c.states.LoadOrStore(limit, st)
	st = v.(*limitState)
	st.asked.Add(cost)
	return st
}

// fromChunk decides from the chunk st holds, if it is alive and holds
// cost: the fast path, one atomic update.
func (c *Client) fromChunk(st *limitState, now, cost int64) (Decision, bool) {
	r := st.cur.Load()
	if r == nil {
		return Decision{}, false
	}
	left, ok := r.take(now, cost)
	if !ok {
		return Decision{}, false
	}
	if now-st.lastUse.Load() > touchEvery {
		st.lastUse.Store(now)
	}
	c.counts.subLease.Add(1)
	if (left < r.low || now >= r.renewAt) && r.kicked.CompareAndSwap(false, true) {
		c.kickRefill(st)
	}
	if c.opt.localObserver != nil {
		return c.subDecision(st, r, now, cost, left), true
	}
	return r.decision(now, left), true
}

func invalid(limit string, cost int64) error {
	if limit == "" {
		return fmt.Errorf("%w: limit is required", ErrInvalid)
	}
	return fmt.Errorf("%w: cost %d of %q: must be >= 0", ErrInvalid, cost, limit)
}

// check asks the agent once.
func (c *Client) check(ctx context.Context, st *limitState, cost int64) (Decision, error) {
	st.asked.Add(cost)
	cctx, cancel := context.WithTimeout(ctx, c.opt.timeout)
	resp, err := c.rpc.Check(cctx, &pb.CheckRequest{LimitId: st.id, Cost: cost})
	cancel()
	now := c.mono()
	if err != nil {
		// Never sent again: the agent may have charged it.
		c.counts.agent[agentError].Add(1)
		return Decision{Reason: pb.Reason_REASON_UNAVAILABLE, ID: newDecisionID(), Source: SourceAgent},
			wrapRPC("check", st.id, err)
	}
	d := fromCheck(resp)
	c.counts.countAgent(d.Reason)
	st.mu.Lock()
	st.limitTokens = d.Limit
	st.resetAt = now + int64(d.ResetAfter)
	st.mu.Unlock()
	switch {
	case d.Reason == pb.Reason_REASON_OVER_LIMIT && c.opt.denial:
		c.cacheDenial(st, now, d)
	case d.Allowed && st.deny.Load() != nil:
		st.deny.Store(nil)
	}
	return d, nil
}

func fromCheck(r *pb.CheckResponse) Decision {
	return Decision{
		Allowed: r.Allowed, Reason: r.Reason, Remaining: r.Remaining,
		RetryAfter: dur(r.RetryAfter), ResetAfter: dur(r.ResetAfter),
		Limit: r.LimitTokens, Window: dur(r.Window), Version: r.LimitVersion,
		ID: newDecisionID(), Source: SourceAgent, WouldDeny: r.WouldDeny,
	}
}

func dur(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return max(0, d.AsDuration())
}

// Item is one limit and cost of an AllowMulti.
type Item struct {
	Limit string
	Cost  int64
}

// AllowMulti decides one request against several limits (at most 16):
// every limit admits it and is charged, or none is charged. It always asks
// the agent (sub-leases are per limit), unless one of the limits has a
// cached denial: then every decision is that denial. A denial is not
// cached from here (the agent does not say which limit denied). When the
// region's Redis is a Cluster the limits must share a hash tag: limits of
// different tags are refused (ErrInvalid, naming them).
func (c *Client) AllowMulti(ctx context.Context, items []Item) ([]Decision, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: at least one item is required", ErrInvalid)
	}
	now := c.mono()
	req := &pb.CheckMultiRequest{Checks: make([]*pb.CheckRequest, len(items))}
	for i, it := range items {
		cost := it.Cost
		if cost == 0 {
			cost = 1
		}
		if cost < 0 || it.Limit == "" {
			return nil, invalid(it.Limit, cost)
		}
		st := c.state(it.Limit)
		st.lastUse.Store(now)
		if c.opt.denial {
			if dn := st.deny.Load(); dn != nil && now < dn.until && cost > dn.remaining {
				c.counts.denialCache.Add(1)
				out := make([]Decision, len(items))
				for j, it := range items {
					out[j] = dn.answer(now)
					if c.opt.localObserver != nil {
						c.observe(it.Limit, max(1, it.Cost), "", out[j])
					}
				}
				return out, nil
			}
		}
		req.Checks[i] = &pb.CheckRequest{LimitId: it.Limit, Cost: cost}
	}
	cctx, cancel := context.WithTimeout(ctx, c.opt.timeout)
	resp, err := c.rpc.CheckMulti(cctx, req)
	cancel()
	if err != nil {
		c.counts.agent[agentError].Add(1)
		return nil, wrapRPC("check", items[0].Limit, err)
	}
	if len(resp.Results) != len(items) {
		c.counts.agent[agentError].Add(1)
		return nil, fmt.Errorf("%w: check: %d results for %d checks", ErrUnavailable, len(resp.Results), len(items))
	}
	out := make([]Decision, len(items))
	for i, r := range resp.Results {
		out[i] = fromCheck(r)
		out[i].Allowed = resp.Allowed
	}
	c.counts.countAgent(multiReason(resp))
	return out, nil
}

// multiReason is one reason for a CheckMulti's decision, to count it: OK
// (FALLBACK if any limit admitted under its fallback) when it passed,
// else OVER_LIMIT if any limit was over, else UNAVAILABLE.
func multiReason(resp *pb.CheckMultiResponse) pb.Reason {
	var fallback, over bool
	for _, r := range resp.Results {
		fallback = fallback || r.Reason == pb.Reason_REASON_FALLBACK
		over = over || r.Reason == pb.Reason_REASON_OVER_LIMIT
	}
	switch {
	case resp.Allowed && fallback:
		return pb.Reason_REASON_FALLBACK
	case resp.Allowed:
		return pb.Reason_REASON_OK
	case over:
		return pb.Reason_REASON_OVER_LIMIT
	}
	return pb.Reason_REASON_UNAVAILABLE
}

// sweeper runs sweep on the real clock until Close.
func (c *Client) sweeper() {
	defer close(c.swept)
	t := time.NewTicker(c.opt.sweepEvery)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-c.stop:
			return
		case <-t.C:
			if n%fullSweep == 0 {
				c.sweep(c.mono())
			} else {
				c.sweepHeld(c.mono())
			}
		}
	}
}

// fullSweep: every fullSweep-th sweep visits every limit (4 s with the
// default 250 ms), the others only those that hold something. An idle
// limit's state is forgotten that much after StateTTL at most.
const fullSweep = 16

// Limits counts the limits the client keeps state for (sub-leases, the
// rates that make a limit hot, denials); each is forgotten a while after
// its last use (StateTTL). It walks them: for a scrape or a test, not a
// request path.
func (c *Client) Limits() int {
	n := 0
	c.states.Range(func(_, _ any) bool { n++; return true })
	return n
}

// Holding counts the limits the client listed as holding a sub-lease, a
// Reserve in flight or a denial (one that stopped holding is unlisted at
// the next sweep, within 250 ms).
func (c *Client) Holding() int {
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	return len(c.held)
}

// HeldTokens counts the tokens the client's sub-leases hold: taken from
// the region's balance, not yet spent nor given back. A sub-lease past
// its deadline counts until the sweep gives it back (within 250 ms).
func (c *Client) HeldTokens() int64 {
	c.heldMu.Lock()
	list := slices.Clone(c.held) // hold takes heldMu under st.mu: not the other way round
	c.heldMu.Unlock()
	var n int64
	for _, st := range list {
		st.mu.Lock()
		n += st.cur.Load().unspent() + st.next.unspent()
		st.mu.Unlock()
	}
	return n
}

// sweep visits every limit: sweepOne, and lists those that hold
// something but were not listed (a safety net; hold lists them as they
// begin to).
func (c *Client) sweep(now int64) {
	c.states.Range(func(_, v any) bool {
		st := v.(*limitState)
		if c.sweepOne(st, now) {
			c.hold(st)
		}
		return true
	})
}

// sweepHeld visits only the limits listed as holding something, and
// unlists those that no longer do.
func (c *Client) sweepHeld(now int64) {
	c.heldMu.Lock()
	list := c.held
	c.held = make([]*limitState, 0, len(list))
	c.heldMu.Unlock()
	for _, st := range list {
		st.listed.Store(false) // a hold from now on lists it again
		if c.sweepOne(st, now) {
			c.hold(st)
		}
	}
}

// hold lists st among the limits every sweep visits: it holds, or is
// about to hold, a chunk, a Reserve in flight or a denial.
func (c *Client) hold(st *limitState) {
	if !st.listed.Load() && st.listed.CompareAndSwap(false, true) {
		c.heldMu.Lock()
		c.held = append(c.held, st)
		c.heldMu.Unlock()
	}
}

// sweepOne releases st's chunks that went idle or whose caller went
// quiet, drops expired chunks and denials, and forgets the limit once it
// is idle for StateTTL and holds nothing. It reports whether st still
// holds something.
func (c *Client) sweepOne(st *limitState, now int64) bool {
	idleFor := now - st.lastUse.Load()
	// A limit that holds nothing (no chunk, no Reserve in flight, no
	// denial) costs a few loads here, until it is old enough to forget
	// (below).
	if !st.holds() && idleFor < int64(c.opt.stateTTL) {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if c.opt.sub != nil {
		rate := st.observeLocked(now)
		idleAfter := c.opt.sub.IdleAfter
		if c.opt.sub.WarmRate > 0 && rate < c.opt.sub.HotRate {
			idleAfter = max(idleAfter, c.opt.sub.WarmHorizon/2) // a warm limit's uses are further apart
		}
		idle := idleFor >= int64(idleAfter)
		// Hysteresis: held while the caller is above half the rate
		// that made the limit hot (or warm), so a caller near it does
		// not flap.
		quiet := !c.chunkable(st, 2*rate)
		if r := st.cur.Load(); r != nil && (idle || quiet || now >= r.deadline) {
			st.cur.Store(nil)
			c.retireLocked(st, r, now)
		}
		if r := st.next; r != nil && (idle || quiet || now >= r.deadline) {
			st.next = nil
			c.retireLocked(st, r, now)
			st.pending.Store(false)
		}
	}
	if dn := st.deny.Load(); dn != nil && now >= dn.until {
		st.deny.CompareAndSwap(dn, nil)
	}
	if st.holds() {
		return true
	}
	if idleFor >= int64(c.opt.stateTTL) {
		st.dead = true
		c.states.CompareAndDelete(st.id, st)
	}
	return false
}

// holds: st holds a chunk, a Reserve in flight (or a next chunk, which
// keeps pending set) or a denial.
func (st *limitState) holds() bool {
	return st.cur.Load() != nil || st.pending.Load() || st.deny.Load() != nil
}

// Close releases every sub-lease (waiting for the releases, bounded by
// ctx) and closes the connection. Allow fails with ErrClosed afterwards.
func (c *Client) Close(ctx context.Context) error {
	c.bgMu.Lock()
	already := c.closed.Swap(true)
	c.bgMu.Unlock()
	if already {
		return nil
	}
	close(c.stop)
	<-c.swept
	now := c.mono()
	type rel struct {
		r       *reservation
		unspent int64
	}
	var rels []rel
	c.states.Range(func(_, v any) bool {
		st := v.(*limitState)
		st.mu.Lock()
		for _, r := range []*reservation{st.cur.Swap(nil), st.next} {
			if r == nil {
				continue
			}
			unspent := r.close()
			if h := c.onRetire; h != nil && unspent >= 0 {
				h(r, unspent, now)
			}
			if unspent > 0 {
				rels = append(rels, rel{r, unspent})
			}
		}
		st.next = nil
		st.mu.Unlock()
		return true
	})
	var wg sync.WaitGroup
	errs := make([]error, len(rels))
	sem := make(chan struct{}, 16)
	for i, x := range rels {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, errs[i] = c.releaseRPC(ctx, x.r, x.unspent)
		}()
	}
	wg.Wait()
	done := make(chan struct{})
	go func() { c.bg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if c.conn != nil {
		errs = append(errs, c.conn.Close())
	}
	err = errors.Join(append(errs, err)...)
	if err != nil {
		return fmt.Errorf("client: close: %w", err)
	}
	return nil
}
