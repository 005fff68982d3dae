package allocator

import (
	"fmt"
	"leasehold/internal/planbind"
	"slices"
	"strconv"
	"strings"
	"time"

	"leasehold/internal/seeded"
	"leasehold/internal/zones"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Grant is one lease as the allocator records it: the durable record of a
// grant, its request id, and (later) its return. It is what [Store] writes to
// etcd, one key per grant.
type Grant struct {
	LeaseID   string `json:"id"`
	Limit     string `json:"limit"`
	Region    string `json:"region"`
	RequestID string `json:"req"`
	Window    int64  `json:"w"`              // window index
	WindowMs  int64  `json:"wms"`            // window length, ms
	PhaseMs   int64  `json:"phms,omitempty"` // the windows' phase offset, ms
	Cal       string `json:"cal,omitempty"`  // calendar windows (zones.Format), e.g. "month Europe/Berlin"
	Tokens    int64  `json:"n"`
	// G is the limit's G when the grant was made (a later change may lower
	// it; the overshoot bound needs the old value).
	G            int64 `json:"g"`
	LimitVersion int64 `json:"v"`
	GrantedAt    int64 `json:"at"`  // unix ns, allocator clock
	StartsAt     int64 `json:"sa"`  // unix ns, allocator clock
	ExpiresAt    int64 `json:"ea"`  // unix ns, allocator clock
	PoolLeft     int64 `json:"pl"`  // pool after this grant
	Returned     bool  `json:"ret"` // a return was recorded
	Unspent      int64 `json:"un,omitempty"`
	Credited     int64 `json:"cr,omitempty"` // credited to the pool (window open)
	// Standing marks the record of a region's standing share, written when
	// the region returns it: the share itself was counted as granted
	// from the window's start without a record (Limit.Standing), so
	// restoring the record restores only its return.
	Standing bool `json:"std,omitempty"`

	// pending is set while the grant (or its latest change) is not yet
	// committed; replays wait on it. Owned by the Allocator; not persisted.
	pending *pendingOp
}

// windowStart and windowEnd on the allocator's clock.
func (g *Grant) window() lease.Window {
	return g.Schedule().ByIndex(g.Window)
}

// Schedule is the window schedule of the limit version that granted g.
func (g *Grant) Schedule() lease.Windows { return schedOf(g.WindowMs, g.PhaseMs, g.Cal) }

// ParseLeaseID splits a lease id made by lease.ID.
func ParseLeaseID(id string) (window int64, region, requestID string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return 0, "", "", fmt.Errorf("want <window>/<region>/<request id>, got %q", id)
	}
	window, err = strconv.ParseInt(parts[0], 10, 64)
	if err != nil || window < 0 {
		return 0, "", "", fmt.Errorf("bad window in %q", id)
	}
	return window, parts[1], parts[2], nil
}

type windowKey struct {
	limit string
	index int64
}

type requestKey struct {
	region, requestID string
}

// standingKey is the key of region's standing share of a window of limit:
// one per limit and window, as "~" is in no request id.
func standingKey(region, limit string, window int64) requestKey {
	return requestKey{region, "~" + strconv.FormatInt(window, 10) + "~" + limit}
}

// key is what the core finds the grant by.
func (g *Grant) key() requestKey {
	if g.Standing {
		return standingKey(g.Region, g.Limit, g.Window)
	}
	return requestKey{g.Region, g.RequestID}
}

type demandKey struct {
	limit, region string
}

// demandReport is a region's latest lease request: its demand and
// holdings, and what the request was granted.
type demandReport struct {
	rate float64
	held int64 // tokens held when the region asked
	at   time.Time
	// window is the window the request was for, granted what it got: right
	// after the grant the region holds held + granted of that window.
	window  int64
	granted int64
}

// windowState is the pool of one (limit, window).
type windowState struct {
	sched    lease.Windows // the windows of the version that opened it
	granted  int64         // tokens granted in leases (standing shares are not in it: Limit.standingTotal)
	credited int64         // tokens returned while the window was open, standing shares' included
	late     int64         // tokens returned after the window closed (not credited)
	maxG     int64         // largest G in force at any grant
	// byRegion is what each region was granted and had credited back in
	// the window: the Granted of its fair share (lease.SizeRequest.G).
	byRegion map[string]*regionUse
	requests []requestKey
	usage    map[reporterKey]*UsageRecord // per region and reporter
}

