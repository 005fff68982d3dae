package allocator

import (
	"context"
	"slices"
	"sync"

	pb "leasehold/proto/leasehold/v1"
)

// Agents learn limit changes by SyncLimits, about once a second. The
// answer holds, per limit, the version in force at the allocator's now
// (a change scheduled for the next window boundary is sent once it
// governs), so agents switch mode, fallback and G within one sync of the
// boundary and need to know nothing of scheduled changes.
//
// The revision an agent echoes must therefore change at such a boundary
// too, although etcd did not: while changes wait for a boundary, the
// revision is -(etcd revision << 20 | changes still waiting), which
// changes each time one comes into force; with none waiting it is the
// etcd revision of the last limit change.

// pendingBits is how many waiting changes the revision can count; with
// more, the answer is never "unchanged".
const pendingBits = 20

// syncCache keeps the limits read at one limits revision, so that an
// agent's sync costs one etcd read while nothing changes.
type syncCache struct {
	mu     sync.Mutex // protects rev, limits
	rev    int64
	limits []*pb.Limit
}

func (a *Allocator) limitsAt(ctx context.Context) (int64, []*pb.Limit, error) {
	rev, err := a.store.LimitsRevision(ctx)
	if err != nil {
		return 0, nil, err
	}
	a.sync.mu.Lock()
	if a.sync.rev == rev && a.sync.limits != nil {
		ls := a.sync.limits
		a.sync.mu.Unlock()
		return rev, ls, nil
	}
	a.sync.mu.Unlock()
	all, err := a.store.AllLimits(ctx)
	if err != nil {
		return 0, nil, err
	}
	if all == nil {
		all = []*pb.Limit{}
	}
	a.sync.mu.Lock()
	a.sync.rev, a.sync.limits = rev, all
	a.sync.mu.Unlock()
	return rev, all, nil
}

// SyncLimits answers an agent of region that knows revision known: the
// versions in force now of the limits spent in region, or unchanged.
func (a *Allocator) SyncLimits(ctx context.Context, region string, known int64) (*pb.SyncLimitsResponse, error) {
	etcdRev, all, err := a.limitsAt(ctx)
	if err != nil {
		return nil, err
	}
	now := a.opt.now()
	pending := 0
	for _, l := range all {
		if scheduled(l, now) && (spentIn(l, region) || spentIn(l.Previous, region)) {
			pending++
		}
		if overriding(l, now) && spentIn(l, region) {
			pending++ // its end changes what the region enforces, with no write
		}
	}
	rev := etcdRev
	if pending > 0 {
		rev = -(etcdRev<<pendingBits | int64(min(pending, 1<<pendingBits-1)))
	}
	nanos := now.UnixNano()
	if etcdRev != 0 && rev == known && pending < 1<<pendingBits-1 {
		return &pb.SyncLimitsResponse{Revision: rev, Unchanged: true, AllocatorUnixNanos: nanos}, nil
	}
	out := &pb.SyncLimitsResponse{Revision: rev, AllocatorUnixNanos: nanos}
	for _, l := range all {
		v := inForce(l, now)
		if spentIn(v, region) {
			out.Limits = append(out.Limits, v)
		}
	}
	return out, nil
}

// spentIn reports whether region spends the limit l: one of its regions,
// or, for a plan, one of its tenants' regions (a contract's).
func spentIn(l *pb.Limit, region string) bool {
	if slices.Contains(l.GetRegions(), region) {
		return true
	}
	for _, c := range l.GetContracts() {
		if slices.Contains(c.GetRegions(), region) {
			return true
		}
	}
	return false
}
