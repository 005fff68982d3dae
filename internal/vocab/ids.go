package vocab

import (
	"regexp"
	"strings"
)

// Bounds on identifiers. They keep etcd keys, Redis keys and lease ids
// parseable and small.
const (
	// MaxLimitIDLen bounds a limit id (and a prefix of one).
	MaxLimitIDLen = 200
	// MaxRequestIDLen bounds a request id: an idempotency key, a reporter,
	// a replica or a reservation id.
	MaxRequestIDLen = 128
	// MaxRegionLen bounds a region name.
	MaxRegionLen = 32
	// MaxLeaseIDLen bounds a lease id as a return names it: the window,
	// the region and the request id that produced it.
	MaxLeaseIDLen = 2 * MaxRequestIDLen
)

var (
	limitIDRe   = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
	requestIDRe = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	regionRe    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
)

// ValidateLimitID checks a limit id: 1-200 characters of [A-Za-z0-9._-] in
// "/"-separated segments, none of them "." or ".." (so every id is a clean
// URL path and names itself in the HTTP API). The error is a *FieldError
// naming field.
func ValidateLimitID(field, id string) error {
	switch {
	case id == "":
		return InvalidField(field, "required")
	case len(id) > MaxLimitIDLen:
		return InvalidField(field, "longer than %d characters", MaxLimitIDLen)
	case !limitIDRe.MatchString(id):
		return InvalidField(field, "%q: use [A-Za-z0-9._-] in segments separated by single '/'", id)
	}
	if seg := DotSegment(id); seg != "" {
		return InvalidField(field, "%q: a segment may not be %q", id, seg)
	}
	return nil
}

// DotSegment returns the first "/"-separated segment of id that is "." or
// "..", which no limit id may have, or "" if there is none.
func DotSegment(id string) string {
	for seg := range strings.SplitSeq(id, "/") {
		if seg == "." || seg == ".." {
			return seg
		}
	}
	return ""
}

// ValidateRequestID checks an idempotency key or reporter id: 1-128
// characters of [A-Za-z0-9._-].
func ValidateRequestID(field, id string) error {
	switch {
	case id == "":
		return InvalidField(field, "required")
	case len(id) > MaxRequestIDLen:
		return InvalidField(field, "longer than %d characters", MaxRequestIDLen)
	case !requestIDRe.MatchString(id):
		return InvalidField(field, "%q: use only [A-Za-z0-9._-]", id)
	}
	return nil
}

// ValidateRegion checks a region name: 1-32 lower-case letters, digits and
// dashes, starting and ending with a letter or digit.
func ValidateRegion(field, r string) error {
	switch {
	case r == "":
		return InvalidField(field, "required")
	case len(r) > MaxRegionLen:
		return InvalidField(field, "longer than %d characters", MaxRegionLen)
	case !regionRe.MatchString(r):
		return InvalidField(field, "%q: use [a-z0-9-], starting and ending with a letter or digit", r)
	}
	return nil
}
