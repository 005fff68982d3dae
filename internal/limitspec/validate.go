package limitspec

import (
	"fmt"
	"leasehold/internal/zones"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Bounds on a limit's definition.
const (
	// MaxWindow bounds W; longer windows would keep grant records for days.
	MaxWindow = 31 * 24 * time.Hour
	// LongestWindow bounds every window of any limit: a fixed one
	// (MaxWindow) or a calendar one, whose longest is a leap year (366
	// days, plus the hours a zone's offset may move in it). What must
	// outlive every window that started under it (an allocator group
	// map's old versions) is kept this long.
	LongestWindow = 367 * 24 * time.Hour
	// MaxOwnerLen, MaxDescriptionLen, MaxTags and MaxTagLen bound the
	// limit's free-form fields (a tag's key and its value each).
	MaxOwnerLen       = 200
	MaxDescriptionLen = 2000
	MaxTags           = 32
	MaxTagLen         = 200
	// MaxRegions bounds the regions (and so the fallbacks) of one limit.
	MaxRegions = 64
	// MaxApplyChanges caps the changes of one ApplyLimits call. Each change
	// costs two writes (the limit and its history entry) in the one etcd
	// transaction that also carries the audit record and the limits
	// revision, so an allocator's cap is also (max txn ops - 2) / 2 (see
	// allocator.WithGroupCommit): 63 with etcd's default --max-txn-ops of
	// 128.
	MaxApplyChanges = 100
	// DefaultSettleGrace is a limit's settle_grace when unset, and
	// MaxSettleGrace its largest: a settle-later decision's record lives
	// in its window's Redis key, which agents keep and report a couple of
	// minutes after the window's end, so every settle must land before.
	DefaultSettleGrace = 30 * time.Second
	MaxSettleGrace     = time.Minute
)

// SettleGrace is how long a settle-later decision of l can be settled.
func SettleGrace(l *pb.Limit) time.Duration {
	if g := l.GetSettleGrace(); g != nil {
		return g.AsDuration()
	}
	return DefaultSettleGrace
}

// CheckSizes checks only the sizes of a limit's strings, maps and lists
// against the bounds above (and vocab's for ids and regions), without
// quoting any of them in its error: it is cheap, and it runs before
// anything about the limit is authorized, written, audited or logged, so
// nothing unbounded is ever copied. ValidateLimit runs it first. The
// error is a *vocab.FieldError naming the field, e.g. "limit.description".
func CheckSizes(l *pb.Limit) error {
	if l == nil {
		return nil
	}
	switch {
	case len(l.Id) > vocab.MaxLimitIDLen:
		return fieldErr("limit.id", "longer than %d bytes", vocab.MaxLimitIDLen)
	case len(l.Owner) > MaxOwnerLen:
		return fieldErr("limit.owner", "longer than %d bytes", MaxOwnerLen)
	case len(l.Description) > MaxDescriptionLen:
		return fieldErr("limit.description", "longer than %d bytes", MaxDescriptionLen)
	case len(l.Tags) > MaxTags:
		return fieldErr("limit.tags", "more than %d tags", MaxTags)
	case len(l.Regions) > MaxRegions:
		return fieldErr("limit.regions", "more than %d regions", MaxRegions)
	case len(l.Fallback) > MaxRegions:
		return fieldErr("limit.fallback", "more than %d regions", MaxRegions)
	case len(l.GetCalendar().GetUnit()) > MaxZoneLen:
		return fieldErr("limit.calendar.unit", "longer than %d bytes", MaxZoneLen)
	case len(l.GetCalendar().GetZone()) > MaxZoneLen:
		return fieldErr("limit.calendar.zone", "longer than %d bytes", MaxZoneLen)
	}
	if len(l.Binds) > planbind.MaxBinds {
		return fieldErr("limit.binds", "more than %d patterns", planbind.MaxBinds)
	}
	for i, b := range l.Binds {
		if len(b) > vocab.MaxLimitIDLen {
			return fieldErr(fmt.Sprintf("limit.binds[%d]", i), "longer than %d bytes", vocab.MaxLimitIDLen)
		}
	}
	if len(l.Contracts) > planbind.MaxContracts {
		return fieldErr("limit.contracts", "more than %d contracts", planbind.MaxContracts)
	}
	for id, c := range l.Contracts {
		if len(id) > vocab.MaxLimitIDLen {
			return fieldErr("limit.contracts", "a tenant id longer than %d bytes", vocab.MaxLimitIDLen)
		}
		switch {
		case len(c.GetRegions()) > MaxRegions:
			return fieldErr("limit.contracts["+id+"].regions", "more than %d regions", MaxRegions)
		case len(c.GetFallback()) > MaxRegions:
			return fieldErr("limit.contracts["+id+"].fallback", "more than %d regions", MaxRegions)
		}
		for i, r := range c.GetRegions() {
			if len(r) > vocab.MaxRegionLen {
				return fieldErr(fmt.Sprintf("limit.contracts[%s].regions[%d]", id, i), "longer than %d bytes", vocab.MaxRegionLen)
			}
		}
		for r := range c.GetFallback() {
			if len(r) > vocab.MaxRegionLen {
				return fieldErr("limit.contracts["+id+"].fallback", "a region name longer than %d bytes", vocab.MaxRegionLen)
			}
		}
	}
	if len(l.Plan) > vocab.MaxLimitIDLen {
		return fieldErr("limit.plan", "longer than %d bytes", vocab.MaxLimitIDLen)
	}
	for i, r := range l.Regions {
		if len(r) > vocab.MaxRegionLen {
			return fieldErr(fmt.Sprintf("limit.regions[%d]", i), "longer than %d bytes", vocab.MaxRegionLen)
		}
	}
	for r := range l.Fallback {
		if len(r) > vocab.MaxRegionLen {
			return fieldErr("limit.fallback", "a region name longer than %d bytes", vocab.MaxRegionLen)
		}
	}
	for k, v := range l.Tags {
		switch {
		case k == "" || len(k) > MaxTagLen:
			return fieldErr("limit.tags", "tag keys must be 1-%d bytes", MaxTagLen)
		case len(v) > MaxTagLen:
			return fieldErr("limit.tags["+k+"]", "longer than %d bytes", MaxTagLen)
		}
	}
	return nil
}

func fieldErr(field, format string, args ...any) error {
	return vocab.InvalidField(field, format, args...)
}

// ValidateLimit checks a limit as sent to PutLimit against the allocator's
// known regions and returns a copy with defaults filled in (ttl,
// min_chunk), regions sorted, and the version, effective time and previous
// version cleared (the allocator sets them). The error is a
// *vocab.FieldError naming the first bad field, e.g. "limit.lease.ttl".
func ValidateLimit(in *pb.Limit, known []string) (*pb.Limit, error) {
	if in == nil {
		return nil, fieldErr("limit", "required")
	}
	if err := CheckSizes(in); err != nil {
		return nil, err
	}
	if in.Override != nil {
		return nil, fieldErr("limit.override", "is set by the allocator: send the change with override_for to make it an override")
	}
	l := proto.Clone(in).(*pb.Limit)
	// Set by the allocator, never by the caller.
	l.Version, l.EffectiveFrom, l.Previous = 0, nil, nil
	if len(l.Contracts) > 0 {
		// The tenants' limits are checked after the plan, from the plan
		// as sent (defaults are taken for each tenant's own window).
		raw := proto.Clone(l).(*pb.Limit)
		v, err := validateLimit(l, known)
		if err != nil {
			return nil, err
		}
		if err := checkContractLimits(v, raw, known); err != nil {
			return nil, err
		}
		return v, nil
	}
	return validateLimit(l, known)
}

// validateLimit is ValidateLimit of l, a copy it may change.
func validateLimit(l *pb.Limit, known []string) (*pb.Limit, error) {
	if err := vocab.ValidateLimitID("limit.id", l.Id); err != nil {
		return nil, err
	}
	if err := checkPlan(l); err != nil {
		return nil, err
	}
	if err := checkKind(l); err != nil {
		return nil, err
	}
	bucket := l.Kind == pb.LimitKind_LIMIT_KIND_BUCKET
	conc := isConcurrency(l)
	var w time.Duration
	switch {
	case bucket:
		if err := checkBucketOnly(l); err != nil {
			return nil, err
		}
	case conc:
		if err := vocab.ValidateTokens("limit.limit_tokens", l.LimitTokens, 1); err != nil {
			return nil, err
		}
		if err := checkConcurrencyOnly(l); err != nil {
			return nil, err
		}
	default:
		if err := vocab.ValidateTokens("limit.limit_tokens", l.LimitTokens, 1); err != nil {
			return nil, err
		}
		if l.Calendar != nil {
			cal, err := checkCalendar(l)
			if err != nil {
				return nil, err
			}
			w = zones.Shortest(cal.Unit)
			break
		}
		if l.Window == nil {
			return nil, fieldErr("limit.window", "required")
		}
		if err := l.Window.CheckValid(); err != nil {
			return nil, fieldErr("limit.window", "%v", err)
		}
		w = l.Window.AsDuration()
		switch {
		case w < time.Second:
			return nil, fieldErr("limit.window", "must be >= 1s, got %v", w)
		case w > MaxWindow:
			return nil, fieldErr("limit.window", "must be <= %v, got %v", MaxWindow, w)
		case w%time.Millisecond != 0:
			return nil, fieldErr("limit.window", "must be whole milliseconds, got %v", w)
		}
		if err := checkPhase(l, w); err != nil {
			return nil, err
		}
	}
	if len(l.Regions) == 0 {
		return nil, fieldErr("limit.regions", "at least one region is required")
	}
	seen := map[string]bool{}
	for i, r := range l.Regions {
		f := fmt.Sprintf("limit.regions[%d]", i)
		if err := vocab.ValidateRegion(f, r); err != nil {
			return nil, err
		}
		if !slices.Contains(known, r) {
			return nil, fieldErr(f, "unknown region %q (known: %v)", r, known)
		}
		if seen[r] {
			return nil, fieldErr(f, "duplicate region %q", r)
		}
		seen[r] = true
	}
	slices.Sort(l.Regions)
	switch l.Mode {
	case pb.Mode_MODE_STRICT, pb.Mode_MODE_BOUNDED:
	case pb.Mode_MODE_UNSPECIFIED:
		return nil, fieldErr("limit.mode", "required: strict or bounded")
	default:
		return nil, fieldErr("limit.mode", "unknown mode %d", l.Mode)
	}
	for r, fb := range l.Fallback {
		f := "limit.fallback[" + r + "]"
		if !seen[r] {
			return nil, fieldErr(f, "region %q is not in limit.regions", r)
		}
		if fb == nil {
			return nil, fieldErr(f, "required")
		}
		switch fb.Kind {
		case pb.FallbackKind_FALLBACK_KIND_CLOSED, pb.FallbackKind_FALLBACK_KIND_OPEN:
			if fb.LocalTokens != 0 {
				return nil, fieldErr(f+".local_tokens", "only local fallbacks take tokens")
			}
		case pb.FallbackKind_FALLBACK_KIND_LOCAL:
			if err := vocab.ValidateTokens(f+".local_tokens", fb.LocalTokens, 1); err != nil {
				return nil, err
			}
		default:
			return nil, fieldErr(f+".kind", "must be closed, local or open")
		}
		if l.Mode == pb.Mode_MODE_STRICT && fb.Kind != pb.FallbackKind_FALLBACK_KIND_CLOSED {
			return nil, fieldErr(f, "strict limits admit only leased tokens: fallback must be closed (use mode bounded)")
		}
		if bucket && fb.Kind != pb.FallbackKind_FALLBACK_KIND_CLOSED {
			return nil, fieldErr(f, "bucket limits fall back closed only in this version (a region without a share answers UNAVAILABLE)")
		}
		if conc && fb.Kind == pb.FallbackKind_FALLBACK_KIND_OPEN {
			return nil, fieldErr(f, "concurrency limits fall back closed or local:A (at most A slots held in the region while the allocator is unreachable), not open")
		}
	}
	if l.Lease == nil {
		l.Lease = &pb.LeaseSettings{}
	}
	if bucket || conc {
		if err := checkShareSettings(l); err != nil {
			return nil, err
		}
		if l.HashTag == l.Id {
			l.HashTag = ""
		}
		if err := validateHashTag(l); err != nil {
			return nil, err
		}
		return l, nil
	}
	ttl := w / 4
	if l.Lease.Ttl != nil {
		if err := l.Lease.Ttl.CheckValid(); err != nil {
			return nil, fieldErr("limit.lease.ttl", "%v", err)
		}
		ttl = l.Lease.Ttl.AsDuration()
		switch {
		case ttl < 100*time.Millisecond:
			return nil, fieldErr("limit.lease.ttl", "must be >= 100ms, got %v", ttl)
		case ttl > w:
			return nil, fieldErr("limit.lease.ttl", "must be <= the window (%v), got %v", w, ttl)
		}
	}
	l.Lease.Ttl = durationpb.New(ttl)
	if err := vocab.ValidateTokens("limit.lease.min_chunk", l.Lease.MinChunk, 0); err != nil {
		return nil, err
	}
	if l.Lease.MinChunk == 0 {
		l.Lease.MinChunk = 1
	}
	if err := vocab.ValidateTokens("limit.lease.max_chunk", l.Lease.MaxChunk, 0); err != nil {
		return nil, err
	}
	if l.Lease.MaxChunk != 0 && l.Lease.MaxChunk < l.Lease.MinChunk {
		return nil, fieldErr("limit.lease.max_chunk", "must be >= min_chunk (%d), got %d", l.Lease.MinChunk, l.Lease.MaxChunk)
	}
	if l.Lease.MinChunk > l.LimitTokens {
		return nil, fieldErr("limit.lease.min_chunk", "must be <= limit_tokens (%d), got %d", l.LimitTokens, l.Lease.MinChunk)
	}
	if err := vocab.ValidateTokens("limit.lease.standing", l.Lease.Standing, 0); err != nil {
		return nil, err
	}
	if n := int64(len(l.Regions)); l.Lease.Standing > l.LimitTokens/n {
		// Every region's share is counted as granted from the window's
		// start: together they must fit in G.
		return nil, fieldErr("limit.lease.standing", "standing x regions must be <= limit_tokens: at most %d for %d regions and limit_tokens %d, got %d",
			l.LimitTokens/n, n, l.LimitTokens, l.Lease.Standing)
	}
	// The hash tag: the limit id means none (the keys' layout without
	// tags), so it is stored empty.
	if l.HashTag == l.Id {
		l.HashTag = ""
	}
	if err := validateHashTag(l); err != nil {
		return nil, err
	}
	if l.SettleGrace != nil {
		if err := l.SettleGrace.CheckValid(); err != nil {
			return nil, fieldErr("limit.settle_grace", "%v", err)
		}
		if g := l.SettleGrace.AsDuration(); g < time.Second || g > MaxSettleGrace || g%time.Millisecond != 0 {
			return nil, fieldErr("limit.settle_grace", "must be whole milliseconds in 1s..%v, got %v", MaxSettleGrace, g)
		}
	}
	switch l.DebtPolicy {
	case pb.DebtPolicy_DEBT_POLICY_UNSPECIFIED, pb.DebtPolicy_DEBT_POLICY_CARRY, pb.DebtPolicy_DEBT_POLICY_FORGIVE:
	default:
		return nil, fieldErr("limit.debt_policy", "must be carry or forgive, got %d", l.DebtPolicy)
	}
	return l, nil
}

// checkPhase checks a window limit's phase offset: 0 <= φ < W, whole
// milliseconds. A zero phase is stored unset, so that a limit without a
// phase reads (and diffs) as it always did.
func checkPhase(l *pb.Limit, w time.Duration) error {
	if l.WindowPhase == nil {
		return nil
	}
	if err := l.WindowPhase.CheckValid(); err != nil {
		return fieldErr("limit.window_phase", "%v", err)
	}
	p := l.WindowPhase.AsDuration()
	switch {
	case p < 0:
		return fieldErr("limit.window_phase", "must be >= 0, got %v", p)
	case p >= w:
		return fieldErr("limit.window_phase", "must be less than the window (%v), got %v", w, p)
	case p%time.Millisecond != 0:
		return fieldErr("limit.window_phase", "must be whole milliseconds, got %v", p)
	}
	if p == 0 {
		l.WindowPhase = nil
	}
	return nil
}

// Phase returns a validated window limit's phase offset (0 when unset).
func Phase(l *pb.Limit) time.Duration {
	return l.GetWindowPhase().AsDuration()
}

// MaxZoneLen bounds a calendar's zone name (IANA names are at most about
// 30 bytes).
const MaxZoneLen = zones.MaxZoneLen

// checkCalendar checks a window limit's calendar windows: a known unit, a
// zone the process's zone cache loads (zones.Load, the embedded
// database), neither window nor window_phase beside them. The lease ttl
// is then checked against the unit's shortest window (zones.Shortest).
func checkCalendar(l *pb.Limit) (lease.Calendar, error) {
	c := l.Calendar
	if _, err := lease.ParseUnit(c.Unit); err != nil {
		return lease.Calendar{}, fieldErr("limit.calendar.unit", "must be day, week, month or year, got %q", vocab.Cap(c.Unit, 16))
	}
	if c.Zone == "" || len(c.Zone) > MaxZoneLen {
		return lease.Calendar{}, fieldErr("limit.calendar.zone", "an IANA time zone name of 1-%d bytes is required, e.g. Europe/Berlin", MaxZoneLen)
	}
	cal, err := zones.Calendar(c.Unit, c.Zone)
	if err != nil {
		return lease.Calendar{}, fieldErr("limit.calendar.zone", "unknown time zone %q", c.Zone)
	}
	if l.Window != nil {
		return lease.Calendar{}, fieldErr("limit.window", "a limit with calendar windows has no fixed window: give calendar or window, not both")
	}
	if l.WindowPhase != nil {
		return lease.Calendar{}, fieldErr("limit.window_phase", "calendar windows start at local midnight: a phase offset is for fixed windows")
	}
	return cal, nil
}

// Schedule returns the window schedule of a validated window limit: its
// calendar windows, or its fixed windows (window, window_phase). A
// calendar whose zone does not load (never for a validated limit) gives
// the empty schedule, which has no windows.
func Schedule(l *pb.Limit) lease.Windows {
	if c := l.GetCalendar(); c != nil {
		cal, err := zones.Calendar(c.Unit, c.Zone)
		if err != nil {
			return lease.Windows{}
		}
		return lease.CalendarWindows(cal)
	}
	return lease.WindowsOf(l.GetWindow().AsDuration(), l.GetWindowPhase().AsDuration())
}

// validateHashTag checks a limit's hash tag; a plan's "{id}" (checkPlan)
// stands for each tenant's own tag (planbind.TenantTag).
func validateHashTag(l *pb.Limit) error {
	if planbind.IsPlan(l.Id) && l.HashTag == planbind.Placeholder {
		return nil
	}
	return vocab.ValidateHashTag("limit.hash_tag", l.HashTag)
}
