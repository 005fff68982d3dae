package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/groupmap"
	"leasehold/internal/limitspec"
	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// With allocator groups (docs/operations.md#allocator-groups) every limit
// lives in one group: quotactl reads the group map from --allocator and
// sends each call where the limit lives; lists and window reports are
// gathered from every group.

// groupState is the group map as --allocator answered it, once per
// invocation.
type groupState struct {
	loaded bool
	m      groupmap.Map
	rev    int64
	group  string // --allocator's group
}

// groupMap reads the group map (empty without groups: an allocator that
// is not a group, or one too old to know of groups).
func (e *env) groupMap(ctx context.Context) (*groupState, error) {
	if e.groups.loaded {
		return &e.groups, nil
	}
	var resp *pb.GetGroupMapResponse
	var code codes.Code
	err := e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
		resp, err = c.GetGroupMap(ctx, &pb.GetGroupMapRequest{}, opt)
		code = status.Code(err)
		return err
	})
	switch {
	case code == codes.Unimplemented:
		e.groups.loaded = true
		return &e.groups, nil
	case err != nil:
		return nil, err
	}
	st := groupState{loaded: true, group: resp.GetGroup(), rev: resp.GetRevision()}
	if len(resp.GetMap()) > 0 {
		if st.m, err = groupmap.Decode(resp.GetMap()); err != nil {
			return nil, fmt.Errorf("the allocator sent a group map that does not decode: %v", err)
		}
	}
	e.groups = st
	return &e.groups, nil
}

// active reports whether the limits live in several groups.
func (g *groupState) active() bool { return len(g.m.Versions) > 0 }

// addrOf is the address quotactl calls a group at: --allocator for its
// own group, else the group's first allocator (a follower names the
// leader).
func (e *env) addrOf(g *groupState, group string) (string, error) {
	if group == g.group {
		return e.addr, nil
	}
	v := g.m.Current()
	gr, ok := v.Group(group)
	if !ok || len(gr.Allocators) == 0 {
		return "", fmt.Errorf("allocator group %q is not in the group map", group)
	}
	return gr.Allocators[0], nil
}

// eachGroup calls fn first at --allocator (following a follower's
// redirect to its leader); when the answer says the allocator is one of
// several groups (fn returns its group), it calls fn once more per other
// group of the newest map version, in name order. Without groups that is
// one call and no other request.
func (e *env) eachGroup(ctx context.Context, fn func(call func(adminRPC) error) (group string, err error)) error {
	first, err := fn(func(rpc adminRPC) error { return e.admin(ctx, rpc) })
	if err != nil || first == "" {
		return err
	}
	return e.otherGroups(ctx, first, fn)
}

// otherGroups calls fn at every group of the newest map version but skip.
func (e *env) otherGroups(ctx context.Context, skip string, fn func(call func(adminRPC) error) (string, error)) error {
	g, err := e.groupMap(ctx)
	if err != nil {
		return err
	}
	for _, gr := range g.m.Current().Groups {
		if gr.Name == skip {
			continue
		}
		addr, err := e.addrOf(g, gr.Name)
		if err != nil {
			return err
		}
		call := func(rpc adminRPC) error {
			if err := e.adminAt(ctx, addr, false, rpc); err != nil {
				return fmt.Errorf("allocator group %s: %w", gr.Name, err)
			}
			return nil
		}
		if _, err := fn(call); err != nil {
			return err
		}
	}
	return nil
}

// ownerOf names the group a limit lives in (the newest version's), "" without groups.
func (g *groupState) ownerOf(id string) string {
	if !g.active() {
		return ""
	}
	v := g.m.Current()
	return v.Owner(id)
}

var groupsCmd = &command{
	name:    "groups",
	summary: "show and change the map of allocator groups",
	detail: `With several allocator groups (leasehold allocator --group), each group is
the authority for a share of the limits: its placement in the group map, or
else the hash of its id. A new version of the map governs the windows that
start the map's notice (30s by default) after it is written or later, so a
limit moves between groups only at one of its own window boundaries.`,
	sub: []*command{groupsShowCmd, groupsPlaceCmd, groupsUnplaceCmd, groupsSetCmd},
}

