package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// jsonOpts: snake_case field names as in the .proto files, and every field
// present (zeros included) so scripts can rely on the keys.
var jsonOpts = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// writeJSON writes msgs as one JSON object (array false) or an array, with
// stable two-space indentation.
func writeJSON(w io.Writer, array bool, msgs ...proto.Message) error {
	var raw bytes.Buffer
	if array {
		raw.WriteByte('[')
	}
	for i, m := range msgs {
		if i > 0 {
			raw.WriteByte(',')
		}
		b, err := jsonOpts.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode JSON: %v", err)
		}
		raw.Write(b)
	}
	if array {
		raw.WriteByte(']')
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw.Bytes(), "", "  "); err != nil {
		return fmt.Errorf("encode JSON: %v", err)
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// printLimit prints one limit: JSON, or "key: value" lines whose keys match
// the flags of "limits set".
func (e *env) printLimit(l *pb.Limit) error {
	if e.json {
		return writeJSON(e.stdout, false, l)
	}
	maxChunk := strconv.FormatInt(l.GetLease().GetMaxChunk(), 10)
	if l.GetLease().GetMaxChunk() == 0 {
		maxChunk += " (no cap)"
	}
	rows := [][2]string{
		{"id", l.GetId()},
		{"limit", strconv.FormatInt(l.GetLimitTokens(), 10)},
		{"window", formatDuration(l.GetWindow())},
	}
	if c := l.GetCalendar(); c != nil {
		rows = append(rows[:2], [2]string{"calendar", c.GetUnit()}, [2]string{"zone", c.GetZone()})
	}
	if p := l.GetWindowPhase(); p.AsDuration() != 0 {
		rows = append(rows, [2]string{"window-phase", formatDuration(p)})
	}
	if l.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET {
		rows = [][2]string{{"id", l.GetId()}, {"kind", "bucket"}, {"rate", formatRate(l)},
			{"burst", strconv.FormatInt(l.GetBurstTokens(), 10)}}
	}
	if l.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY {
		rows = [][2]string{{"id", l.GetId()}, {"kind", "concurrency"}, {"slots", strconv.FormatInt(l.GetLimitTokens(), 10)}}
	}
	rows = append(rows, [][2]string{
		{"regions", strings.Join(l.GetRegions(), ",")},
		{"mode", limitspec.ModeName(l.GetMode())},
		{"fallback", effectiveFallback(l)},
		{"ttl", formatDuration(l.GetLease().GetTtl())},
		{"min-chunk", strconv.FormatInt(l.GetLease().GetMinChunk(), 10)},
		{"max-chunk", maxChunk},
		{"owner", l.GetOwner()},
		{"description", l.GetDescription()},
		{"tags", formatTags(l.GetTags())},
	}...)
	if n := l.GetLease().GetStanding(); n != 0 {
		rows = append(rows, [2]string{"standing", strconv.FormatInt(n, 10)})
	}
	if t := l.GetHashTag(); t != "" {
		rows = append(rows, [2]string{"hash-tag", t})
	}
	if g := l.GetSettleGrace(); g != nil {
		rows = append(rows, [2]string{"settle-grace", formatDuration(g)})
	}
	if p := l.GetDebtPolicy(); p != pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED {
		rows = append(rows, [2]string{"debt-policy", debtPolicyName(p)})
	}
	if l.GetShadow() {
		rows = append(rows, [2]string{"shadow", "yes: tried, not enforced (every request admitted; would-deny counted)"})
	}
	if b := l.GetBinds(); len(b) > 0 {
		rows = append(rows, [2]string{"binds", strings.Join(b, ",")})
	}
	if cs := l.GetContracts(); len(cs) > 0 {
		parts := make([]string, 0, len(cs))
		for _, id := range slices.Sorted(maps.Keys(cs)) {
			parts = append(parts, id+"="+limitspec.FormatContract(cs[id]))
		}
		rows = append(rows, [2]string{"contracts", strings.Join(parts, "; ")})
	}
	if p := l.GetPlan(); p != "" {
		rows = append(rows, [2]string{"plan", p})
	}
	if o := l.GetOverride(); o != nil {
		rows = append(rows, [2]string{"override", overrideSummary(o)})
	}
	rows = append(rows, [2]string{"version", strconv.FormatInt(l.GetVersion(), 10)})
	if e.planGroups != "" {
		rows = append(rows, [2]string{"groups", e.planGroups})
	}
	if ts := formatTS(l.GetEffectiveFrom()); ts != "" {
		rows = append(rows, [2]string{"effective-from", ts})
	}
	if p := l.GetPrevious(); p != nil {
		rows = append(rows, [2]string{"previous", fmt.Sprintf("version %d (limit %d) governs until effective-from", p.GetVersion(), p.GetLimitTokens())})
	}
	var b strings.Builder
	for _, r := range rows {
		line := fmt.Sprintf("%-15s %s", r[0]+":", cell(r[1], ""))
		b.WriteString(strings.TrimRight(line, " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(e.stdout, b.String())
	return err
}

// printLimits prints limits as an aligned table or a JSON array.
func (e *env) printLimits(ls []*pb.Limit) error {
	if e.json {
		msgs := make([]proto.Message, len(ls))
		for i, l := range ls {
			msgs[i] = l
		}
		return writeJSON(e.stdout, true, msgs...)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tG\tWINDOW\tREGIONS\tMODE\tFALLBACK\tVERSION\tOWNER")
	for _, l := range ls {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n",
			cell(l.GetId(), "-"), l.GetLimitTokens(), cell(formatDuration(l.GetWindow()), "-"),
			cell(strings.Join(l.GetRegions(), ","), "-"), limitspec.ModeName(l.GetMode()),
			cell(effectiveFallback(l), "-"), l.GetVersion(), cell(l.GetOwner(), "-"))
	}
	return tw.Flush()
}

// cell makes a value safe for a one-line field: control characters (tabs
// and newlines included) escaped; empty becomes empty.
func cell(s, empty string) string {
	if s == "" {
		return empty
	}
	return oneLine(s)
}

func parseMode(s string) (pb.Mode, error) {
	switch s {
	case "strict":
		return pb.Mode_MODE_STRICT, nil
	case "bounded":
		return pb.Mode_MODE_BOUNDED, nil
	}
	return 0, fmt.Errorf("want strict or bounded")
}

func parseDebtPolicy(s string) (pb.DebtPolicy, error) {
	switch s {
	case "carry":
		return pb.DebtPolicy_DEBT_POLICY_CARRY, nil
	case "forgive":
		return pb.DebtPolicy_DEBT_POLICY_FORGIVE, nil
	}
	return 0, fmt.Errorf("want carry or forgive")
}

// debtPolicyName is the name parseDebtPolicy takes.
func debtPolicyName(p pb.DebtPolicy) string {
	switch p {
	case pb.DebtPolicy_DEBT_POLICY_FORGIVE:
		return "forgive"
	case pb.DebtPolicy_DEBT_POLICY_CARRY, pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED:
		return "carry"
	}
	return p.String()
}

// formatDuration prints d as time.Duration does, without zero trailing
// units ("1m", "1h", "1h30m", "15s"), so it parses back with
// time.ParseDuration.
func formatDuration(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	s := d.AsDuration().String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Fallback syntax, as the docs and the architecture brief write it.
const fallbackWant = "want REGION=closed|local:A|open"

// parseFallbacks adds the comma-separated REGION=KIND items of s to m. A
// region given twice is an error.
func parseFallbacks(s string, m map[string]*pb.Fallback) error {
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		region, kind, ok := strings.Cut(item, "=")
		if !ok || region == "" {
			return usagef("--fallback %q: %s", item, fallbackWant)
		}
		fb, err := parseFallbackKind(kind)
		if err != nil && strings.HasPrefix(kind, "local:") {
			return usagef("--fallback %q: %v", item, err)
		}
		if err != nil {
			return usagef("--fallback %q: %s", item, fallbackWant)
		}
		if _, dup := m[region]; dup {
			return usagef("--fallback %q: region %q given twice", item, region)
		}
		m[region] = fb
	}
	return nil
}

func parseFallbackKind(s string) (*pb.Fallback, error) { return limitspec.ParseFallback(s) }

// formatFallbacks prints m as "eu=closed,us=local:100", regions sorted:
// the syntax parseFallbacks reads.
func formatFallbacks(m map[string]*pb.Fallback) string {
	regions := make([]string, 0, len(m))
	for r := range m {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	parts := make([]string, len(regions))
	for i, r := range regions {
		parts[i] = r + "=" + limitspec.FallbackName(m[r])
	}
	return strings.Join(parts, ",")
}

// effectiveFallback is the fallback in force in each of l's regions: a
// region without an entry is closed.
func effectiveFallback(l *pb.Limit) string {
	m := make(map[string]*pb.Fallback, len(l.GetRegions()))
	for _, r := range l.GetRegions() {
		m[r] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}
	}
	for r, fb := range l.GetFallback() {
		m[r] = fb
	}
	return formatFallbacks(m)
}

// parseTag adds one KEY=VALUE tag to m.
func parseTag(s string, m map[string]string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE")
	}
	if _, dup := m[k]; dup {
		return fmt.Errorf("tag %q given twice", k)
	}
	m[k] = v
	return nil
}

func formatTags(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}

// shadowSuffix says ", shadow" for a version in shadow mode.
func shadowSuffix(l *pb.Limit) string {
	if l.GetShadow() {
		return ", shadow"
	}
	return ""
}

// overrideSummary is how quotactl shows an override in force: "in force
// until T (reason); then limit 1000" (limits get, plans get, windows).
func overrideSummary(o *pb.LimitOverride) string {
	return fmt.Sprintf("in force until %s (%s); then %s%s", formatTS(o.GetEndsAt()),
		oneLine(o.GetReason()), numbersOf(o.GetAfter()), shadowSuffix(o.GetAfter()))
}

// overrideChanges lists the settings the override in force on l changes:
// l (the override) against the version it returns to, in diffLimits'
// names and order.
func overrideChanges(l *pb.Limit) []fieldDiff {
	cur := proto.Clone(l).(*pb.Limit)
	cur.Override = nil
	return diffLimits(l.GetOverride().GetAfter(), cur)
}

// formatRate writes a bucket limit's rate as --rate takes it: "100/s".
// numbersOf is what a version of a limit allows, by its kind: "limit G",
// "rate R/P burst B" or "slots N".
func numbersOf(l *pb.Limit) string {
	switch l.GetKind() {
	case pb.LimitKind_LIMIT_KIND_BUCKET:
		return "rate " + formatRate(l) + " burst " + strconv.FormatInt(l.GetBurstTokens(), 10)
	case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
		return "slots " + strconv.FormatInt(l.GetLimitTokens(), 10)
	}
	return "limit " + strconv.FormatInt(l.GetLimitTokens(), 10)
}

func formatRate(l *pb.Limit) string {
	p := time.Second
	if l.GetRatePeriod() != nil {
		p = l.GetRatePeriod().AsDuration()
	}
	return limitspec.FormatRate(l.GetRateTokens(), p)
}

// printPlans prints plans as a table (or JSON).
func (e *env) printPlans(ls []*pb.Limit) error {
	if e.json {
		return e.printLimits(ls)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	head := "PLAN\tKIND\tLIMIT\tWINDOW\tREGIONS\tMODE\tSHADOW\tBINDS\tVERSION"
	if e.planGroupRows != nil {
		head += "\tGROUPS"
	}
	fmt.Fprintln(tw, head)
	for _, l := range ls {
		shadow := "no"
		if l.GetShadow() {
			shadow = "yes"
		}
		kind, limit := "window", strconv.FormatInt(l.GetLimitTokens(), 10)
		switch l.GetKind() {
		case pb.LimitKind_LIMIT_KIND_BUCKET:
			kind, limit = "bucket", formatRate(l)+" burst "+strconv.FormatInt(l.GetBurstTokens(), 10)
		case pb.LimitKind_LIMIT_KIND_CONCURRENCY:
			kind, limit = "concurrency", limit+" slots"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d",
			cell(strings.TrimPrefix(l.GetId(), "plans/"), "-"), kind, limit, cell(formatDuration(l.GetWindow()), "-"),
			cell(strings.Join(l.GetRegions(), ","), "-"), limitspec.ModeName(l.GetMode()), shadow,
			cell(strings.Join(l.GetBinds(), ","), "-"), l.GetVersion())
		if e.planGroupRows != nil {
			fmt.Fprintf(tw, "\t%s", e.planGroupRows[l.GetId()])
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// parseContract adds one --contract TENANT=N to m.
func parseContract(s string, m map[string]*pb.Contract) error {
	id, spec, ok := strings.Cut(s, "=")
	if !ok || id == "" {
		return fmt.Errorf("want TENANT=N or TENANT=FIELD=VALUE ..., e.g. tenant/atlas=3000 or 'tenant/atlas=limit=3000 mode=bounded'")
	}
	c, err := limitspec.ParseContract(spec)
	if err != nil {
		return err
	}
	if _, dup := m[id]; dup {
		return fmt.Errorf("a contract for %q given twice", id)
	}
	m[id] = c
	return nil
}
