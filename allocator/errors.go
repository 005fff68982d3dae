package allocator

import (
	"errors"

	"leasehold/internal/vocab"
)

// Sentinel errors. Callers match them with errors.Is; the gRPC server maps
// them to status codes in one table (toStatus, server.go). Bad input is a
// *vocab.FieldError naming the field; it matches vocab.ErrInvalid.
var (
	// ErrNotFound: no such limit.
	ErrNotFound = errors.New("allocator: not found")
	// ErrVersionMismatch: an expected version did not match the stored one.
	ErrVersionMismatch = errors.New("allocator: version mismatch")
	// ErrNotLeader: this replica does not lead; the error carries the
	// leader's address when it is known.
	ErrNotLeader = errors.New("allocator: not leader")
	// ErrFenced: a write was refused because this replica lost leadership
	// between deciding and committing. Nothing was committed.
	ErrFenced = errors.New("allocator: fenced: leadership lost")
	// ErrStopped: the allocator is shutting down.
	ErrStopped = errors.New("allocator: stopped")
)

// fieldErr is bad input in one field: a *vocab.FieldError, matching
// vocab.ErrInvalid.
func fieldErr(field, format string, args ...any) error {
	return vocab.InvalidField(field, format, args...)
}

// NotLeaderError is returned by a follower. It matches ErrNotLeader.
type NotLeaderError struct {
	Leader string // the leader's advertised gRPC address; "" if unknown
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "allocator: not leader (no leader elected)"
	}
	return "allocator: not leader; leader is " + e.Leader
}
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
