package allocator

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Bounds on identifiers. They keep etcd keys, Redis keys and lease ids
// parseable and small.
const (
	maxLimitIDLen   = 200
	maxRequestIDLen = 128
	maxRegionLen    = 32
	maxOwnerLen     = 200
	maxDescLen      = 2000
	maxTags         = 32
	maxTagLen       = 200
	// MaxWindow bounds W; longer windows would keep grant records for days.
	MaxWindow = 31 * 24 * time.Hour
)

var (
	limitIDRe   = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
	requestIDRe = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	regionRe    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
)

// ValidateLimitID checks a limit id: 1-200 characters of [A-Za-z0-9._-] in
// "/"-separated segments, none of them "." or ".." (so every id is a clean
// URL path and names itself in the HTTP API).
func ValidateLimitID(field, id string) error {
	switch {
	case id == "":
		return fieldErr(field, "required")
	case len(id) > maxLimitIDLen:
		return fieldErr(field, "longer than %d characters", maxLimitIDLen)
	case !limitIDRe.MatchString(id):
		return fieldErr(field, "%q: use [A-Za-z0-9._-] in segments separated by single '/'", id)
	}
	for seg := range strings.SplitSeq(id, "/") {
		if seg == "." || seg == ".." {
			return fieldErr(field, "%q: a segment may not be %q", id, seg)
		}
	}
	return nil
}

// ValidateRequestID checks an idempotency key or reporter id.
func ValidateRequestID(field, id string) error {
	switch {
	case id == "":
		return fieldErr(field, "required")
	case len(id) > maxRequestIDLen:
		return fieldErr(field, "longer than %d characters", maxRequestIDLen)
	case !requestIDRe.MatchString(id):
		return fieldErr(field, "%q: use only [A-Za-z0-9._-]", id)
	}
	return nil
}

// ValidateRegion checks a region name: lower-case letters, digits, dashes.
func ValidateRegion(field, r string) error {
	switch {
	case r == "":
		return fieldErr(field, "required")
	case len(r) > maxRegionLen:
		return fieldErr(field, "longer than %d characters", maxRegionLen)
	case !regionRe.MatchString(r):
		return fieldErr(field, "%q: use [a-z0-9-], starting and ending with a letter or digit", r)
	}
	return nil
}

// Limit is the allocator's view of a limit, decoded once from its record.
// Immutable once built: a change replaces the value.
type Limit struct {
	ID       string
	Tokens   int64         // G
	Window   time.Duration // W
	Regions  []string      // sorted
	TTL      time.Duration // lease ttl (<= W)
	MinChunk int64
	MaxChunk int64
	Version  int64
	Proto    *pb.Limit // as stored, for Admin and SyncLimits
	// EffectiveFrom is when this version starts to govern; Previous is the
	// version that governs before it (nil when none is scheduled).
	// Windows are decided by the version that governs their start.
	EffectiveFrom time.Time
	Previous      *Limit
}

// At returns the version of l that governs instant t: Previous before
// EffectiveFrom, l from then on.
func (l *Limit) At(t time.Time) *Limit {
	if l.Previous != nil && t.Before(l.EffectiveFrom) {
		return l.Previous
	}
	return l
}

// forIndex returns the version whose window of that index this is. An
// index means a different instant under each version's window length;
// the version that governs the start of its reading wins, and when both
// readings are governed by their own version (window lengths differ), the
// reading nearest to now.
func (l *Limit) forIndex(index int64, now time.Time) *Limit {
	if l.Previous == nil {
		return l
	}
	var best *Limit
	var bestDist time.Duration
	for _, v := range []*Limit{l, l.Previous} {
		start := lease.Window{Index: index, Length: v.Window}.Start()
		if l.At(start) != v {
			continue
		}
		d := now.Sub(start)
		if d < 0 {
			d = -d
		}
		if best == nil || d < bestDist {
			best, bestDist = v, d
		}
	}
	if best == nil {
		return l.At(now)
	}
	return best
}

// HasRegion reports whether region r spends this limit.
func (l *Limit) HasRegion(r string) bool {
	_, ok := slices.BinarySearch(l.Regions, r)
	return ok
}

