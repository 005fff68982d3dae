package allocator

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Plans (docs/plans.md). A plan is a limit record "plans/<name>" whose
// binds name the ids it defines ("tenant/{id}"). The core resolves such
// an id on its first grant, with the same pure function the agents use
// (planbind), and keeps nothing for an id that was never used: the state
// of a tenant is the state of its windows, kept and forgotten as any
// limit's (retention). An explicit limit record of the id wins over its
// plan.

// plansChanged rebuilds the binding table after a plan changed and drops
// the cached resolutions: the next use resolves from the new plan.
func (c *Core) plansChanged() {
	var plans []*Limit
	for id, l := range c.limits {
		if planbind.IsPlan(id) {
			plans = append(plans, l)
		}
	}
	protos := make([]*pb.Limit, len(plans))
	for i, l := range plans {
		protos[i] = l.Proto
	}
	c.bind = planbind.NewTable(protos)
	clear(c.resolved)
}

// limit returns the limit of id: its record, or the one the plan that
// binds id gives it. A plan's record is not a limit.
func (c *Core) limit(id string) (*Limit, bool) {
	if l, ok := c.limits[id]; ok {
		if planbind.IsPlan(id) {
			return nil, false
		}
		return l, true
	}
	if l, ok := c.resolved[id]; ok {
		return l, true
	}
	pid, ok := c.bind.Match(id)
	if !ok {
		return nil, false
	}
	p, ok := c.limits[pid]
	if !ok {
		return nil, false
	}
	return decodeLimit(planbind.Resolve(p.Proto, id)), true
}

// use is limit for a grant: a resolved limit is kept while its windows
// are (Forget drops it), so that a busy tenant is resolved once.
func (c *Core) use(id string) (*Limit, bool) {
	l, ok := c.limit(id)
	if ok && l.Proto.GetPlan() != "" {
		c.resolved[id] = l
	}
	return l, ok
}

// eachLimit calls fn for every limit with a record (plans excepted) and
// every id resolved from a plan that has windows or summaries kept: the
// used tenants of plans, never every id a plan could bind.
func (c *Core) eachLimit(fn func(id string, l *Limit)) {
	for id, l := range c.limits {
		if !planbind.IsPlan(id) {
			fn(id, l)
		}
	}
	if c.bind.Len() == 0 {
		return
	}
	seen := map[string]bool{}
	visit := func(id string) {
		if _, explicit := c.limits[id]; explicit || seen[id] {
			return
		}
		seen[id] = true
		if l, ok := c.limit(id); ok {
			fn(id, l)
		}
	}
	for k := range c.windows {
		visit(k.limit)
	}
	for id := range c.summaries {
		visit(id)
	}
	for id := range c.shares {
		visit(id) // tenants of bucket and concurrency plans with shares kept
	}
}

// overriddenNow is the version of limit id in force now when it is an
// override (ListWindowsResponse.overridden): its record's, or for a
// tenant of a plan the plan's resolved for it; nil without an override
// in force, or when this allocator does not lead.
func (a *Allocator) overriddenNow(id string) (out *pb.Limit) {
	_ = a.View(func(now time.Time, c *Core) {
		if l, ok := c.limit(id); ok && l.After != nil && now.Before(l.OverrideEnds) {
			out = cloneLimit(l.Proto)
		}
	})
	return out
}

// planOf names the plan the leader resolves id from ("" for a limit
// with a record of its own, or when this allocator does not lead).
func (a *Allocator) planOf(id string) (plan string) {
	_ = a.View(func(_ time.Time, c *Core) {
		if l, ok := c.limit(id); ok {
			plan = l.Proto.GetPlan()
		}
	})
	return plan
}

// Resolved counts the limits the core keeps resolved from plans (for
// tests and the plans' memory claims: used tenants only).
func (c *Core) Resolved() int { return len(c.resolved) }

// maxPlans bounds the plan records one allocator keeps (each is synced
// to every agent of its regions).
const maxPlans = 1000

