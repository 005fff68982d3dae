package regionagent

import (
	"context"
	"errors"
	"sync"
	"time"

	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// lockLease is how long a replica's renewal lock of a limit lives in Redis
// without being extended. The replica extends the locks of its rounds in
// progress every lockLease/3 (a round waits on the allocator up to its
// retry budget, 5 s, and then deposits), so a round keeps its lock however
// long it takes, and a replica that dies holding one holds up the limit's
// renewals in its region for at most lockLease: the other replicas go on
// spending the region's balance meanwhile, and renew once it expires.
// (A lock of a fixed 10 s, long enough for any round, held renewals up for
// 10 s after a replica was killed.)
const lockLease = 3 * time.Second

// heldLocks are the renewal locks this replica's rounds hold in Redis.
type heldLocks struct {
	mu sync.Mutex // protects m
	m  map[string]bool
}

func (h *heldLocks) add(key string) {
	h.mu.Lock()
	if h.m == nil {
		h.m = map[string]bool{}
	}
	h.m[key] = true
	h.mu.Unlock()
}

func (h *heldLocks) remove(key string) {
	h.mu.Lock()
	delete(h.m, key)
	h.mu.Unlock()
}

func (h *heldLocks) keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.m))
	for k := range h.m {
		out = append(out, k)
	}
	return out
}

// lockKey is the renewal lock of the round's limit.
func lockKey(k core.Round) string { return bucket.LockKey(k.Key.HashTag, k.Key.Limit) }

// lockLoop extends the renewal locks this replica holds, all in one
// pipeline, every lockLease/3 until ctx ends. With no round in progress
// it sends nothing.
func (a *Agent) lockLoop(ctx context.Context) {
	t := time.NewTicker(lockLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keys := a.locks.keys()
		if len(keys) == 0 {
			continue
		}
		x := a.shared.b.Batch()
		for _, k := range keys {
			x.ExtendLock(k, a.cfg.ReplicaID, lockLease)
		}
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		x.Exec(rctx)
		cancel()
		for i, k := range keys {
			// A lock that expired (a pause longer than lockLease) may be
			// another replica's now: this round no longer holds it. Two
			// replicas renewing at once is harmless: each asks with its
			// own request ids and what the region holds.
			if errors.Is(x.Extended(i), bucket.ErrNotHeld) {
				a.locks.remove(k)
			}
		}
	}
}