// regionUse is one region's part of a window's granted and credited.
type regionUse struct {
	granted, credited int64
}

// region returns the counts of region in the window, creating them.
func (ws *windowState) region(region string) *regionUse {
	u := ws.byRegion[region]
	if u == nil {
		if ws.byRegion == nil {
			ws.byRegion = map[string]*regionUse{}
		}
		u = &regionUse{}
		ws.byRegion[region] = u
	}
	return u
}

// net returns what region holds of the window: granted minus credited.
// ws may be nil (nothing granted yet).
func (ws *windowState) net(region string) int64 {
	if ws == nil {
		return 0
	}
	u := ws.byRegion[region]
	if u == nil {
		return 0
	}
	return u.granted - u.credited
}

// Core is the allocator's decision state machine: limits, pools (with what
// each region was granted and had credited back in each window), grants by
// request id, and each region's last reported demand. Sizing gives every
// region with a fresh report a demand-weighted share of each window's G
// (lease.Allot): a busy region cannot take the share of a quiet one that
// has not asked yet, and an empty answer says when the requester's share
// is what ran out (Decision.ShareSpent).
//
// It does no I/O and reads no clock: every method takes now. Decisions are
// applied to the in-memory state at once; the caller must persist the
// returned records before answering, and must discard the Core if
// persisting fails (the state may then be ahead of etcd; a new Core is
// rebuilt from etcd, per-region counts included, by Restore).
//
// The zero value is not usable; call NewCore. Not safe for concurrent use:
// the Allocator serializes calls.
type Core struct {
	limits    map[string]*Limit
	windows   map[windowKey]*windowState
	byRequest map[requestKey]*Grant
	demand    map[demandKey]demandReport
	summaries map[string][]*WindowSummary // closed windows kept for reports, per limit, oldest first
	// owner, when set, says whether this core's allocator group owns a
	// limit's window starting at start (and else which group does): a
	// window another group owns is never granted here (the group map,
	// package internal/groupmap).
	owner     func(limit string, start time.Time) (group string, owned bool)
	shares    map[string]*shareState     // rate shares of bucket limits, per limit (shares.go)
	shareReq  map[requestKey]*ShareGrant // rate shares by request id
	heldMax   map[string]int64           // concurrency limits: the most slots reported held together (HeldSlotsMax)
	boundMax  map[string]int64           // concurrency limits: the largest bound in force when held slots were recorded (slotBoundNow)
	bucketUse map[string]*bucketUsage    // bucket limits' admitted counts per reporting interval (bucketusage.go)
	// bind are the plans' patterns (plans.go); resolved caches the limits
	// resolved from plans for the ids granted since the last plan change,
	// each dropped with its last window (a cache: resolution is a pure
	// function of the plan).
	bind     planbind.Table
	resolved map[string]*Limit
}

// NewCore returns an empty core.
func NewCore() *Core {
	return &Core{
		limits:    map[string]*Limit{},
		windows:   map[windowKey]*windowState{},
		byRequest: map[requestKey]*Grant{},
		demand:    map[demandKey]demandReport{},
		summaries: map[string][]*WindowSummary{},
		shares:    map[string]*shareState{},
		shareReq:  map[requestKey]*ShareGrant{},
		heldMax:   map[string]int64{},
		boundMax:  map[string]int64{},
		bucketUse: map[string]*bucketUsage{},
		resolved:  map[string]*Limit{},
	}
}

// SetOwnership makes the core grant only the windows its allocator group
// owns: owner(limit, start) says whether the group owns the limit's
// window that starts at start, and otherwise names the group that does.
// A request for another group's window is answered WRONG_GROUP naming
// it. A replayed request is answered from its grant whatever the map says
// now: it was granted while the window was this group's. nil: every
// window is this core's (one group).
func (c *Core) SetOwnership(owner func(limit string, start time.Time) (group string, owned bool)) {
	c.owner = owner
}

