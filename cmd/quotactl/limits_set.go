package main

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

var limitsSetCmd = &command{
	name:    "set",
	args:    "ID (--limit N --window DUR | --rate N/PERIOD --burst N) --regions R[,R...] --mode strict|bounded [flags]",
	summary: "create or replace a limit and print it with its new version",
	detail: `set writes the whole limit: settings not given take their defaults, they
are not kept from the stored version. Use --expect-version to make sure you
replace the version you read (0: create only). The allocator checks every
field; its message names the field it refused. --reason is required and
recorded in the limit's history. A change to an existing limit governs from
the next window boundary unless --effective now. --dry-run prints what would
change and its effect on the current window, and writes nothing. --rate and
--burst describe a bucket limit (rate and burst) instead of a window limit;
--concurrency N a concurrency limit (at most N slots held at once, all
regions together; holders acquire, heartbeat and release slots through the
agent).`,
	flags: func(f *flagSet) action { return setLimitFlags(f, false) },
}

// setLimitFlags declares the flags of limits set, or (plan) of plans set:
// a plan is a limit named plans/NAME that binds ids (--bind) and has
// contracts (--contract), with no hash tag but {id}.
func setLimitFlags(f *flagSet, plan bool) action {
	l := &pb.Limit{Lease: &pb.LeaseSettings{}}
	var window, phase, ttl, grace time.Duration
	var expect int64
	f.tokensVar(&l.LimitTokens, "limit", "`N`: G, the global budget per window, all regions together (required for a window limit)", 1)
	f.durationVar(&window, "window", "`DUR`: the window W, e.g. 1s, 1m, 1h (required for a window limit, >= 1s)")
	var cal pb.CalendarWindows
	f.value("calendar", "`day|week|month|year`: calendar windows in --zone instead of --window: G per local day, ISO week, month or year, reset at local midnight", func(s string) error {
		if _, err := lease.ParseUnit(s); err != nil {
			return errors.New("want day, week, month or year")
		}
		cal.Unit = s
		return nil
	})
	f.stringVar(&cal.Zone, "zone", "`NAME`: the IANA time zone of --calendar, e.g. Europe/Berlin")
	f.durationVar(&phase, "window-phase", "`DUR`: the windows' phase offset, 0 <= DUR < the window, whole ms: windows start at k x W + DUR, so that limits do not all reset at once (default 0: windows start at multiples of W)")
	var rate, slots int64
	var period time.Duration
	if plan {
		l.Contracts = map[string]*pb.Contract{}
		f.value("contract", "`TENANT=N|TENANT=FIELD=VALUE ...`: a tenant's contract: what it replaces of the plan for that tenant, its G (tenant/atlas=3000) or any of limit, rate, burst, mode, regions, fallback, window, ttl, min-chunk, max-chunk, standing, shadow ('tenant/atlas=limit=3000 mode=bounded fallback=eu=local:50'; a bucket plan's 'tenant/atlas=rate=100 burst=300'); the tenant must be bound to the plan; repeatable", func(s string) error {
			return parseContract(s, l.Contracts)
		})
		f.listVar(&l.Binds, "bind", "`PATTERN|ID,...`: the ids the plan defines: a pattern, e.g. tenant/{id} (every id tenant/X without a limit of its own is on the plan from its first request), or one tenant's id, e.g. tenant/bigco (on this plan whatever pattern names it); repeatable")
	}
	f.value("rate", "`N/PERIOD`: a bucket limit's rate R, all regions together, e.g. 100/s or 5/250ms; with --burst, instead of --limit and --window", func(s string) error {
		n, p, err := limitspec.ParseRate(s)
		rate, period = n, p
		return err
	})
	f.tokensVar(&l.BurstTokens, "burst", "`N`: a bucket limit's burst B, all regions together (required with --rate)", 1)
	f.tokensVar(&slots, "concurrency", "`N`: a concurrency limit: at most N slots held at once, all regions together; instead of --limit and --window (--ttl is then its slot shares' ttl, 1s..10m, default 10s)", 1)
	f.listVar(&l.Regions, "regions", "`R,...`: regions that spend the limit, e.g. eu,us (required; repeatable)")
	f.value("mode", "`strict|bounded`: strict admits only leased tokens; bounded allows fallbacks (required)", func(s string) error {
		m, err := parseMode(s)
		l.Mode = m
		return err
	})
	l.Fallback = map[string]*pb.Fallback{}
	f.value("fallback", "`REGION=closed|local:A|open`: what a region admits when it cannot get leases; repeatable or comma separated; a region not named is closed", func(s string) error {
		return parseFallbacks(s, l.Fallback)
	})
	f.durationVar(&ttl, "ttl", "`DUR`: lease lifetime, <= the window (default: a quarter of the window)")
	f.tokensVar(&l.Lease.MinChunk, "min-chunk", "`N`: smallest grant while the pool has tokens (default 1)", 0)
	f.tokensVar(&l.Lease.MaxChunk, "max-chunk", "`N`: largest single grant; 0 means no cap (default 0)", 0)
	f.tokensVar(&l.Lease.Standing, "standing", "`N`: each region's standing share of every window, counted as granted from the window's start so a region decides a limit's first Checks without waiting for a lease; N x regions <= limit; changes only at a window boundary (default 0: none)", 0)
	f.stringVar(&l.Owner, "owner", "`S`: who owns the limit, e.g. a team or a contract")
	f.stringVar(&l.Description, "description", "`S`: free text")
	if !plan {
		f.stringVar(&l.HashTag, "hash-tag", "`T`: the Redis hash tag of the limit's keys: limits checked together in one CheckMulti share it on Redis Cluster, e.g. the tenant (default: the id; cannot change later)")
	} else {
		f.stringVar(&l.HashTag, "hash-tag", "`{id}`: tag each tenant's keys with its id's last segment, so that a tenant's limits under several plans (tenant/X, tenant-month/X) can be checked together in one CheckMulti on Redis Cluster (default: none, each tenant's keys under its own id; cannot change later); the only tag a plan takes")
	}
	f.durationVar(&grace, "settle-grace", "`DUR`: how long after a settle-later Check its Settle is taken, 1s..1m (default 30s)")
	f.value("debt-policy", "`carry|forgive`: a settle-later overrun the window cannot hold is paid by the region's next window (carry, the default) or only counted (forgive)", func(s string) error {
		p, err := parseDebtPolicy(s)
		l.DebtPolicy = p
		return err
	})
	f.boolVar(&l.Shadow, "shadow", "shadow mode: decide every request as if enforced, admit it anyway, and count (and answer) the ones it would have denied")
	l.Tags = map[string]string{}
	f.value("tag", "`KEY=VALUE`: a tag; repeatable", func(s string) error { return parseTag(s, l.Tags) })
	f.int64Var(&expect, "expect-version", "`V`: write only if the stored version is V (0: only if the limit does not exist)")
	ch := registerChangeFlags(f, true)

	return func(ctx context.Context, e *env, args []string) error {
		id, err := oneID(args)
		if err != nil {
			return err
		}
		if plan {
			if id, err = planID(id); err != nil {
				return err
			}
		}
		if f.isSet("concurrency") {
			// A concurrency limit: N slots, no window.
			if f.isSet("limit") || f.isSet("window") || f.isSet("window-phase") || f.isSet("calendar") || f.isSet("zone") || f.isSet("rate") || f.isSet("burst") {
				return usagef("--concurrency makes a concurrency limit: give it instead of --limit and --window (and not with --window-phase, --rate or --burst)")
			}
			if err := f.require("regions", "mode", "reason"); err != nil {
				return err
			}
			l.Kind, l.LimitTokens = pb.LimitKind_LIMIT_KIND_CONCURRENCY, slots
		} else if f.isSet("rate") {
			// A bucket limit: rate and burst, no window.
			if f.isSet("limit") || f.isSet("window") || f.isSet("window-phase") || f.isSet("calendar") || f.isSet("zone") {
				return usagef("--rate and --burst make a bucket limit: give them instead of --limit and --window (and --window-phase)")
			}
			if err := f.require("burst", "regions", "mode", "reason"); err != nil {
				return err
			}
			l.Kind, l.RateTokens, l.RatePeriod = pb.LimitKind_LIMIT_KIND_BUCKET, rate, durationpb.New(period)
		} else if f.isSet("calendar") || f.isSet("zone") {
			// Calendar windows: G per local day, week, month or year
			// in --zone (the allocator checks the unit and the zone).
			if err := f.require("limit", "calendar", "zone", "regions", "mode", "reason"); err != nil {
				return err
			}
			if f.isSet("window") || f.isSet("window-phase") || f.isSet("burst") {
				return usagef("--calendar and --zone give calendar windows: not with --window, --window-phase or --burst")
			}
			l.Calendar = &cal
		} else {
			if f.isSet("burst") {
				return usagef("--burst is for a bucket limit: give --rate too")
			}
			if err := f.require("limit", "window", "regions", "mode", "reason"); err != nil {
				return err
			}
			l.Window = durationpb.New(window)
			if f.isSet("window-phase") {
				l.WindowPhase = durationpb.New(phase)
			}
		}
		l.Id = id
		if f.isSet("ttl") {
			l.Lease.Ttl = durationpb.New(ttl)
		}
		if f.isSet("settle-grace") {
			l.SettleGrace = durationpb.New(grace)
		}
		req := &pb.PutLimitRequest{Limit: l, Reason: ch.reason, Effective: ch.effective, DryRun: ch.dryRun}
		if f.isSet("expect-version") {
			req.ExpectedVersion = &expect
		}
		names, g, err := e.planGroupNames(ctx, id)
		if err != nil {
			return err
		}
		if names != nil {
			// A plan with allocator groups: written to every group.
			if req.ExpectedVersion != nil {
				return usagef("--expect-version: a plan's version is per allocator group; write it without (plans get shows each group's)")
			}
			l, eff, copies, err := e.planEverywhere(ctx, g, names, id, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (*pb.Limit, *pb.ChangeEffect, error) {
				resp, err := c.PutLimit(ctx, req, opt)
				return resp.GetLimit(), resp.GetEffect(), err
			})
			if err != nil {
				return err
			}
			if ch.dryRun {
				return e.printDryRun(&pb.PutLimitResponse{Limit: l, Effect: eff}, eff)
			}
			e.planGroups = groupsRow(copies)
			return e.printLimit(l)
		}
		var resp *pb.PutLimitResponse
		err = e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
			resp, err = c.PutLimit(ctx, req, opt)
			return err
		})
		if err != nil {
			return err
		}
		if ch.dryRun {
			return e.printDryRun(resp, resp.GetEffect())
		}
		return e.printLimit(resp.GetLimit())
	}
}
