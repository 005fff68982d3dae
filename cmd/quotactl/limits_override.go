package main

import (
	"context"
	"maps"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

var limitsOverrideCmd = &command{
	name:    "override",
	args:    "ID (--limit N | --rate N/PERIOD | --burst N | --concurrency N | --shadow | --enforce | --mode M | --fallback R=F | --ttl DUR) --for DUR --reason TEXT [--dry-run] | ID --end --reason TEXT",
	summary: "an emergency change that ends by itself: raise or cut G (R and B, N), switch shadow mode, the mode, fallbacks or the lease ttl, for a while",
	detail: `override changes a limit at once for --for (1s to 31 days) and then the
version in force before it governs again by itself, at its end time, on
whichever allocator leads then: nothing has to run at the end. It starts
from the version the override replaces (an override of an override keeps
the first one's version to return to and its own end time), changes only
what the flags say (--limit, --shadow or --enforce for a window limit;
--rate and --burst for a bucket limit; --concurrency for a concurrency
limit; --mode, --fallback and --ttl for any kind, named and parsed as for
limits set, except that --fallback changes only the regions it names),
and is recorded with --reason in the limit's history and the
audit log like any change. A bucket or concurrency limit's shares granted
during it are sized by it; those granted before keep what they were
granted until they expire (one share ttl). limits
get, the status page and the allocator's answers show it in force and its
end. --end ends an override now (the version before it governs again). A
later limits set or limits apply with --effective now also replaces it; one
for the next window is refused while an override is in force.`,
	flags: func(f *flagSet) action {
		var g int64
		var dur time.Duration
		var shadow, enforce, end bool
		f.tokensVar(&g, "limit", "`N`: G while the override is in force", 1)
		var rate, burst, slots int64
		var period time.Duration
		f.value("rate", "`N/PERIOD`: a bucket limit's R while the override is in force, in the limit's own period, e.g. 300/s", func(s string) error {
			n, p, err := limitspec.ParseRate(s)
			rate, period = n, p
			return err
		})
		f.tokensVar(&burst, "burst", "`N`: a bucket limit's B while the override is in force", 1)
		f.tokensVar(&slots, "concurrency", "`N`: a concurrency limit's N while the override is in force", 1)
		f.boolVar(&shadow, "shadow", "shadow mode while the override is in force (every request admitted, would-deny counted)")
		f.boolVar(&enforce, "enforce", "enforce while the override is in force (a limit in shadow mode)")
		f.durationVar(&dur, "for", "`DUR`: how long the override is in force, e.g. 30m, 2h (1s to 31 days)")
		f.boolVar(&end, "end", "end the override in force now")
		var mode pb.Mode
		f.value("mode", "`strict|bounded`: the mode while the override is in force", func(s string) error {
			m, err := parseMode(s)
			mode = m
			return err
		})
		fallback := map[string]*pb.Fallback{}
		f.value("fallback", "`REGION=closed|local:A|open`: a region's fallback while the override is in force (the regions not named keep theirs); repeatable or comma separated", func(s string) error {
			return parseFallbacks(s, fallback)
		})
		var ttl time.Duration
		f.durationVar(&ttl, "ttl", "`DUR`: the lease ttl (a bucket or concurrency limit's share ttl) while the override is in force")
		ch := registerChangeFlags(f, false)
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			changes := 0
			for _, n := range overrideChangeFlags {
				if f.isSet(n) {
					changes++
				}
			}
			switch {
			case end && (changes > 0 || f.isSet("for")):
				return usagef("--end takes no --limit, --rate, --burst, --concurrency, --shadow, --enforce, --mode, --fallback, --ttl or --for")
			case shadow && enforce:
				return usagef("--shadow and --enforce: one or the other")
			case !end && changes == 0:
				return usagef("say what the override changes: --limit, --rate, --burst, --concurrency, --shadow, --enforce, --mode, --fallback or --ttl (or --end to end one)")
			case !end && !f.isSet("for"):
				return usagef("--for is required: how long the override is in force")
			case f.isSet("ttl") && ttl <= 0:
				return usagef("--ttl: want a lease ttl above 0, got %s", formatDuration(durationpb.New(ttl)))
			case !end && (dur < time.Second || dur > limitspec.MaxWindow):
				return usagef("--for: want 1s to %s, got %s", formatDuration(durationpb.New(limitspec.MaxWindow)), formatDuration(durationpb.New(dur)))
			}
			// makeReq builds the override of cur (as a group stores it).
			makeReq := func(cur *pb.Limit) (*pb.PutLimitRequest, error) {
				base := cur
				if o := cur.GetOverride(); o.GetAfter() != nil {
					base = o.After
				} else if end {
					return nil, usagef("%s has no override in force", oneLine(id))
				}
				if err := overrideFlagsFit(f, base.GetKind(), id); err != nil {
					return nil, err
				}
				next := proto.Clone(base).(*pb.Limit)
				next.Id, next.Version, next.EffectiveFrom, next.Previous, next.Override = id, 0, nil, nil, nil
				if f.isSet("limit") {
					next.LimitTokens = g
				}
				if f.isSet("concurrency") {
					next.LimitTokens = slots
				}
				if f.isSet("rate") {
					// In another period than the limit's, the allocator
					// refuses it naming limit.rate_period.
					next.RateTokens, next.RatePeriod = rate, durationpb.New(period)
				}
				if f.isSet("burst") {
					next.BurstTokens = burst
				}
				if shadow || enforce {
					next.Shadow = shadow
				}
				if f.isSet("mode") {
					next.Mode = mode
				}
				if len(fallback) > 0 {
					// The regions named change; the others keep theirs.
					// A region the limit does not have is refused by the
					// allocator naming limit.fallback.
					if next.Fallback == nil {
						next.Fallback = map[string]*pb.Fallback{}
					}
					maps.Copy(next.Fallback, fallback)
				}
				if f.isSet("ttl") {
					if next.Lease == nil {
						next.Lease = &pb.LeaseSettings{}
					}
					next.Lease.Ttl = durationpb.New(ttl)
				}
				expect := cur.GetVersion()
				req := &pb.PutLimitRequest{Limit: next, Reason: ch.reason, Effective: pb.Effective_EFFECTIVE_NOW,
					DryRun: ch.dryRun, ExpectedVersion: &expect}
				if !end {
					req.OverrideFor = durationpb.New(dur)
				}
				return req, nil
			}
			names, gs, err := e.planGroupNames(ctx, id)
			if err != nil {
				return err
			}
			if names != nil {
				// A plan with allocator groups: overridden in every
				// group, each from its own copy (at its version); each
				// group's end is its change's time plus --for on its
				// own clock.
				var usage error
				l, eff, copies, err := e.planEverywhere(ctx, gs, names, id, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (*pb.Limit, *pb.ChangeEffect, error) {
					cur, err := c.GetLimit(ctx, &pb.GetLimitRequest{Id: id}, opt)
					if err != nil {
						return nil, nil, err
					}
					req, err := makeReq(cur.GetLimit())
					if err != nil {
						usage = err
						return nil, nil, err
					}
					resp, err := c.PutLimit(ctx, req, opt)
					return resp.GetLimit(), resp.GetEffect(), err
				})
				if usage != nil {
					return usage
				}
				if err != nil {
					return err
				}
				if ch.dryRun {
					return e.printDryRun(&pb.PutLimitResponse{Limit: l, Effect: eff}, eff)
				}
				e.planGroups = groupsRow(copies)
				return e.printLimit(l)
			}
			var cur *pb.Limit
			err = e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
				resp, err := c.GetLimit(ctx, &pb.GetLimitRequest{Id: id}, opt)
				cur = resp.GetLimit()
				return err
			})
			if err != nil {
				return err
			}
			req, err := makeReq(cur)
			if err != nil {
				return err
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
	},
}

// overrideChangeFlags are the flags that say what an override changes.
var overrideChangeFlags = []string{"limit", "rate", "burst", "concurrency", "shadow", "enforce", "mode", "fallback", "ttl"}

// overrideFlagsFit reports, as a usage error, an override flag that the
// kind of the limit id (as stored) has no use for.
func overrideFlagsFit(f *flagSet, kind pb.LimitKind, id string) error {
	var wrong []string
	switch kind {
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		wrong = []string{"limit", "concurrency"}
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		wrong = []string{"limit", "rate", "burst"}
	default:
		wrong = []string{"rate", "burst", "concurrency"}
	}
	for _, n := range wrong {
		if f.isSet(n) {
			return usagef("--%s: %s is a %s limit: override %s", n, oneLine(id), kindWord(kind), kindFlags(kind))
		}
	}
	return nil
}

// kindWord names a limit kind as quotactl prints it.
func kindWord(k pb.LimitKind) string {
	switch k {
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		return "bucket"
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		return "concurrency"
	}
	return "window"
}

// kindFlags names the override flags that change a limit's numbers.
func kindFlags(k pb.LimitKind) string {
	switch k {
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		return "--rate and --burst"
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		return "--concurrency"
	}
	return "--limit"
}