// SetLimit adds or replaces a limit. Each window is decided by the version
// that governs its start (Limit.At): a change in force at once (no
// Previous) applies to the running window, and a lower G empties its pool
// at once (pools are computed from the G in force, clamped at zero).
// A plan (an id under planbind.Namespace) is kept as a limit record
// that is never granted; it defines the limits of the ids it binds.
func (c *Core) SetLimit(l *Limit) {
	c.limits[l.ID] = l
	if planbind.IsPlan(l.ID) {
		c.plansChanged()
	}
}

// DeleteLimit forgets a limit; its open windows stay until they expire, so
// returns are still counted.
func (c *Core) DeleteLimit(id string) {
	delete(c.limits, id)
	if planbind.IsPlan(id) {
		c.plansChanged()
	}
}

// Limit returns a limit by id: its record, or the limit the plan that
// binds id gives it (plans.go). A plan's own record is no limit.
func (c *Core) Limit(id string) (*Limit, bool) {
	return c.limit(id)
}

// Restore adds a committed grant while rebuilding from etcd.
func (c *Core) Restore(g *Grant) {
	k := windowKey{g.Limit, g.Window}
	ws := c.window(k, g.Schedule())
	ws.credited += g.Credited
	if !g.Standing {
		ws.granted += g.Tokens
		u := ws.region(g.Region)
		u.granted += g.Tokens
		u.credited += g.Credited
	}
	if g.Returned {
		ws.late += g.Unspent - g.Credited
	}
	ws.maxG = max(ws.maxG, g.G)
	rk := g.key()
	ws.requests = append(ws.requests, rk)
	c.byRequest[rk] = g
}

func (c *Core) window(k windowKey, sched lease.Windows) *windowState {
	ws := c.windows[k]
	if ws == nil {
		ws = &windowState{sched: sched}
		c.windows[k] = ws
	}
	return ws
}

// Pool returns what the pool of (limit, window) holds now: G - standing
// shares - granted + credited returns, never below zero. G and the shares
// are the ones of the version that governs the window's start.
func (c *Core) Pool(limit string, window int64) int64 {
	l, ok := c.limit(limit)
	if !ok {
		return 0
	}
	ws := c.windows[windowKey{limit, window}]
	v := l
	if l.Previous != nil {
		sched := l.Windows()
		if ws != nil {
			sched = ws.sched
		}
		v = l.At(sched.ByIndex(window).Start())
	}
	return c.pool(v, ws)
}

func (c *Core) pool(l *Limit, ws *windowState) int64 {
	if ws == nil {
		return max(0, l.Tokens-l.standingTotal())
	}
	return max(0, l.Tokens-l.standingTotal()-ws.granted+ws.credited)
}

// WindowStats is what the core knows of one (limit, window).
type WindowStats struct {
	Granted, Credited, ReturnedLate, MaxG int64
}

// Stats returns the counts of one (limit, window).
func (c *Core) Stats(limit string, window int64) (WindowStats, bool) {
	ws, ok := c.windows[windowKey{limit, window}]
	if !ok {
		return WindowStats{}, false
	}
	return WindowStats{ws.granted, ws.credited, ws.late, ws.maxG}, true
}

// AcquireRequest is one item of an AcquireLeases call, already validated.
type AcquireRequest struct {
	RequestID string
	Limit     string
	Next      bool // the window after the current one
	Demand    float64
	Held      int64
	Want      int64
}

// Decision is the core's answer to one AcquireRequest.
type Decision struct {
	Code     pb.ItemCode
	Message  string
	Grant    *Grant // nil when nothing was granted
	Replayed bool   // Grant was made earlier for the same request id
	New      bool   // Grant is new and must be persisted
	// Window and PoolLeft name the window an empty answer (no grant, code
	// OK) was for, so the agent marks the right window spent.
	Window   lease.Window
	PoolLeft int64
	// ShareSpent is set on an empty answer when the pool is not empty but
	// the other regions' fresh demand claims all of it: the requester has
	// used its demand-weighted share of the window (lease.Allotment).
	ShareSpent bool
	// OwnerGroup names the allocator group that owns the window when Code
	// is WRONG_GROUP.
	OwnerGroup string
}

