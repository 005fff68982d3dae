package regionagent

import (
	"context"
	"fmt"
	"time"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// evaluateLocal is evaluate while Redis is down: the replica renews the
// leases it holds in process for itself, sized by its own demand, without
// the Redis lock (there is no shared balance to guard), closes and returns
// expired and surplus ones. Requests carry this replica's request ids, so
// a retried request still gets the same lease.
func (a *Agent) evaluateLocal(ctx context.Context, l *limitView, st *limitState) {
	now := a.opt.now()
	w := a.windowOf(now, l)
	bal := a.local.balance(l.id, w.Index, now)
	count := bal.Admitted + bal.Denied + counterValue(bal, counterFallback)
	st.mu.Lock()
	st.localDemand.Observe(now, w.Index, count)
	rate := st.localDemand.Rate(now)
	kickCost := st.kickCost
	spent := st.spentWindow == w.Index && now.Sub(st.spentAt) < spentRetry
	havePending := st.pending != nil
	nextDone := st.localNext == w.Index+1
	st.mu.Unlock()

	p := core.PlanRenewal(core.PlanInput{NowMs: a.local.ms(now), Left: a.windowEnd(w).Sub(now), Rate: rate, TTL: l.ttl,
		Lead: a.opt.lead, Every: a.opt.renewEvery, Bucket: bal, Spent: spent, Pending: havePending,
		NextDone: nextDone, KickCost: kickCost})
	a.log.Debug("renewal (in process): evaluated", "limit", l.id, "window", w.Index, "spendable", bal.Spendable,
		"held", p.Held, "rate", rate, "low", p.Low, "acquire", p.Acquire, "next", p.AcquireNext,
		"surplus", len(p.Surplus), "expired", len(p.Close))
	if p.Acquire {
		a.acquire(ctx, l, st, false, rate, p.Held, p.Want, true)
	}
	if p.AcquireNext {
		a.acquire(ctx, l, st, true, rate, 0, 0, true)
	}
	a.closeAndReturnLocal(ctx, l, w.Index, p.Closing())
}

func counterValue(bal bucket.BalanceResult, name string) int64 {
	for _, c := range bal.Counters {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}

// depositLocal stores a lease in process with the same deadline
// arithmetic as deposit: the deadline is measured from when the request
// was sent, on the agent's monotonic clock, minus the safety margin; a
// next-window lease starts when the reply arrived plus starts_in.
func (a *Agent) depositLocal(l *limitView, ls *pb.Lease, sent, recv time.Time) error {
	expires := ls.ExpiresIn.AsDuration()
	deadline := lease.Deadline(sent, expires, a.opt.safetyMargin(expires))
	d := store.Deposit{
		Key:        store.Key{Limit: l.id, Window: ls.WindowIndex},
		LeaseID:    ls.LeaseId,
		Tokens:     ls.Tokens,
		DeadlineMs: a.local.ms(deadline),
		NowMs:      a.local.ms(recv),
	}
	if ls.StartsIn.AsDuration() > 0 {
		d.StartMs = a.local.msUp(lease.StartAt(recv, ls.StartsIn.AsDuration()))
	}
	if d.DeadlineMs <= d.StartMs || d.DeadlineMs <= d.NowMs {
		return errUselessLease
	}
	d.ExpireAtMs = max(a.local.ms(recv.Add(ls.WindowLeft.AsDuration())), d.DeadlineMs) + a.opt.keyGrace.Milliseconds()
	res, err := a.local.deposit(d)
	if err != nil {
		return err
	}
	switch res.Status {
	case bucket.Deposited:
		a.lm.leaseTokens.Add(float64(ls.Tokens))
		return nil
	case bucket.AlreadyDeposited:
		return nil
	}
	return fmt.Errorf("regionagent: in-process store refused the deposit: %s", res.Status)
}

// closeAndReturnLocal closes in-process leases of window and returns their
// unspent tokens to the allocator in one call. A close counts its unspent
// tokens once: a lease already closed is not returned again.
func (a *Agent) closeAndReturnLocal(ctx context.Context, l *limitView, window int64, ids []string) {
	if len(ids) == 0 {
		return
	}
	now := a.opt.now()
	var rets []*pb.LeaseReturn
	for _, id := range ids {
		r := a.local.close(l.id, window, id, now)
		if r.AlreadyClosed || r.Unknown {
			continue
		}
		rets = append(rets, &pb.LeaseReturn{LimitId: l.id, LeaseId: id, Unspent: r.Unspent})
	}
	if len(rets) > 0 {
		a.returnLeases(ctx, l.id, rets)
	}
}

// drainLocal, once Redis answers again, closes every in-process lease of
// the limit (previous, current and next window) and returns what they had
// left, so the region goes back to one shared balance.
func (a *Agent) drainLocal(ctx context.Context, l *limitView, st *limitState) {
	st.mu.Lock()
	st.localNext = -1
	st.mu.Unlock()
	if !a.local.holds(l.id) {
		return
	}
	now := a.opt.now()
	w := a.windowOf(now, l)
	for idx := w.Index - 1; idx <= w.Index+1; idx++ {
		bal := a.local.balance(l.id, idx, now)
		ids := make([]string, 0, len(bal.Open)+len(bal.Expired))
		for _, o := range bal.Open {
			ids = append(ids, o.ID)
		}
		for _, e := range bal.Expired {
			ids = append(ids, e.ID)
		}
		if len(ids) > 0 {
			a.log.Info("returning in-process leases", "limit", l.id, "window", idx, "leases", len(ids))
			a.closeAndReturnLocal(ctx, l, idx, ids)
		}
	}
}

// localUsage is what this replica admitted and denied from in-process
// leases (and under a fallback mode while Redis was down) in the windows
// idx of limit, for the usage report.
func (a *Agent) localUsage(limit string, from, to int64, now time.Time) []*pb.Usage {
	var out []*pb.Usage
	for idx := from; idx <= to; idx++ {
		bal := a.local.balance(limit, idx, now)
		u := usageOf(limit, idx, bal)
		if u.Admitted+u.Denied+u.FallbackAdmitted > 0 {
			out = append(out, u)
		}
	}
	return out
}

// usageOf turns a bucket's counters into a usage record.
func usageOf(limit string, window int64, bal bucket.BalanceResult) *pb.Usage {
	u := &pb.Usage{LimitId: limit, WindowIndex: window, Admitted: bal.Admitted, Denied: bal.Denied}
	for _, c := range bal.Counters {
		switch c.Name {
		case counterFallback:
			u.FallbackAdmitted = c.Value
		case counterModeLocal:
			u.Fallback = max(u.Fallback, pb.FallbackKind_FALLBACK_KIND_LOCAL)
		case counterModeOpen:
			u.Fallback = pb.FallbackKind_FALLBACK_KIND_OPEN
		}
	}
	return u
}

// localReporter names this process's in-process counts at the allocator:
// the replica id and the process nonce, so a restarted replica (whose
// counts start again from zero) is a new reporter, and the allocator sums
// replicas and the shared bucket without counting anything twice.
func localReporter(replicaID, nonce string) string {
	const maxLen = 128 // allocator.ValidateRequestID
	suffix := "." + nonce
	if len(replicaID)+len(suffix) > maxLen {
		replicaID = replicaID[:maxLen-len(suffix)]
	}
	return replicaID + suffix
}

// bucketReporter names the shared bucket's counts of one Redis incarnation
// (see bucket.Epoch): every replica reports the same counts under the same
// name (the allocator keeps the highest), and counts that restart from
// zero after Redis lost its data are a new reporter, added to the old.
func bucketReporter(epoch string) string { return "bucket-" + epoch }
