package allocator

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"leasehold/internal/limitspec"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// A bucket limit (rate R per period, burst B) is granted as rate shares:
// each region gets (r_i, b_i) for a TTL and refills a token bucket of its
// own at r_i up to b_i (lease.TokenBucket). The Core keeps, at every
// instant, the shares that may still be in force within the limit:
//
//	sum over regions of max(r of the region's unexpired shares) <= 1000*R
//	sum over regions of max(b of the region's unexpired shares) <= B
//
// A region is counted at the largest of its unexpired shares, not its
// latest, because its agent may still spend an older share until the newer
// one reaches it (or forever, if the reply is lost). A share is unexpired
// until its ExpiresAt on the allocator's clock, which is never before the
// agent's deadline for it (lease.Deadline): an expired share's rate goes
// back to the pool only after its holder stopped spending it.

// DefaultShareTTL is how long a rate share lives when the limit names no
// lease ttl. Agents renew well before (lease.LowWater's lead), so a region
// that stops renewing gives its share back within about this long.
const DefaultShareTTL = limitspec.DefaultShareTTL // validation fills it in

// ShareGrant is one rate share as the allocator records it in etcd.
type ShareGrant struct {
	ShareID   string `json:"id"`
	Limit     string `json:"limit"`
	Region    string `json:"region"`
	Holder    string `json:"h,omitempty"` // "" the region's shared bucket; an agent replica's in-process one
	RequestID string `json:"req"`
	Seq       int64  `json:"seq"`
	Rate      int64  `json:"r"`   // milli-tokens per period
	Burst     int64  `json:"b"`   // tokens
	PeriodMs  int64  `json:"pms"` // the limit's rate period, ms
	// LimitRate and LimitBurst are the limit's R and B when the share was
	// granted (a later change may lower them; the bound needs the old).
	LimitRate    int64 `json:"lr"`
	LimitBurst   int64 `json:"lb"`
	LimitVersion int64 `json:"v"`
	// Slots and Admit are a concurrency limit's slot share (Rate and
	// Burst are then 0): the holder may hold Slots at once, and admit a
	// new slot while it holds fewer than Admit (<= Slots). LimitN is the
	// limit's N when the share was granted.
	Slots     int64 `json:"n,omitempty"`
	Admit     int64 `json:"a,omitempty"`
	LimitN    int64 `json:"ln,omitempty"`
	Held      int64 `json:"hd,omitempty"` // the slots the holder held when it asked
	GrantedAt int64 `json:"at"`           // unix ns, allocator clock
	ExpiresAt int64 `json:"ea"`           // unix ns, allocator clock

	// pending is set while the grant is not yet committed; replays wait
	// on it. Owned by the Allocator; not persisted.
	pending *pendingOp
}

// ShareID formats a share id: "s/<region>/<request id>". Region and request
// ids contain no "/".
func ShareID(region, requestID string) string { return "s/" + region + "/" + requestID }

// inForce reports whether the share may still be spent at now.
func (g *ShareGrant) inForce(now time.Time) bool { return now.UnixNano() < g.ExpiresAt }

// shareState is the shares of one bucket limit, by holder (holderKey):
// each bucket that spends shares is counted apart.
type shareState struct {
	byRegion map[string][]*ShareGrant // granted, not yet forgotten, oldest first, by holder key
	seq      map[string]int64         // the latest seq granted per holder key
	asked    []string                 // the regions whose demand the core keeps (c.demand)
}

// holderKey names the bucket a share is spent from: the region's shared
// bucket (holder "") or a replica's in-process one. Region ids have no
// "/".
func holderKey(region, holder string) string {
	if holder == "" {
		return region
	}
	return region + "/" + holder
}

func (g *ShareGrant) holderKey() string { return holderKey(g.Region, g.Holder) }

func (c *Core) shareState(limit string) *shareState {
	st := c.shares[limit]
	if st == nil {
		st = &shareState{byRegion: map[string][]*ShareGrant{}, seq: map[string]int64{}}
		c.shares[limit] = st
	}
	return st
}

// held returns what a holder (holderKey) may still spend at now: the
// largest rate and the largest burst of its unexpired shares.
func (st *shareState) held(hk string, now time.Time) (rate, burst int64) {
	for _, g := range st.byRegion[hk] {
		if g.inForce(now) {
			rate, burst = max(rate, g.Rate), max(burst, g.Burst)
		}
	}
	return rate, burst
}

// heldSlots returns how many slots a holder (holderKey) may still hold at
// now: the largest of its unexpired slot shares.
func (st *shareState) heldSlots(hk string, now time.Time) (n int64) {
	for _, g := range st.byRegion[hk] {
		if g.inForce(now) {
			n = max(n, g.Slots)
		}
	}
	return n
}