// demandTTL: a region that has not asked for this long is treated as quiet,
// so its old demand no longer holds back the others.
func demandTTL(l *Limit) time.Duration { return max(2*l.TTL, 5*time.Second) }

// Acquire decides one lease request of region at now.
func (c *Core) Acquire(now time.Time, region string, r AcquireRequest) Decision {
	d := c.acquire(now, region, r)
	idx := d.Window.Index
	if d.Grant != nil {
		idx = d.Grant.Window
	}
	if _, cached := c.resolved[r.Limit]; cached && (d.Code != pb.ItemCode_ITEM_CODE_OK || c.windows[windowKey{r.Limit, idx}] == nil) {
		// A tenant of a plan is kept resolved only while it has a window
		// (Forget drops it then): a refused or empty request leaves none.
		delete(c.resolved, r.Limit)
	}
	return d
}

func (c *Core) acquire(now time.Time, region string, r AcquireRequest) Decision {
	rk := requestKey{region, r.RequestID}
	if g, ok := c.byRequest[rk]; ok && !seeded.On(seeded.RegrantRetry) {
		if g.Limit != r.Limit {
			return Decision{Code: pb.ItemCode_ITEM_CODE_CONFLICT,
				Message: fmt.Sprintf("request id %q was used for limit %q", r.RequestID, g.Limit)}
		}
		return Decision{Grant: g, Replayed: true}
	}
	if g, ok := c.shareReq[rk]; ok {
		return Decision{Code: pb.ItemCode_ITEM_CODE_CONFLICT,
			Message: fmt.Sprintf("request id %q was used for a rate share of limit %q", r.RequestID, g.Limit)}
	}
	l, ok := c.use(r.Limit)
	if !ok {
		if c.owner != nil {
			// Not here: a limit another group owns lives there (its W,
			// unknown here, names its windows; the owner now is the one
			// to ask).
			if g, owned := c.owner(r.Limit, now); !owned && g != "" {
				return Decision{Code: pb.ItemCode_ITEM_CODE_WRONG_GROUP, OwnerGroup: g,
					Message: fmt.Sprintf("limit %q is owned by allocator group %q", r.Limit, g)}
			}
		}
		return Decision{Code: pb.ItemCode_ITEM_CODE_NOT_FOUND, Message: fmt.Sprintf("no limit %q", r.Limit)}
	}
	if v := l.At(now); v.Windowless() {
		return Decision{Code: pb.ItemCode_ITEM_CODE_WRONG_KIND,
			Message: fmt.Sprintf("limit %q is a %s limit: acquire shares", r.Limit, kindName(v.Proto))}
	}
	if !l.HasRegion(region) && (l.Previous == nil || !l.Previous.HasRegion(region)) {
		return Decision{Code: pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED,
			Message: fmt.Sprintf("limit %q is not spent in region %q", r.Limit, region)}
	}
	// The window is decided by the version that governs its start: a lease
	// for the next window fetched early already uses a change scheduled
	// for the boundary, the current window keeps the version it began with.
	v := l.At(now)
	w := v.Windows().Of(now)
	left := w.Left(now)
	if r.Next {
		w = w.Next()
		if nv := l.At(w.Start()); nv != v {
			// A change comes into force at this boundary, which is a
			// boundary of both versions' windows (see nextBoundary).
			v = nv
			w = v.Windows().Of(w.Start())
		}
		left = w.Length // the whole next window: its own length (a calendar window's varies)
	}
	if c.owner != nil {
		if g, owned := c.owner(l.ID, w.Start()); !owned {
			return Decision{Window: w, Code: pb.ItemCode_ITEM_CODE_WRONG_GROUP, OwnerGroup: g,
				Message: fmt.Sprintf("limit %q's window %d is owned by allocator group %q", r.Limit, w.Index, g)}
		}
	}
	dk := demandKey{l.ID, region}
	c.demand[dk] = demandReport{rate: r.Demand, held: r.Held, at: now, window: -1}
	if !v.HasRegion(region) {
		return Decision{Code: pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED,
			Message: fmt.Sprintf("limit %q is not spent in region %q in that window", r.Limit, region)}
	}
	l = v
	rep := c.demand[dk]
	rep.window = w.Index
	c.demand[dk] = rep
	k := windowKey{l.ID, w.Index}
	ws := c.windows[k]
	pool := c.pool(l, ws)
	timing := lease.Schedule(now, w, l.TTL)
	if pool == 0 || timing.ExpiresIn <= 0 {
		return Decision{Window: w, PoolLeft: pool}
	}
	a := lease.Allot(lease.SizeRequest{
		Pool:     pool,
		Left:     left,
		Horizon:  l.TTL,
		Region:   region,
		Want:     r.Want,
		Demands:  c.demands(now, l, w.Index, ws),
		MinChunk: l.MinChunk,
		MaxChunk: l.MaxChunk,
		G:        l.Tokens,
	})
	tokens := a.Tokens
	if tokens <= 0 {
		return Decision{Window: w, PoolLeft: pool, ShareSpent: a.ShareSpent}
	}
	rep.granted = tokens
	c.demand[dk] = rep
	ws = c.window(k, l.Windows())
	ws.granted += tokens
	ws.region(region).granted += tokens
	ws.maxG = max(ws.maxG, l.Tokens)
	ws.requests = append(ws.requests, rk)
	g := &Grant{
		LeaseID:      lease.ID(w.Index, region, r.RequestID),
		Limit:        l.ID,
		Region:       region,
		RequestID:    r.RequestID,
		Window:       w.Index,
		WindowMs:     w.Length.Milliseconds(),
		PhaseMs:      w.Phase.Milliseconds(),
		Cal:          zones.Format(w.Cal),
		Tokens:       tokens,
		G:            l.Tokens,
		LimitVersion: l.Version,
		GrantedAt:    now.UnixNano(),
		StartsAt:     now.Add(timing.StartsIn).UnixNano(),
		ExpiresAt:    now.Add(timing.ExpiresIn).UnixNano(),
		PoolLeft:     pool - tokens,
	}
	c.byRequest[rk] = g
	return Decision{Grant: g, New: true}
}