// checkPlanChanges refuses what this version of plans does not carry end
// to end, naming the field, and a pattern another plan binds already
// (two plans for one id would be ambiguous). Plans are few: the stored
// ones are read from etcd, not from the core, which learns of a plan
// written a moment ago only through the watch.
func (a *Allocator) checkPlanChanges(ctx context.Context, cs *changeSet) (*changeItem, error) {
	var plans []*changeItem
	for i := range cs.items {
		if planbind.IsPlan(cs.items[i].id()) {
			plans = append(plans, &cs.items[i])
		}
	}
	if len(plans) == 0 {
		return nil, nil
	}
	it := plans[0]
	stored, err := a.storedPlans(ctx)
	if err != nil {
		return nil, err
	}
	changed := map[string]bool{}
	for _, p := range plans {
		changed[p.id()] = true
	}
	bound := map[string]string{} // prefix -> plan id, of plans this change leaves alone
	for _, p := range stored {
		if changed[p.Id] {
			continue
		}
		for _, b := range p.Binds {
			if key, _, err := planbind.ParseBind(b); err == nil {
				bound[key] = p.Id
			}
		}
	}
	if len(stored)+len(plans) > maxPlans {
		return it, fieldErr(it.field, "at most %d plans", maxPlans)
	}
	for _, p := range plans {
		if p.deleting {
			continue
		}
		for i, b := range p.valid.Binds {
			key, _, _ := planbind.ParseBind(b) // valid: limitspec checked it
			if other, ok := bound[key]; ok {
				return p, fieldErr(fmt.Sprintf("%s.binds[%d]", p.field, i), "%q is bound to %s already: one plan per pattern or tenant (unbind it there first)", b, other)
			}
			bound[key] = p.id()
		}
	}
	return nil, nil
}

// storedPlans reads the plan records.
func (a *Allocator) storedPlans(ctx context.Context) ([]*pb.Limit, error) {
	var out []*pb.Limit
	token := ""
	for {
		page, next, err := a.store.ListLimits(ctx, planbind.Namespace, maxPlans, token)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" || len(out) > 10*maxPlans {
			return out, nil
		}
		token = next
	}
}

// maxDenyingShown bounds ChangeEffect.plan_tenants_denying.
const maxDenyingShown = 100

// planEffect fills a plan change's effect on its tenants (a dry run):
// how many used the plan in the windows kept, and which of them admitted
// more in their last window (the last closed one, else the running one)
// than the new G, or all of them for a delete. A tenant with a limit of
// its own is not on the plan.
func (c *Core) planEffect(now time.Time, e *pb.ChangeEffect, plan string, next *pb.Limit, deleting bool) {
	type tenant struct {
		id       string
		admitted int64
	}
	var denying []tenant
	counted := map[string]bool{}
	c.eachLimit(func(id string, l *Limit) {
		if l.Proto.GetPlan() != plan {
			return
		}
		counted[id] = true
		e.PlanTenants++
		if l.Windowless() {
			if admitted, over := c.shareTenantOver(now, id, next, deleting); over {
				denying = append(denying, tenant{id, admitted})
			}
			return
		}
		cur := l.At(now).Windows().Of(now).Index
		rep, ok := c.report(now, id, cur-1)
		if !ok {
			rep, ok = c.report(now, id, cur)
		}
		var admitted int64
		if ok {
			admitted = rep.AdmittedTotal
		}
		if deleting || next != nil && admitted > tenantG(next, id) {
			denying = append(denying, tenant{id, admitted})
		}
	})
	slices.SortFunc(denying, func(a, b tenant) int {
		if a.admitted != b.admitted {
			return cmp.Compare(b.admitted, a.admitted)
		}
		return strings.Compare(a.id, b.id)
	})
	// Tenants the plan names (its mapping, as changed) are on it, used
	// or not.
	mapped := c.bind.Mapped(plan)
	if next != nil {
		mapped = mapped[:0]
		for _, b := range next.Binds {
			if key, exact, err := planbind.ParseBind(b); err == nil && exact {
				mapped = append(mapped, key)
			}
		}
		for id := range next.Contracts {
			if !slices.Contains(mapped, id) {
				mapped = append(mapped, id) // a tenant with a contract is on the plan
			}
		}
	}
	for _, id := range mapped {
		if _, explicit := c.limits[id]; explicit || counted[id] {
			continue
		}
		if c.owner != nil {
			if _, owned := c.owner(id, now); !owned {
				continue // another group's tenant: that group counts it (quotactl sums the groups)
			}
		}
		e.PlanTenants++
		if deleting {
			denying = append(denying, tenant{id, 0})
		}
	}
	e.PlanTenantsDenyingCount = int64(len(denying))
	for _, d := range denying[:min(len(denying), maxDenyingShown)] {
		e.PlanTenantsDenying = append(e.PlanTenantsDenying, d.id)
	}
}

