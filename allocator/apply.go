package allocator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/allocator/auth"
	"leasehold/internal/limitspec"
	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Limits of a change request.
const (
	maxReasonLen = 1000
	// changeRetries bounds how often a change is re-read and retried when
	// its transaction lost a race it had no expected version for.
	changeRetries = 5
)

// Change says how a limit is changed: the reason recorded in its history
// (required), when the change governs, and the version it was planned
// against.
type Change struct {
	Reason string
	// Effective: a change to an existing limit governs from the next
	// window boundary (EFFECTIVE_UNSPECIFIED, EFFECTIVE_NEXT_WINDOW) or at
	// once (EFFECTIVE_NOW). Creating a limit always governs at once.
	Effective pb.Effective
	// Expected is the version the change expects (0: the limit must not
	// exist); nil changes whatever version is stored.
	Expected *int64
	// OverrideFor > 0 makes the change an override that ends by itself
	// (PutLimitRequest.override_for).
	OverrideFor time.Duration
}

// inProcess is the principal of Go callers in the allocator's own process
// (leasehold dev, tests) that put none in the context.
var inProcess = &auth.Principal{Name: "in-process", Kind: auth.KindAnonymous, Role: auth.RoleAdmin, Via: auth.ViaNone}

func callerOf(ctx context.Context) *auth.Principal {
	if p := auth.FromContext(ctx); p != nil {
		return p
	}
	return inProcess
}

// PutLimit validates and stores a limit, with its history and audit
// record, as the principal in ctx (in-process callers without one are
// trusted). It is served by the leader.
func (a *Allocator) PutLimit(ctx context.Context, l *pb.Limit, c Change) (*pb.Limit, error) {
	res, err := a.applyChanges(ctx, callerOf(ctx), changeSet{
		action: "put", reason: c.Reason, effective: c.Effective, overrideFor: c.OverrideFor,
		items: []changeItem{{put: l, expected: c.Expected, field: "limit", expField: "expected_version"}},
	})
	if err != nil {
		return nil, err
	}
	return res.limits[0], nil
}

// DeleteLimit deletes a limit as the principal in ctx (see PutLimit).
func (a *Allocator) DeleteLimit(ctx context.Context, id string, c Change) error {
	_, err := a.applyChanges(ctx, callerOf(ctx), changeSet{
		action: "delete", reason: c.Reason,
		items: []changeItem{{del: id, deleting: true, expected: c.Expected, field: "id", expField: "expected_version"}},
	})
	return err
}

// changeItem is one limit change of a call.
type changeItem struct {
	put      *pb.Limit // a put: the limit as sent (nil: missing)
	del      string    // a delete: the limit id
	deleting bool      // the change is a delete
	expected *int64
	field    string // how errors name the put or delete: "limit", "changes[2].put", "id"
	expField string // how errors name the expected version

	valid *pb.Limit // the put, validated
}

func (it *changeItem) id() string {
	if !it.deleting {
		return it.put.GetId()
	}
	return it.del
}

// changeSet is what one PutLimit, DeleteLimit or ApplyLimits call asks.
type changeSet struct {
	action    string // "put", "delete", "apply"
	items     []changeItem
	reason    string
	effective pb.Effective
	dryRun    bool
	// overrideFor > 0 makes a put an override of an existing limit that
	// ends by itself after this long (PutLimitRequest.override_for).
	overrideFor time.Duration
	principal   *auth.Principal // set by applyChanges
}

// changeResult is what a change did (or, on a dry run, would do).
type changeResult struct {
	limits   []*pb.Limit // per item: the stored limit (nil for deletes)
	effects  []*pb.ChangeEffect
	changeID string // the audit record id; "" when nothing was written
}

// maxChanges is the most changes one call may carry with this
// allocator's transaction size (see limitspec.MaxApplyChanges).
func (a *Allocator) maxChanges() int {
	return max(1, min(limitspec.MaxApplyChanges, (a.opt.maxOps-2)/2))
}