// demands lists the fresh demand reports of the limit's regions for sizing
// window (ws, nil if nothing was granted in it yet). Each region's Granted
// is its net part of the window: granted minus credited returns. Its Held
// is what it held when it asked, plus what that request was granted if it
// was for this window: a region that was just given a lease holds it.
// Only fresh reports count, for the need and for the fair share alike: a
// region that stopped asking neither holds the others back nor keeps a
// share of the window.
func (c *Core) demands(now time.Time, l *Limit, window int64, ws *windowState) []lease.RegionDemand {
	out := c.reported(now, l)
	for i := range out {
		d := &out[i]
		if rep := c.demand[demandKey{l.ID, d.Region}]; rep.window == window {
			d.Held += rep.granted
		}
		d.Granted = ws.net(d.Region)
	}
	return out
}

// reported lists the fresh demand reports of the limit's regions as they
// were sent: Held is what each region held when it asked.
func (c *Core) reported(now time.Time, l *Limit) []lease.RegionDemand {
	ttl := demandTTL(l)
	out := make([]lease.RegionDemand, 0, len(l.Regions))
	for _, r := range l.Regions {
		d, ok := c.demand[demandKey{l.ID, r}]
		if !ok || now.Sub(d.at) > ttl {
			continue
		}
		out = append(out, lease.RegionDemand{Region: r, Rate: d.rate, Held: d.held})
	}
	return out
}

// ReturnRequest is one item of a ReturnLeases call, already validated.
type ReturnRequest struct {
	Limit   string
	LeaseID string
	Unspent int64
}

// ReturnDecision is the core's answer to one return.
type ReturnDecision struct {
	Code      pb.ItemCode
	Message   string
	Credited  int64
	Duplicate bool
	// Grant is the updated record to persist (nil when nothing changed).
	Grant *Grant
	// Wait is set when the lease's grant is not yet committed; the caller
	// waits for it and asks again.
	Wait *pendingOp
}

