package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// fieldDiff is one setting a change sets to another value. Names are the
// limits file's keys: limit, window (kind, rate, burst for a bucket
// limit), regions, mode, fallback.eu,
// lease.ttl, lease.min_chunk, lease.max_chunk, lease.standing (only
// when set), owner, description,
// tags.KEY, hash_tag, shadow (only when true), override (only when in
// force). An absent value (a tag added or removed) is "".
type fieldDiff struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// setting is one flattened setting of a limit.
type setting struct{ name, value string }

// flatten lists l's settings in a fixed order, as they govern: every
// region's fallback in force (closed when not given), defaults as stored.
func flatten(l *pb.Limit) []setting {
	if l == nil {
		return nil
	}
	regions := slices.Sorted(slices.Values(l.GetRegions()))
	out := []setting{
		{"limit", strconv.FormatInt(l.GetLimitTokens(), 10)},
		{"window", formatDuration(l.GetWindow())},
	}
	if c := l.GetCalendar(); c != nil {
		out[1] = setting{"calendar", c.GetUnit() + " " + c.GetZone()}
	}
	if p := l.GetWindowPhase(); p.AsDuration() != 0 {
		out = append(out, setting{"window_phase", formatDuration(p)}) // absent: 0
	}
	if l.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY {
		out = append(out, setting{"kind", "concurrency"})
	}
	if l.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET {
		out = append(out, setting{"kind", "bucket"}, setting{"rate", formatRate(l)},
			setting{"burst", strconv.FormatInt(l.GetBurstTokens(), 10)})
	}
	out = append(out,
		setting{"regions", strings.Join(regions, ",")},
		setting{"mode", limitspec.ModeName(l.GetMode())},
	)
	fb := map[string]string{}
	for _, r := range regions {
		fb[r] = "closed"
	}
	for r, f := range l.GetFallback() {
		fb[r] = limitspec.FallbackName(f)
	}
	for _, r := range slices.Sorted(maps.Keys(fb)) {
		out = append(out, setting{"fallback." + r, fb[r]})
	}
	out = append(out,
		setting{"lease.ttl", formatDuration(l.GetLease().GetTtl())},
		setting{"lease.min_chunk", strconv.FormatInt(l.GetLease().GetMinChunk(), 10)},
		setting{"lease.max_chunk", strconv.FormatInt(l.GetLease().GetMaxChunk(), 10)},
	)
	if n := l.GetLease().GetStanding(); n != 0 {
		out = append(out, setting{"lease.standing", strconv.FormatInt(n, 10)})
	}
	out = append(out,
		setting{"owner", l.GetOwner()},
		setting{"description", l.GetDescription()},
	)
	for _, k := range slices.Sorted(maps.Keys(l.GetTags())) {
		out = append(out, setting{"tags." + k, l.GetTags()[k]})
	}
	out = append(out, setting{"hash_tag", l.GetHashTag()})
	if g := l.GetSettleGrace(); g != nil {
		out = append(out, setting{"settle_grace", formatDuration(g)})
	}
	if p := l.GetDebtPolicy(); p != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED {
		out = append(out, setting{"debt_policy", debtPolicyName(p)})
	}
	if l.GetShadow() {
		out = append(out, setting{"shadow", "true"}) // absent: enforced
	}
	if o := l.GetOverride(); o != nil {
		out = append(out, setting{"override", "until " + formatTS(o.GetEndsAt())}) // absent: none
	}
	if b := l.GetBinds(); len(b) > 0 {
		out = append(out, setting{"binds", strings.Join(slices.Sorted(slices.Values(b)), ",")}) // a plan's
	}
	for _, id := range slices.Sorted(maps.Keys(l.GetContracts())) {
		out = append(out, setting{"contracts." + id, limitspec.FormatContract(l.GetContracts()[id])})
	}
	return out
}

// diffLimits lists the settings that differ between old and new (either
// may be nil), in flatten's order: old's settings first, then those only
// new has.
func diffLimits(old, new *pb.Limit) []fieldDiff {
	a, b := flatten(old), flatten(new)
	bv := make(map[string]string, len(b))
	for _, s := range b {
		bv[s.name] = s.value
	}
	seen := map[string]bool{}
	var out []fieldDiff
	for _, s := range a {
		seen[s.name] = true
		if nv := bv[s.name]; nv != s.value {
			out = append(out, fieldDiff{s.name, s.value, nv})
		}
	}
	for _, s := range b {
		if !seen[s.name] && s.value != "" {
			out = append(out, fieldDiff{s.name, "", s.value})
		}
	}
	return out
}