// applyChanges authorizes, validates and applies (or, dry, evaluates) a
// change set: every change or none. Refusals are audited: denied,
// invalid, conflict.
func (a *Allocator) applyChanges(ctx context.Context, p *auth.Principal, cs changeSet) (*changeResult, error) {
	if p == nil {
		return nil, auth.ErrUnauthenticated
	}
	cs.principal = p
	refuse := func(it *changeItem, outcome pb.AuditOutcome, err error) error {
		e := newEvent(ctx, p, cs.action, "", cs.reason)
		if it != nil {
			e.LimitId = it.id()
			if !it.deleting && outcome != pb.AuditOutcome_AUDIT_OUTCOME_INVALID {
				e.New = it.put
			}
		}
		a.recordRefusal(ctx, e, outcome, err)
		return err
	}
	// Sizes first: nothing unbounded is authorized, audited or logged.
	if it, err := a.checkSizes(&cs); err != nil {
		return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_INVALID, err)
	}
	for i := range cs.items {
		it := &cs.items[i]
		if err := p.Allow(auth.ActionWrite, it.id(), ""); err != nil {
			return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_DENIED, err)
		}
	}
	if it, err := a.validateChanges(&cs); err != nil {
		return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_INVALID, err)
	}
	for i := range cs.items {
		if err := a.writableHere(cs.items[i].id()); err != nil {
			return nil, err // not this group's to change: the caller asks the owner
		}
	}
	t, err := a.currentTerm()
	if err != nil {
		return nil, err
	}
	a.changeMu.Lock()
	defer a.changeMu.Unlock()
	// Under changeMu: two changes cannot bind one pattern to two plans.
	if it, err := a.checkPlanChanges(ctx, &cs); err != nil {
		if it != nil && errors.Is(err, vocab.ErrInvalid) {
			return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_INVALID, err)
		}
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		plan, it, err := a.planChanges(ctx, t, &cs)
		if err != nil {
			if it != nil && (errors.Is(err, ErrVersionMismatch) || errors.Is(err, ErrNotFound)) {
				return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_CONFLICT, err)
			}
			if it != nil && errors.Is(err, vocab.ErrInvalid) {
				return nil, refuse(it, pb.AuditOutcome_AUDIT_OUTCOME_INVALID, err)
			}
			return nil, err
		}
		if cs.dryRun {
			return plan.result, nil
		}
		done, err := a.commitChanges(ctx, t, &cs, plan)
		if err != nil || done {
			return plan.result, err
		}
		if attempt == changeRetries {
			return nil, fmt.Errorf("%w: limits kept changing under this change; try again", ErrVersionMismatch)
		}
	}
}

// checkSizes checks the sizes of everything a change set names (reason,
// count of changes, each limit's id and strings: limitspec.CheckSizes)
// before anything else looks at it; on error it returns the change at
// fault, as validateChanges does.
func (a *Allocator) checkSizes(cs *changeSet) (*changeItem, error) {
	switch {
	case len(cs.reason) > maxReasonLen:
		return firstItem(cs), fieldErr("reason", "longer than %d characters", maxReasonLen)
	case len(cs.items) > a.maxChanges():
		return firstItem(cs), fieldErr("changes", "at most %d changes per apply (etcd transaction of %d ops), got %d: split the file",
			a.maxChanges(), a.opt.maxOps, len(cs.items))
	}
	for i := range cs.items {
		it := &cs.items[i]
		if len(it.id()) > vocab.MaxLimitIDLen {
			return it, fieldErr(it.field+idField(it), "longer than %d characters", vocab.MaxLimitIDLen)
		}
		if it.deleting {
			continue
		}
		if err := limitspec.CheckSizes(it.put); err != nil {
			var fe *vocab.FieldError
			if errors.As(err, &fe) && it.field != "limit" {
				fe.Field = it.field + strings.TrimPrefix(fe.Field, "limit")
			}
			return it, err
		}
	}
	return nil, nil
}

// idField is the suffix naming an item's limit id: ".id" for a put
// ("limit.id", "changes[2].put.id"), nothing for a delete (its field is
// the id).
func idField(it *changeItem) string {
	if it.deleting {
		return ""
	}
	return ".id"
}

