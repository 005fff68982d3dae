package regionagent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Concurrency limits in the shell (the decisions are core.SlotPlan's and
// the slot set's, lua/slots.lua): AcquireSlot, HeartbeatSlot and
// ReleaseSlot run one script call each on the region's Redis; a replica
// asks the allocator for the region's slot share when none is in force
// (the acquire waits for it) and renews it at half its life while the
// limit is used (acquires and heartbeats arrive: a held slot is
// heartbeated at least every third of its life, and its life never
// passes the share's deadline), off the request path.
//
// While Redis is down, a concurrency limit answers UNAVAILABLE: its slots
// live in Redis only (no in-process slots in this version), and a slot
// that cannot be counted cannot be granted.
//
// While the allocator is unreachable and the region has no share of its
// own in force, a limit whose fallback in this region is local:A installs
// a fallback share of A slots (core.SlotPlan.FallbackSlots) and acquires
// under it, answered REASON_FALLBACK; closed answers UNAVAILABLE.

// Bounds on a slot's ttl (AcquireSlotRequest.ttl).
const (
	MinSlotTTL = 100 * time.Millisecond
	MaxSlotTTL = 10 * time.Minute
	// maxHolderID bounds a holder id (vocab.ValidateRequestID's 128).
	maxHolderID = 128
)

// SlotDecision is the answer to AcquireSlot.
type SlotDecision struct {
	Allowed    bool
	Reason     pb.Reason
	SlotID     string
	ExpiresIn  time.Duration // from the agent's answer (Redis's clock)
	RetryAfter time.Duration
	Limit      int64 // N
	Held       int64 // the region's slots held after the call
	Slots      int64 // the region's share (0: none in force)
	Version    int64
}

// slotPlans are the replica's slot plans, by limit.
type slotPlans struct {
	mu    sync.Mutex // protects plans
	plans map[string]*slotPlan
	seq   atomic.Uint64 // request ids
}

type slotPlan struct {
	core.SlotPlan
	held int64         // the region's slots held, as last seen
	done chan struct{} // closed when the request in flight ends
}

// forgetIdle forgets the slot plans idle for after at now
// (core.SlotPlan.Idle): a replica keeps a concurrency limit's plan while
// it is used, not for every limit (or tenant of a plan) it ever served.
// It returns how many it keeps.
func (s *slotPlans) forgetIdle(now time.Time, after time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, p := range s.plans {
		if p.Idle(now, after) {
			delete(s.plans, id)
		}
	}
	return len(s.plans)
}

func (s *slotPlans) plan(limit string) *slotPlan {
	if s.plans == nil {
		s.plans = map[string]*slotPlan{}
	}
	p := s.plans[limit]
	if p == nil {
		p = &slotPlan{}
		s.plans[limit] = p
	}
	return p
}

// slotKeyOf names a limit's slot set.
func slotKeyOf(l core.Limit) store.SlotKey {
	k := store.SlotKey{Limit: l.ID}
	if l.HashTag != l.ID {
		k.HashTag = l.HashTag
	}
	return k
}

// validSlotTTL checks a slot ttl field.
func validSlotTTL(field string, ttl time.Duration) error {
	if ttl < MinSlotTTL || ttl > MaxSlotTTL || ttl%time.Millisecond != 0 {
		return fieldErr(field, "must be whole milliseconds in %v..%v, got %v", MinSlotTTL, MaxSlotTTL, ttl)
	}
	return nil
}

// validSlotID checks a slot id as AcquireSlot makes them: "<holder>~<n>".
func validSlotID(id string) error {
	h, n, ok := strings.Cut(id, "~")
	if id == "" {
		return fieldErr("slot_id", "required")
	}
	if len(id) > maxHolderID+21 || !ok || vocab.ValidateRequestID("slot_id", h) != nil {
		return fieldErr("slot_id", "not a slot id (HOLDER~N, as AcquireSlot answers): %q", vocab.Cap(id, 64))
	}
	if v, err := strconv.ParseUint(n, 10, 63); err != nil || v == 0 {
		return fieldErr("slot_id", "not a slot id (HOLDER~N, as AcquireSlot answers): %q", vocab.Cap(id, 64))
	}
	return nil
}

// slotLimit looks a concurrency limit up: unknown is ErrUnknownLimit, a
// limit of another kind invalid input naming limit_id, not synced yet
// errNotSynced.
func (a *Agent) slotLimit(limit string) (core.Limit, error) {
	if err := vocab.ValidateLimitID("limit_id", limit); err != nil {
		return core.Limit{}, err
	}
	var (
		l      core.Limit
		ok     bool
		synced bool
	)
	a.withCore(func(c *core.Core) { l, ok = c.Resolve(limit); synced = c.IsSynced() }) // a plan's tenant too
	switch {
	case !ok && !synced:
		return core.Limit{}, fmt.Errorf("%w: the agent has no limits from the allocator yet", errNotSynced)
	case !ok:
		return core.Limit{}, fmt.Errorf("%w: %q is not a limit of region %s", ErrUnknownLimit, limit, a.cfg.Region)
	case !l.IsConcurrency():
		return core.Limit{}, fieldErr("limit_id", "%q is not a concurrency limit: Check it", limit)
	}
	return l, nil
}

// AcquireSlot takes one slot of a concurrency limit for holder, for ttl
// (see the RegionAgent service). Denied is a decision (OVER_LIMIT, or
// UNAVAILABLE when the agent cannot decide); bad input is an error
// naming the field.
func (a *Agent) AcquireSlot(ctx context.Context, limit, holder string, ttl time.Duration) (SlotDecision, error) {
	d, err := a.acquireSlot(ctx, limit, holder, ttl)
	if err != nil {
		return d, err
	}
	return a.countSlot(d), nil
}

func (a *Agent) acquireSlot(ctx context.Context, limit, holder string, ttl time.Duration) (SlotDecision, error) {
	if err := vocab.ValidateRequestID("holder_id", holder); err != nil {
		return SlotDecision{}, err
	}
	if err := validSlotTTL("ttl", ttl); err != nil {
		return SlotDecision{}, err
	}
	l, err := a.slotLimit(limit)
	if err != nil {
		if errors.Is(err, errNotSynced) {
			return unavailableSlot(l), nil
		}
		return SlotDecision{}, err
	}
	if a.rh.isDown() {
		return unavailableSlot(l), nil
	}
	key := slotKeyOf(l)
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		r, err := a.shared.b.AcquireSlot(rctx, key, holder, ttl.Milliseconds(), a.shared.nowMs())
		cancel()
		a.observeRedis(err)
		if err != nil {
			return unavailableSlot(l), nil
		}
		d := SlotDecision{Allowed: r.Allowed, SlotID: r.SlotID, ExpiresIn: time.Duration(r.ExpiresInMs) * time.Millisecond,
			Limit: l.Slots, Held: r.Held, Slots: r.N, Version: l.Version}
		a.slots.mu.Lock()
		p := a.slots.plan(l.ID)
		p.held = r.Held
		p.Used(a.opt.now())
		if !r.Allowed {
			p.Denied++
		}
		a.slots.mu.Unlock()
		if r.Allowed {
			d.Reason = pb.Reason_REASON_OK
			if a.underFallback(l) {
				d.Reason = pb.Reason_REASON_FALLBACK
			}
			a.renewSlots(l)
			return d, nil
		}
		if r.N > 0 {
			// A share is in force and the region holds what it allows.
			a.renewSlots(l)
			wait := max(time.Duration(r.RetryMs)*time.Millisecond, 10*time.Millisecond)
			d.Reason, d.RetryAfter = pb.Reason_REASON_OVER_LIMIT, wait
			return d, nil
		}
		if try == 1 && a.slotFallback(ctx, l) {
			continue // acquire under the region's fallback share
		}
		if try > 0 {
			break
		}
		// No share in force in Redis: ask for one and wait for it (even if
		// this replica believes one is in force: its install failed, or
		// Redis forgot it).
		a.slots.mu.Lock()
		if !p.Pending {
			p.Deadline = time.Time{}
		}
		a.slots.mu.Unlock()
		if empty := a.awaitSlotShare(ctx, l); empty {
			d.Reason, d.RetryAfter = pb.Reason_REASON_OVER_LIMIT, core.SlotRetry
			return d, nil
		}
	}
	return unavailableSlot(l), nil
}