// Plan actions.
const (
	actCreate = "create"
	actUpdate = "update"
	actDelete = "delete"
)

// planChange is one change of a plan.
type planChange struct {
	Action string `json:"action"`
	ID     string `json:"id"`
	// ExpectedVersion is the live version the change was planned against;
	// 0 for a create (the limit must not exist).
	ExpectedVersion int64       `json:"expected_version"`
	Fields          []fieldDiff `json:"fields"`
	// Limit is the limit to store (create, update), as the file declares
	// it.
	Limit *pb.Limit `json:"-"`
}

// planFormat names the plan file format.
const planFormat = "quotactl-plan/1"

// plan is the difference between a limits file and the live limits in
// its scope, pinned to the versions it saw. It is what `plan -o` writes
// and `apply --plan` reads.
type plan struct {
	Format    string    `json:"format"`
	Allocator string    `json:"allocator"`
	Created   time.Time `json:"created"`
	// Source and SourceSHA256 name the limits file planned.
	Source       string `json:"source"`
	SourceSHA256 string `json:"source_sha256"`
	// Manage is the file's scope; nil means "the ids in IDs".
	Manage []string `json:"manage"`
	IDs    []string `json:"ids,omitempty"`
	// Live is every live limit in scope and its version when planned:
	// apply refuses if this set or any version moved.
	Live      map[string]int64 `json:"live"`
	Changes   []planChange     `json:"changes"`
	Unchanged int              `json:"unchanged"`
}

// planJSON is plan on disk: limits as protojson.
type planJSON struct {
	plan
	Changes []planChangeJSON `json:"changes"`
}

type planChangeJSON struct {
	planChange
	Limit json.RawMessage `json:"limit,omitempty"`
}

// inScope reports whether a live limit id belongs to the plan's scope.
func (p *plan) inScope(id string) bool {
	if p.Manage != nil {
		return inScopes(p.Manage, id)
	}
	_, ok := slices.BinarySearch(p.IDs, id)
	return ok
}

