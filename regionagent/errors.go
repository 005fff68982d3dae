package regionagent

import (
	"errors"
	"fmt"
)

// Sentinel errors, mapped to gRPC codes in one table (server.go).
var (
	// ErrInvalid marks bad input; the error names the field.
	ErrInvalid = errors.New("regionagent: invalid argument")
	// ErrUnknownLimit: the limit does not exist or is not spent in this
	// region.
	ErrUnknownLimit = errors.New("regionagent: unknown limit")

	// errNotSynced: the agent has no limits from the allocator yet
	// (UNAVAILABLE: ask again soon).
	errNotSynced = errors.New("regionagent: not synced")
	// errEpochChanged: Redis's buckets changed incarnation during a read.
	errEpochChanged = errors.New("regionagent: bucket epoch changed during the read")
	// errNoEpoch: a limit's buckets have no epoch yet.
	errNoEpoch = errors.New("regionagent: no bucket epoch yet")
)

// FieldError is bad input in one field. It matches ErrInvalid.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string        { return e.Field + ": " + e.Reason }
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
