package regionagent

import (
	"errors"

	"leasehold/internal/vocab"
)

// Sentinel errors, mapped to gRPC codes in one table (server.go).
var (
	// ErrInvalid marks bad input; the error names the field. It is the
	// vocabulary's (every *FieldError matches it).
	ErrInvalid = vocab.ErrInvalid
	// ErrUnknownLimit: the limit does not exist or is not spent in this
	// region.
	ErrUnknownLimit = errors.New("regionagent: unknown limit")
	// ErrUnknownDecision: Settle names no settle-later decision of the
	// limit (never made, released, or long gone).
	ErrUnknownDecision = errors.New("regionagent: unknown decision")
	// ErrSettleRefused: the decision cannot be settled so: its grace
	// period is over, or it was settled with another actual cost.
	ErrSettleRefused = errors.New("regionagent: settle refused")
	// ErrSlotNotHeld: HeartbeatSlot names a slot that is not held
	// (released, expired or unknown): its holder has lost it.
	ErrSlotNotHeld = errors.New("regionagent: slot not held")

	// errNotSynced: the agent has no limits from the allocator yet
	// (UNAVAILABLE: ask again soon).
	errNotSynced = errors.New("regionagent: not synced")
	// errEpochChanged: Redis's buckets changed incarnation during a read.
	errEpochChanged = errors.New("regionagent: bucket epoch changed during the read")
	// errNoEpoch: a limit's buckets have no epoch yet.
	errNoEpoch = errors.New("regionagent: no bucket epoch yet")
)

// FieldError is bad input in one field ("field: reason"). It matches
// ErrInvalid.
type FieldError = vocab.FieldError

func fieldErr(field, format string, args ...any) error {
	return vocab.InvalidField(field, format, args...)
}