// validateChanges checks a change set; on error it returns the change at
// fault (nil when the error is not about one change).
func (a *Allocator) validateChanges(cs *changeSet) (*changeItem, error) {
	switch {
	case strings.TrimSpace(cs.reason) == "":
		return firstItem(cs), fieldErr("reason", "required: say why the limit changes")
	case len(cs.reason) > maxReasonLen:
		return firstItem(cs), fieldErr("reason", "longer than %d characters", maxReasonLen)
	}
	if _, ok := pb.Effective_name[int32(cs.effective)]; !ok {
		return firstItem(cs), fieldErr("effective", "unknown value %d: NEXT_WINDOW or NOW", cs.effective)
	}
	if cs.overrideFor != 0 {
		switch {
		case cs.overrideFor < time.Second || cs.overrideFor > limitspec.MaxWindow:
			return firstItem(cs), fieldErr("override_for", "must be 1s to %v, got %v", limitspec.MaxWindow, cs.overrideFor)
		case cs.overrideFor%time.Millisecond != 0:
			return firstItem(cs), fieldErr("override_for", "must be whole milliseconds, got %v", cs.overrideFor)
		case cs.effective == pb.Effective_EFFECTIVE_NEXT_WINDOW:
			return firstItem(cs), fieldErr("effective", "an override governs at once: leave effective out or send NOW")
		case len(cs.items) != 1 || cs.items[0].deleting:
			return firstItem(cs), fieldErr("override_for", "only a put of one limit can be an override")
		}
	}
	if len(cs.items) == 0 {
		return nil, fieldErr("changes", "at least one change is required")
	}
	if n := a.maxChanges(); len(cs.items) > n {
		return firstItem(cs), fieldErr("changes", "at most %d changes per apply (etcd transaction of %d ops), got %d: split the file",
			n, a.opt.maxOps, len(cs.items))
	}
	seen := map[string]int{}
	for i := range cs.items {
		it := &cs.items[i]
		if it.expected != nil && *it.expected < 0 {
			return it, fieldErr(it.expField, "must be >= 0, got %d", *it.expected)
		}
		if it.deleting {
			if err := vocab.ValidateLimitID(it.field, it.del); err != nil {
				return it, err
			}
		} else {
			v, err := limitspec.ValidateLimit(it.put, a.cfg.Regions)
			if err != nil {
				var fe *vocab.FieldError
				if errors.As(err, &fe) && it.field != "limit" {
					fe.Field = it.field + strings.TrimPrefix(fe.Field, "limit")
				}
				return it, err
			}
			it.valid = v
		}
		if j, dup := seen[it.id()]; dup {
			return it, fieldErr(it.field, "limit %q is also changed by changes[%d]", it.id(), j)
		}
		seen[it.id()] = i
	}
	return nil, nil
}

func firstItem(cs *changeSet) *changeItem {
	if len(cs.items) == 0 {
		return nil
	}
	return &cs.items[0]
}

// changePlan is a change set checked against the stored limits: what to
// write, and the result to answer.
type changePlan struct {
	now     time.Time
	modRevs []int64     // per item: the mod revision read (0: absent)
	stored  []*pb.Limit // per item: the stored limit (nil: absent)
	next    []*pb.Limit // per item: what to store (nil: delete or unchanged)
	result  *changeResult
}

// planChanges reads the changed limits at one revision, checks the
// expected versions and computes the new records and their effects.
func (a *Allocator) planChanges(ctx context.Context, t *term, cs *changeSet) (*changePlan, *changeItem, error) {
	ops := make([]clientv3.Op, len(cs.items))
	for i := range cs.items {
		ops[i] = clientv3.OpGet(a.store.limitKey(cs.items[i].id()))
	}
	resp, err := a.cfg.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("allocator: read limits: %w", err)
	}
	now := a.opt.now()
	pl := &changePlan{now: now, modRevs: make([]int64, len(cs.items)), stored: make([]*pb.Limit, len(cs.items)),
		next: make([]*pb.Limit, len(cs.items)), result: &changeResult{limits: make([]*pb.Limit, len(cs.items)),
			effects: make([]*pb.ChangeEffect, len(cs.items))}}
	for i := range cs.items {
		it := &cs.items[i]
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			cur := &pb.Limit{}
			if err := proto.Unmarshal(kvs[0].Value, cur); err != nil {
				return nil, nil, fmt.Errorf("allocator: decode limit %q: %w", it.id(), err)
			}
			pl.stored[i], pl.modRevs[i] = cur, kvs[0].ModRevision
		}
		var curVersion int64
		if pl.stored[i] != nil {
			curVersion = pl.stored[i].Version
		}
		if it.expected != nil && *it.expected != curVersion {
			return nil, it, fmt.Errorf("%w: %s: limit %q is at version %d, expected %d", ErrVersionMismatch,
				it.expField, it.id(), curVersion, *it.expected)
		}
		if it.deleting && pl.stored[i] == nil {
			return nil, it, fmt.Errorf("%w: %s: limit %q", ErrNotFound, it.field, it.id())
		}
		next, err := nextRecord(now, pl.stored[i], it, cs.effective, cs.overrideFor > 0)
		if err == nil && cs.overrideFor > 0 {
			next, err = overrideRecord(now, pl.stored[i], next, it, cs)
		}
		if err != nil {
			return nil, it, err
		}
		pl.next[i] = next
		switch {
		case it.deleting:
		case next != nil:
			pl.result.limits[i] = next
		default:
			pl.result.limits[i] = asShown(pl.stored[i], now)
		}
	}
	t.mu.Lock()
	for i := range cs.items {
		pl.result.effects[i] = t.core.effect(now, cs.items[i].id(), pl.stored[i], pl.next[i], cs.items[i].deleting)
	}
	t.mu.Unlock()
	return pl, nil, nil
}