// countSlot counts an AcquireSlot answer.
func (a *Agent) countSlot(d SlotDecision) SlotDecision {
	switch d.Reason {
	case pb.Reason_REASON_OK:
		a.m.slotAcquires.WithLabelValues("ok").Inc()
	case pb.Reason_REASON_FALLBACK:
		a.m.slotAcquires.WithLabelValues("fallback").Inc()
	case pb.Reason_REASON_OVER_LIMIT:
		a.m.slotAcquires.WithLabelValues("over_limit").Inc()
	default:
		a.m.slotAcquires.WithLabelValues("unavailable").Inc()
	}
	return d
}

func unavailableSlot(l core.Limit) SlotDecision {
	return SlotDecision{Reason: pb.Reason_REASON_UNAVAILABLE, RetryAfter: time.Second, Limit: l.Slots, Version: l.Version}
}

// HeartbeatSlot extends a held slot: its new life from now. A slot not
// held is ErrSlotNotHeld.
func (a *Agent) HeartbeatSlot(ctx context.Context, limit, slotID string, ttl time.Duration) (time.Duration, error) {
	if err := validSlotID(slotID); err != nil {
		return 0, err
	}
	if err := validSlotTTL("ttl", ttl); err != nil {
		return 0, err
	}
	l, err := a.slotLimit(limit)
	if err != nil {
		return 0, err
	}
	if a.rh.isDown() {
		return 0, fmt.Errorf("regionagent: the region's Redis is down: slot %q cannot be extended", slotID)
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	r, err := a.shared.b.HeartbeatSlot(rctx, slotKeyOf(l), slotID, ttl.Milliseconds(), a.shared.nowMs())
	cancel()
	a.observeRedis(err)
	if err != nil {
		return 0, redisFailed(ctx, err)
	}
	if !r.Held {
		return 0, fmt.Errorf("%w: %q (released, expired or unknown): its holder has lost it", ErrSlotNotHeld, slotID)
	}
	a.renewSlots(l)
	return time.Duration(r.ExpiresInMs) * time.Millisecond, nil
}

// ReleaseSlot frees a held slot: false when it was not held (released
// before, expired, unknown), which is not an error.
func (a *Agent) ReleaseSlot(ctx context.Context, limit, slotID string) (bool, error) {
	if err := validSlotID(slotID); err != nil {
		return false, err
	}
	l, err := a.slotLimit(limit)
	if err != nil {
		return false, err
	}
	if a.rh.isDown() {
		return false, fmt.Errorf("regionagent: the region's Redis is down: slot %q cannot be released (it ends at its expiry)", slotID)
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	ok, err := a.shared.b.ReleaseSlot(rctx, slotKeyOf(l), slotID, a.shared.nowMs())
	cancel()
	a.observeRedis(err)
	if err != nil {
		return false, redisFailed(ctx, err)
	}
	return ok, nil
}

// redisFailed is a Redis call's failure as the caller sees it: the
// caller's own deadline or cancellation as such, anything else
// (including the agent's Redis timeout) UNAVAILABLE.
func redisFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("regionagent: the region's Redis did not answer: %s", err.Error())
}

// renewSlots asks for the limit's next share in the background when the
// one in force is half through its life (or there is none).
func (a *Agent) renewSlots(l core.Limit) {
	a.slots.mu.Lock()
	p := a.slots.plan(l.ID)
	p.Used(a.opt.now())
	var ask slotAsk
	start := p.ShouldAsk(a.opt.now())
	if start {
		ask = a.startSlotAsk(p)
	}
	a.slots.mu.Unlock()
	if start {
		go a.askSlotShare(a.runCtx(), l, ask)
	}
}

// slotAsk is one slot share request: what it reports, and done, closed
// when it is over.
type slotAsk struct {
	demand float64
	held   int64
	done   chan struct{}
}

// startSlotAsk marks a request in flight and takes what it reports;
// a.slots.mu is held, so no second request starts before this one ends.
func (a *Agent) startSlotAsk(p *slotPlan) slotAsk {
	now := a.opt.now()
	ask := slotAsk{demand: p.Demand(now, p.held), held: p.held, done: make(chan struct{})}
	p.Asked(now)
	p.done = ask.done
	return ask
}

// awaitSlotShare asks for a share (unless a request is in flight) and
// waits for the answer, at most until ctx ends or the agent's wait
// bound. It reports whether the allocator said nothing was free.
func (a *Agent) awaitSlotShare(ctx context.Context, l core.Limit) (empty bool) {
	a.slots.mu.Lock()
	p := a.slots.plan(l.ID)
	now := a.opt.now()
	var done chan struct{}
	switch {
	case p.Pending:
		done = p.done
	case p.ShouldAsk(now) || !p.InForce(now):
		if !p.ShouldAsk(now) {
			// A recent empty or failed answer: say so rather than ask again.
			empty = !p.EmptyAt.IsZero()
			a.slots.mu.Unlock()
			return empty
		}
		ask := a.startSlotAsk(p)
		done = ask.done
		go a.askSlotShare(a.runCtx(), l, ask)
	}
	a.slots.mu.Unlock()
	if done != nil {
		t := time.NewTimer(max(a.opt.wait, time.Second))
		defer t.Stop()
		select {
		case <-done:
		case <-ctx.Done():
		case <-t.C:
		}
	}
	a.slots.mu.Lock()
	empty = !p.EmptyAt.IsZero() && !p.InForce(a.opt.now())
	a.slots.mu.Unlock()
	return empty
}

// askSlotShare asks the allocator for the region's next slot share of l
// and installs it in Redis; ask.done is closed when it is over.
func (a *Agent) askSlotShare(ctx context.Context, l core.Limit, ask slotAsk) {
	defer close(ask.done)
	a.slots.mu.Lock()
	p := a.slots.plan(l.ID)
	a.slots.mu.Unlock()
	held, demand := ask.held, ask.demand

	now := a.opt.now()
	cl := a.alloc
	if a.groups.active() {
		cl = a.groups.client(a.groups.owner(l.ID, now))
	}
	req := &pb.ShareRequest{RequestId: a.cfg.ReplicaID + "-" + a.nonce + "-s" + strconv.FormatUint(a.slots.seq.Add(1), 10),
		LimitId: l.ID, DemandPerSecond: demand, HeldSlots: held}
	var reply core.SlotReply
	sent := a.opt.now()
	var resp *pb.AcquireSharesResponse
	err := fmt.Errorf("regionagent: no allocator client for limit %q", l.ID)
	if cl != nil {
		err = cl.call(ctx, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
			var err error
			resp, err = ac.AcquireShares(ctx, &pb.AcquireSharesRequest{Region: a.cfg.Region, Requests: []*pb.ShareRequest{req}}, opts...)
			return err
		})
	}
	recv := a.opt.now()
	switch {
	case err != nil:
		a.notes.callFailed(a.log, "slot share requests", 1, err)
	case len(resp.Results) != 1:
		a.log.Warn("the allocator answered a slot share request with the wrong number of results", "limit", l.ID)
	case resp.Results[0].Code != pb.ItemCode_ITEM_CODE_OK:
		a.log.Warn("slot share refused", "limit", l.ID, "code", resp.Results[0].Code.String(),
			"reason", vocab.Cap(resp.Results[0].Message, maxLogValue))
	default:
		s := resp.Results[0].Share
		reply = core.SlotReply{OK: true, Seq: s.GetSeq(), N: s.GetSlots(), Admit: s.GetAdmitSlots(), ExpiresIn: dur(s.GetExpiresIn())}
	}
	var margin time.Duration
	a.withCore(func(c *core.Core) { margin = c.Margin(reply.ExpiresIn) })
	a.slots.mu.Lock()
	deadline, install := p.Answered(sent, recv, reply, margin)
	a.slots.mu.Unlock()
	if !install {
		return
	}
	res, err := a.installSlots(ctx, l, reply.Seq, reply.N, reply.Admit, deadline)
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	switch {
	case err == nil && res.Status != store.ShareRefusedKeyExpiry:
		p.held = res.Held
	case p.Seq == reply.Seq:
		p.Deadline = time.Time{} // not in force in Redis: ask again when next used
	}
}

