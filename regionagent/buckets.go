package regionagent

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// Bucket limits in the shell (the decisions are the core's, bucket.go
// there): a Check's take goes to the store's token bucket, share requests
// go to the allocator in batched AcquireShares calls, and shares are
// installed in the store they were asked for.

// take carries out a Check's StepTake on store s.
func (a *Agent) take(ctx context.Context, s core.Store, key store.RateKey, cost int64, shadow bool) (store.TakeResult, error) {
	if s == core.Local {
		return a.local.take(key, cost, shadow)
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	defer cancel()
	r, err := a.shared.b.Take(rctx, bucket.RateKeyOf(key), cost, a.shared.nowMs(), shadow)
	a.observeRedis(err)
	return r, err
}

// installs puts shares in force, each in its store.
func (a *Agent) installs(ctx context.Context, ins []core.Install) {
	res := make([]store.ShareResult, len(ins))
	errs := make([]error, len(ins))
	for i, in := range ins {
		if in.Store == core.Local {
			res[i], errs[i] = a.local.install(in, a.opt.keyGrace)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
		res[i], errs[i] = a.shared.install(rctx, in)
		cancel()
	}
	now := a.opt.now()
	a.withCore(func(c *core.Core) {
		for i, in := range ins {
			c.ShareInstalled(now, in, res[i], errs[i])
		}
	})
}

// install puts a share in force in the region's Redis, its deadline on
// Redis's clock rounded down (as a deposit's).
func (s *redisStore) install(ctx context.Context, in core.Install) (store.ShareResult, error) {
	cs, err := s.syncedClock(ctx)
	if err != nil {
		s.a.observeRedis(err)
		return store.ShareResult{}, err
	}
	sh := in.Share
	sh.DeadlineMs = max(1, cs.ToRedis(in.Deadline))
	r, err := s.b.InstallShare(ctx, bucket.RateKeyOf(in.Key), bucket.ShareInstall{Share: sh,
		ExpireAtMs: max(cs.ToRedis(in.Deadline.Add(s.a.opt.keyGrace)), sh.DeadlineMs), NowMs: s.nowMs()})
	s.a.observeRedis(err)
	return r, err
}

// take spends from the replica's in-process token bucket.
func (s *memStore) take(key store.RateKey, cost int64, shadow bool) (store.TakeResult, error) {
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.Take(key, cost, nowMs, shadow)
}

// install puts a share in force in the replica's in-process bucket.
func (s *memStore) install(in core.Install, grace time.Duration) (store.ShareResult, error) {
	sh := in.Share
	sh.DeadlineMs = max(1, s.ms(in.Deadline))
	nowMs := s.ms(s.clockNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.InstallShare(store.ShareInstall{Key: in.Key, Share: sh, ExpireAtMs: sh.DeadlineMs + max(grace.Milliseconds(), 1), NowMs: nowMs})
}

// sendShares asks the allocator for rate shares in one call; with
// allocator groups, one call per group owning the limits now (groups.go),
// a request answered WRONG_GROUP sent once more to the group it names.
func (a *Agent) sendShares(ctx context.Context, reqs []core.ShareAcquire) {
	if !a.groups.active() {
		a.sharesFrom(ctx, "", a.alloc, reqs, false)
		return
	}
	byGroup := map[string][]core.ShareAcquire{}
	now := a.opt.now()
	for _, r := range reqs {
		o := a.groups.owner(r.Limit, now)
		byGroup[o] = append(byGroup[o], r)
	}
	for group, rs := range byGroup {
		a.queuesOf(group).shares.add(a, rs) // each group on its own queue (groups.go)
	}
}

// sharesOfGroup sends one group its share requests.
func (a *Agent) sharesOfGroup(ctx context.Context, group string, rs []core.ShareAcquire) {
	cl := a.groups.client(group)
	if cl == nil {
		a.withCore(func(c *core.Core) { c.ShareAcquireFailed(a.opt.now(), rs, false) })
		return
	}
	a.sharesFrom(ctx, group, cl, rs, true)
}

// sharesFrom sends share requests through cl (the client of group, ""
// without groups); redirect resends those answered WRONG_GROUP naming
// another group there, once.
func (a *Agent) sharesFrom(ctx context.Context, group string, cl *allocClient, reqs []core.ShareAcquire, redirect bool) {
	in := make([]*pb.ShareRequest, len(reqs))
	for i, r := range reqs {
		in[i] = &pb.ShareRequest{RequestId: r.RequestID, LimitId: r.Limit, DemandPerSecond: r.Demand, Holder: r.Holder,
			AdmittedTokens: r.Admitted, WouldDenyTokens: r.WouldDeny, WouldDenyChecks: r.WouldDenyChecks}
	}
	sent := a.opt.now()
	var resp *pb.AcquireSharesResponse
	err := cl.call(ctx, func(ctx context.Context, ac pb.AllocatorClient, opts ...grpc.CallOption) error {
		var err error
		resp, err = ac.AcquireShares(ctx, &pb.AcquireSharesRequest{Region: a.cfg.Region, Requests: in}, opts...)
		return err
	})
	recv := a.opt.now()
	if err == nil && len(resp.Results) != len(reqs) {
		err = fmt.Errorf("regionagent: the allocator answered %d of %d share requests", len(resp.Results), len(reqs))
	}
	if err != nil {
		a.notes.callFailed(a.log, "share requests", len(reqs), err)
		a.withCore(func(c *core.Core) { c.ShareAcquireFailed(recv, reqs, ctx.Err() != nil) })
		return
	}
	var done []core.ShareAcquire
	var replies []core.ShareReply
	moved := map[string][]core.ShareAcquire{}
	for i, r := range resp.Results {
		if redirect && r.Code == pb.ItemCode_ITEM_CODE_WRONG_GROUP && r.OwnerGroup != "" && r.OwnerGroup != group {
			moved[r.OwnerGroup] = append(moved[r.OwnerGroup], reqs[i])
			continue
		}
		done = append(done, reqs[i])
		replies = append(replies, shareReplyOf(r))
	}
	if len(done) > 0 {
		a.withCore(func(c *core.Core) { c.SharesAcquired(sent, recv, done, replies) })
	}
	for owner, rs := range moved {
		if oc := a.groups.client(owner); oc != nil {
			a.m.groupRedirects.Add(float64(len(rs)))
			a.sharesFrom(ctx, owner, oc, rs, false)
		} else {
			a.withCore(func(c *core.Core) { c.ShareAcquireFailed(recv, rs, false) })
		}
	}
}

func shareReplyOf(r *pb.ShareResult) core.ShareReply {
	if r.Code != pb.ItemCode_ITEM_CODE_OK {
		return core.ShareReply{Message: r.Code.String() + ": " + r.Message}
	}
	s := r.Share
	if s == nil {
		return core.ShareReply{OK: true}
	}
	return core.ShareReply{OK: true, Seq: s.Seq, Rate: s.RateMilliTokens, Burst: s.BurstTokens, ExpiresIn: dur(s.ExpiresIn)}
}