// nextRecord is the record a change stores over stored (nil: absent), or
// nil for a delete or a put that changes nothing.
func nextRecord(now time.Time, stored *pb.Limit, it *changeItem, eff pb.Effective, overridePut bool) (*pb.Limit, error) {
	if it.deleting {
		return nil, nil
	}
	next := cloneLimit(it.valid)
	if stored == nil {
		// Creation governs at once.
		next.Version, next.EffectiveFrom = 1, timestamppb.New(now)
		return next, nil
	}
	if len(diffLimits(stored, next)) == 0 {
		return nil, nil
	}
	if next.HashTag != stored.HashTag {
		// The tag is in every Redis key of the limit: a new one would
		// leave the running window's regional buckets (leases, counts,
		// locks) behind under the old keys, mid-window.
		return nil, fieldErr(it.field+".hash_tag", "%q -> %q: the hash tag of an existing limit cannot change "+
			"(it names the limit's Redis keys); delete the limit and create it again with the new tag",
			stored.HashTag, next.HashTag)
	}
	if kindName(next) != kindName(stored) {
		// A limit's windows and its rate shares are different state: a
		// limit does not turn from one into the other mid-flight.
		return nil, fieldErr(it.field+".kind", "the kind of an existing limit cannot change (%s -> %s): delete the limit and create it again",
			kindName(stored), kindName(next))
	}
	if windowless(next) && !overridePut {
		// No window boundary to wait for: a change governs at once (the
		// allocator sizes the next shares by it; shares granted before
		// expire within their ttl and are counted in the bound).
		if eff == pb.Effective_EFFECTIVE_NEXT_WINDOW {
			return nil, fieldErr("effective", "a %s limit has no windows: leave effective unset or make it NOW", kindName(next))
		}
		eff = pb.Effective_EFFECTIVE_NOW
	}
	next.Version = stored.Version + 1
	cur := inForce(stored, now)
	if overriding(stored, now) && eff != pb.Effective_EFFECTIVE_NOW && !overridePut {
		return nil, fieldErr("effective", "an override is in force until %s: change the limit with effective NOW (which ends the override) or after it ends",
			stored.Override.EndsAt.AsTime().UTC().Format(time.RFC3339))
	}
	if eff == pb.Effective_EFFECTIVE_NOW || len(diffLimits(cur, next)) == 0 {
		// At once; or back to the version in force, which cancels the
		// scheduled change.
		if err := standingAtOnce(it.field, cur, next); err != nil {
			return nil, err
		}
		next.EffectiveFrom = timestamppb.New(now)
		return next, nil
	}
	curW, nextW := limitspec.Schedule(cur), limitspec.Schedule(next)
	from, err := nextBoundary(now, curW, nextW)
	if err != nil {
		field := ".window"
		switch {
		case curW.IsCalendar() || nextW.IsCalendar():
			field = ".calendar"
		case curW.Length == nextW.Length:
			field = ".window_phase"
		}
		return nil, fieldErr(it.field+field, "%v", err)
	}
	if scheds := contractWindows(cur, next); len(scheds) > 0 {
		// Tenants with a window of their own (a contract's) must not
		// see a change mid-window either: the change waits for an
		// instant that starts a window of the plan and of every one of
		// them, before and after.
		if from, err = commonStart(now, append(scheds, curW, nextW)); err != nil {
			return nil, fieldErr(it.field+".contracts", "%v", err)
		}
	}
	prev := cloneLimit(cur)
	prev.Previous = nil
	if planbind.IsPlan(next.Id) {
		// Which ids a plan binds changes at once, on every reader (the
		// binding table is built from the record); its settings wait
		// for the boundary.
		prev.Binds = next.Binds
	}
	next.EffectiveFrom, next.Previous = timestamppb.New(from), prev
	return next, nil
}

