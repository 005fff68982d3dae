package core

import (
	"strconv"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// Bucket limits (rate R per period, burst B; package lease's TokenBucket)
// are spent from one token bucket per limit in the region's store,
// refilled by the region's rate share. The Core asks the allocator for
// shares ([ShareAcquire], answered by [Core.SharesAcquired]), has them
// installed ([Install], [Core.ShareInstalled]) and renews them at half
// their life while the limit has Checks; a Check of a bucket limit takes
// its cost from the bucket ([StepTake], [Core.Taken]).
//
// A share's deadline is measured as a lease's is: from when its request
// was sent, minus the safety margin, so the bucket stops refilling and
// spending before the allocator gives the share's rate to other regions.
// While Redis is down the replica spends from its own in-process bucket,
// with shares it acquires for itself: they name the replica as their
// holder, and the allocator counts each holder's share apart, so replicas
// spending alone can never add up to more than the limit.
//
// Not in this version: a Check naming a bucket limit with other limits
// (CheckMulti), sub-leases of bucket limits, usage reports of bucket
// limits, and fallbacks other than closed (a bucket limit that cannot get
// a share denies with UNAVAILABLE, whatever its fallback says).

// ShareAcquire is one rate share request of a bucket limit.
type ShareAcquire struct {
	Limit     string
	RequestID string
	Demand    float64 // the demand it reports, tokens per second
	// Holder names the bucket the share is for: "" for the region's shared
	// store, the replica's request prefix for its in-process store.
	Holder string
	Store  Store
	// Admitted is the holder's bucket's admitted counter as last read
	// (cumulative): the allocator counts admits per reporting interval
	// from it.
	Admitted int64
	// WouldDeny and WouldDenyChecks are the holder's bucket's would-deny
	// counters as last read (cumulative; shadow mode).
	WouldDeny, WouldDenyChecks int64
}

// ShareReply is the allocator's answer to one ShareAcquire.
type ShareReply struct {
	OK      bool   // false: refused (Message says why)
	Message string // for a refusal
	// Seq, Rate (milli-tokens per period), Burst (tokens) and ExpiresIn
	// are the share; Rate and Burst are 0 when nothing was free.
	Seq, Rate, Burst int64
	ExpiresIn        time.Duration
}

// Install asks the caller to put a share in force in a store's token
// bucket. Share.DeadlineMs is left for the caller to fill in from
// Deadline, on the store's clock with the conservative bound (as a
// deposit's deadline).
type Install struct {
	Limit    string
	Store    Store
	Key      store.RateKey
	Share    lease.BucketShare
	Deadline time.Time // agent clock
}

// bucketState is what a limitState knows of its bucket limit's share.
type bucketState struct {
	pending  *ShareAcquire // the request in flight
	store    Store         // where the share in force was installed
	deadline time.Time     // the share in force's deadline (zero: none)
	renewAt  time.Time     // when to ask again while the limit has Checks
	emptyAt  time.Time     // the allocator said nothing was free (zero: no)
	failedAt time.Time     // a request failed for good (zero: no)
	admitted [2]int64      // the largest admitted counter a take returned, by Store
	wd, wdc  [2]int64      // the largest would-deny counters a take returned, by Store
}

// IsBucket reports whether l is a bucket limit.
func (l *Limit) IsBucket() bool { return l.Rate > 0 }

// rateKey names the limit's token bucket in a store.
func (l *Limit) rateKey() store.RateKey {
	k := store.RateKey{Limit: l.ID}
	if l.HashTag != l.ID {
		k.HashTag = l.HashTag
	}
	return k
}

// holder names the bucket a share is for in store s.
func (c *Core) holder(s Store) string {
	if s == Local {
		return c.cfg.RequestPrefix
	}
	return ""
}

// inForce reports whether the limit's share in force in store s may be
// spent at now.
func (b *bucketState) inForce(s Store, now time.Time) bool {
	return b.store == s && now.Before(b.deadline)
}

// kickShare asks for the limit's next share, unless a request is in
// flight or the allocator is known unreachable.
func (c *Core) kickShare(st *limitState, now time.Time) {
	if st.bucket.pending != nil || c.allocDown {
		return
	}
	s := c.store()
	req := ShareAcquire{Limit: st.id, RequestID: c.requestID(), Demand: st.demandIn(s).Rate(now), Holder: c.holder(s), Store: s,
		Admitted: st.bucket.admitted[s], WouldDeny: st.bucket.wd[s], WouldDenyChecks: st.bucket.wdc[s]}
	st.bucket.pending = &req
	c.byRequest[req.RequestID] = st
	c.ready.Shares = append(c.ready.Shares, req)
}

// SharesAcquired hands the Core the allocator's answers to share requests
// sent at sent and answered at recv: a share becomes an Install, timed from
// sent.
func (c *Core) SharesAcquired(sent, recv time.Time, reqs []ShareAcquire, replies []ShareReply) {
	for i, req := range reqs {
		st := c.byRequest[req.RequestID]
		if st == nil || i >= len(replies) || st.bucket.pending == nil || st.bucket.pending.RequestID != req.RequestID {
			continue // answered before
		}
		delete(c.byRequest, req.RequestID)
		st.bucket.pending = nil
		c.changed[st.id] = true
		r := replies[i]
		switch {
		case !r.OK:
			c.stats.RenewalsRejected++
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteRefused, Limit: st.id, Text: r.Message})
			st.bucket.failedAt, st.bucket.renewAt = recv, recv.Add(c.opt.spentRetry)
		case r.Rate == 0 && r.Burst == 0:
			c.stats.RenewalsEmpty++
			st.bucket.emptyAt, st.bucket.failedAt = recv, time.Time{}
			st.bucket.renewAt = recv.Add(c.opt.spentRetry)
		default:
			c.stats.RenewalsGranted++
			st.bucket.emptyAt, st.bucket.failedAt = time.Time{}, time.Time{}
			deadline := lease.Deadline(sent, r.ExpiresIn, c.margin(r.ExpiresIn))
			st.bucket.store, st.bucket.deadline = req.Store, deadline
			st.bucket.renewAt = sent.Add(r.ExpiresIn / 2)
			c.ready.Installs = append(c.ready.Installs, Install{Limit: st.id, Store: req.Store, Key: st.l.rateKey(),
				Share:    lease.BucketShare{Seq: r.Seq, Rate: r.Rate, Burst: r.Burst, Unit: lease.BucketUnit(st.l.RatePeriod)},
				Deadline: deadline})
		}
		c.schedule(st, recv)
	}
}

