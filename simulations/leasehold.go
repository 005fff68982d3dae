package simulations

import (
	"slices"
	"strconv"
	"time"

	"leasehold/allocator"
	"leasehold/lease"
	"leasehold/overshoot"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
)

// Parameters of the simulated allocator node. (The agent's settings are
// the agent core's defaults; the shell's own parameters are in agent.go.)
const (
	takeover   = 5 * time.Second // etcd session TTL: a follower takes over
	grantsKeep = time.Minute     // grant retention after a window
)

// leasehold runs the real allocator core in the home region and, in every
// region, an agent: the real agent core in a simulated shell (agent.go)
// with its region's in-memory bucket.
type leasehold struct {
	w      *world
	alloc  *allocNode
	agents []*agent
	limits []*allocator.Limit
	byID   map[string]int
}

func newLeasehold(w *world) *leasehold {
	lh := &leasehold{w: w, byID: map[string]int{}}
	regions := make([]string, len(w.sc.Regions))
	for i, r := range w.sc.Regions {
		regions[i] = r.Name
	}
	slices.Sort(regions)
	for i, ls := range w.sc.Limits {
		l := &allocator.Limit{ID: ls.ID, Tokens: ls.G, Window: w.sc.Window, Regions: regions,
			TTL: ls.TTL, MinChunk: ls.MinChunk, MaxChunk: ls.MaxChunk, Version: 1}
		if ls.IsBucket() {
			l.Tokens, l.Window, l.MinChunk, l.MaxChunk = 0, 0, 0, 0
			l.Kind, l.Rate, l.RatePeriod, l.Burst = pb.LimitKind_LIMIT_KIND_BUCKET, ls.Rate, ls.RatePeriod, ls.Burst
		}
		lh.limits = append(lh.limits, l)
		lh.byID[ls.ID] = i
	}
	lh.alloc = newAllocNode(lh)
	for i := range w.sc.Regions {
		lh.agents = append(lh.agents, newAgent(lh, i))
	}
	return lh
}

func (lh *leasehold) start() {
	lh.alloc.start()
	for _, a := range lh.agents {
		a.start()
	}
}

func (lh *leasehold) check(region, limit int, _ time.Duration, done func(outcome, time.Duration)) {
	lh.agents[region].check(limit, done)
}

func (lh *leasehold) fault(f Fault, begin bool) {
	switch f.Kind {
	case AllocatorFailover:
		if begin {
			lh.alloc.die()
		} else {
			lh.alloc.rebuild()
		}
	case RegionLoss:
		lh.agents[f.Region].up = false
	case Partition:
		if a := lh.agents[f.Region]; begin && a.heldAtCut < 0 {
			a.heldAtCut = a.held(lh.w.sc.Series)
		}
	}
}

func (lh *leasehold) finish(r *Result) {
	sc := lh.w.sc
	rec := lh.w.rec
	r.AllocCallsPerSec = float64(lh.alloc.calls) / sc.Duration().Seconds()
	r.BoundNote = "overshoot.Compute per window"
	for li := range sc.Limits {
		if sc.Limits[li].IsBucket() {
			continue // no windows: RunKinds measures bucket limits
		}
		g := sc.Limits[li].G
		for wi := range sc.Windows {
			led := lh.alloc.ledger[ledgerKey{li, rec.base + int64(wi)}]
			var granted, returned int64
			if led != nil {
				granted, returned = led.granted, led.credited
			}
			ow := rec.overshootWindow(li, wi, granted, returned)
			b := overshoot.Compute(ow)
			if b.Infinite {
				r.BoundInfinite = true
			} else {
				r.Bound = max(r.Bound, b.Total)
			}
			if !b.Covers(overshoot.Observed(ow)) {
				r.BoundViolations++
			}
			r.LeaseStrandedG = max(r.LeaseStrandedG, float64(overshoot.Stranded(ow))/float64(g))
		}
	}
	var late, undeposited int64
	for _, a := range lh.agents {
		late += a.lateSpends
		undeposited += a.undeposited
	}
	r.LateSpends = late
	if late > 0 {
		r.Notes = append(r.Notes, "spends outside their lease's window: "+strconv.FormatInt(late, 10))
	}
	if lh.alloc.failovers > 0 {
		r.Notes = append(r.Notes, "allocator failovers: "+strconv.Itoa(lh.alloc.failovers)+
			", grants lost uncommitted: "+strconv.FormatInt(lh.alloc.lostUncommitted, 10))
	}
	for _, a := range lh.agents {
		if a.heldAtCut >= 0 {
			r.Notes = append(r.Notes, "tokens "+a.name+" held when cut off: "+strconv.FormatInt(a.heldAtCut, 10))
		}
	}
	if undeposited > 0 {
		r.Notes = append(r.Notes, "leases returned undeposited: "+strconv.FormatInt(undeposited, 10))
	}
}

