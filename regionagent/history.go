package regionagent

import (
	"leasehold/internal/zones"
	"time"

	"leasehold/internal/history"
	"leasehold/regionagent/client"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// WithHistory records the agent's decisions (Check, CheckMulti, the
// Envoy API, the chunks' in-memory decisions), each where its answer is
// final, and its sub-lease reservations and releases, to rec (package
// internal/history checks them offline). Off by default: without it the
// request path pays a nil check.
func WithHistory(rec *history.Recorder) Option { return func(o *options) { o.hist = rec } }

// recordCheck records the answers of a Check the core decided: one record
// per limit. spendAt is when its last spend was sent (zero: none was).
func (a *Agent) recordCheck(items []CheckItem, chk *core.Check, spendAt time.Time) {
	now := a.opt.now().UnixNano()
	path := history.PathRedis
	switch {
	case chk.Store == core.Local:
		path = history.PathInProcess
	case chk.Result == core.ResultNotSynced:
		path = history.PathNone
	}
	for i, an := range chk.Answers {
		reason := an.Reason
		if an.WouldDeny != 0 {
			// Shadow mode: the history holds the enforced decision (the
			// checker's bounds are about it); the request passed anyway.
			reason = an.WouldDeny
		}
		rec := history.Record{Kind: history.KindDecision, T: now, Proc: a.cfg.ReplicaID, Region: a.cfg.Region,
			G: an.Limit, WindowLen: int64(an.Window), WindowPhase: int64(an.Phase), Cal: zones.Format(an.Cal), Path: path, Answer: answerOf(reason)}
		if i < len(items) {
			rec.Limit, rec.Cost = items[i].Limit, max(1, items[i].Cost)
		}
		if i < len(chk.Costs) && chk.Costs[i] > 0 {
			rec.Cost = chk.Costs[i]
		}
		if i < len(chk.Keys) {
			rec.Window = chk.Keys[i].Window
		}
		if an.Reason == core.ReasonFallback && i < len(chk.Count) {
			rec.Fallback = history.FallbackOpen
			if c := chk.Count[i]; c.Mode == store.CounterModeLocal {
				rec.Fallback, rec.Cap = history.FallbackLocal, c.Cap
			}
			rec.Window = chk.Count[i].Key.Window
		}
		if !spendAt.IsZero() {
			rec.Spend = spendAt.UnixNano()
		}
		if len(items) > 1 {
			rec.Items = len(items)
		}
		a.opt.hist.Record(rec)
	}
}

func answerOf(r core.Reason) history.Answer {
	switch r {
	case core.ReasonOK, core.ReasonFallback:
		return history.AnswerOK
	case core.ReasonOverLimit:
		return history.AnswerOverLimit
	}
	return history.AnswerUnavailable
}

// ClientDecisionRecorder returns what client.WithLocalDecisionObserver
// takes to record a client's own decisions to rec: the agent's chunks
// (path history.PathChunk) or a gateway's sub-leases (history.PathSubLease).
// proc and region name the recorder (region may be "": the reservation
// the decision spent from names it).
func ClientDecisionRecorder(rec *history.Recorder, proc, region string, path history.Path) func(client.LocalDecision) {
	return func(d client.LocalDecision) {
		r := history.Record{Kind: history.KindDecision, T: d.At.UnixNano(), Proc: proc, Region: region, Limit: d.Limit,
			Cost: max(1, d.Cost), G: d.Decision.Limit, WindowLen: int64(d.Decision.Window), Path: path,
			Reservation: d.Reservation, Answer: history.AnswerOK}
		if d.Decision.Source == client.SourceDenialCache {
			r.Path, r.Answer = history.PathDenialCache, history.AnswerOverLimit
		}
		rec.Record(r)
	}
}

// recordShare records the region's standing share of a window (d, in its
// bucket) as a grant to the region: the allocator counts it as granted
// from the window's start, without a request or a record of its own. Its
// lease and request ids name the limit too (a share's lease id is the same
// for every limit), and every replica that finds the share records the
// same grant. Start and expiry are the window's, on the allocator's clock.
func (a *Agent) recordShare(now time.Time, l core.Limit, d core.Deposit) {
	w := l.Windows().ByIndex(d.Key.Window)
	id := d.LeaseID + "@" + l.ID
	a.opt.hist.Record(history.Record{Kind: history.KindGrant, T: now.UnixNano(), Proc: a.cfg.ReplicaID,
		Region: a.cfg.Region, Limit: l.ID, Window: d.Key.Window, WindowLen: int64(w.Length), WindowPhase: int64(l.Phase),
		Cal: zones.Format(l.Cal), G: l.Tokens, Request: id, Lease: id, Tokens: d.Tokens,
		Start: w.Start().UnixNano(), Expiry: w.End().UnixNano(), End: w.End().UnixNano()})
}

// recordReserve records a reservation granted of limit from window key.
func (a *Agent) recordReserve(now time.Time, l core.Limit, key store.Key, id string, r Reservation, replayed bool) {
	a.opt.hist.Record(history.Record{Kind: history.KindReserve, T: now.UnixNano(), Proc: a.cfg.ReplicaID,
		Region: a.cfg.Region, Limit: l.ID, Window: key.Window, WindowLen: int64(l.Windows().ByIndex(key.Window).Length), WindowPhase: int64(l.Phase), Cal: zones.Format(l.Cal), G: l.Tokens,
		Reservation: id, Tokens: r.Granted, Expiry: now.Add(r.ExpiresIn).UnixNano(), Replayed: replayed})
}

// recordRelease records a release the bucket of window took.
func (a *Agent) recordRelease(limit string, window int64, id string, unspent, returned int64) {
	a.opt.hist.Record(history.Record{Kind: history.KindRelease, T: a.opt.now().UnixNano(), Proc: a.cfg.ReplicaID,
		Region: a.cfg.Region, Limit: limit, Window: window, Reservation: id, Unspent: unspent, Returned: returned})
}