// ShareAcquireFailed hands the Core share requests that got no answer
// (canceled: the call was abandoned, not failed).
func (c *Core) ShareAcquireFailed(now time.Time, reqs []ShareAcquire, canceled bool) {
	for _, req := range reqs {
		st := c.byRequest[req.RequestID]
		if st == nil || st.bucket.pending == nil || st.bucket.pending.RequestID != req.RequestID {
			continue
		}
		delete(c.byRequest, req.RequestID)
		st.bucket.pending = nil
		c.stats.RenewalsFailed++
		if !canceled {
			st.bucket.failedAt = now
			c.ready.Notes = append(c.ready.Notes, Note{Kind: NoteFallback, Limit: st.id})
		}
		st.bucket.renewAt = now.Add(c.opt.spentRetry) // every path that ends a request sets the next one ahead
		c.changed[st.id] = true
		c.schedule(st, now)
	}
}

// ShareInstalled hands the Core the outcome of an Install: waiting Checks
// look again. A share the store did not take (err) is not in force there.
func (c *Core) ShareInstalled(now time.Time, in Install, res store.ShareResult, err error) {
	st := c.states[in.Limit]
	if st == nil {
		return
	}
	if err != nil && st.bucket.store == in.Store {
		st.bucket.deadline = time.Time{}
	}
	c.changed[st.id] = true
	_ = res
	_ = now
}

// beginTake sets a Check of one bucket limit to take its cost.
// Keys[0] names the limit, for a wait (StepWait waits on Keys' limits).
func (c *Core) beginTake(chk *Check) {
	chk.Step, chk.Store = StepTake, c.store()
	chk.RateKey = chk.sts[0].l.rateKey()
	chk.TakeShadow = chk.sts[0].l.Shadow
	chk.Keys = chk.Keys[:1]
	chk.Keys[0] = store.Key{Limit: chk.RateKey.Limit, HashTag: chk.RateKey.HashTag}
}

// Taken hands a Check the result of its take (err: the store did not
// decide it).
func (c *Core) Taken(now time.Time, chk *Check, res store.TakeResult, err error) {
	c.taken(now, chk, res, err)
	c.shadowTake(chk, res, err)
}

// shadowTake turns the final denial of a take that the store counted as
// a would-deny (a shadow share could not pay it) into an admission that
// says what enforcement would have answered: over the limit, or
// unavailable where the enforcing Core would answer that. The decision
// is exactly the enforcing one (waits for a share included) and the
// bucket was charged nothing: the store counted the would-deny in the
// same script call. A take the store did not decide (an error) is
// answered as enforced, UNAVAILABLE: nothing was counted.
func (c *Core) shadowTake(chk *Check, res store.TakeResult, err error) {
	if err != nil || !res.Shadowed || chk.Step != StepDone || len(chk.Answers) != 1 || chk.Answers[0].Allowed {
		return
	}
	a := &chk.Answers[0]
	a.Allowed, a.WouldDeny, a.Reason, a.RetryAfter = true, a.Reason, ReasonOK, 0
	chk.Result = ResultWouldDeny
}

