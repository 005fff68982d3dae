package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/planbind"
	pb "leasehold/proto/leasehold/v1"
)

// Plans with allocator groups (docs/design.md, "Plans with allocator
// groups"). A tenant is granted by the group its id hashes to, so every
// group holds every plan: quotactl writes a plan to each group of the
// newest map version, in name order, one call per group (a group's own
// change is all or nothing, with its own version and history), and goes
// on past a group that fails so that as many as possible have it. A
// partial write says which groups have the change (and at which version)
// and which not, and exits 1; the same command again completes it: a
// group that has the plan as given answers unchanged. Reads show each
// group's version and flag copies that differ.

// planGroupNames returns the groups a plan is written to and read from:
// every group of the newest map version, in name order; nil when id is
// not a plan or the allocators are not groups.
func (e *env) planGroupNames(ctx context.Context, id string) ([]string, *groupState, error) {
	if !planbind.IsPlan(id) {
		return nil, nil, nil
	}
	g, err := e.groupMap(ctx)
	if err != nil || !g.active() {
		return nil, nil, err
	}
	var names []string
	for _, gr := range g.m.Current().Groups {
		names = append(names, gr.Name)
	}
	slices.Sort(names)
	return names, g, nil
}

// atGroup calls rpc at group's allocator (its leader, not another group).
func (e *env) atGroup(ctx context.Context, g *groupState, group string, rpc adminRPC) error {
	addr, err := e.addrOf(g, group)
	if err != nil {
		return err
	}
	if group == g.group {
		return e.adminAt(ctx, e.addr, false, rpc)
	}
	return e.adminAt(ctx, addr, false, rpc)
}

// planCopy is one group's answer about a plan.
type planCopy struct {
	group string
	limit *pb.Limit // nil: the group has none (or failed)
	err   error
}

// groupsRow formats the groups' versions of a plan for a "groups" row:
// "a v3, b v3", with copies that differ (or are missing) flagged.
func groupsRow(copies []planCopy) string {
	var parts []string
	var first *pb.Limit
	differ := false
	for _, c := range copies {
		switch {
		case c.err != nil:
			parts = append(parts, c.group+" unreachable")
			differ = true
		case c.limit == nil:
			parts = append(parts, c.group+" missing")
			differ = true
		default:
			parts = append(parts, fmt.Sprintf("%s v%d", c.group, c.limit.GetVersion()))
			if first == nil {
				first = c.limit
			} else if len(diffLimits(forCompare(first), forCompare(c.limit))) > 0 {
				differ = true
			}
		}
	}
	s := strings.Join(parts, ", ")
	if differ {
		s += " (DIFFER: write the plan again, e.g. plans set, to make every group hold it)"
	}
	return s
}

// planCopies reads plan id at every group.
func (e *env) planCopies(ctx context.Context, g *groupState, names []string, id string) []planCopy {
	out := make([]planCopy, len(names))
	for i, n := range names {
		out[i].group = n
		out[i].err = e.atGroup(ctx, g, n, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
			resp, err := c.GetLimit(ctx, &pb.GetLimitRequest{Id: id}, opt)
			if status.Code(err) == codes.NotFound {
				return nil // this group has none: limit stays nil
			}
			if err == nil {
				out[i].limit = resp.GetLimit()
			}
			return err
		})
	}
	return out
}

// planEverywhere makes one change of a plan at every group: call makes it
// at one group and returns the plan as that group stored it (nil for a
// delete) and the change's effect (a dry run's). It returns the first
// group's plan, the effects summed over the groups (a plan's tenants live
// in the group their id hashes to), and an error naming the groups that
// have the change and those that do not.
func (e *env) planEverywhere(ctx context.Context, g *groupState, names []string, id string,
	call func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (*pb.Limit, *pb.ChangeEffect, error)) (*pb.Limit, *pb.ChangeEffect, []planCopy, error) {
	var first *pb.Limit
	var eff *pb.ChangeEffect
	copies := make([]planCopy, len(names))
	var done, failed []string
	var errs []error
	for i, n := range names {
		copies[i].group = n
		err := e.atGroup(ctx, g, n, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
			l, ef, err := call(ctx, c, opt)
			if err != nil {
				return err
			}
			copies[i].limit = l
			if first == nil {
				first = l
			}
			eff = sumEffects(eff, ef)
			return nil
		})
		if err != nil {
			copies[i].err = err
			failed = append(failed, n)
			errs = append(errs, fmt.Errorf("allocator group %s: %w", n, err))
			continue
		}
		v := ""
		if l := copies[i].limit; l != nil {
			v = fmt.Sprintf(" (version %d)", l.GetVersion())
		}
		done = append(done, n+v)
	}
	if len(failed) == 0 {
		return first, eff, copies, nil
	}
	err := errors.Join(errs...)
	if len(done) > 0 {
		err = fmt.Errorf("%w\nplan %s: changed in allocator groups %s; NOT in %s: the groups' copies differ until the same command succeeds again "+
			"(groups that have the change answer unchanged)", err, id, strings.Join(done, ", "), strings.Join(failed, ", "))
	}
	return nil, nil, copies, err
}

// sumEffects adds a group's effect of a plan change to the others': the
// tenants on the plan (each counted by its own group) and those that would
// start being denied.
func sumEffects(acc, ef *pb.ChangeEffect) *pb.ChangeEffect {
	if ef == nil {
		return acc
	}
	if acc == nil {
		return ef
	}
	acc.PlanTenants += ef.GetPlanTenants()
	acc.PlanTenantsDenyingCount += ef.GetPlanTenantsDenyingCount()
	for _, d := range ef.GetPlanTenantsDenying() {
		if len(acc.PlanTenantsDenying) < maxDenyingShown && !slices.Contains(acc.PlanTenantsDenying, d) {
			acc.PlanTenantsDenying = append(acc.PlanTenantsDenying, d)
		}
	}
	return acc
}

// maxDenyingShown is the allocator's cap on plan_tenants_denying.
const maxDenyingShown = 100

// forCompare is a group's copy of a plan as compared with another's: an
// override's end is each group's change time plus --for on its own clock,
// so ends a moment apart are the same override.
func forCompare(l *pb.Limit) *pb.Limit {
	if l.GetOverride() == nil {
		return l
	}
	c := proto.Clone(l).(*pb.Limit)
	c.Override.EndsAt = nil
	return c
}
