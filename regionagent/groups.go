package regionagent

import (
	"context"
	"errors"
	"fmt"
	"leasehold/lease"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"leasehold/internal/groupmap"
	"leasehold/internal/planbind"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
)

// Allocator groups. When the allocators are several groups, each the
// authority for a share of the limits (package internal/groupmap), the
// allocator the agent is configured with (any replica of any group) sends
// the group map with its limit sync. From then on the agent syncs the
// limits of every group and merges them, and sends each lease request,
// return and usage report to the group that owns the (limit, window) it is
// for: the owner of a window is a function of the window's start, so
// every window is asked of one group. A group that answers WRONG_GROUP
// names the owner (the agent's map or its estimate of the allocator's
// clock was behind); the request is sent there once more, unchanged. A
// group that is down fails only its own limits' requests (their fail
// modes apply, limit by limit, as when one request fails); the core hears
// that the allocator is down only when every group is.
//
// Without a map (one allocator group, the default) nothing here is used.

// groupRoutes is the agent's view of the allocator groups. Safe for
// concurrent use.
type groupRoutes struct {
	dial   func(group string, addrs []string) *allocClient
	health func(anyUp bool) // told when it changes

	mu      sync.Mutex // protects the fields below
	m       groupmap.Map
	rev     int64
	clients map[string]*allocClient // by group
	addrs   map[string][]string     // the addresses each client dials
	down    map[string]bool         // groups whose breaker opened
	syncs   map[string]*groupSync   // by group
	queues  map[string]*groupQueues // by group
	anyUp   bool
}

// groupQueues batch one group's allocator calls on their own, so a group
// that is slow or down (its calls retried for seconds) never holds up the
// calls of another group.
type groupQueues struct {
	acquires batcher[core.Acquire]
	returns  batcher[core.Return]
	shares   batcher[core.ShareAcquire]
}

// groupSync is what the agent holds of one group's limits.
type groupSync struct {
	rev    int64          // the group's revision of its limits
	limits []*pb.Limit    // from its last complete answer
	tok    core.SyncToken // the sync start of its last answer
	taken  time.Time      // the group allocator's clock then
}

func newGroupRoutes(dial func(group string, addrs []string) *allocClient, health func(anyUp bool)) *groupRoutes {
	return &groupRoutes{dial: dial, health: health, clients: map[string]*allocClient{}, addrs: map[string][]string{},
		down: map[string]bool{}, syncs: map[string]*groupSync{}, queues: map[string]*groupQueues{}, anyUp: true}
}

// active reports whether the agent routes by groups.
func (g *groupRoutes) active() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m.Versions) > 0
}

// revision is the revision of the agent's map (0: none).
func (g *groupRoutes) revision() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rev
}

// learn installs a map sent with a sync answer when it is newer than the
// agent's, and dials the groups it names. A map that does not decode is
// refused (the agent keeps its own).
func (g *groupRoutes) learn(b []byte, rev int64) error {
	if len(b) == 0 {
		return nil
	}
	m, err := groupmap.Decode(b)
	if err != nil {
		return fmt.Errorf("regionagent: the allocator sent a group map that does not decode: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if rev <= g.rev {
		return nil
	}
	g.m, g.rev = m, rev
	for _, v := range m.Versions {
		for _, gr := range v.Groups {
			if cur, ok := g.addrs[gr.Name]; ok && slices.Equal(cur, gr.Allocators) {
				continue
			}
			if old := g.clients[gr.Name]; old != nil {
				old.close()
			}
			g.clients[gr.Name] = g.dial(gr.Name, slices.Clone(gr.Allocators))
			g.addrs[gr.Name] = slices.Clone(gr.Allocators)
		}
	}
	return nil
}

// names lists every group of every version of the map, sorted: the groups
// whose limits the agent syncs.
func (g *groupRoutes) names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.namesLocked()
}