// Return closes a lease of region at now. Unspent tokens go back to the
// pool only while the lease's window is open; a retried return is counted
// once and answers as the first did.
func (c *Core) Return(now time.Time, region string, r ReturnRequest) (ReturnDecision, error) {
	window, leaseRegion, reqID, err := ParseLeaseID(r.LeaseID)
	if err != nil {
		return ReturnDecision{Code: pb.ItemCode_ITEM_CODE_UNKNOWN_LEASE, Message: err.Error()}, nil
	}
	rk := requestKey{leaseRegion, reqID}
	if reqID == lease.StandingRequestID {
		rk = standingKey(leaseRegion, r.Limit, window)
	}
	g, ok := c.byRequest[rk]
	if !ok && reqID == lease.StandingRequestID && leaseRegion == region {
		var msg string
		if g, msg = c.standingShare(now, region, r.Limit, window); g == nil {
			return ReturnDecision{Code: pb.ItemCode_ITEM_CODE_UNKNOWN_LEASE, Message: msg}, nil
		}
		ok = true
	}
	if !ok || leaseRegion != region || g.Limit != r.Limit || g.Window != window {
		return ReturnDecision{Code: pb.ItemCode_ITEM_CODE_UNKNOWN_LEASE,
			Message: fmt.Sprintf("no lease %q of limit %q in region %q", r.LeaseID, r.Limit, region)}, nil
	}
	if g.pending != nil && !g.pending.isDone() {
		return ReturnDecision{Wait: g.pending}, nil
	}
	if g.Returned && !seeded.On(seeded.DoubleCredit) {
		return ReturnDecision{Credited: g.Credited, Duplicate: true}, nil
	}
	if r.Unspent > g.Tokens {
		return ReturnDecision{}, fieldErr("unspent", "%d is more than the lease's %d tokens", r.Unspent, g.Tokens)
	}
	ws := c.window(windowKey{g.Limit, g.Window}, g.Schedule())
	upd := *g
	upd.pending = nil
	upd.Returned = true
	upd.Unspent = r.Unspent
	code := pb.ItemCode_ITEM_CODE_OK
	msg := ""
	if now.Before(g.window().End()) {
		// The pool gets the tokens back when the record is durable
		// (Credit), not now.
		upd.Credited = r.Unspent
	} else {
		code, msg = pb.ItemCode_ITEM_CODE_WINDOW_CLOSED, "window is over: nothing credited"
		ws.late += r.Unspent
	}
	*g = upd
	return ReturnDecision{Code: code, Message: msg, Credited: upd.Credited, Grant: g}, nil
}

// standingShare makes the record of region's standing share of a window
// of limit, which the region is returning: the share was counted as
// granted from the window's start (the version that governs it says how
// much), and from now on this record is what a second return finds. It
// returns nil and why when there is no such share: the limit has none
// for the region in that window, or the window has not started.
func (c *Core) standingShare(now time.Time, region, limit string, window int64) (*Grant, string) {
	l, ok := c.limit(limit)
	if !ok {
		return nil, fmt.Sprintf("no limit %q", limit)
	}
	v := l.forIndex(window, now)
	w := v.Windows().ByIndex(window)
	switch {
	case v.Windowless() || v.Standing == 0 || !v.HasRegion(region):
		return nil, fmt.Sprintf("limit %q has no standing share for region %q in window %d", limit, region, window)
	case now.Before(w.Start()):
		return nil, fmt.Sprintf("window %d of limit %q has not started", window, limit)
	}
	if c.owner != nil {
		if g, owned := c.owner(limit, w.Start()); !owned {
			return nil, fmt.Sprintf("limit %q's window %d is owned by allocator group %q", limit, window, g)
		}
	}
	g := &Grant{
		LeaseID:      lease.StandingLeaseID(window, region),
		Limit:        limit,
		Region:       region,
		RequestID:    lease.StandingRequestID,
		Window:       window,
		WindowMs:     w.Length.Milliseconds(),
		PhaseMs:      w.Phase.Milliseconds(),
		Cal:          zones.Format(w.Cal),
		Tokens:       v.Standing,
		G:            v.Tokens,
		LimitVersion: v.Version,
		GrantedAt:    w.Start().UnixNano(),
		StartsAt:     w.Start().UnixNano(),
		ExpiresAt:    w.End().UnixNano(),
		Standing:     true,
	}
	ws := c.window(windowKey{limit, window}, v.Windows())
	ws.maxG = max(ws.maxG, v.Tokens)
	ws.requests = append(ws.requests, g.key())
	c.byRequest[g.key()] = g
	return g, ""
}

