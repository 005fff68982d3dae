package limitspec

import (
	"fmt"
	"strings"

	"leasehold/internal/planbind"
	pb "leasehold/proto/leasehold/v1"
)

// checkPlan checks what makes a limit a plan (docs/plans.md): an id
// "plans/<name>" and its binds, or, on any other limit, no binds. What
// this version of plans does not carry to the tenants' limits is
// refused, naming the field: a hash tag (every tenant's keys are its
// own) and bucket plans.
func checkPlan(l *pb.Limit) error {
	if l.Plan != "" {
		return fieldErr("limit.plan", "is set on limits resolved from a plan, never in requests")
	}
	if !planbind.IsPlan(l.Id) {
		if len(l.Binds) > 0 {
			return fieldErr("limit.binds", "only a plan (a limit id %q) binds ids; %q is a limit", planbind.Namespace+"<name>", l.Id)
		}
		return nil
	}
	if strings.Count(l.Id, "/") != 1 {
		return fieldErr("limit.id", "%q: a plan is named %q, one segment after %q", l.Id, planbind.Namespace+"<name>", planbind.Namespace)
	}
	if l.HashTag != "" {
		return fieldErr("limit.hash_tag", "a plan has no hash tag: each tenant's limit keeps its keys under its own id")
	}
	if l.Kind != pb.LimitKind_LIMIT_KIND_UNSPECIFIED && l.Kind != pb.LimitKind_LIMIT_KIND_WINDOW {
		return fieldErr("limit.kind", "plans are window limits in this version")
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
	return nil
}