// ReservedSlots returns how many slots the shares of a concurrency limit
// that may still be in force at now hold together, each holder counted
// at the largest of its unexpired shares. The Core keeps it <= N.
func (c *Core) ReservedSlots(limit string, now time.Time) (n int64) {
	st := c.shares[limit]
	if st == nil {
		return 0
	}
	for hk := range st.byRegion {
		n += st.heldSlots(hk, now)
	}
	return n
}

// Reserved returns what the shares of a bucket limit that may still be in
// force at now hold together: each region counted at the largest of its
// unexpired shares. The Core keeps rate <= 1000*R and burst <= B.
func (c *Core) Reserved(limit string, now time.Time) (rate, burst int64) {
	st := c.shares[limit]
	if st == nil {
		return 0, 0
	}
	for region := range st.byRegion {
		r, b := st.held(region, now)
		rate, burst = rate+r, burst+b
	}
	return rate, burst
}

// ShareAcquire is one item of an AcquireShares call, already validated.
type ShareAcquire struct {
	RequestID string
	Limit     string
	Demand    float64 // tokens per second
	Holder    string  // "" the region's shared bucket; a replica's in-process one
	Admitted  int64   // the holder's bucket's admitted counter (cumulative)
	// HeldSlots is, for a concurrency limit, how many slots the holder
	// holds now: its next share is never sized below it while the others
	// leave room. Demand is then the slots it wants (held + waiting).
	HeldSlots int64
	// WouldDeny and WouldDenyChecks are the holder's bucket's would-deny
	// counters (cumulative; a bucket limit in shadow mode).
	WouldDeny, WouldDenyChecks int64
}

// ShareDecision is the core's answer to one ShareAcquire.
type ShareDecision struct {
	Code     pb.ItemCode
	Message  string
	Grant    *ShareGrant // nil when nothing was granted
	Replayed bool        // Grant was made earlier for the same request id
	New      bool        // Grant is new and must be persisted
	// OwnerGroup names the allocator group that grants the limit's
	// shares when Code is WRONG_GROUP.
	OwnerGroup string
}

// shareTTL is how long l's shares live.
func shareTTL(l *Limit) time.Duration {
	if l.TTL > 0 {
		return l.TTL
	}
	return DefaultShareTTL
}

// AcquireShare decides one rate share request of region at now: the
// region's next share, sized by fresh demand (lease.SizeShare) within what
// the other regions' unexpired shares leave. A request id already granted
// is answered with the same share (Replayed); a request id of a lease is a
// CONFLICT. Nothing free gives an empty answer (code OK, no grant).
func (c *Core) AcquireShare(now time.Time, region string, r ShareAcquire) ShareDecision {
	rk := requestKey{region, r.RequestID}
	if g, ok := c.shareReq[rk]; ok {
		if g.Limit != r.Limit {
			return ShareDecision{Code: pb.ItemCode_ITEM_CODE_CONFLICT,
				Message: fmt.Sprintf("request id %q was used for limit %q", r.RequestID, g.Limit)}
		}
		return ShareDecision{Grant: g, Replayed: true}
	}
	if g, ok := c.byRequest[rk]; ok {
		return ShareDecision{Code: pb.ItemCode_ITEM_CODE_CONFLICT,
			Message: fmt.Sprintf("request id %q was used for a lease of limit %q", r.RequestID, g.Limit)}
	}
	resolved, ok := c.limit(r.Limit)
	if !ok {
		return ShareDecision{Code: pb.ItemCode_ITEM_CODE_NOT_FOUND, Message: fmt.Sprintf("no limit %q", r.Limit)}
	}
	l := resolved.At(now)
	if !l.Windowless() {
		return ShareDecision{Code: pb.ItemCode_ITEM_CODE_WRONG_KIND,
			Message: fmt.Sprintf("limit %q is a window limit: acquire leases", r.Limit)}
	}
	if c.owner != nil {
		// Shares are not windowed: a group grants them only once it has
		// owned the limit for a share's life, so every share the previous
		// owner granted has expired (it stopped at the move).
		g, owned := c.owner(l.ID, now)
		if owned {
			_, owned = c.owner(l.ID, now.Add(-shareTTL(l)))
		}
		if !owned {
			return ShareDecision{Code: pb.ItemCode_ITEM_CODE_WRONG_GROUP, OwnerGroup: g,
				Message: fmt.Sprintf("limit %q's rate shares are granted by allocator group %q (from a share's life after a move)", r.Limit, g)}
		}
	}
	if !l.HasRegion(region) {
		return ShareDecision{Code: pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED,
			Message: fmt.Sprintf("limit %q is not spent in region %q", r.Limit, region)}
	}
	c.demand[demandKey{l.ID, region}] = demandReport{rate: r.Demand, at: now, window: -1}

	hk := holderKey(region, r.Holder)
	st := c.shareState(l.ID)
	if !slices.Contains(st.asked, region) {
		st.asked = append(st.asked, region)
	}
	// A tenant of a plan keeps its resolution while it has shares (so a
	// busy tenant is resolved once), and nothing once it has none: a
	// request granted nothing leaves no state (forgetShareTenant).
	defer func() {
		if resolved.Proto.GetPlan() != "" && len(st.byRegion) > 0 {
			c.resolved[l.ID] = resolved
		}
		c.forgetShareTenant(l.ID)
	}()
	if l.IsConcurrency() {
		return c.acquireSlots(now, region, hk, l, st, r)
	}
	c.observeBucket(now, l, hk, holderCounts{admitted: r.Admitted, wd: r.WouldDeny, wdc: r.WouldDenyChecks})
	var othersRate, othersBurst int64
	for other := range st.byRegion {
		if other != hk {
			r, b := st.held(other, now)
			othersRate, othersBurst = othersRate+r, othersBurst+b
		}
	}
	rate, burst := lease.SizeShare(lease.ShareRequest{
		Rate:        l.Rate * lease.MilliTokens,
		Burst:       l.Burst,
		Region:      region,
		Demands:     c.reported(now, l),
		OthersRate:  othersRate,
		OthersBurst: othersBurst,
	})
	if rate == 0 && burst == 0 {
		return ShareDecision{}
	}
	g := newShareGrant(now, region, hk, l, st, r)
	g.Rate, g.Burst, g.PeriodMs, g.LimitRate, g.LimitBurst = rate, burst, l.RatePeriod.Milliseconds(), l.Rate, l.Burst
	st.byRegion[hk] = append(st.byRegion[hk], g)
	c.shareReq[rk] = g
	return ShareDecision{Grant: g, New: true}
}

