package allocator

import "leasehold/internal/vocab"

// Names the region agent (package regionagent) still takes from here. They
// are leasehold/internal/vocab's, under their old names, until the agent
// imports vocab itself; nothing else uses them. Remove them then.

// LeaderMetadataKey is vocab.LeaderMetadataKey.
const LeaderMetadataKey = vocab.LeaderMetadataKey

// FieldError is vocab.FieldError.
type FieldError = vocab.FieldError

// ValidateRegion is vocab.ValidateRegion.
func ValidateRegion(field, r string) error { return vocab.ValidateRegion(field, r) }

// ValidateRequestID is vocab.ValidateRequestID.
func ValidateRequestID(field, id string) error { return vocab.ValidateRequestID(field, id) }