func (g *groupRoutes) namesLocked() []string {
	var out []string
	for _, v := range g.m.Versions {
		for _, gr := range v.Groups {
			out = append(out, gr.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// owner names the group that owns limit's window starting at start.
func (g *groupRoutes) owner(limit string, start time.Time) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	o, _, _ := g.m.Owner(limit, start)
	return o
}

// client returns the group's allocator client (nil for a group the map
// does not name).
func (g *groupRoutes) client(group string) *allocClient {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.clients[group]
}

// queuesOf returns the group's call queues, made on first use with the
// agent's senders for that group.
func (a *Agent) queuesOf(group string) *groupQueues {
	g := a.groups
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.queues[group]
	if q == nil {
		q = &groupQueues{}
		q.acquires.send = func(ctx context.Context, rs []core.Acquire) { a.acquireFromGroup(ctx, group, rs, true) }
		q.returns.send = func(ctx context.Context, rs []core.Return) { a.returnToGroup(ctx, group, rs) }
		q.shares.send = func(ctx context.Context, rs []core.ShareAcquire) { a.sharesOfGroup(ctx, group, rs) }
		g.queues[group] = q
	}
	return q
}

// setHealth records a group's breaker and tells the agent when no group
// answers any more, or one answers again.
func (g *groupRoutes) setHealth(group string, up bool) {
	g.mu.Lock()
	g.down[group] = !up
	anyUp := false
	for _, n := range g.namesLocked() {
		anyUp = anyUp || !g.down[n]
	}
	changed := anyUp != g.anyUp
	g.anyUp = anyUp
	g.mu.Unlock()
	if changed {
		g.health(anyUp)
	}
}

func (g *groupRoutes) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.clients {
		c.close()
	}
}

// ---- the agent's calls, routed ----

// windowStart is where a window of limit begins on the allocator's clock:
// the window index times the limit's W as the agent knows it (ok false for
// a limit it does not know).
func (a *Agent) windowStart(limit string, index int64) (time.Time, bool) {
	var w lease.Window
	a.withCore(func(c *core.Core) {
		if l, ok := c.Limit(limit); ok {
			w = l.Windows().ByIndex(index)
		}
	})
	if w.Length <= 0 {
		return time.Time{}, false
	}
	return w.Start(), true
}

// acquireStarts names the start of the window each request is for.
func (a *Agent) acquireStarts(reqs []core.Acquire) []time.Time {
	out := make([]time.Time, len(reqs))
	now := a.opt.now()
	a.withCore(func(c *core.Core) {
		for i, r := range reqs {
			l, ok := c.Limit(r.Limit)
			if !ok {
				out[i] = now // not asked for a limit the core does not know
				continue
			}
			w := c.WindowOf(now, &l)
			if r.Next {
				w = w.Next()
			}
			out[i] = w.Start()
		}
	})
	return out
}

// sendAcquiresByGroup queues each group's requests on that group's own
// queue (one call per group per batch); requests a group answers
// WRONG_GROUP are sent once more to the group it names.
func (a *Agent) sendAcquiresByGroup(_ context.Context, reqs []core.Acquire) {
	starts := a.acquireStarts(reqs)
	byGroup := map[string][]core.Acquire{}
	for i, r := range reqs {
		o := a.groups.owner(r.Limit, starts[i])
		byGroup[o] = append(byGroup[o], r)
	}
	for group, rs := range byGroup {
		a.queuesOf(group).acquires.add(a, rs)
	}
}

func (a *Agent) acquireFromGroup(ctx context.Context, group string, reqs []core.Acquire, redirect bool) {
	cl := a.groups.client(group)
	if cl == nil {
		err := fmt.Errorf("regionagent: no allocator group %q in the group map", group)
		a.notes.callFailed(a.log, "lease requests", len(reqs), err)
		a.withCore(func(c *core.Core) { c.AcquireFailed(a.opt.now(), reqs, false) })
		return
	}
	sent, recv, resp, err := a.callAcquire(ctx, cl, reqs)
	if err != nil {
		a.notes.callFailed(a.log, "lease requests (allocator group "+group+")", len(reqs), err)
		a.withCore(func(c *core.Core) { c.AcquireFailed(recv, reqs, ctx.Err() != nil) })
		return
	}
	var ok []core.Acquire
	var gs []core.Grant
	moved := map[string][]core.Acquire{}
	for i, r := range resp.Results {
		if redirect && r.Code == pb.ItemCode_ITEM_CODE_WRONG_GROUP && r.OwnerGroup != "" && r.OwnerGroup != group {
			moved[r.OwnerGroup] = append(moved[r.OwnerGroup], reqs[i])
			continue
		}
		ok = append(ok, reqs[i])
		gs = append(gs, grantOf(r))
	}
	if len(ok) > 0 {
		a.withCore(func(c *core.Core) { c.Acquired(sent, recv, ok, gs) })
	}
	for owner, rs := range moved {
		a.m.groupRedirects.Add(float64(len(rs)))
		a.acquireFromGroup(ctx, owner, rs, false)
	}
}

// sendReturnsByGroup returns each lease to the group that owns its
// window (it granted the lease), on that group's own queue.
func (a *Agent) sendReturnsByGroup(_ context.Context, rets []core.Return) {
	byGroup := map[string][]core.Return{}
	for _, r := range rets {
		group := ""
		if w, ok := core.LeaseWindow(r.LeaseID); ok {
			if start, ok := a.windowStart(r.Limit, w); ok {
				group = a.groups.owner(r.Limit, start)
			}
		}
		byGroup[group] = append(byGroup[group], r)
	}
	for group, rs := range byGroup {
		a.queuesOf(group).returns.add(a, rs)
	}
}

// returnToGroup sends returns to one group.
func (a *Agent) returnToGroup(ctx context.Context, group string, rs []core.Return) {
	cl := a.groups.client(group)
	if cl == nil {
		// A lease of a limit the agent no longer knows: the window's
		// owner cannot be named, and its unspent tokens stay with the
		// window (the allocator counts them as spent: the safe side).
		now := a.opt.now()
		a.withCore(func(c *core.Core) { c.ReturnsDone(now, rs, nil) })
		return
	}
	a.sendReturnsTo(ctx, cl, rs)
}

// reportByGroup sends usage to the groups that own the windows, one call
// per group of at most maxPerCall records; it returns the records no
// group acknowledged.
func (a *Agent) reportByGroup(ctx context.Context, reporter string, usage []*pb.Usage) (failed []*pb.Usage) {
	byGroup := map[string][]*pb.Usage{}
	for _, u := range usage {
		group := ""
		if start, ok := a.windowStart(u.LimitId, u.WindowIndex); ok {
			group = a.groups.owner(u.LimitId, start)
		}
		byGroup[group] = append(byGroup[group], u)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for group, us := range byGroup {
		cl := a.groups.client(group)
		if cl == nil {
			continue // a limit the agent no longer knows: nobody to report to
		}
		wg.Add(1)
		go func() { // concurrently: a slow group delays only its own reports
			defer wg.Done()
			if err := reportTo(ctx, cl, a.cfg.Region, reporter, us); err != nil {
				mu.Lock()
				failed = append(failed, us...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

// reportTo sends usage in calls of at most maxPerCall records.
func reportTo(ctx context.Context, cl *allocClient, region, reporter string, usage []*pb.Usage) error {
	var err error
	for off := 0; off < len(usage) && err == nil; off += maxPerCall {
		part := usage[off:min(len(usage), off+maxPerCall)]
		err = cl.call(ctx, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
			_, err := ac.ReportUsage(ctx, &pb.ReportUsageRequest{Region: region, Reporter: reporter, Usage: part}, opts...)
			return err
		})
	}
	return err
}

// syncGroups syncs every group's limits (concurrently) and hands the core
// their union. Each group's limits are kept from its last answer, so a
// group that does not answer keeps its limits known (their leases and
// fail modes go on); the core learns that a limit does not exist only
// once every group answered a sync started after the question (the sync
// token handed to it is the oldest group's).
func (a *Agent) syncGroups(ctx context.Context) error {
	names := a.groups.names()
	a.mu.Lock()
	tok := a.core.SyncStart()
	a.mu.Unlock()
	type answer struct {
		group      string
		resp       *pb.SyncLimitsResponse
		sent, recv time.Time
		err        error
	}
	answers := make([]answer, len(names))
	known := a.groups.revision()
	var wg sync.WaitGroup
	for i, group := range names {
		a.groups.mu.Lock()
		cl, prev := a.groups.clients[group], a.groups.syncs[group]
		a.groups.mu.Unlock()
		var rev int64
		if prev != nil {
			rev = prev.rev
		}
		answers[i].group = group
		if cl == nil {
			answers[i].err = errors.New("no client")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			an := &answers[i]
			an.sent = a.opt.now()
			an.err = cl.callFor(ctx, a.opt.allocTimeout, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
				var err error
				an.resp, err = ac.SyncLimits(ctx, &pb.SyncLimitsRequest{Region: a.cfg.Region, KnownRevision: rev, KnownGroupMapRevision: known}, opts...)
				return err
			})
			an.recv = a.opt.now()
		}()
	}
	wg.Wait()
	changed, answered := false, 0
	var clock *answer
	var errs []error
	for i := range answers {
		an := &answers[i]
		if an.err != nil {
			errs = append(errs, fmt.Errorf("allocator group %s: %w", an.group, an.err))
			continue
		}
		answered++
		if err := a.groups.learn(an.resp.GroupMap, an.resp.GroupMapRevision); err != nil {
			a.notes.callFailed(a.log, "group map", 1, err)
		}
		a.groups.mu.Lock()
		s := a.groups.syncs[an.group]
		if s == nil {
			s = &groupSync{}
			a.groups.syncs[an.group] = s
			changed = true
		}
		s.tok = tok
		if an.resp.AllocatorUnixNanos != 0 {
			s.taken = time.Unix(0, an.resp.AllocatorUnixNanos)
		}
		if !an.resp.Unchanged {
			s.rev, s.limits, changed = an.resp.Revision, an.resp.Limits, true
		}
		a.groups.mu.Unlock()
		if clock == nil && an.resp.AllocatorUnixNanos != 0 {
			clock = an
		}
	}
	if answered == 0 {
		return errors.Join(errs...)
	}
	merged := a.mergeGroups(names)
	perGroup, gm := a.groupPlans(names)
	a.withCore(func(c *core.Core) {
		if clock != nil {
			c.SetAllocatorClock(clock.sent, clock.recv, time.Unix(0, clock.resp.AllocatorUnixNanos))
		}
		// Each group's allocator has its own clock: a standing share is
		// spent by its window owner's.
		for _, an := range answers {
			if an.err == nil && an.resp.AllocatorUnixNanos != 0 {
				c.SetGroupClock(an.group, an.sent, an.recv, time.Unix(0, an.resp.AllocatorUnixNanos))
			}
		}
		c.SetShareGroups(merged.owners.owner)
		ls, plans := coreLimits(merged.Limits, a.cfg.Region)
		if plans != nil {
			plans = groupResolver(perGroup, gm, a.opt.now, a.cfg.Region, plans)
		}
		taken := time.Unix(0, merged.AllocatorUnixNanos)
		if changed {
			c.SetPlans(plans)
			c.SetLimits(merged.oldest, merged.Revision, ls, taken)
		} else {
			c.Synced(merged.oldest, taken)
		}
	})
	a.syncOnce.Do(func() { close(a.synced) })
	if changed {
		a.saveSnapshot(ctx, merged.SyncLimitsResponse)
	}
	if len(errs) > 0 {
		a.notes.callFailed(a.log, "limit syncs (the other groups answered)", len(errs), errors.Join(errs...))
	}
	return nil
}

// merged is the union of the groups' limits as one sync answer.
type merged struct {
	*pb.SyncLimitsResponse
	oldest core.SyncToken // the oldest group's sync token (0: a group never answered)
	owners shareOwners
}

// shareOwners says which group's allocator counts a limit's standing
// shares: from names the group each limit was taken from, m is the group
// map then.
type shareOwners struct {
	from map[string]string
	m    groupmap.Map
}

// owner names the group whose allocator counts the standing share of
// limit's window starting at start: the window's owner, ok only when the
// limit was taken from it (core.Core.SetShareGroups).
func (so shareOwners) owner(limit string, start time.Time) (string, bool) {
	o, _, _ := so.m.Owner(limit, start)
	return o, o != "" && so.from[limit] == o
}

// mergeGroups unites the groups' limits. A limit two groups hold (it is
// moving) is taken from the group that owns its window now, else the
// newest version. The revision is the sum of the groups' etcd revisions:
// it grows whenever any group's does (snapshots kept in the region compare
// by it).
func (a *Agent) mergeGroups(names []string) merged {
	a.groups.mu.Lock()
	defer a.groups.mu.Unlock()
	out := merged{SyncLimitsResponse: &pb.SyncLimitsResponse{}, owners: shareOwners{from: map[string]string{}, m: a.groups.m}}
	byID, from := map[string]*pb.Limit{}, out.owners.from
	now := a.opt.now()
	for i, n := range names {
		s := a.groups.syncs[n]
		var tok core.SyncToken
		if s != nil {
			tok = s.tok
		}
		if i == 0 || tok < out.oldest {
			out.oldest = tok
		}
		if s == nil {
			continue
		}
		out.Revision += core.EtcdRevision(s.rev)
		if s.taken.UnixNano() > out.AllocatorUnixNanos {
			out.AllocatorUnixNanos = s.taken.UnixNano()
		}
		for _, l := range s.limits {
			prev, ok := byID[l.Id]
			if !ok {
				byID[l.Id], from[l.Id] = l, n
				continue
			}
			owner, _, _ := a.groups.m.Owner(l.Id, now)
			if n == owner || (from[l.Id] != owner && l.Version > prev.Version) {
				byID[l.Id], from[l.Id] = l, n
			}
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out.Limits = append(out.Limits, byID[id])
	}
	return out
}

// groupPlans returns the plan records each group that answered a sync
// sent (every group holds every plan: docs/design.md, "Plans with
// allocator groups") and the group map.
func (a *Agent) groupPlans(names []string) (map[string][]*pb.Limit, groupmap.Map) {
	a.groups.mu.Lock()
	defer a.groups.mu.Unlock()
	out := map[string][]*pb.Limit{}
	for _, n := range names {
		s := a.groups.syncs[n]
		if s == nil {
			continue
		}
		pls := []*pb.Limit{}
		for _, l := range s.limits {
			if planbind.IsPlan(l.Id) {
				pls = append(pls, l)
			}
		}
		out[n] = pls
	}
	return out, a.groups.m
}

// groupResolver resolves a tenant with the plans of the group that owns
// it, which is the group that grants it: so the agent enforces the plan's
// version that group's allocator grants by, even while a plan change has
// reached some groups and not others. A tenant whose group has not
// answered a sync yet is resolved from the merged snapshot (fallback);
// one whose group answered without a plan binding it is unknown.
func groupResolver(per map[string][]*pb.Limit, m groupmap.Map, now func() time.Time, region string, fallback core.Resolver) core.Resolver {
	if len(m.Versions) == 0 {
		return fallback
	}
	rs := make(map[string]core.Resolver, len(per))
	for g, pls := range per {
		if _, r := coreLimits(pls, region); r != nil {
			rs[g] = r
		}
	}
	return func(id string) (core.Limit, bool) {
		g, _, ok := m.Owner(id, now())
		if !ok {
			return fallback(id)
		}
		if r, ok := rs[g]; ok {
			return r(id)
		}
		if _, answered := per[g]; answered {
			return core.Limit{}, false
		}
		return fallback(id)
	}
}