// newShareGrant is a share of l for holder hk of region, the next in its
// seq, granted at now for the limit's share ttl; the caller sets what it
// shares (a rate and burst, or slots).
func newShareGrant(now time.Time, region, hk string, l *Limit, st *shareState, r ShareAcquire) *ShareGrant {
	st.seq[hk]++
	return &ShareGrant{
		ShareID:      ShareID(region, r.RequestID),
		Limit:        l.ID,
		Region:       region,
		Holder:       r.Holder,
		RequestID:    r.RequestID,
		Seq:          st.seq[hk],
		LimitVersion: l.Version,
		GrantedAt:    now.UnixNano(),
		ExpiresAt:    now.Add(shareTTL(l)).UnixNano(),
	}
}

// acquireSlots sizes a concurrency limit's slot share (lease.SizeSlots):
// at every instant, over the shares that may still be in force, each
// holder counted at the largest of its unexpired shares, the slots add up
// to at most N.
func (c *Core) acquireSlots(now time.Time, region, hk string, l *Limit, st *shareState, r ShareAcquire) ShareDecision {
	var others int64
	for other := range st.byRegion {
		if other != hk {
			others += st.heldSlots(other, now)
		}
	}
	n, admit := lease.SizeSlots(lease.SlotRequest{N: l.Tokens, Region: region, Demands: c.reported(now, l),
		Held: r.HeldSlots, Others: others})
	if n == 0 {
		return ShareDecision{}
	}
	g := newShareGrant(now, region, hk, l, st, r)
	g.Slots, g.Admit, g.Held, g.LimitN = n, admit, max(r.HeldSlots, 0), l.Tokens
	st.byRegion[hk] = append(st.byRegion[hk], g)
	c.shareReq[requestKey{region, r.RequestID}] = g
	c.heldMax[l.ID] = max(c.heldMax[l.ID], c.HeldSlots(l.ID, now))
	c.boundMax[l.ID] = max(c.boundMax[l.ID], slotBoundNow(l, st, now))
	return ShareDecision{Grant: g, New: true}
}

// HeldSlots returns the slots of a concurrency limit held at now as its
// holders last said: each holder with a share in force counted at what
// it reported with its latest share (a report is up to half a share's
// life old).
func (c *Core) HeldSlots(limit string, now time.Time) (n int64) {
	st := c.shares[limit]
	if st == nil {
		return 0
	}
	for _, gs := range st.byRegion {
		if len(gs) > 0 && gs[len(gs)-1].inForce(now) {
			n += gs[len(gs)-1].Held
		}
	}
	return n
}

// HeldSlotsMax returns the most slots of a concurrency limit its holders
// reported held together since this leader started (HeldSlots at each
// grant).
func (c *Core) HeldSlotsMax(limit string) int64 { return c.heldMax[limit] }

