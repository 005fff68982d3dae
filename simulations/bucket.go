package simulations

import "leasehold/regionagent/store"

// The in-memory region bucket is store.Mem, where the region agent also
// keeps the leases it holds in process while its Redis is down. These names
// keep the simulator's vocabulary.

// BKey names a bucket: one (limit, window).
type BKey = store.Key

// Deposit is a deposit into a Bucket.
type Deposit = store.Deposit

// Bucket is an in-memory region bucket with the semantics of the Redis
// scripts of regionagent/bucket; see store.Mem.
type Bucket = store.Mem

// NewBucket returns an empty bucket whose orphan keys live orphanTTLMs.
func NewBucket(orphanTTLMs int64) *Bucket { return store.NewMem(orphanTTLMs) }
