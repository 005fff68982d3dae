package client

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// Source says who decided.
type Source uint8

const (
	// SourceAgent: the region agent decided (a Check).
	SourceAgent Source = iota
	// SourceDenialCache: a denial the agent gave earlier, repeated locally
	// until its retry-after.
	SourceDenialCache
	// SourceSubLease: spent in process from a chunk reserved from the
	// region.
	SourceSubLease
)

func (s Source) String() string {
	switch s {
	case SourceAgent:
		return "agent"
	case SourceDenialCache:
		return "denial-cache"
	case SourceSubLease:
		return "sub-lease"
	}
	return "unknown"
}

// DecisionID names one decision (for logs and problem reports). It is
// random, not secret (math/rand/v2), made without allocating: 128 random
// bits, or for decisions from one sub-lease 64 bits shared by the chunk
// and 64 random bits per decision.
type DecisionID [16]byte

func newDecisionID() DecisionID { return decisionIDWith(rand.Uint64()) }

// decisionIDWith makes an id from a 64-bit prefix and 64 random bits.
func decisionIDWith(prefix uint64) DecisionID {
	var id DecisionID
	binary.LittleEndian.PutUint64(id[:8], prefix)
	binary.LittleEndian.PutUint64(id[8:], rand.Uint64())
	return id
}

// String returns the id as 32 hexadecimal digits.
func (id DecisionID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero id (no decision).
func (id DecisionID) IsZero() bool { return id == DecisionID{} }

// Decision is the answer to one Allow.
type Decision struct {
	// Allowed: the request may pass (Reason OK or FALLBACK).
	Allowed bool
	// Reason: OK, OVER_LIMIT, UNAVAILABLE (the agent cannot decide) or
	// FALLBACK (admitted under the region's fallback).
	Reason pb.Reason
	// Remaining is the region's spendable balance as last known (for a
	// sub-lease decision: this client's chunk plus the region's balance
	// when the chunk was reserved). An estimate, for headers.
	Remaining int64
	// RetryAfter is when a denied caller should try again.
	RetryAfter time.Duration
	// ResetAfter is the time until the limit's current window ends.
	ResetAfter time.Duration
	// Limit is G, Window is W, of the limit's Version.
	Limit   int64
	Window  time.Duration
	Version int64
	// ID names this decision.
	ID DecisionID
	// Source says who decided.
	Source Source
	// WouldDeny: the limit is in shadow mode and enforcement would have
	// denied the request for this reason (OVER_LIMIT or UNAVAILABLE);
	// Allowed is then true. UNSPECIFIED otherwise.
	WouldDeny pb.Reason
}