var groupsShowCmd = &command{
	name:    "show",
	summary: "print the group map, each group's leader and whether it answers",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			g, err := e.groupMap(ctx)
			if err != nil {
				return err
			}
			if !g.active() {
				return fmt.Errorf("allocator %s is not one of several allocator groups: every limit lives in it", e.addr)
			}
			var b strings.Builder
			for _, v := range g.m.Versions {
				state := "governs windows starting from"
				if v.From.After(time.Now()) {
					state = "pending: governs windows starting from"
				}
				fmt.Fprintf(&b, "version %d  %s %s", v.Number, state, v.From.UTC().Format(time.RFC3339))
				if v.Reason != "" {
					fmt.Fprintf(&b, "  (%s)", v.Reason)
				}
				b.WriteString("\n")
			}
			v := g.m.Current()
			b.WriteString("\nGROUP  ALLOCATORS  LEADER  STATE\n")
			for _, gr := range v.Groups {
				leader, state := "-", "answers"
				addr, _ := e.addrOf(g, gr.Name)
				var resp *pb.GetGroupMapResponse
				err := e.adminAt(ctx, addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
					resp, err = c.GetGroupMap(ctx, &pb.GetGroupMapRequest{}, opt)
					return err
				})
				switch {
				case err != nil:
					state = "does not answer: " + oneLine(err.Error())
				case resp.GetGroup() != gr.Name:
					state = fmt.Sprintf("answers as group %q: check its --group", resp.GetGroup())
				default:
					if resp.GetLeader() != "" {
						leader = resp.GetLeader()
					}
					if resp.GetRevision() < g.rev {
						state = fmt.Sprintf("answers; its map is at revision %d, behind %d", resp.GetRevision(), g.rev)
					}
				}
				fmt.Fprintf(&b, "%s  %s  %s  %s\n", gr.Name, strings.Join(gr.Allocators, ","), leader, state)
			}
			if len(v.Place) > 0 {
				b.WriteString("\nPLACED LIMIT  GROUP\n")
				ids := make([]string, 0, len(v.Place))
				for id := range v.Place {
					ids = append(ids, id)
				}
				sort.Strings(ids)
				for _, id := range ids {
					fmt.Fprintf(&b, "%s  %s\n", id, v.Place[id])
				}
			}
			_, err = fmt.Fprint(e.stdout, b.String())
			return err
		}
	},
}

var groupsPlaceCmd = &command{
	name:    "place",
	args:    "LIMIT GROUP --reason TEXT",
	summary: "move a limit to a group (at its first window boundary a notice from now)",
	detail: `place writes a new version of the group map that places LIMIT on GROUP, and
copies the limit to GROUP. The window in progress when the version takes
effect stays with the old group to its end; the next window is GROUP's.
Changes of the limit are made at GROUP from now on. If quotactl stops
between the map and the copy, run the same command again.`,
	flags: func(f *flagSet) action {
		var reason string
		f.stringVar(&reason, "reason", "`TEXT`: why (recorded with the map version; required)")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) != 2 {
				return usagef("want LIMIT GROUP, got %d arguments", len(args))
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			return e.changeGroups(ctx, groupmap.Change{Place: map[string]string{args[0]: args[1]}, Reason: reason})
		}
	},
}

var groupsUnplaceCmd = &command{
	name:    "unplace",
	args:    "LIMIT --reason TEXT",
	summary: "give a placed limit back to hashing (moving it if its hash names another group)",
	flags: func(f *flagSet) action {
		var reason string
		f.stringVar(&reason, "reason", "`TEXT`: why (required)")
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			return e.changeGroups(ctx, groupmap.Change{Unplace: []string{id}, Reason: reason})
		}
	},
}