// ---- allocator ----

type ledgerKey struct {
	limit  int
	window int64
}

type ledgerEntry struct{ granted, credited int64 }

// allocNode is the allocator leader: the real Core, with etcd played as "a
// commit takes sc.Commit". A grant is answered only once committed; a
// failover loses what was not committed, and the next leader rebuilds a
// Core from the committed records.
type allocNode struct {
	lh        *leasehold
	core      *allocator.Core
	term      int
	commitAt  map[string]time.Duration              // lease id -> commit instant, this term
	committed map[int64]map[string]*allocator.Grant // etcd: window -> lease id -> record
	shares    map[string]*allocator.ShareGrant      // etcd: share id -> record
	ledger    map[ledgerKey]*ledgerEntry            // committed granted / credited per (limit, window)
	calls     int64
	failovers int
	// lostUncommitted counts grants decided but not committed when the
	// leader died (never answered, so never spent).
	lostUncommitted int64
}

func newAllocNode(lh *leasehold) *allocNode {
	a := &allocNode{lh: lh, committed: map[int64]map[string]*allocator.Grant{}, ledger: map[ledgerKey]*ledgerEntry{},
		shares: map[string]*allocator.ShareGrant{}}
	a.core = a.newCore()
	a.commitAt = map[string]time.Duration{}
	return a
}

func (a *allocNode) newCore() *allocator.Core {
	c := allocator.NewCore()
	for _, l := range a.lh.limits {
		c.SetLimit(l)
	}
	return c
}

func (a *allocNode) start() {
	w := a.lh.w
	var gc func()
	gc = func() {
		if w.allocUp {
			now := w.sc.Home.At(w.eng.Now())
			for _, k := range a.core.Expired(now, grantsKeep) {
				a.core.Forget(k)
			}
			cur := lease.WindowOf(now, w.sc.Window).Index
			for win := range a.committed {
				if win < cur-2 {
					delete(a.committed, win)
				}
			}
		}
		w.eng.After(30*time.Second, gc)
	}
	w.eng.After(30*time.Second, gc)
}

func (a *allocNode) die() {
	a.term++
	for id, at := range a.commitAt {
		if at > a.lh.w.eng.Now() {
			a.lostUncommitted++
			_ = id
		}
	}
	a.commitAt = map[string]time.Duration{}
	a.failovers++
}

// rebuild is the new leader loading every committed grant.
func (a *allocNode) rebuild() {
	a.core = a.newCore()
	wins := make([]int64, 0, len(a.committed))
	for win := range a.committed {
		wins = append(wins, win)
	}
	slices.Sort(wins)
	for _, win := range wins {
		ids := make([]string, 0, len(a.committed[win]))
		for id := range a.committed[win] {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			g := *a.committed[win][id]
			a.core.Restore(&g)
		}
	}
	ids := make([]string, 0, len(a.shares))
	for id := range a.shares {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		g := *a.shares[id]
		a.core.RestoreShare(&g)
	}
}

// acquireShares handles one AcquireShares call from region as the
// allocator's server does: every request decided in order, the new shares
// committed together (sc.Commit), replays answered once their share is
// committed, every share rendered at the answer's instant.
func (a *allocNode) acquireShares(region string, reqs []allocator.ShareAcquire, reply func([]core.ShareReply)) {
	w := a.lh.w
	t := w.eng.Now()
	now := w.sc.Home.At(t)
	decs := make([]allocator.ShareDecision, len(reqs))
	var fresh []*allocator.ShareGrant
	at := t
	for i, r := range reqs {
		d := a.core.AcquireShare(now, region, r)
		decs[i] = d
		switch {
		case d.New:
			a.commitAt[d.Grant.ShareID] = t + w.sc.Commit
			fresh = append(fresh, d.Grant)
			at = max(at, t+w.sc.Commit)
		case d.Replayed:
			at = max(at, a.commitAt[d.Grant.ShareID])
		}
	}
	term := a.term
	w.eng.At(at, func() {
		if term != a.term {
			return // the leader died before the commit
		}
		for _, g := range fresh {
			c := *g
			a.shares[g.ShareID] = &c
		}
		now := w.sc.Home.At(w.eng.Now())
		out := make([]core.ShareReply, len(decs))
		for i, d := range decs {
			out[i] = ShareReplyOf(now, d)
		}
		reply(out)
	})
}

