package limitspec

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// checkPlan checks what makes a limit a plan (docs/plans.md): an id
// "plans/<name>" and its binds, or, on any other limit, no binds. A
// plan's hash tag is "{id}" or none (planbind.TenantTag). A plan may be
// of any kind: window, bucket or concurrency.
func checkPlan(l *pb.Limit) error {
	if l.Plan != "" {
		return fieldErr("limit.plan", "is set on limits resolved from a plan, never in requests")
	}
	if !planbind.IsPlan(l.Id) {
		if len(l.Binds) > 0 {
			return fieldErr("limit.binds", "only a plan (a limit id %q) binds ids; %q is a limit", planbind.Namespace+"<name>", l.Id)
		}
		if len(l.Contracts) > 0 {
			return fieldErr("limit.contracts", "only a plan (a limit id %q) has contracts; %q is a limit", planbind.Namespace+"<name>", l.Id)
		}
		return nil
	}
	if strings.Count(l.Id, "/") != 1 {
		return fieldErr("limit.id", "%q: a plan is named %q, one segment after %q", l.Id, planbind.Namespace+"<name>", planbind.Namespace)
	}
	if l.HashTag != "" && l.HashTag != planbind.Placeholder {
		return fieldErr("limit.hash_tag", "a plan's hash tag is %s (each tenant's keys tagged with its id's last segment) or none: "+
			"one tag for every tenant would put them all in one Redis Cluster slot", planbind.Placeholder)
	}
	seen := map[string]int{}
	for i, b := range l.Binds {
		f := fmt.Sprintf("limit.binds[%d]", i)
		key, _, err := planbind.ParseBind(b)
		if err != nil {
			return fieldErr(f, "%v", err)
		}
		if j, dup := seen[key]; dup {
			return fieldErr(f, "%q is also limit.binds[%d]", b, j)
		}
		seen[key] = i
	}
	return checkContracts(l)
}

// checkContracts checks a plan's contracts: each for a tenant the plan
// binds (by pattern or by id), with a G of its own.
func checkContracts(l *pb.Limit) error {
	if len(l.Contracts) == 0 {
		return nil
	}
	tbl := planbind.NewTable([]*pb.Limit{l})
	for _, id := range slices.Sorted(maps.Keys(l.Contracts)) {
		f := "limit.contracts[" + id + "]"
		c := l.Contracts[id]
		if err := vocab.ValidateLimitID(f, id); err != nil {
			return err
		}
		if p, ok := tbl.Match(id); !ok || p != l.Id {
			return fieldErr(f, "%q is not bound to this plan: bind it (a pattern or its id) first", id)
		}
		if c == nil {
			return fieldErr(f, "required")
		}
		if contractEmpty(c) {
			return fieldErr(f, "replaces nothing: set at least one of limit_tokens, rate_tokens, burst_tokens, mode, regions, fallback, lease, shadow, window")
		}
		// A bucket plan's rate and burst: checked here for their sign (0
		// keeps the plan's), then with the tenant's limit as any limit's
		// (a window or concurrency plan refuses them there).
		if c.RateTokens != 0 {
			if err := vocab.ValidateTokens(f+".rate_tokens", c.RateTokens, 1); err != nil {
				return err
			}
		}
		if c.BurstTokens != 0 {
			if err := vocab.ValidateTokens(f+".burst_tokens", c.BurstTokens, 1); err != nil {
				return err
			}
		}
		if c.LimitTokens != 0 {
			if err := vocab.ValidateTokens(f+".limit_tokens", c.LimitTokens, 1); err != nil {
				return err
			}
			if m := l.GetLease().GetMinChunk(); c.Lease == nil && c.LimitTokens < m {
				return fieldErr(f+".limit_tokens", "must be >= the plan's lease.min_chunk (%d), got %d", m, c.LimitTokens)
			}
		}
	}
	return nil
}

func contractEmpty(c *pb.Contract) bool {
	return c.LimitTokens == 0 && c.Mode == pb.Mode_MODE_UNSPECIFIED && len(c.Regions) == 0 && len(c.Fallback) == 0 &&
		c.Lease == nil && c.Shadow == nil && c.Window == nil && c.RateTokens == 0 && c.BurstTokens == 0
}

// checkContractLimits validates each tenant's limit as its contract makes
// it: the plan as sent (raw, before defaults) resolved for the tenant, by
// ValidateLimit itself, so a contract is held to every rule a limit is.
// An error names the contract's field: limit.contracts[<id>].<field>.
// The stored contract is normalized: its regions sorted and, when it
// replaces the window or the lease settings, the tenant's lease settings
// with their defaults filled in (a ttl left unset is a quarter of the
// tenant's window, not of the plan's).
func checkContractLimits(l, raw *pb.Limit, known []string) error {
	for _, id := range slices.Sorted(maps.Keys(l.Contracts)) {
		r := planbind.Resolve(raw, id)
		r.Plan = ""
		v, err := ValidateLimit(r, known)
		if err != nil {
			var fe *vocab.FieldError
			if errors.As(err, &fe) {
				field := "limit.contracts[" + id + "]" + strings.TrimPrefix(fe.Field, "limit")
				return fieldErr(field, "%s (the tenant's limit under its contract)", fe.Reason)
			}
			return err
		}
		c := l.Contracts[id]
		if len(c.Regions) > 0 {
			c.Regions = v.Regions
		}
		if c.Window != nil || c.Lease != nil {
			c.Lease = v.Lease // defaults filled in, as a limit's
		}
	}
	return nil
}