// standingAtOnce refuses a change that governs the running window at once
// (from cur, the version in force, to next) if it would change what the
// window's standing shares are: regions may already have spent theirs,
// without a request the allocator could have refused. So lease.standing
// changes only at a window boundary, and while a share is set no region
// leaves at once (adding one is safe: its share is counted from the
// change on, and every version's shares fit in its G). A plan is held to
// it for every tenant its contracts shape too.
func standingAtOnce(field string, cur, next *pb.Limit) error {
	check := func(f string, cur, next *pb.Limit) error {
		was, will := cur.GetLease().GetStanding(), next.GetLease().GetStanding()
		if was != will {
			return fieldErr(f+".lease.standing", "%d -> %d: regions may have spent their standing shares of the running window: "+
				"a standing share changes only at a window boundary (leave effective unset, or NEXT_WINDOW)", was, will)
		}
		if was == 0 {
			return nil
		}
		for _, r := range cur.Regions {
			if !slices.Contains(next.Regions, r) {
				return fieldErr(f+".regions", "%q may have spent its standing share of the running window: "+
					"a limit with standing shares drops a region only at a window boundary (leave effective unset, or NEXT_WINDOW)", r)
			}
		}
		return nil
	}
	if err := check(field, cur, next); err != nil {
		return err
	}
	if !planbind.IsPlan(next.Id) {
		return nil
	}
	ids := slices.Sorted(maps.Keys(cur.Contracts))
	for id := range next.Contracts {
		if _, ok := cur.Contracts[id]; !ok {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		if err := check(field+".contracts["+id+"]", planbind.Resolve(cur, id), planbind.Resolve(next, id)); err != nil {
			return err
		}
	}
	return nil
}

// overrideEnder is the principal that records an override's end.
var overrideEnder = &auth.Principal{Name: "allocator (override ended)", Kind: auth.KindAnonymous, Role: auth.RoleAdmin, Via: auth.ViaNone}

// recordOverrideEnds writes, for every stored override that has ended, the
// version it returned to as a change of its own (history and audit say
// when and why it ended, and the record no longer carries the override).
// Bookkeeping only: the override stopped governing at its end whether or
// not this runs (Limit.At, inForce), so a failure is retried at the next
// sweep, and a change made meanwhile wins (expected version).
func (a *Allocator) recordOverrideEnds(t *term) {
	now := a.opt.now()
	var ended []*pb.Limit
	t.mu.Lock()
	for _, l := range t.core.limits {
		if l.After != nil && !now.Before(l.OverrideEnds) {
			ended = append(ended, l.Proto)
		}
	}
	t.mu.Unlock()
	for _, p := range ended {
		// The core learns of writes through the watch: read the record,
		// so that an end just recorded (or a change made meanwhile) is
		// not written again and refused as a conflict.
		if cur, err := a.store.GetLimit(t.ctx, p.Id); err != nil || cur == nil || cur.Version != p.Version || !overrideEnded(cur, now) {
			continue
		}
		next := afterOf(p)
		next.Version, next.EffectiveFrom = 0, nil
		v := p.Version
		_, err := a.applyChanges(t.ctx, overrideEnder, changeSet{action: "put", effective: pb.Effective_EFFECTIVE_NOW,
			reason: "override ended (" + vocab.Cap(p.Override.Reason, maxReasonLen-40) + ")",
			items:  []changeItem{{put: next, expected: &v, field: "limit", expField: "expected_version"}}})
		if err != nil && t.ctx.Err() == nil && !errors.Is(err, ErrVersionMismatch) {
			a.log.Warn("recording an override's end", "limit", p.Id, "err", err)
		}
	}
}

// overrideRecord makes next (the record a put stores over stored) an
// override that ends by itself at now + cs.overrideFor: from then on the
// version in force now governs again. An override of an override keeps
// the first one's version to return to. It may change G (a bucket
// limit's R and B, a concurrency limit's N), the mode, the fallbacks, the
// lease settings and shadow mode; not the window, the rate period or the
// regions (a window that changes length and back mid-window has no
// meaning). A bucket or concurrency limit has no windows: its override
// governs the shares granted from now until its end, the version it
// returns to those granted from then (Limit.At), each share counted at
// what it was granted under until it expires.
func overrideRecord(now time.Time, stored, next *pb.Limit, it *changeItem, cs *changeSet) (*pb.Limit, error) {
	if stored == nil {
		return nil, fieldErr("override_for", "an override changes an existing limit: %q does not exist", it.id())
	}
	if scheduled(stored, now) {
		// Its end would return to the version in force now and lose the
		// scheduled one.
		return nil, fieldErr("override_for", "a change of %q is scheduled for %s: wait for it, or make it effective now, before an override",
			it.id(), stored.EffectiveFrom.AsTime().UTC().Format(time.RFC3339))
	}
	after := inForce(stored, now)
	if overriding(stored, now) {
		after = stored.Override.After
	}
	after = cloneLimit(after)
	after.Previous, after.Override, after.EffectiveFrom = nil, nil, nil
	if next == nil { // the same settings as in force: an override that changes nothing
		return nil, fieldErr(it.field, "the override changes nothing: it equals the version in force")
	}
	if next.Window.AsDuration() != after.Window.AsDuration() {
		return nil, fieldErr(it.field+".window", "an override keeps the window (%v), got %v", after.Window.AsDuration(), next.Window.AsDuration())
	}
	if limitspec.Schedule(next) != limitspec.Schedule(after) {
		return nil, fieldErr(it.field+".calendar", "an override keeps the calendar windows (%v), got %v",
			limitspec.Schedule(after), limitspec.Schedule(next))
	}
	if next.GetWindowPhase().AsDuration() != after.GetWindowPhase().AsDuration() {
		return nil, fieldErr(it.field+".window_phase", "an override keeps the window phase (%v), got %v",
			after.GetWindowPhase().AsDuration(), next.GetWindowPhase().AsDuration())
	}
	if !slices.Equal(slices.Sorted(slices.Values(next.Regions)), slices.Sorted(slices.Values(after.Regions))) {
		return nil, fieldErr(it.field+".regions", "an override keeps the regions (%s)", strings.Join(after.Regions, ","))
	}
	if next.GetRatePeriod().AsDuration() != after.GetRatePeriod().AsDuration() {
		// R is tokens per period: a share granted under one period and
		// counted under another would be a different rate.
		return nil, fieldErr(it.field+".rate_period", "an override keeps the rate period (%v), got %v",
			after.GetRatePeriod().AsDuration(), next.GetRatePeriod().AsDuration())
	}
	if planbind.IsPlan(next.Id) {
		if err := checkPlanOverride(it.field, after, next); err != nil {
			return nil, err
		}
	}
	if err := standingAtOnce(it.field, after, next); err != nil {
		return nil, err
	}
	next.EffectiveFrom, next.Previous = timestamppb.New(now), nil
	next.Override = &pb.LimitOverride{Reason: cs.reason, EndsAt: timestamppb.New(now.Add(cs.overrideFor)), After: after}
	return next, nil
}

// nextBoundary returns when a change scheduled at now for the next window
// comes into force: the end of the current window of the version in force
// (schedule cur), or, when the change also sets a new window length or
// phase offset, the first instant from then that starts a window of both
// schedules, so that no window is ever half old, half new. Windows of
// lengths a and b start together every lcm(a, b) at most; with phases
// they start together only if the phases agree modulo gcd(a, b) (two
// phases of one length never do: such a change is made effective NOW).
func nextBoundary(now time.Time, cur, next lease.Windows) (time.Time, error) {
	end := cur.Of(now).End()
	if next == cur {
		return end, nil
	}
	if cur.IsCalendar() || next.IsCalendar() {
		return calendarBoundary(end, cur, next)
	}
	a, b := cur.Length.Milliseconds(), next.Length.Milliseconds()
	g := gcd(a, b)
	span := a / g * b // both are at most limitspec.MaxWindow in ms: no overflow
	if longest := max(a, b); span > 10*longest {
		return time.Time{}, fmt.Errorf("windows of %v and %v start together only every %v: apply this change with effective NOW, or change the window in two steps",
			cur.Length, next.Length, time.Duration(span)*time.Millisecond)
	}
	if cur.Phase == 0 && next.Phase == 0 {
		w := time.Duration(span) * time.Millisecond
		return lease.WindowOf(end.Add(w-1), w).Start(), nil
	}
	// The common starts, if any, repeat every span: look at the starts of
	// the longer windows within one span from the end (at most ten).
	long, short := cur, next
	if next.Length > cur.Length {
		long, short = next, cur
	}
	t := long.Of(end.Add(-1)).End() // the first start of long at or after end
	for range span/long.Length.Milliseconds() + 1 {
		if short.StartsWindow(t) {
			return t, nil
		}
		t = t.Add(long.Length)
	}
	return time.Time{}, fmt.Errorf("windows of %v and %v never start together: apply this change with effective NOW",
		cur, next)
}

// contractWindows returns the window schedules of the tenants whose
// contracts give them a window of their own in the plan's version cur or
// next (none for a limit that is not a plan).
func contractWindows(cur, next *pb.Limit) []lease.Windows {
	var out []lease.Windows
	for _, v := range []*pb.Limit{cur, next} {
		for _, c := range v.GetContracts() {
			if c.GetWindow() != nil {
				w := lease.WindowsOf(c.Window.AsDuration(), v.GetWindowPhase().AsDuration())
				if !slices.Contains(out, w) {
					out = append(out, w)
				}
			}
		}
	}
	return out
}

// maxCommonStarts bounds how many windows of the longest schedule a
// change waits for a common start (the bound nextBoundary puts on two
// schedules: lcm within ten of the longer windows).
const maxCommonStarts = 10

// commonStart returns the first instant after now that starts a window
// of every schedule, within maxCommonStarts of the longest windows.
func commonStart(now time.Time, scheds []lease.Windows) (time.Time, error) {
	long := scheds[0]
	for _, s := range scheds {
		if s.Of(now).Length > long.Of(now).Length {
			long = s
		}
	}
	t := long.Of(now).End()
	for range maxCommonStarts {
		all := true
		for _, s := range scheds {
			all = all && s.StartsWindow(t)
		}
		if all {
			return t, nil
		}
		w := long.Of(t)
		if w.Length <= 0 {
			break // outside a calendar's years
		}
		t = w.End()
	}
	return time.Time{}, fmt.Errorf("the windows of the plan and of its contracts' own windows start together only rarely or never: apply this change with effective NOW")
}

// calendarBoundary is nextBoundary when either schedule is a calendar: the
// first instant at or after end that starts a window of both, looked for
// among the starts of the schedule with the longer windows within ten of
// them (a calendar window's starts are not periodic, so no lcm names
// them). Month -> day, day -> 1 h, month Berlin -> month Paris meet at the
// next local midnight of the longer unit both share; a month in Berlin and
// one in New York never start together (refused: apply it NOW).
func calendarBoundary(end time.Time, cur, next lease.Windows) (time.Time, error) {
	long, short := cur, next
	if next.Of(end).Length > cur.Of(end).Length {
		long, short = next, cur
	}
	t := long.Of(end.Add(-1)).End() // the first start of long at or after end
	for range 10 {
		w := long.Of(t)
		if w.Length <= 0 || t.Before(end) {
			break // outside the calendar's years: no boundary to offer
		}
		if short.StartsWindow(t) {
			return t, nil
		}
		t = w.End()
	}
	return time.Time{}, fmt.Errorf("windows of %v and %v do not start together within ten windows: apply this change with effective NOW",
		cur, next)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// commitChanges writes a planned change set in one fenced transaction:
// the limits, their history entries, the audit record and the limits
// revision, only if every limit is still as read. done is false when a
// limit moved in between (the caller plans again).
func (a *Allocator) commitChanges(ctx context.Context, t *term, cs *changeSet, pl *changePlan) (done bool, err error) {
	recordID := a.ids.next(pl.now)
	var events []*pb.AuditEvent
	var eventItems []int
	for i := range cs.items {
		it := &cs.items[i]
		if !it.deleting && pl.next[i] == nil {
			continue // unchanged
		}
		e := newEvent(ctx, cs.principal, cs.action, it.id(), cs.reason)
		e.Outcome = pb.AuditOutcome_AUDIT_OUTCOME_APPLIED
		if s := pl.stored[i]; s != nil {
			e.Old, e.OldVersion = s, s.Version
		}
		if n := pl.next[i]; n != nil {
			e.New, e.NewVersion, e.EffectiveFrom = n, n.Version, n.EffectiveFrom
		} else {
			e.EffectiveFrom = timestamppb.New(pl.now)
		}
		events = append(events, e)
		eventItems = append(eventItems, i)
	}
	if len(events) == 0 {
		return true, nil // nothing changes: nothing to write or record
	}
	stamp(recordID, pl.now, events)
	if cs.action == "apply" {
		for _, e := range events {
			e.ChangeId = recordID
		}
		pl.result.changeID = recordID
	}
	cmps := []clientv3.Cmp{t.fence.Cmp()}
	var ops []clientv3.Op
	for k, i := range eventItems {
		key := a.store.limitKey(cs.items[i].id())
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", pl.modRevs[i]))
		if n := pl.next[i]; n != nil {
			b, err := proto.Marshal(n)
			if err != nil {
				return false, err
			}
			ops = append(ops, clientv3.OpPut(key, string(b)))
		} else {
			ops = append(ops, clientv3.OpDelete(key))
		}
		hb, err := proto.Marshal(events[k])
		if err != nil {
			return false, err
		}
		ops = append(ops, clientv3.OpPut(a.store.historyKey(events[k].LimitId, events[k].Id), string(hb)))
	}
	rec, err := encodeAuditRecord(events)
	if err != nil {
		return false, err
	}
	ops = append(ops, clientv3.OpPut(a.store.auditKey(recordID), string(rec)), clientv3.OpPut(a.store.limitsRevKey(), ""))
	if n := opsSize(ops); n > maxChangeBytes {
		// etcd would refuse it as too large, an error that reads as
		// etcd being unavailable: say what to do instead.
		return false, fieldErr("changes", "%d changes encode to %d bytes with their history and audit, above the %d one etcd transaction may carry: split them",
			len(events), n, maxChangeBytes)
	}
	start := time.Now()
	resp, err := a.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	a.am.changeDur.Observe(time.Since(start).Seconds())
	if err != nil {
		return false, fmt.Errorf("allocator: change limits: %w", err)
	}
	if !resp.Succeeded {
		if t.ctx.Err() != nil {
			return false, ErrFenced
		}
		fr, err := a.cfg.Client.Get(ctx, t.fence.Key)
		if err != nil {
			return false, fmt.Errorf("allocator: change limits: %w", err)
		}
		if len(fr.Kvs) == 0 || fr.Kvs[0].CreateRevision != t.fence.Rev {
			return false, ErrFenced
		}
		return false, nil // a limit moved: plan again
	}
	a.am.audit.WithLabelValues("applied").Add(float64(len(events)))
	for k, i := range eventItems {
		a.log.Info("allocator: limit changed", "limit", cs.items[i].id(), "action", cs.action,
			"principal", events[k].Principal, "version", events[k].NewVersion, "reason", cs.reason)
	}
	return true, nil
}

// maxChangeBytes bounds the encoded writes of one change set: etcd's
// default request limit (--max-request-bytes, 1.5 MiB) less room for the
// transaction's framing.
const maxChangeBytes = 1400 << 10

// opsSize is the bytes of keys and values ops write.
func opsSize(ops []clientv3.Op) int {
	n := 0
	for _, op := range ops {
		n += len(op.KeyBytes()) + len(op.ValueBytes())
	}
	return n
}

// isBucket tells whether l is a bucket limit.
func isBucket(l *pb.Limit) bool { return l.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET }

// isConcurrency tells whether l is a concurrency limit.
func isConcurrency(l *pb.Limit) bool { return l.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY }

// windowless tells whether l has no windows (bucket and concurrency
// limits).
func windowless(l *pb.Limit) bool { return isBucket(l) || isConcurrency(l) }

// kindName is a limit's kind as limits files write it.
func kindName(l *pb.Limit) string {
	switch {
	case isBucket(l):
		return "bucket"
	case isConcurrency(l):
		return "concurrency"
	}
	return "window"
}
