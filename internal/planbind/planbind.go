// Package planbind resolves a limit id that no limit record names from the
// plans that bind it: the one pure resolution shared by the allocator and
// the region agents, so both decide the same limit for the same id from
// the same records (docs/plans.md, docs/design.md "Plans").
//
// A plan is a limit record whose id is "plans/<name>" (Namespace). Its
// binds field lists patterns "<prefix>{id}": every id "<prefix><segment>"
// (one segment, no "/") is the plan's limit, with the plan's settings and
// version, unless a limit record of that id exists (an explicit limit
// wins); and tenant ids, each the plan's whatever pattern names it (a
// tenant-to-plan mapping, which wins over patterns). A pattern or an id
// is bound to one plan; the allocator refuses a second.
//
// It imports the generated protobuf package and the standard library
// only. Table is not safe for concurrent use; its zero value is an empty
// table.
package planbind

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
)

// Namespace is the id prefix of plan records: "plans/<name>".
const Namespace = "plans/"

// Placeholder ends every pattern: it stands for one id segment.
const Placeholder = "{id}"

// MaxBinds bounds the binds of one plan (patterns and tenant ids).
const MaxBinds = 1000

// IsPlan reports whether id names a plan record (and so never a limit
// that is checked).
func IsPlan(id string) bool { return strings.HasPrefix(id, Namespace) }

// PatternPrefix checks a pattern "<prefix>{id}" and returns its prefix. The
// prefix is one or more id segments followed by "/", outside the plans'
// namespace.
func PatternPrefix(p string) (string, error) {
	prefix, ok := strings.CutSuffix(p, Placeholder)
	switch {
	case !ok:
		return "", fmt.Errorf("%q: a pattern ends with %s, e.g. \"tenant/{id}\"", clip(p), Placeholder)
	case prefix == "" || !strings.HasSuffix(prefix, "/"):
		return "", fmt.Errorf("%q: %s must follow a prefix ending in \"/\", e.g. \"tenant/{id}\"", clip(p), Placeholder)
	case IsPlan(prefix):
		return "", fmt.Errorf("%q: ids under %q name plans, not tenants", clip(p), Namespace)
	}
	for seg := range strings.SplitSeq(strings.TrimSuffix(prefix, "/"), "/") {
		if !validSegment(seg) {
			return "", fmt.Errorf("%q: the prefix must be segments of [A-Za-z0-9._-] separated by single \"/\"", clip(p))
		}
	}
	return prefix, nil
}

// ParseBind checks one entry of a plan's binds: a pattern
// "<prefix>{id}" (key: the prefix, ending in "/") or one tenant's id
// (key: the id, exact), the tenant-to-plan mapping of a tenant the
// plan's patterns do not name, or that another plan's pattern names.
func ParseBind(b string) (key string, exact bool, err error) {
	if strings.HasSuffix(b, Placeholder) {
		prefix, err := PatternPrefix(b)
		return prefix, false, err
	}
	if strings.Contains(b, "{") || strings.Contains(b, "}") {
		return "", false, fmt.Errorf("%q: %s may only end a pattern, e.g. \"tenant/{id}\"", clip(b), Placeholder)
	}
	if IsPlan(b) {
		return "", false, fmt.Errorf("%q: ids under %q name plans, not tenants", clip(b), Namespace)
	}
	for seg := range strings.SplitSeq(b, "/") {
		if !validSegment(seg) {
			return "", false, fmt.Errorf("%q: a tenant id is segments of [A-Za-z0-9._-] separated by single \"/\", or a pattern ending in %s", clip(b), Placeholder)
		}
	}
	if len(b) > maxIDLen {
		return "", false, fmt.Errorf("longer than %d characters", maxIDLen)
	}
	return b, true, nil
}

// maxIDLen is the longest limit id (vocab.MaxLimitIDLen).
const maxIDLen = 200