var groupsSetCmd = &command{
	name:    "set",
	args:    "NAME=ADDR[,ADDR...] ... --reason TEXT",
	summary: "replace the groups (add or remove one), moving the limits whose hash changes",
	detail: `set names every group of the new version with its allocators' addresses,
e.g. set g1=10.0.0.1:7400,10.0.0.2:7400 g2=10.0.1.1:7400. Adding a group
moves to it about 1/n of the limits and moves nothing between the other
groups; every moved limit is copied to its new group.`,
	flags: func(f *flagSet) action {
		var reason string
		f.stringVar(&reason, "reason", "`TEXT`: why (required)")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) == 0 {
				return usagef("want at least one NAME=ADDR[,ADDR...]")
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			var groups []groupmap.Group
			for _, a := range args {
				name, addrs, ok := strings.Cut(a, "=")
				if !ok || name == "" || addrs == "" {
					return usagef("%q: want NAME=ADDR[,ADDR...]", a)
				}
				for _, ad := range strings.Split(addrs, ",") {
					if err := checkAddr(ad); err != nil {
						return usagef("%s: %v", name, err)
					}
				}
				groups = append(groups, groupmap.Group{Name: name, Allocators: strings.Split(addrs, ",")})
			}
			return e.changeGroups(ctx, groupmap.Change{Groups: groups, Reason: reason})
		}
	},
}

// changeGroups writes a new version of the map and copies every limit
// whose group changes to its new group. The limits are read just before
// the map is written; from the write on, their old groups refuse changes
// of them, so the copies are the last versions.
func (e *env) changeGroups(ctx context.Context, change groupmap.Change) error {
	g, err := e.groupMap(ctx)
	if err != nil {
		return err
	}
	if !g.active() && g.group == "" {
		return fmt.Errorf("allocator %s is not one of several allocator groups (leasehold allocator --group)", e.addr)
	}
	// Check the change locally first: a bad group name is a usage error
	// before anything is read.
	next, err := g.m.Next(time.Now(), time.Minute, limitspec.LongestWindow, change)
	if err != nil {
		return usagef("%v", err)
	}
	var live []*pb.Limit
	if g.active() {
		if live, err = e.listLimits(ctx, "", 1000); err != nil {
			return err
		}
	}
	type move struct {
		l        *pb.Limit
		from, to string
	}
	var moves []move
	var plans []*pb.Limit
	nv := next.Current()
	for _, l := range live {
		if planbind.IsPlan(l.GetId()) {
			plans = append(plans, l) // in every group: copied to every group of the new version below
			continue
		}
		if from, to := g.ownerOf(l.GetId()), nv.Owner(l.GetId()); from != to {
			moves = append(moves, move{l, from, to})
		}
	}
	req := &pb.ChangeGroupMapRequest{ExpectedRevision: g.rev, Place: change.Place, Unplace: change.Unplace, Reason: change.Reason}
	for _, gr := range change.Groups {
		req.Groups = append(req.Groups, &pb.GroupSpec{Name: gr.Name, Allocators: gr.Allocators})
	}
	var resp *pb.ChangeGroupMapResponse
	if err := e.adminAt(ctx, e.addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
		resp, err = c.ChangeGroupMap(ctx, req, opt)
		return err
	}); err != nil {
		return err
	}
	m, err := groupmap.Decode(resp.GetMap())
	if err != nil {
		return fmt.Errorf("the allocator sent a group map that does not decode: %v", err)
	}
	e.groups = groupState{loaded: true, m: m, rev: resp.GetRevision(), group: g.group}
	v := m.Current()
	fmt.Fprintf(e.stdout, "group map version %d written: governs windows starting from %s\n", v.Number, v.From.UTC().Format(time.RFC3339))
	ready := map[string]bool{}
	for _, mv := range moves {
		l := limitToCopy(mv.l)
		addr, err := e.addrOf(&e.groups, mv.to)
		if err != nil {
			return err
		}
		if !ready[mv.to] {
			// The group takes the limit once it has read the new map
			// (its allocators re-read it every second).
			if err := e.waitMapRevision(ctx, addr, resp.GetRevision()); err != nil {
				return fmt.Errorf("allocator group %s has not read the new group map (run the command again to finish the move): %w", mv.to, err)
			}
			ready[mv.to] = true
		}
		err = e.adminAt(ctx, addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
			_, err := c.PutLimit(ctx, &pb.PutLimitRequest{Limit: l, Reason: "moved from allocator group " + mv.from + ": " + change.Reason,
				Effective: pb.Effective_EFFECTIVE_NOW}, opt)
			return err
		})
		if err != nil {
			return fmt.Errorf("copying %s to group %s (run the command again to finish the move): %w", l.GetId(), mv.to, err)
		}
		fmt.Fprintf(e.stdout, "moved %s: group %s -> %s\n", l.GetId(), mv.from, mv.to)
	}
	if len(moves) == 0 {
		fmt.Fprintln(e.stdout, "no limit changes group")
	}
	// Every group holds every plan (a tenant is granted by the group its
	// id hashes to): a group the new version adds gets each plan. A group
	// that has the plan keeps its own version, even one that differs
	// (plans get flags it; plans set writes the plan to every group).
	for _, gr := range v.Groups {
		addr, err := e.addrOf(&e.groups, gr.Name)
		if err != nil {
			return err
		}
		for _, p := range plans {
			if !ready[gr.Name] {
				if err := e.waitMapRevision(ctx, addr, resp.GetRevision()); err != nil {
					return fmt.Errorf("allocator group %s has not read the new group map (run the command again to copy the plans): %w", gr.Name, err)
				}
				ready[gr.Name] = true
			}
			l := limitToCopy(p)
			if o := l.GetOverride(); o != nil {
				// An override is the allocator's to set: the copy is the
				// version it returns to (a group created during an
				// override gets the override with limits override).
				l = limitToCopy(o.GetAfter())
				l.Id = p.GetId()
			}
			copied := false
			err = e.adminAt(ctx, addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
				_, err := c.GetLimit(ctx, &pb.GetLimitRequest{Id: l.GetId()}, opt)
				if status.Code(err) != codes.NotFound {
					return err // the group has the plan (or the read failed)
				}
				_, err = c.PutLimit(ctx, &pb.PutLimitRequest{Limit: l, Reason: "plan copied to allocator group " + gr.Name + ": " + change.Reason,
					Effective: pb.Effective_EFFECTIVE_NOW}, opt)
				copied = err == nil
				return err
			})
			if err != nil {
				return fmt.Errorf("copying plan %s to group %s (run the command again to finish): %w", l.GetId(), gr.Name, err)
			}
			if copied {
				fmt.Fprintf(e.stdout, "copied plan %s to group %s\n", l.GetId(), gr.Name)
			}
		}
	}
	return nil
}