// makePlan diffs the file against live (any limits: those out of the
// file's scope are ignored). It is pure.
func makePlan(lf *limitsFile, live []*pb.Limit) *plan {
	p := &plan{Format: planFormat, Manage: lf.manage, Live: map[string]int64{}, Changes: []planChange{}}
	if lf.manage == nil {
		for _, fl := range lf.limits {
			p.IDs = append(p.IDs, fl.limit.Id)
		}
		slices.Sort(p.IDs)
	}
	byID := map[string]*pb.Limit{}
	for _, l := range live {
		if p.inScope(l.GetId()) {
			byID[l.GetId()] = l
			p.Live[l.GetId()] = l.GetVersion()
		}
	}
	declared := map[string]bool{}
	for _, fl := range lf.limits {
		want := fl.limit
		declared[want.Id] = true
		cur, ok := byID[want.Id]
		switch {
		case !ok:
			p.Changes = append(p.Changes, planChange{Action: actCreate, ID: want.Id, Fields: diffLimits(nil, want), Limit: want})
		default:
			if d := diffLimits(cur, want); len(d) > 0 {
				p.Changes = append(p.Changes, planChange{Action: actUpdate, ID: want.Id, ExpectedVersion: cur.GetVersion(), Fields: d, Limit: want})
			} else {
				p.Unchanged++
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		if !declared[id] {
			p.Changes = append(p.Changes, planChange{Action: actDelete, ID: id, ExpectedVersion: byID[id].GetVersion()})
		}
	}
	// Deterministic order: by id.
	slices.SortStableFunc(p.Changes, func(a, b planChange) int { return strings.Compare(a.ID, b.ID) })
	return p
}

// moved compares the live limits in p's scope with what p saw and says
// what moved, in one line; "" when nothing did.
func (p *plan) moved(live []*pb.Limit) string {
	now := map[string]int64{}
	for _, l := range live {
		if p.inScope(l.GetId()) {
			now[l.GetId()] = l.GetVersion()
		}
	}
	var diffs []string
	for _, id := range slices.Sorted(maps.Keys(p.Live)) {
		v, ok := now[id]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s was deleted (the plan saw version %d)", id, p.Live[id]))
		case v != p.Live[id]:
			diffs = append(diffs, fmt.Sprintf("%s is at version %d, the plan saw %d", id, v, p.Live[id]))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(now)) {
		if _, ok := p.Live[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s was created (version %d)", id, now[id]))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	const show = 5
	if len(diffs) > show {
		diffs = append(diffs[:show], fmt.Sprintf("and %d more", len(diffs)-show))
	}
	return strings.Join(diffs, "; ")
}

// counts returns how many creates, updates and deletes p holds.
func (p *plan) counts() (c, u, d int) {
	for _, ch := range p.Changes {
		switch ch.Action {
		case actCreate:
			c++
		case actUpdate:
			u++
		case actDelete:
			d++
		}
	}
	return
}

// request is the ApplyLimits request carrying p's changes.
func (p *plan) request(reason string, eff pb.Effective, dryRun bool) *pb.ApplyLimitsRequest {
	req := &pb.ApplyLimitsRequest{Reason: reason, Effective: eff, DryRun: dryRun}
	for _, ch := range p.Changes {
		c := &pb.LimitChange{ExpectedVersion: ch.ExpectedVersion}
		if ch.Action == actDelete {
			c.Change = &pb.LimitChange_Delete{Delete: ch.ID}
		} else {
			c.Change = &pb.LimitChange_Put{Put: ch.Limit}
		}
		req.Changes = append(req.Changes, c)
	}
	return req
}

// marshal encodes p as the plan file.
func (p *plan) marshal() ([]byte, error) {
	out := planJSON{plan: *p, Changes: make([]planChangeJSON, len(p.Changes))}
	for i, ch := range p.Changes {
		out.Changes[i].planChange = ch
		if ch.Fields == nil {
			out.Changes[i].Fields = []fieldDiff{}
		}
		if ch.Limit != nil {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ch.Limit)
			if err != nil {
				return nil, fmt.Errorf("encode plan: %v", err)
			}
			out.Changes[i].Limit = b
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode plan: %v", err)
	}
	return append(b, '\n'), nil
}

// unmarshalPlan decodes and checks a plan file; errors name what is wrong.
func unmarshalPlan(data []byte) (*plan, error) {
	var in planJSON
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("not a plan written by quotactl limits plan -o: %v", err)
	}
	if in.Format != planFormat {
		return nil, fmt.Errorf("format %q: want %q (written by quotactl limits plan -o)", in.Format, planFormat)
	}
	p := in.plan
	p.Changes = make([]planChange, len(in.Changes))
	if p.Live == nil {
		p.Live = map[string]int64{}
	}
	for i, c := range in.Changes {
		ch := c.planChange
		what := fmt.Sprintf("changes[%d]", i)
		switch ch.Action {
		case actCreate, actUpdate:
			if len(c.Limit) == 0 {
				return nil, fmt.Errorf("%s: %s %s without a limit", what, ch.Action, ch.ID)
			}
			l := &pb.Limit{}
			if err := protojson.Unmarshal(c.Limit, l); err != nil {
				return nil, fmt.Errorf("%s.limit: %v", what, err)
			}
			if l.Id != ch.ID {
				return nil, fmt.Errorf("%s: limit id %q differs from id %q", what, l.Id, ch.ID)
			}
			ch.Limit = l
		case actDelete:
		default:
			return nil, fmt.Errorf("%s: unknown action %q", what, ch.Action)
		}
		if want, ok := p.Live[ch.ID]; (ok && want != ch.ExpectedVersion) || (!ok && ch.ExpectedVersion != 0) {
			return nil, fmt.Errorf("%s: %s expects version %d, inconsistent with the plan's live versions", what, ch.ID, ch.ExpectedVersion)
		}
		p.Changes[i] = ch
	}
	slices.Sort(p.IDs)
	return &p, nil
}

// sha256Hex is the hex SHA-256 of b.
func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// listScope lists the live limits the scope can hold: under each manage
// prefix, or every limit when manage is nil or holds "*". It follows
// pages to the end.
func (e *env) listScope(ctx context.Context, manage []string) ([]*pb.Limit, error) {
	prefixes := manage
	if manage == nil || slices.Contains(manage, manageAll) {
		prefixes = []string{""}
	}
	seen := map[string]bool{}
	var all []*pb.Limit
	for _, p := range prefixes {
		ls, err := e.listLimits(ctx, p, 1000)
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			if !seen[l.GetId()] {
				seen[l.GetId()] = true
				all = append(all, l)
			}
		}
	}
	return all, nil
}

// listLimits lists every limit under prefix, following pages; with
// allocator groups, every group's, in id order.
func (e *env) listLimits(ctx context.Context, prefix string, pageSize int32) ([]*pb.Limit, error) {
	var all []*pb.Limit
	listedBy := map[*pb.Limit]string{} // the group that listed it
	pages := 0
	err := e.eachGroup(ctx, func(call func(adminRPC) error) (group string, err error) {
		token := ""
		for {
			if pages == maxListPages {
				return "", errors.New("more than " + strconv.Itoa(maxListPages) + " pages; narrow the list with --prefix")
			}
			pages++
			req := &pb.ListLimitsRequest{Prefix: prefix, PageSize: pageSize, PageToken: token}
			var resp *pb.ListLimitsResponse
			err := call(func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
				resp, err = c.ListLimits(ctx, req, opt)
				return err
			})
			if err != nil {
				return "", err
			}
			for _, l := range resp.GetLimits() {
				all = append(all, l)
				listedBy[l] = resp.GetGroup()
			}
			group = resp.GetGroup()
			next := resp.GetNextPageToken()
			if next == "" {
				return group, nil
			}
			if next == token {
				return "", errors.New("allocator returned the same page token twice")
			}
			token = next
		}
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(all, func(a, b *pb.Limit) int { return strings.Compare(a.GetId(), b.GetId()) })
	// A group that has not read a new map yet still lists a limit that
	// moved away: keep the copy of the group the map names.
	out := all[:0]
	for i, l := range all {
		if i > 0 && all[i-1].GetId() == l.GetId() {
			if e.groups.ownerOf(l.GetId()) == listedBy[l] {
				out[len(out)-1] = l
			}
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// printPlan writes p for people: one block per change, then a summary.
func printPlan(w io.Writer, p *plan) error {
	var b strings.Builder
	scope := "the limits it names (no manage: nothing is deleted)"
	if p.Manage != nil {
		scope = "manage: " + strings.Join(p.Manage, ", ")
	}
	fmt.Fprintf(&b, "plan: %s against %s (%s)\n", cell(p.Source, "-"), p.Allocator, oneLine(scope))
	for _, ch := range p.Changes {
		switch ch.Action {
		case actCreate:
			fmt.Fprintf(&b, "\n+ create %s\n", oneLine(ch.ID))
		case actUpdate:
			fmt.Fprintf(&b, "\n~ update %s (version %d)\n", oneLine(ch.ID), ch.ExpectedVersion)
		case actDelete:
			fmt.Fprintf(&b, "\n- delete %s (version %d)\n", oneLine(ch.ID), ch.ExpectedVersion)
		}
		writeFieldDiffs(&b, "    ", ch.Action == actCreate, ch.Fields)
	}
	c, u, d := p.counts()
	if c+u+d == 0 {
		fmt.Fprintf(&b, "\nNo changes: the live limits match the file (%d unchanged).\n", p.Unchanged)
	} else {
		fmt.Fprintf(&b, "\n%d to create, %d to update, %d to delete, %d unchanged.\n", c, u, d, p.Unchanged)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFieldDiffs writes "field: old -> new" lines, aligned; for a
// creation "field: new".
func writeFieldDiffs(w io.Writer, indent string, created bool, ds []fieldDiff) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, d := range ds {
		if created {
			fmt.Fprintf(tw, "%s%s:\t%s\n", indent, oneLine(d.Field), showValue(d.New))
			continue
		}
		fmt.Fprintf(tw, "%s%s:\t%s -> %s\n", indent, oneLine(d.Field), showValue(d.Old), showValue(d.New))
	}
	_ = tw.Flush()
}

// showValue prints a setting's value: "(none)" when empty, quoted when it
// has spaces or would be misread.
func showValue(s string) string {
	if s == "" {
		return "(none)"
	}
	if strings.ContainsAny(s, " \t\"") || strings.Contains(s, "->") || oneLine(s) != s {
		return strconv.Quote(s)
	}
	return s
}