func validSegment(s string) bool {
	if s == "" || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Table maps tenant ids and pattern prefixes to the plans that bind them.
type Table struct {
	byID     map[string]string // tenant id -> plan id (exact binds)
	byPrefix map[string]string // prefix -> plan id
}

// NewTable builds the table of plans (limit records; those outside the
// namespace are skipped). Should two plans bind one pattern (the
// allocator refuses it; records written to several allocator groups
// could still disagree for a moment), the smaller plan id wins, so every
// reader decides alike.
func NewTable(plans []*pb.Limit) Table {
	t := Table{byID: map[string]string{}, byPrefix: map[string]string{}}
	for _, p := range plans {
		if !IsPlan(p.GetId()) {
			continue
		}
		for _, b := range p.GetBinds() {
			key, exact, err := ParseBind(b)
			if err != nil {
				continue
			}
			m := t.byPrefix
			if exact {
				m = t.byID
			}
			if cur, ok := m[key]; !ok || p.Id < cur {
				m[key] = p.Id
			}
		}
	}
	return t
}

// Len is how many patterns and tenant ids the table binds.
func (t Table) Len() int { return len(t.byPrefix) + len(t.byID) }

// Match returns the plan that binds id: the plan that names id itself
// (a tenant-to-plan mapping), else the plan of the pattern whose prefix
// is id up to its last "/" (the id's last segment stands for {id}).
// Plan ids themselves are never bound.
func (t Table) Match(id string) (plan string, ok bool) {
	if t.Len() == 0 || IsPlan(id) {
		return "", false
	}
	if plan, ok := t.byID[id]; ok {
		return plan, true
	}
	i := strings.LastIndexByte(id, '/')
	if i < 0 || i == len(id)-1 {
		return "", false
	}
	plan, ok = t.byPrefix[id[:i+1]]
	return plan, ok
}

// Mapped returns the tenant ids plan binds by name (its mapping).
func (t Table) Mapped(plan string) []string {
	var out []string
	for id, p := range t.byID {
		if p == plan {
			out = append(out, id)
		}
	}
	return out
}

// maxTagLen is the longest hash tag (vocab.MaxHashTagLen).
const maxTagLen = 64

// TenantTag is the hash tag of tenant id under a plan whose hash tag is
// planTag: for "{id}" (Placeholder, the only tag a plan takes) the id's
// last segment, so that the limits of one tenant under several plans
// ("tenant/atlas" and "tenant-month/atlas") share a tag and can be
// checked together on Redis Cluster; "" (the id is its own tag) for a
// plan without one, or a last segment longer than a hash tag may be.
func TenantTag(planTag, id string) string {
	if planTag != Placeholder {
		return ""
	}
	seg := id[strings.LastIndexByte(id, '/')+1:]
	if seg == "" || len(seg) > maxTagLen {
		return ""
	}
	return seg
}

// MaxContracts bounds the contracts of one plan.
const MaxContracts = 1000

// ApplyContract replaces the fields of v that the contract c sets (nil:
// none): G, the mode, the regions (dropping the fallbacks of regions no
// longer in them, unless c replaces the fallbacks), the fallbacks, the
// lease settings, shadow mode and the window. v is changed in place and
// keeps c's values (not copies).
func ApplyContract(v *pb.Limit, c *pb.Contract) {
	if c == nil {
		return
	}
	if c.LimitTokens > 0 {
		v.LimitTokens = c.LimitTokens
	}
	if c.RateTokens > 0 {
		v.RateTokens = c.RateTokens
	}
	if c.BurstTokens > 0 {
		v.BurstTokens = c.BurstTokens
	}
	if c.Mode != pb.Mode_MODE_UNSPECIFIED {
		v.Mode = c.Mode
	}
	if len(c.Regions) > 0 {
		v.Regions = c.Regions
		if len(c.Fallback) == 0 && len(v.Fallback) > 0 {
			kept := map[string]*pb.Fallback{}
			for _, r := range c.Regions {
				if fb, ok := v.Fallback[r]; ok {
					kept[r] = fb
				}
			}
			v.Fallback = kept
		}
	}
	if len(c.Fallback) > 0 {
		v.Fallback = c.Fallback
	}
	if c.Lease != nil {
		v.Lease = c.Lease
	}
	if c.Shadow != nil {
		v.Shadow = *c.Shadow
	}
	if c.Window != nil {
		// A window of the tenant's own replaces the plan's schedule,
		// calendar windows included.
		v.Window, v.Calendar = c.Window, nil
	}
}

// Resolve returns the limit id has under plan: the plan's record (its
// version, scheduled change and override included) with the id set to
// id, plan set to the plan's id, the tenant's contract applied to each
// version (the contract of that version), and the binding table and
// contracts cleared. Every version in it is the plan's, and a contract
// is part of it: a change of the plan or of the contract reaches the
// tenant at the time the change governs, with a new version.
func Resolve(plan *pb.Limit, id string) *pb.Limit {
	l := proto.Clone(plan).(*pb.Limit)
	name := plan.GetId()
	fix := func(v *pb.Limit) {
		if v == nil {
			return
		}
		ApplyContract(v, v.Contracts[id])
		v.Id, v.Binds, v.Plan, v.HashTag, v.Contracts = id, nil, name, TenantTag(v.HashTag, id), nil
	}
	fix(l)
	fix(l.Previous)
	if l.Override != nil {
		fix(l.Override.After)
	}
	return l
}
