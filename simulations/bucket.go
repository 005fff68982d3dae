package simulations

import "leasehold/regionagent/bucket"

// The in-memory region bucket lives in regionagent/bucket (bucket.Mem),
// where the region agent also keeps the leases it holds in process while
// its Redis is down. These names keep the simulator's vocabulary.

// BKey names a bucket: one (limit, window), like bucket.Key.
type BKey struct {
	Limit  string
	Window int64
}

// Deposit is bucket.Deposit with a BKey.
type Deposit = bucket.MemDeposit[BKey]

// Bucket is an in-memory region bucket with the semantics of the Redis
// scripts of regionagent/bucket; see bucket.Mem.
type Bucket = bucket.Mem[BKey]

// NewBucket returns an empty bucket whose orphan keys live orphanTTLMs.
func NewBucket(orphanTTLMs int64) *Bucket { return bucket.NewMem[BKey](orphanTTLMs) }