func (c *Core) taken(now time.Time, chk *Check, res store.TakeResult, err error) {
	st := chk.sts[0]
	if err != nil {
		chk.StoreErr = true
		c.bucketFallback(now, chk)
		return
	}
	st.demandIn(chk.Store).Observe(now, 0, res.Admitted+res.Denied+res.WouldDeny)
	st.bucket.admitted[chk.Store] = max(st.bucket.admitted[chk.Store], res.Admitted)
	st.bucket.wd[chk.Store] = max(st.bucket.wd[chk.Store], res.WouldDeny)
	st.bucket.wdc[chk.Store] = max(st.bucket.wdc[chk.Store], res.WouldDenyChecks)
	// chk.Demand stays 0: the agent's hot-limit chunks are sub-leases,
	// which bucket limits do not have.
	inForce := st.bucket.inForce(chk.Store, now)
	if inForce && !now.Before(st.bucket.renewAt) || !inForce && st.bucket.store != chk.Store {
		c.kickShare(st, now)
	}
	if !st.timedBusy && c.active(st, now) {
		c.schedule(st, now)
	}
	wait := time.Duration(max(res.WaitMs, 0)) * time.Millisecond
	if res.Allowed {
		c.answerBucket(now, chk, ReasonOK, res.Tokens, wait)
		chk.Result = ResultOK
		return
	}
	if inForce && res.WaitMs >= 0 {
		// The region's share refills the bucket: rate limited until then.
		c.answerBucket(now, chk, ReasonOverLimit, res.Tokens, wait)
		chk.Answers[0].RetryAfter = c.jitter(wait, wait/10)
		chk.Result = ResultOverLimit
		return
	}
	if inForce || !st.bucket.emptyAt.IsZero() && now.Sub(st.bucket.emptyAt) < c.opt.spentRetry {
		// The share cannot pay this cost before it ends, or the other
		// regions hold the whole rate: over the limit for now.
		c.kickShare(st, now)
		c.answerBucket(now, chk, ReasonOverLimit, res.Tokens, c.opt.spentRetry)
		chk.Answers[0].RetryAfter = c.jitter(c.opt.spentRetry, c.opt.spentRetry)
		chk.Result = ResultOverLimit
		return
	}
	if c.allocDown || !st.bucket.failedAt.IsZero() && now.Sub(st.bucket.failedAt) < c.opt.spentRetry {
		c.bucketFallback(now, chk)
		return
	}
	c.kickShare(st, now)
	if now.Before(chk.deadline) {
		chk.Step, chk.Until = StepWait, chk.deadline
		return
	}
	c.unavailable(now, chk, 50*time.Millisecond, 50*time.Millisecond)
}

// answerBucket answers a Check of a bucket limit: Limit is the rate per
// Window (the rate period), Remaining the whole tokens in the bucket,
// ResetAfter the time until it holds the cost again.
func (c *Core) answerBucket(now time.Time, chk *Check, reason Reason, tokens int64, reset time.Duration) {
	st := chk.sts[0]
	chk.Answers = chk.answers(1)
	chk.Answers[0] = Answer{Allowed: reason == ReasonOK, Reason: reason, Limit: st.l.Rate, Window: st.l.RatePeriod,
		Version: st.l.Version, Remaining: tokens, ResetAfter: reset}
	chk.Step = StepDone
	_ = now
}

// bucketFallback answers a Check of a bucket limit that cannot get a share
// or whose store cannot answer: UNAVAILABLE, as a closed fallback does.
func (c *Core) bucketFallback(now time.Time, chk *Check) {
	c.markFallback(chk.sts[0], FallbackClosed)
	c.answerBucket(now, chk, ReasonUnavailable, 0, 0)
	chk.Answers[0].RetryAfter = c.jitter(time.Second, time.Second)
	chk.Result = ResultUnavailable
}

// checkBucketItems refuses what this version does not do with bucket
// limits: a Check naming one with other limits, or a cost above its burst
// (it could never be admitted).
func checkBucketItems(items []Item, limitOf func(i int) *Limit) *ItemError {
	for i, it := range items {
		l := limitOf(i)
		if l.IsConcurrency() {
			return &ItemError{Index: i, Field: "limit_id",
				Reason: strconv.Quote(l.ID) + " is a concurrency limit: acquire a slot (AcquireSlot), not a Check"}
		}
		if !l.IsBucket() {
			continue
		}
		if len(items) > 1 {
			return &ItemError{Index: i, Field: "limit_id",
				Reason: strconv.Quote(l.ID) + " is a bucket limit: check it alone (not with other limits)"}
		}
		if it.Cost < 0 || it.Cost > l.Burst {
			return &ItemError{Index: i, Field: "cost",
				Reason: "must be 1.." + strconv.FormatInt(l.Burst, 10) + " (the limit's burst), got " + strconv.FormatInt(it.Cost, 10)}
		}
	}
	return nil
}