// ValidateLimit checks a limit as sent to PutLimit against the allocator's
// known regions and returns it with defaults filled in (ttl, min_chunk),
// regions sorted, and the version left for the store to set. The error
// names the first bad field, e.g. "limit.lease.ttl".
func ValidateLimit(in *pb.Limit, known []string) (*pb.Limit, error) {
	if in == nil {
		return nil, fieldErr("limit", "required")
	}
	l := cloneLimit(in)
	// Set by the allocator, never by the caller.
	l.Version, l.EffectiveFrom, l.Previous = 0, nil, nil
	if err := ValidateLimitID("limit.id", l.Id); err != nil {
		return nil, err
	}
	if l.LimitTokens < 1 {
		return nil, fieldErr("limit.limit_tokens", "must be >= 1, got %d", l.LimitTokens)
	}
	if l.Window == nil {
		return nil, fieldErr("limit.window", "required")
	}
	if err := l.Window.CheckValid(); err != nil {
		return nil, fieldErr("limit.window", "%v", err)
	}
	w := l.Window.AsDuration()
	switch {
	case w < time.Second:
		return nil, fieldErr("limit.window", "must be >= 1s, got %v", w)
	case w > MaxWindow:
		return nil, fieldErr("limit.window", "must be <= %v, got %v", MaxWindow, w)
	case w%time.Millisecond != 0:
		return nil, fieldErr("limit.window", "must be whole milliseconds, got %v", w)
	}
	if len(l.Regions) == 0 {
		return nil, fieldErr("limit.regions", "at least one region is required")
	}
	seen := map[string]bool{}
	for i, r := range l.Regions {
		f := fmt.Sprintf("limit.regions[%d]", i)
		if err := ValidateRegion(f, r); err != nil {
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
			if fb.LocalTokens < 1 {
				return nil, fieldErr(f+".local_tokens", "local:A needs A >= 1, got %d", fb.LocalTokens)
			}
		default:
			return nil, fieldErr(f+".kind", "must be closed, local or open")
		}
		if l.Mode == pb.Mode_MODE_STRICT && fb.Kind != pb.FallbackKind_FALLBACK_KIND_CLOSED {
			return nil, fieldErr(f, "strict limits admit only leased tokens: fallback must be closed (use mode bounded)")
		}
	}
	if l.Lease == nil {
		l.Lease = &pb.LeaseSettings{}
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
	if l.Lease.MinChunk < 0 {
		return nil, fieldErr("limit.lease.min_chunk", "must be >= 0, got %d", l.Lease.MinChunk)
	}
	if l.Lease.MinChunk == 0 {
		l.Lease.MinChunk = 1
	}
	if l.Lease.MaxChunk < 0 {
		return nil, fieldErr("limit.lease.max_chunk", "must be >= 0, got %d", l.Lease.MaxChunk)
	}
	if l.Lease.MaxChunk != 0 && l.Lease.MaxChunk < l.Lease.MinChunk {
		return nil, fieldErr("limit.lease.max_chunk", "must be >= min_chunk (%d), got %d", l.Lease.MinChunk, l.Lease.MaxChunk)
	}
	if l.Lease.MinChunk > l.LimitTokens {
		return nil, fieldErr("limit.lease.min_chunk", "must be <= limit_tokens (%d), got %d", l.LimitTokens, l.Lease.MinChunk)
	}
	if len(l.Owner) > maxOwnerLen {
		return nil, fieldErr("limit.owner", "longer than %d characters", maxOwnerLen)
	}
	if len(l.Description) > maxDescLen {
		return nil, fieldErr("limit.description", "longer than %d characters", maxDescLen)
	}
	if len(l.Tags) > maxTags {
		return nil, fieldErr("limit.tags", "more than %d tags", maxTags)
	}
	for k, v := range l.Tags {
		if k == "" || len(k) > maxTagLen || len(v) > maxTagLen {
			return nil, fieldErr("limit.tags["+k+"]", "keys must be 1-%d characters and values at most %d", maxTagLen, maxTagLen)
		}
	}
	return l, nil
}

// decodeLimit turns a validated, stored limit into the core's view, with
// the version it replaces while that one is still in force.
func decodeLimit(p *pb.Limit) *Limit {
	l := decodeVersion(p)
	if p.Previous != nil && p.EffectiveFrom != nil {
		l.EffectiveFrom = p.EffectiveFrom.AsTime()
		l.Previous = decodeVersion(p.Previous)
	}
	return l
}

func decodeVersion(p *pb.Limit) *Limit {
	return &Limit{
		ID:       p.Id,
		Tokens:   p.LimitTokens,
		Window:   p.Window.AsDuration(),
		Regions:  slices.Sorted(slices.Values(p.Regions)),
		TTL:      p.GetLease().GetTtl().AsDuration(),
		MinChunk: p.GetLease().GetMinChunk(),
		MaxChunk: p.GetLease().GetMaxChunk(),
		Version:  p.Version,
		Proto:    p,
	}
}

// scheduled reports whether the stored limit p still waits for a change
// to come into force at now.
func scheduled(p *pb.Limit, now time.Time) bool {
	return p.GetPrevious() != nil && p.GetEffectiveFrom() != nil && now.Before(p.EffectiveFrom.AsTime())
}

// inForce returns the version of the stored limit p that governs now,
// without a previous version: what agents enforce.
func inForce(p *pb.Limit, now time.Time) *pb.Limit {
	if scheduled(p, now) {
		v := cloneLimit(p.Previous)
		v.Previous = nil
		return v
	}
	if p.GetPrevious() == nil {
		return p
	}
	v := cloneLimit(p)
	v.Previous = nil
	return v
}

// asShown returns the stored limit p as readers see it at now: the
// previous version is kept only while it is still in force.
func asShown(p *pb.Limit, now time.Time) *pb.Limit {
	if p.GetPrevious() == nil || scheduled(p, now) {
		return p
	}
	v := cloneLimit(p)
	v.Previous = nil
	return v
}