// ShareReplyOf is the answer to one share request as AcquireShares puts
// it on the wire at now (ShareGrant.ToProto), in the agent core's terms.
func ShareReplyOf(now time.Time, d allocator.ShareDecision) core.ShareReply {
	if d.Code != pb.ItemCode_ITEM_CODE_OK {
		return core.ShareReply{Message: d.Code.String() + ": " + d.Message}
	}
	if d.Grant == nil {
		return core.ShareReply{OK: true}
	}
	s := d.Grant.ToProto(now)
	return core.ShareReply{OK: true, Seq: s.Seq, Rate: s.RateMilliTokens, Burst: s.BurstTokens, ExpiresIn: s.ExpiresIn.AsDuration()}
}

// persist records g as committed (etcd).
func (a *allocNode) persist(g *allocator.Grant) {
	m := a.committed[g.Window]
	if m == nil {
		m = map[string]*allocator.Grant{}
		a.committed[g.Window] = m
	}
	prev := m[g.LeaseID]
	c := *g
	m[g.LeaseID] = &c
	li := a.lh.byID[g.Limit]
	k := ledgerKey{li, g.Window}
	e := a.ledger[k]
	if e == nil {
		e = &ledgerEntry{}
		a.ledger[k] = e
	}
	if prev == nil {
		e.granted += g.Tokens
	}
	if g.Returned && (prev == nil || !prev.Returned) {
		e.credited += g.Credited
	}
}

// acquire handles one AcquireLeases call from region as the allocator's
// server does: every request is decided in order, the new grants are
// committed together (one etcd transaction, sc.Commit), replays wait for
// their grant's commit, and then the call is answered, every lease
// rendered at that instant. A leader that dies before then never answers.
func (a *allocNode) acquire(region string, reqs []allocator.AcquireRequest, reply func([]core.Grant)) {
	w := a.lh.w
	t := w.eng.Now()
	now := w.sc.Home.At(t)
	decs := make([]allocator.Decision, len(reqs))
	var fresh []*allocator.Grant
	at := t
	for i, r := range reqs {
		d := a.core.Acquire(now, region, r)
		decs[i] = d
		switch {
		case d.New:
			a.commitAt[d.Grant.LeaseID] = t + w.sc.Commit
			fresh = append(fresh, d.Grant)
			at = max(at, t+w.sc.Commit)
		case d.Replayed:
			at = max(at, a.commitAt[d.Grant.LeaseID])
		}
	}
	term := a.term
	w.eng.At(at, func() {
		if term != a.term {
			return // the leader died before the commit
		}
		for _, g := range fresh {
			a.persist(g)
		}
		now := w.sc.Home.At(w.eng.Now())
		gs := make([]core.Grant, len(decs))
		for i, d := range decs {
			gs[i] = GrantOf(now, region, reqs[i], d)
		}
		reply(gs)
	})
}

// GrantOf is the answer to one request as AcquireLeases puts it on the
// wire at now (allocator clock: Grant.ToProto, Decision.EmptyLease), in the
// agent core's terms: an empty answer says which window it was for, what
// its pool holds, and whether only the region's share of it is spent. The
// protocol explorer (simulations/explore) answers with it too.
func GrantOf(now time.Time, region string, r allocator.AcquireRequest, d allocator.Decision) core.Grant {
	if d.Code != pb.ItemCode_ITEM_CODE_OK {
		return core.Grant{Message: d.Code.String() + ": " + d.Message}
	}
	var ls *pb.Lease
	switch {
	case d.Grant != nil:
		ls = d.Grant.ToProto(now)
	case d.Window.Length > 0:
		ls = d.EmptyLease(now, r.Limit, region, r.RequestID)
	default:
		return core.Grant{OK: true, Replayed: d.Replayed}
	}
	return core.Grant{OK: true, LeaseID: ls.LeaseId, Tokens: ls.Tokens, Window: ls.WindowIndex,
		WindowLen: ls.Window.AsDuration(), WindowPhase: ls.WindowPhase.AsDuration(), StartsIn: ls.StartsIn.AsDuration(), ExpiresIn: ls.ExpiresIn.AsDuration(),
		WindowLeft: ls.WindowLeft.AsDuration(), PoolLeft: ls.PoolLeft, ShareSpent: ls.ShareSpent, Replayed: d.Replayed}
}

// giveBack handles one ReturnLeases call: every return is decided, the
// changed records are committed together, then the call is answered.
func (a *allocNode) giveBack(region string, rs []allocator.ReturnRequest, reply func()) {
	w := a.lh.w
	t := w.eng.Now()
	var changed []*allocator.Grant
	for _, r := range rs {
		d, err := a.core.Return(w.sc.Home.At(t), region, r)
		if err == nil && d.Grant != nil {
			changed = append(changed, d.Grant)
		}
	}
	if len(changed) == 0 {
		reply()
		return
	}
	term := a.term
	w.eng.At(t+w.sc.Commit, func() {
		if term != a.term {
			return
		}
		for _, g := range changed {
			a.persist(g)
			a.core.Credit(g)
		}
		reply()
	})
}