// RestoreShare adds a committed share while rebuilding from etcd.
func (c *Core) RestoreShare(g *ShareGrant) {
	st := c.shareState(g.Limit)
	hk := g.holderKey()
	st.byRegion[hk] = append(st.byRegion[hk], g)
	slices.SortFunc(st.byRegion[hk], func(a, b *ShareGrant) int { return cmp.Compare(a.Seq, b.Seq) })
	st.seq[hk] = max(st.seq[hk], g.Seq)
	c.shareReq[requestKey{g.Region, g.RequestID}] = g
}

// ExpiredShares lists the shares that expired at least grace before now,
// oldest first per limit and region; their records may be removed.
func (c *Core) ExpiredShares(now time.Time, grace time.Duration) []*ShareGrant {
	var out []*ShareGrant
	cut := now.Add(-grace).UnixNano()
	for _, st := range c.shares {
		for _, gs := range st.byRegion {
			for _, g := range gs {
				if g.ExpiresAt <= cut {
					out = append(out, g)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b *ShareGrant) int {
		if c := strings.Compare(a.Limit, b.Limit); c != 0 {
			return c
		}
		if c := strings.Compare(a.Region, b.Region); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	return out
}

// ForgetShare drops an expired share and its request id. The region's seq
// is kept, so its next share still follows; a request id retried after
// this gets a new share: retries must come within the grace.
func (c *Core) ForgetShare(g *ShareGrant) {
	st := c.shares[g.Limit]
	if st == nil {
		return
	}
	hk := g.holderKey()
	st.byRegion[hk] = slices.DeleteFunc(st.byRegion[hk], func(x *ShareGrant) bool { return x == g })
	if len(st.byRegion[hk]) == 0 {
		delete(st.byRegion, hk)
	}
	rk := requestKey{g.Region, g.RequestID}
	if c.shareReq[rk] == g {
		delete(c.shareReq, rk)
	}
	c.forgetShareTenant(g.Limit)
}

// SharesKept reports whether the core keeps any share state of limit:
// shares or the holders' seq (with them the regions' demand reports),
// reporting intervals, the most slots held, or a cached resolution from
// a plan (for tests and the plans' memory claims: a tenant of a plan
// costs nothing once idle).
func (c *Core) SharesKept(limit string) bool {
	_, resolved := c.resolved[limit]
	_, heldMax := c.heldMax[limit]
	return c.shares[limit] != nil || c.bucketUse[limit] != nil || heldMax || resolved && c.windowless(limit)
}

// windowless reports whether the cached resolution of id is a bucket or
// concurrency limit.
func (c *Core) windowless(id string) bool {
	l, ok := c.resolved[id]
	return ok && l.Windowless()
}

// forgetShareTenant forgets everything the core keeps of a bucket or
// concurrency limit with no record of its own (a tenant of a plan, or a
// limit deleted) once none of its shares is kept: the holders' seq, the
// reporting intervals, the most slots held, the demand reports and the
// cached resolution. Otherwise every tenant that ever used a bucket or
// concurrency plan would cost memory for good. Its next share starts at
// seq 1 again, which is safe: a share is forgotten only the retention
// after its ExpiresAt, and no holder spends a share past its deadline,
// which is never after ExpiresAt (docs/design.md, "Plans": forgetting a
// tenant's shares). A limit with a record keeps its state (its seq and
// its intervals) as before plans.
func (c *Core) forgetShareTenant(id string) {
	if _, own := c.limits[id]; own {
		return
	}
	if st := c.shares[id]; st != nil && len(st.byRegion) > 0 {
		return
	}
	delete(c.heldMax, id)
	delete(c.boundMax, id)
	delete(c.bucketUse, id)
	delete(c.resolved, id) // a share limit has no windows: nothing else uses it
	if st := c.shares[id]; st != nil {
		for _, region := range st.asked {
			delete(c.demand, demandKey{id, region})
		}
	}
	delete(c.shares, id)
}

// ToProto renders a share as the agent receives it at now: expires_in is
// measured from now, so a replay a little later does not extend it.
func (g *ShareGrant) ToProto(now time.Time) *pb.RateShare {
	return &pb.RateShare{
		ShareId:         g.ShareID,
		LimitId:         g.Limit,
		Region:          g.Region,
		Seq:             g.Seq,
		RateMilliTokens: g.Rate,
		RatePeriod:      durpb(time.Duration(g.PeriodMs) * time.Millisecond),
		BurstTokens:     g.Burst,
		ExpiresIn:       durpb(max(0, time.Duration(g.ExpiresAt-now.UnixNano()))),
		RequestId:       g.RequestID,
		LimitVersion:    g.LimitVersion,
		Slots:           g.Slots,
		AdmitSlots:      g.Admit,
	}
}