// installSlots installs a slot share of l in the region's Redis: seq, n
// slots (admit of them open to new acquires) until deadline (agent
// clock, converted to Redis's rounded down).
func (a *Agent) installSlots(ctx context.Context, l core.Limit, seq, n, admit int64, deadline time.Time) (store.SlotInstallResult, error) {
	ictx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	defer cancel()
	var res store.SlotInstallResult
	cs, err := a.shared.syncedClock(ictx)
	if err == nil {
		dl := max(1, cs.ToRedis(deadline))
		res, err = a.shared.b.InstallSlots(ictx, bucket.SlotInstall{Key: slotKeyOf(l),
			Share:      store.SlotShare{Seq: seq, N: n, Admit: admit, DeadlineMs: dl},
			ExpireAtMs: max(cs.ToRedis(deadline.Add(a.opt.keyGrace)), dl), NowMs: a.shared.nowMs()})
	}
	a.observeRedis(err)
	return res, err
}

// underFallback reports whether l's slots are held under the region's
// fallback share: the allocator unreachable and no share of the
// region's own in force, as this replica knows.
func (a *Agent) underFallback(l core.Limit) bool {
	if l.Fallback.Kind != core.FallbackLocal {
		return false
	}
	var down bool
	a.withCore(func(c *core.Core) { down = c.AllocatorDown() })
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	return down && !a.slots.plan(l.ID).InForce(a.opt.now())
}

// slotFallback installs l's fallback share in the region's Redis when
// the allocator is unreachable, the region has no share of its own and
// its fallback is local (core.SlotPlan.FallbackSlots), and reports
// whether one is in force there now (installed by this replica or by
// another).
func (a *Agent) slotFallback(ctx context.Context, l core.Limit) bool {
	var down bool
	a.withCore(func(c *core.Core) { down = c.AllocatorDown() })
	now := a.opt.now()
	a.slots.mu.Lock()
	seq, n, deadline, ok := a.slots.plan(l.ID).FallbackSlots(l, down, now)
	a.slots.mu.Unlock()
	if !ok {
		return false
	}
	res, err := a.installSlots(ctx, l, seq, n, n, deadline)
	if err != nil || res.Status == store.ShareRefusedKeyExpiry {
		return false
	}
	if res.Status == store.ShareInstalled {
		a.log.Warn("allocator unreachable: a concurrency limit holds slots under its local fallback",
			"limit", l.ID, "slots", n, "until", deadline.UTC().Format(time.RFC3339Nano))
	}
	return true
}
