package limitspec

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Bounds on a limit's definition.
const (
	// MaxWindow bounds W; longer windows would keep grant records for days.
	MaxWindow = 31 * 24 * time.Hour
	// MaxOwnerLen, MaxDescriptionLen, MaxTags and MaxTagLen bound the
	// limit's free-form fields (a tag's key and its value each).
	MaxOwnerLen       = 200
	MaxDescriptionLen = 2000
	MaxTags           = 32
	MaxTagLen         = 200
	// MaxApplyChanges caps the changes of one ApplyLimits call. Each change
	// costs two writes (the limit and its history entry) in the one etcd
	// transaction that also carries the audit record and the limits
	// revision, so an allocator's cap is also (max txn ops - 2) / 2 (see
	// allocator.WithGroupCommit): 63 with etcd's default --max-txn-ops of
	// 128.
	MaxApplyChanges = 100
)

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
	l := proto.Clone(in).(*pb.Limit)
	// Set by the allocator, never by the caller.
	l.Version, l.EffectiveFrom, l.Previous = 0, nil, nil
	if err := vocab.ValidateLimitID("limit.id", l.Id); err != nil {
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
	if len(l.Owner) > MaxOwnerLen {
		return nil, fieldErr("limit.owner", "longer than %d characters", MaxOwnerLen)
	}
	if len(l.Description) > MaxDescriptionLen {
		return nil, fieldErr("limit.description", "longer than %d characters", MaxDescriptionLen)
	}
	if len(l.Tags) > MaxTags {
		return nil, fieldErr("limit.tags", "more than %d tags", MaxTags)
	}
	for k, v := range l.Tags {
		if k == "" || len(k) > MaxTagLen || len(v) > MaxTagLen {
			return nil, fieldErr("limit.tags["+k+"]", "keys must be 1-%d characters and values at most %d", MaxTagLen, MaxTagLen)
		}
	}
	return l, nil
}