// shareTenantOver says whether a tenant of a bucket or concurrency plan
// would start being refused under next (nil: deleted, every tenant is):
// a bucket tenant whose last closed reporting interval (else the running
// one) admitted more than next allows in an interval of that length
// (its B + R x the interval, lease.BucketBound), a concurrency tenant
// whose holders reported more slots held now than next's N. It returns
// what was admitted (or held), for the order of the list.
func (c *Core) shareTenantOver(now time.Time, id string, next *pb.Limit, deleting bool) (int64, bool) {
	var used, allowed int64
	if next != nil {
		r := decodeLimit(planbind.Resolve(next, id))
		switch {
		case r.IsConcurrency():
			used, allowed = c.HeldSlots(id, now), r.Tokens
		case r.IsBucket():
			rep, ok := c.BucketReport(id, now)
			if !ok {
				if reps := c.BucketReports(id, now, 1); len(reps) == 1 {
					rep = reps[0]
				}
			}
			used, allowed = rep.Admitted, lease.BucketBound(r.Rate, r.RatePeriod, r.Burst, BucketInterval, 0)
		}
	}
	return used, deleting || next != nil && used > allowed
}

// IdleTenants returns the ids with no record of their own (tenants of
// plans, and limits deleted since) with no window in progress and whose
// newest kept window ended keep of its windows ago or more: their
// summaries are dropped, so that the allocator keeps what such an id used
// for as long as reports show (keep windows), not for every tenant that
// ever used a plan or every limit ever deleted. A limit with a record
// keeps its last windows however long it is idle, as before plans.
func (c *Core) IdleTenants(now time.Time, keep int) []string {
	live := map[string]bool{}
	for k := range c.windows {
		live[k.limit] = true
	}
	var out []string
	for id, ss := range c.summaries {
		if _, explicit := c.limits[id]; explicit || live[id] || len(ss) == 0 {
			continue
		}
		last := ss[len(ss)-1]
		w := schedOf(last.WindowMs, last.PhaseMs, last.Cal).ByIndex(last.Window)
		if !now.Before(w.End().Add(time.Duration(keep) * w.Length)) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// summaryWindows returns the windows of id's kept summaries.
func (c *Core) summaryWindows(id string) []int64 {
	var out []int64
	for _, s := range c.summaries[id] {
		out = append(out, s.Window)
	}
	return out
}

// DropSummaries forgets id's summaries (IdleTenants).
func (c *Core) DropSummaries(id string) { delete(c.summaries, id) }

// ForgetDemand forgets the demand reports of ids (idle tenants of plans,
// IdleTenants): stale for sizing long since (demandTTL), they would
// otherwise stay for every tenant that ever used a plan. One pass over
// the reports for the whole batch.
func (c *Core) ForgetDemand(ids []string) {
	if len(ids) == 0 {
		return
	}
	drop := make(map[string]bool, len(ids))
	for _, id := range ids {
		drop[id] = true
	}
	for k := range c.demand {
		if drop[k.limit] {
			delete(c.demand, k)
		}
	}
}

// tenantG is G of tenant id under plan p: its contract's, else the plan's.
func tenantG(p *pb.Limit, id string) int64 {
	if c := p.Contracts[id]; c.GetLimitTokens() > 0 {
		return c.LimitTokens
	}
	return p.LimitTokens
}

// checkPlanOverride refuses an override of a plan (next over after, the
// version it returns to) that would change what an override may not
// change for any tenant: which ids the plan binds (the binding table is
// built from the stored record, which keeps the override's binds until
// its end is written), and each tenant's window and regions, its
// contract's included (a tenant's window that changes length and back
// inside one of its windows has no meaning, as for a limit).
func checkPlanOverride(field string, after, next *pb.Limit) error {
	if !slices.Equal(slices.Sorted(slices.Values(next.Binds)), slices.Sorted(slices.Values(after.Binds))) {
		return fieldErr(field+".binds", "an override of a plan keeps its binds (%s)", vocab.Cap(strings.Join(after.Binds, ","), 200))
	}
	ids := map[string]bool{}
	for id := range after.Contracts {
		ids[id] = true
	}
	for id := range next.Contracts {
		ids[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		a, n := planbind.Resolve(after, id), planbind.Resolve(next, id)
		f := field + ".contracts[" + id + "]"
		if a.Window.AsDuration() != n.Window.AsDuration() {
			return fieldErr(f+".window", "an override keeps each tenant's window (%v), got %v", a.Window.AsDuration(), n.Window.AsDuration())
		}
		if !slices.Equal(slices.Sorted(slices.Values(a.Regions)), slices.Sorted(slices.Values(n.Regions))) {
			return fieldErr(f+".regions", "an override keeps each tenant's regions (%s)", strings.Join(a.Regions, ","))
		}
	}
	return nil
}
