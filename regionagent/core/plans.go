package core

// Plans (docs/plans.md): an id that no limit of the snapshot names, but
// that a plan of it binds ("tenant/{id}"), is a limit from its first
// Check, with no allocator call on the request path and nothing kept for
// ids never checked. The agent's shell builds the Resolver from the
// snapshot's plans with the resolution the allocator uses
// (internal/planbind), so both decide the same limit for the same id.

// Resolver gives the limit of an id the snapshot's plans bind; false
// when none binds it. It must be a pure function of the snapshot.
type Resolver func(id string) (Limit, bool)

// SetPlans sets the resolver of the snapshot being set: called with
// SetLimits (before it) or after a RestoreLimits that was taken; nil
// when the snapshot has no plans. The ids resolved so far are resolved
// again: a plan change reaches the tenants in use at once (the
// allocator's sync carries a change when it governs).
func (c *Core) SetPlans(r Resolver) {
	c.resolver = r
	c.rebind()
}

// bind resolves id from the plans into the snapshot, if a plan binds it.
func (c *Core) bind(id string) bool {
	if c.resolver == nil {
		return false
	}
	l, ok := c.resolver(id)
	if !ok || l.ID != id {
		return false
	}
	c.limits[id] = &l
	c.bound[id] = true
	if st := c.states[id]; st != nil {
		st.l = l // a limit deleted (or resolved before): the plan's now
	}
	return true
}

// rebind resolves again the ids resolved from plans that still have
// state, after the snapshot or its plans changed; a limit of the
// snapshot with the same id wins over the plan.
func (c *Core) rebind() {
	for id := range c.bound {
		if l := c.limits[id]; l != nil && l.Plan == "" {
			delete(c.bound, id) // an explicit limit now: the snapshot's
			continue
		}
		delete(c.limits, id)
		delete(c.bound, id)
		if c.states[id] != nil {
			c.bind(id)
		}
	}
}

// unbind forgets a resolved limit with its state.
func (c *Core) unbind(id string) {
	if c.bound[id] {
		delete(c.bound, id)
		delete(c.limits, id)
	}
}

// Resolve returns the limit of id: the snapshot's (or one a Check
// bound), else the one a plan of the snapshot gives it, which is not
// kept. Concurrency limits use it: their state is the shell's slot
// plans (regionagent/slots.go), not the core's, so a tenant of a
// concurrency plan is resolved on each slot call and the core keeps
// nothing of it.
func (c *Core) Resolve(id string) (Limit, bool) {
	if l, ok := c.limits[id]; ok {
		return *l, true
	}
	if c.resolver == nil {
		return Limit{}, false
	}
	l, ok := c.resolver(id)
	if !ok || l.ID != id {
		return Limit{}, false
	}
	return l, true
}

// Bound counts the ids resolved from plans the core keeps (used ones).
func (c *Core) Bound() int { return len(c.bound) }

// unbindStateless forgets the limits a Check resolved from plans that got
// no state (the Check was refused first: a bad cost, an unknown limit
// beside them), so that refused Checks keep nothing.
func (c *Core) unbindStateless(items []Item) {
	for _, it := range items {
		if c.bound[it.Limit] && c.states[it.Limit] == nil {
			c.unbind(it.Limit)
		}
	}
}