// waitMapRevision waits (with backoff, up to 15 s) until the allocator
// at addr has read the group map at revision rev or later.
func (e *env) waitMapRevision(ctx context.Context, addr string, rev int64) error {
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(500*time.Millisecond), backoff.WithMaxElapsedTime(15*time.Second))
	return backoff.Retry(func() error {
		var resp *pb.GetGroupMapResponse
		err := e.adminAt(ctx, addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
			resp, err = c.GetGroupMap(ctx, &pb.GetGroupMapRequest{}, opt)
			return err
		})
		switch {
		case err != nil:
			return backoff.Permanent(err)
		case resp.GetRevision() < rev:
			return fmt.Errorf("its map is at revision %d, not yet %d", resp.GetRevision(), rev)
		}
		return nil
	}, backoff.WithContext(bo, ctx))
}

// limitToCopy is a limit as its new group is given it: the definition in
// force from now, without the fields the allocator sets.
func limitToCopy(l *pb.Limit) *pb.Limit {
	c := proto.Clone(l).(*pb.Limit)
	c.Version, c.EffectiveFrom, c.Previous = 0, nil, nil
	return c
}

// applyByGroup applies req where its limits live: without groups one
// call, all or nothing; with groups one call per group of the changes that
// live in it (a plan's change in every group), each all or nothing (a failure in a later group leaves the
// earlier groups' parts applied, and says so). The answers are joined in
// group order; code is the failed call's.
func (e *env) applyByGroup(ctx context.Context, req *pb.ApplyLimitsRequest) (*pb.ApplyLimitsResponse, codes.Code, error) {
	// First as one call at --allocator: without groups (or when every
	// limit lives in its group) that is all. A plan lives in every group:
	// a file with plans is split at once when there are groups.
	var resp *pb.ApplyLimitsResponse
	var code codes.Code
	var trailer []string
	hasPlans := false
	for _, ch := range req.GetChanges() {
		hasPlans = hasPlans || planbind.IsPlan(ch.GetDelete()) || planbind.IsPlan(ch.GetPut().GetId())
	}
	var err error
	var g *groupState
	if hasPlans {
		if g, err = e.groupMap(ctx); err != nil {
			return nil, status.Code(err), err
		}
	}
	if g == nil || !g.active() {
		err = e.adminAt(ctx, e.addr, false, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
			var md metadata.MD
			resp, err = c.ApplyLimits(ctx, req, opt, grpc.Trailer(&md))
			code, trailer = status.Code(err), md.Get(vocab.GroupMetadataKey)
			return err
		})
		if err == nil || code != codes.FailedPrecondition || len(trailer) == 0 {
			return resp, code, err
		}
		if g, err = e.groupMap(ctx); err != nil {
			return nil, status.Code(err), err
		}
	}
	parts := map[string]*pb.ApplyLimitsRequest{}
	var order []string
	for _, ch := range req.GetChanges() {
		id := ch.GetDelete()
		if p := ch.GetPut(); p != nil {
			id = p.GetId()
		}
		owners := []string{g.ownerOf(id)}
		if planbind.IsPlan(id) && g.active() {
			owners = owners[:0] // a plan: every group's
			for _, gr := range g.m.Current().Groups {
				owners = append(owners, gr.Name)
			}
		}
		for _, owner := range owners {
			part := parts[owner]
			if part == nil {
				part = &pb.ApplyLimitsRequest{Reason: req.Reason, Effective: req.Effective, DryRun: req.DryRun}
				parts[owner] = part
				order = append(order, owner)
			}
			part.Changes = append(part.Changes, ch)
		}
	}
	sort.Strings(order)
	out := &pb.ApplyLimitsResponse{}
	var ids []string
	for i, owner := range order {
		call := func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
			resp, err = c.ApplyLimits(ctx, parts[owner], opt)
			code = status.Code(err)
			return err
		}
		if owner == "" {
			err = e.admin(ctx, call)
		} else {
			var addr string
			if addr, err = e.addrOf(g, owner); err == nil {
				err = e.adminAt(ctx, addr, false, call)
			}
		}
		if err != nil {
			if i > 0 && !req.DryRun {
				err = fmt.Errorf("allocator group %s: %w (the changes of groups %s were applied)", owner, err, strings.Join(order[:i], ", "))
			}
			return nil, code, err
		}
		out.Effects = append(out.Effects, resp.GetEffects()...)
		out.Limits = append(out.Limits, resp.GetLimits()...)
		if resp.GetChangeId() != "" {
			ids = append(ids, resp.GetChangeId())
		}
	}
	out.ChangeId = strings.Join(ids, ",")
	out.Effects, out.Limits = onePerPlan(out.Effects, out.Limits)
	return out, codes.OK, nil
}

// onePerPlan keeps one answer per plan of an apply made in every group:
// the first group's limit, and the effects summed (each group counts the
// tenants whose ids hash to it).
func onePerPlan(effs []*pb.ChangeEffect, ls []*pb.Limit) ([]*pb.ChangeEffect, []*pb.Limit) {
	var outE []*pb.ChangeEffect
	seen := map[string]*pb.ChangeEffect{}
	for _, ef := range effs {
		id := ef.GetLimitId()
		if !planbind.IsPlan(id) {
			outE = append(outE, ef)
			continue
		}
		if acc, ok := seen[id]; ok {
			sumEffects(acc, ef)
			continue
		}
		seen[id] = ef
		outE = append(outE, ef)
	}
	var outL []*pb.Limit
	have := map[string]bool{}
	for _, l := range ls {
		if planbind.IsPlan(l.GetId()) {
			if have[l.GetId()] {
				continue
			}
			have[l.GetId()] = true
		}
		outL = append(outL, l)
	}
	return outE, outL
}
