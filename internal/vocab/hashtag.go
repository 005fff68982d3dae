package vocab

// MaxHashTagLen bounds a limit's hash tag (it is part of every Redis key
// of the limit).
const MaxHashTagLen = 64

// ValidateHashTag checks a limit's hash tag: empty (the limit id is the
// tag), or 1-64 characters with the grammar of a limit id:
// [A-Za-z0-9._-] in "/"-separated segments. Braces and ':' can never
// appear, so the tag is the whole Redis Cluster hash tag of the limit's
// keys and those keys stay parseable. The error is a *FieldError naming
// field.
func ValidateHashTag(field, tag string) error {
	switch {
	case tag == "":
		return nil
	case len(tag) > MaxHashTagLen:
		return InvalidField(field, "longer than %d characters", MaxHashTagLen)
	case !limitIDRe.MatchString(tag):
		return InvalidField(field, "%q: use [A-Za-z0-9._-] in segments separated by single '/' (no braces)", tag)
	}
	return nil
}