// Credit gives the pool back the tokens a return credited (g, the record
// Return handed out), once that record is durable: the allocator calls it
// when the return's commit has landed, the simulator and the explorer when
// their model etcd took it, and Restore counts what etcd holds. Until then
// the tokens are not granted again: a grant made from them could commit
// in a transaction that lands while the return's is lost with the term,
// and etcd would hold more than G for the window (the protocol explorer
// found that interleaving). Call it once per record Return gave.
func (c *Core) Credit(g *Grant) {
	if g == nil || g.Credited <= 0 {
		return
	}
	ws := c.window(windowKey{g.Limit, g.Window}, g.Schedule())
	ws.credited += g.Credited
	if !g.Standing {
		ws.region(g.Region).credited += g.Credited
	}
}

// Expired lists the windows that ended at least grace before now; their
// records may be removed.
func (c *Core) Expired(now time.Time, grace time.Duration) []windowKey {
	var out []windowKey
	for k, ws := range c.windows {
		w := ws.sched.ByIndex(k.index)
		if !now.Before(w.End().Add(grace)) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b windowKey) int {
		if c := strings.Compare(a.limit, b.limit); c != 0 {
			return c
		}
		return int(a.index - b.index)
	})
	return out
}

// Forget drops an expired window and its grants' request ids. A request id
// retried after this gets a new lease: retries must come within the grace.
func (c *Core) Forget(k windowKey) {
	ws, ok := c.windows[k]
	if !ok {
		return
	}
	for _, rk := range ws.requests {
		if g, ok := c.byRequest[rk]; ok && g.Limit == k.limit && g.Window == k.index {
			delete(c.byRequest, rk)
		}
	}
	delete(c.windows, k)
	delete(c.resolved, k.limit) // resolved again if the id is used again
}

// ToProto renders a grant as the lease an agent receives at now: durations
// are measured from now, so a replay a little later does not extend it.
func (g *Grant) ToProto(now time.Time) *pb.Lease {
	startsIn := max(0, time.Duration(g.StartsAt-now.UnixNano()))
	expiresIn := max(0, time.Duration(g.ExpiresAt-now.UnixNano()))
	w := g.window()
	return &pb.Lease{
		LeaseId:      g.LeaseID,
		LimitId:      g.Limit,
		Region:       g.Region,
		WindowIndex:  g.Window,
		Window:       durpb(w.Length),
		Tokens:       g.Tokens,
		StartsIn:     durpb(startsIn),
		ExpiresIn:    durpb(expiresIn),
		RequestId:    g.RequestID,
		LimitVersion: g.LimitVersion,
		PoolLeft:     g.PoolLeft,
		WindowLeft:   durpb(max(0, w.End().Sub(now))),
		WindowPhase:  phasepb(w.Phase),
		Calendar:     calpb(w.Cal),
	}
}

// EmptyLease renders an empty answer (no grant, code OK, d.Window set) as
// the lease of 0 tokens an agent receives at now: it names the window, what
// its pool holds, and whether the requester's share of it is spent.
func (d Decision) EmptyLease(now time.Time, limit, region, requestID string) *pb.Lease {
	w := d.Window
	return &pb.Lease{
		LimitId:     limit,
		Region:      region,
		WindowIndex: w.Index,
		Window:      durpb(w.Length),
		StartsIn:    durpb(0),
		ExpiresIn:   durpb(0),
		RequestId:   requestID,
		PoolLeft:    d.PoolLeft,
		WindowLeft:  durpb(max(0, w.End().Sub(now))),
		ShareSpent:  d.ShareSpent,
		WindowPhase: phasepb(w.Phase),
		Calendar:    calpb(w.Cal),
	}
}
