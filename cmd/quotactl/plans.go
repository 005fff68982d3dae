package main

import (
	"context"
	"strings"

	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
)

// plansCmd groups the commands on plans (docs/plans.md).
var plansCmd = &command{
	name:    "plans",
	summary: "create, read and list plans: limit definitions many tenants share, each tenant's limit existing from its first request",
	detail: `A plan is a limit definition (G, window, regions, mode, fallbacks, lease
settings, shadow mode) that binds ids by pattern: with --bind tenant/{id},
every id tenant/X that has no limit of its own is limited by the plan from
its first request, with no limit to create per tenant; with --bind
tenant/bigco, that one tenant is on the plan whatever pattern names it (a
tenant-to-plan mapping). A plan is stored as
the limit plans/NAME: limits history, limits delete and limits files work
on it under that id.`,
	sub: []*command{plansSetCmd, plansGetCmd, plansListCmd},
}

// planID is the limit id of plan NAME (plans/NAME given whole is taken
// as is).
func planID(name string) (string, error) {
	id := name
	if !planbind.IsPlan(name) {
		id = planbind.Namespace + name
	}
	if strings.Count(id, "/") != 1 {
		return "", usagef("plan %q: a plan name is one segment of [A-Za-z0-9._-], e.g. pro", vocab.Cap(name, 64))
	}
	if err := vocab.ValidateLimitID("NAME", id); err != nil {
		return "", usagef("plan %q: use [A-Za-z0-9._-]", vocab.Cap(name, 64))
	}
	return id, nil
}

var plansSetCmd = &command{
	name:    "set",
	args:    "NAME (--limit N --window DUR | --rate N/PERIOD --burst N) --regions R[,R...] --mode strict|bounded --bind PATTERN [flags]",
	summary: "create or replace a plan and print it with its new version",
	detail: `set writes the whole plan, as limits set writes a limit. A change governs
every tenant on the plan from the next window boundary unless --effective
now; which ids it binds (--bind) changes at once. A pattern is bound to
one plan: the allocator refuses a second. A tenant with a limit of its own
keeps it: an explicit limit wins over the plan. --shadow tries a plan on
real traffic before it is enforced. --dry-run writes nothing and says how
many tenants used the plan recently and which of them admitted more in
their last window than the new limit (they would start being denied).
--rate and --burst make a bucket plan: every tenant it binds is a bucket
limit of that rate and burst; its changes govern at once.`,
	flags: func(f *flagSet) action { return setLimitFlags(f, true) },
}

var plansGetCmd = &command{
	name:    "get",
	args:    "NAME",
	summary: "print one plan",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			name, err := oneID(args)
			if err != nil {
				return err
			}
			id, err := planID(name)
			if err != nil {
				return err
			}
			return e.printStoredLimit(ctx, id)
		}
	},
}

var plansListCmd = &command{
	name:    "list",
	summary: "list the plans in name order",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			all, err := e.listLimits(ctx, planbind.Namespace, 1000)
			if err != nil {
				return err
			}
			names, g, err := e.planGroupNames(ctx, planbind.Namespace+"any")
			if err != nil {
				return err
			}
			if names != nil && !e.json {
				// Each group's version of each plan, copies that differ flagged.
				e.planGroupRows = map[string]string{}
				for _, l := range all {
					e.planGroupRows[l.GetId()] = groupsRow(e.planCopies(ctx, g, names, l.GetId()))
				}
			}
			return e.printPlans(all)
		}
	},
}
