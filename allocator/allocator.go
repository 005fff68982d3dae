package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Config is the required wiring of an Allocator.
type Config struct {
	// Client reaches the etcd cluster that holds the allocator's state.
	Client *clientv3.Client
	// Prefix of every key; allocators that shard limits use one prefix per
	// leader group. Default "/leasehold/".
	Prefix string
	// Regions the limits may name.
	Regions []string
	// Advertise is this replica's gRPC address, told to callers of
	// followers so they can reach the leader.
	Advertise string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

type options struct {
	now          func() time.Time
	sessionTTL   int // seconds
	maxOps       int
	committers   int
	commitTO     time.Duration
	retention    time.Duration
	gcInterval   time.Duration
	keepWindows  int
	reportLimits int
	retryBackoff func() backoff.BackOff
	// audit log
	auditRetention time.Duration
	auditSweep     time.Duration
}

// Option changes an optional setting.
type Option func(*options)

// WithClock replaces time.Now (tests drive windows with it).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithSessionTTL sets the etcd session TTL: how long a dead leader keeps
// leadership before a follower takes over. Default 2s (the session is
// kept alive every third of it).
func WithSessionTTL(d time.Duration) Option {
	return func(o *options) { o.sessionTTL = max(1, int(d.Round(time.Second)/time.Second)) }
}

// WithGroupCommit sets how many writes one etcd transaction may carry and
// how many transactions may be in flight. maxOps 1 disables batching.
// Defaults 128 (etcd's default --max-txn-ops) and 2.
func WithGroupCommit(maxOps, inflight int) Option {
	return func(o *options) { o.maxOps, o.committers = maxOps, inflight }
}

// WithRetention sets how long grant records are kept after their window
// ends (retries of a request id are answered from them until then), and how
// often expired windows are swept. Defaults 1m and 10s.
func WithRetention(grace, sweep time.Duration) Option {
	return func(o *options) { o.retention, o.gcInterval = grace, sweep }
}

// WithReports sets how many closed windows per limit are kept for reports
// (in etcd, so a failover keeps them) and how many limits the per-limit
// window metrics cover at most. Defaults 60 and 1000.
func WithReports(windows, metricLimits int) Option {
	return func(o *options) { o.keepWindows, o.reportLimits = max(1, windows), max(0, metricLimits) }
}

// WithAuditRetention sets how long the audit log and the limits' history
// are kept, and how often the leader removes older records. Defaults 400
// days and 1h.
func WithAuditRetention(keep, sweep time.Duration) Option {
	return func(o *options) { o.auditRetention, o.auditSweep = keep, sweep }
}

// DefaultAuditRetention is how long audit records are kept by default.
const DefaultAuditRetention = 400 * 24 * time.Hour

// Allocator is one replica of the allocator service. Every replica
// campaigns for leadership; the leader rebuilds its Core from etcd and
// serves grants, followers refuse them with the leader's address. Safe for
// concurrent use.
type Allocator struct {
	cfg   Config
	opt   options
	store *Store
	log   *slog.Logger
	m     *metrics
	am    *adminMetrics
	ids   auditIDs
	sync  syncCache

	changeMu sync.Mutex // serializes limit changes on this replica

	mu         sync.Mutex // protects term, leaderAddr, sessionID
	term       *term
	leaderAddr string
	sessionID  clientv3.LeaseID
	termChange chan struct{} // closed and replaced whenever term changes
}

// term is one period of leadership: the core rebuilt for it and the
// fence that makes its writes fail once it is over.
type term struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	fence  Fence
	commit *committer

	mu   sync.Mutex // protects core
	core *Core
}

// New returns an allocator; call Run to campaign and serve.
func New(cfg Config, opts ...Option) (*Allocator, error) {
	if cfg.Client == nil {
		return nil, errors.New("allocator: Config.Client is required")
	}
	if len(cfg.Regions) == 0 {
		return nil, errors.New("allocator: Config.Regions is required")
	}
	for i, r := range cfg.Regions {
		if err := vocab.ValidateRegion(fmt.Sprintf("regions[%d]", i), r); err != nil {
			return nil, err
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/leasehold/"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	o := options{
		now:          time.Now,
		sessionTTL:   5,
		maxOps:       128,
		committers:   2,
		commitTO:     5 * time.Second,
		retention:    time.Minute,
		gcInterval:   10 * time.Second,
		keepWindows:  60,
		reportLimits: 1000,
		retryBackoff: func() backoff.BackOff {
			b := backoff.NewExponentialBackOff()
			b.InitialInterval = 100 * time.Millisecond
			b.MaxInterval = 2 * time.Second
			b.MaxElapsedTime = 0
			return b
		},
		auditRetention: DefaultAuditRetention,
		auditSweep:     time.Hour,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.auditRetention <= 0 || o.auditSweep <= 0 {
		return nil, errors.New("allocator: the audit retention and its sweep interval must be > 0")
	}
	a := &Allocator{
		cfg:        cfg,
		opt:        o,
		store:      NewStore(cfg.Client, cfg.Prefix),
		log:        cfg.Logger,
		m:          newMetrics(cfg.Registerer),
		am:         newAdminMetrics(cfg.Registerer),
		termChange: make(chan struct{}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(newWindowCollector(a))
	}
	return a, nil
}

// Store returns the allocator's etcd store.
func (a *Allocator) Store() *Store { return a.store }

// Regions returns the regions limits may name.
func (a *Allocator) Regions() []string { return slices.Clone(a.cfg.Regions) }

// IsLeader reports whether this replica serves grants now.
func (a *Allocator) IsLeader() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.term != nil
}

// Leader returns the advertised address of the current leader ("" if
// unknown).
func (a *Allocator) Leader() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leaderAddr
}

// SessionLease returns the etcd lease of this replica's current session
// (0 when it has none). Revoking it ends this replica's leadership.
func (a *Allocator) SessionLease() clientv3.LeaseID {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessionID
}

// WaitLeader blocks until this replica leads, or ctx ends.
func (a *Allocator) WaitLeader(ctx context.Context) error {
	for {
		a.mu.Lock()
		t, ch := a.term, a.termChange
		a.mu.Unlock()
		if t != nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *Allocator) setTerm(t *term) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.term = t
	close(a.termChange)
	a.termChange = make(chan struct{})
	if t != nil {
		a.leaderAddr = a.cfg.Advertise
		a.m.leader.Set(1)
	} else {
		a.m.leader.Set(0)
	}
}

func (a *Allocator) currentTerm() (*term, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.term == nil || a.term.ctx.Err() != nil {
		return nil, &NotLeaderError{Leader: a.leaderAddr}
	}
	return a.term, nil
}

// Run campaigns for leadership and serves while leading, until ctx ends.
// A lost session or a failed commit ends the term; Run then campaigns
// again. It returns ctx's error.
func (a *Allocator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.observeLeader(ctx) }()
	defer wg.Wait()
	bo := a.opt.retryBackoff()
	for ctx.Err() == nil {
		led, err := a.campaignAndLead(ctx)
		if ctx.Err() != nil {
			break
		}
		if led {
			bo.Reset()
		}
		wait := bo.NextBackOff()
		a.log.Warn("allocator: leadership ended or campaign failed; campaigning again", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return ctx.Err()
}

// observeLeader keeps leaderAddr current for followers' redirects.
func (a *Allocator) observeLeader(ctx context.Context) {
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(a.cfg.Client, concurrency.WithTTL(a.opt.sessionTTL), concurrency.WithContext(ctx))
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		el := concurrency.NewElection(sess, a.store.electionPrefix())
		for resp := range el.Observe(ctx) {
			if len(resp.Kvs) > 0 {
				a.mu.Lock()
				a.leaderAddr = string(resp.Kvs[0].Value)
				a.mu.Unlock()
			}
		}
		sess.Close()
	}
}

// campaignAndLead runs one leadership term: campaign, rebuild, serve until
// the session or a commit fails. led reports whether the term started.
func (a *Allocator) campaignAndLead(ctx context.Context) (led bool, err error) {
	sess, err := concurrency.NewSession(a.cfg.Client, concurrency.WithTTL(a.opt.sessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("session: %w", err)
	}
	defer sess.Close() // revokes the lease: leadership is released at once
	a.mu.Lock()
	a.sessionID = sess.Lease()
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.sessionID = 0
		a.mu.Unlock()
	}()

	el := concurrency.NewElection(sess, a.store.electionPrefix())
	if err := el.Campaign(ctx, a.cfg.Advertise); err != nil {
		return false, fmt.Errorf("campaign: %w", err)
	}
	fence := Fence{Key: el.Key(), Rev: el.Rev()}
	// Everything a previous leader committed is visible now: its key is
	// gone, so its later writes fail their fence.
	st, err := a.store.Load(ctx)
	if err != nil {
		return false, err
	}
	core := NewCore()
	for _, lp := range st.Limits {
		core.SetLimit(decodeLimit(lp))
	}
	for _, g := range st.Grants {
		core.Restore(g)
	}
	for _, u := range st.Usage {
		core.RestoreUsage(u)
	}
	for _, w := range st.Summaries {
		core.RestoreSummary(w)
	}

	tctx, cancel := context.WithCancelCause(ctx)
	t := &term{ctx: tctx, cancel: cancel, fence: fence, core: core}
	t.commit = newCommitter(a.store, fence, a.opt.maxOps, a.opt.committers, a.opt.commitTO, a.m,
		func(err error) { cancel(fmt.Errorf("commit failed: %w", err)) })
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); a.watchLimits(t, st.Revision) }()
	go func() { defer wg.Done(); a.sweep(t) }()
	go func() { defer wg.Done(); a.sweepAuditLoop(t) }()

	a.m.leaderChanges.Inc()
	a.setTerm(t)
	a.log.Info("allocator: leading", "advertise", a.cfg.Advertise, "limits", len(st.Limits), "grants", len(st.Grants), "revision", st.Revision)

	select {
	case <-sess.Done():
		cancel(errors.New("etcd session lost"))
	case <-tctx.Done():
	}
	a.setTerm(nil)
	cause := context.Cause(tctx)
	t.commit.close(errTermEnded)
	wg.Wait()
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	_ = el.Resign(rctx)
	rcancel()
	if ctx.Err() != nil {
		a.log.Info("allocator: leadership term ended: shutting down")
	} else {
		a.log.Warn("allocator: leadership term ended", "cause", cause)
	}
	return true, cause
}

// watchLimits applies limit changes to the term's core as etcd reports them.
func (a *Allocator) watchLimits(t *term, rev int64) {
	wch := a.cfg.Client.Watch(clientv3.WithRequireLeader(t.ctx), a.store.limitsPrefix(),
		clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			t.cancel(fmt.Errorf("limits watch: %w", err))
			return
		}
		t.mu.Lock()
		for _, ev := range resp.Events {
			id := string(ev.Kv.Key[len(a.store.limitsPrefix()):])
			if ev.Type == clientv3.EventTypeDelete {
				t.core.DeleteLimit(id)
				continue
			}
			l, err := decodeLimitEvent(ev.Kv.Value)
			if err != nil {
				a.log.Error("allocator: undecodable limit record; ignored", "id", id, "err", err)
				continue
			}
			t.core.SetLimit(decodeLimit(l))
		}
		t.mu.Unlock()
	}
	if t.ctx.Err() == nil {
		t.cancel(errors.New("limits watch closed"))
	}
}

// sweep removes records of windows that ended more than the retention ago,
// every gcInterval, until the term ends.
func (a *Allocator) sweep(t *term) {
	tick := time.NewTicker(a.opt.gcInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
		if err := a.sweepOnce(t); err != nil {
			return
		}
	}
}

// sweepOnce removes the expired windows' records (fenced, batched) and
// then forgets them in the core.
func (a *Allocator) sweepOnce(t *term) error {
	t.mu.Lock()
	keys := t.core.Expired(a.opt.now(), a.opt.retention)
	t.mu.Unlock()
	for len(keys) > 0 {
		n := min(len(keys), max(1, a.opt.maxOps/2))
		var ops []*pendingOp
		t.mu.Lock()
		for _, k := range keys[:n] {
			if sum := t.core.summarize(k); sum != nil {
				if op, err := a.store.putSummaryOp(sum); err == nil {
					ops = append(ops, t.commit.enqueue(op))
				}
				for _, old := range t.core.keepSummary(sum, a.opt.keepWindows) {
					ops = append(ops, t.commit.enqueue(clientv3.OpDelete(a.store.summaryKey(k.limit, old))))
				}
				a.countClosed(t.core, k)
			}
			for _, op := range a.store.deleteWindowOps(k) {
				ops = append(ops, t.commit.enqueue(op))
			}
		}
		t.mu.Unlock()
		for _, p := range ops {
			if err := p.wait(t.ctx); err != nil {
				return err
			}
		}
		t.mu.Lock()
		for _, k := range keys[:n] {
			t.core.Forget(k)
		}
		t.mu.Unlock()
		keys = keys[n:]
	}
	return nil
}

// unavailable wraps a commit failure for callers: nothing they were told
// was lost, and a retry with the same request ids is safe.
func unavailable(err error) error {
	return fmt.Errorf("%w: grant not committed (retry with the same request ids): %v", ErrFenced, err)
}

// AcquireLeases grants leases to region. The requests must already be
// validated (see ValidateAcquire). New grants are durable when it returns.
func (a *Allocator) AcquireLeases(ctx context.Context, region string, reqs []*pb.LeaseRequest) ([]*pb.LeaseResult, error) {
	start := time.Now()
	defer func() { a.m.acquireDur.Observe(time.Since(start).Seconds()) }()
	t, err := a.currentTerm()
	if err != nil {
		return nil, err
	}
	now := a.opt.now()
	results := make([]*pb.LeaseResult, len(reqs))
	decs := make([]Decision, len(reqs))
	var waits []*pendingOp
	t.mu.Lock()
	for i, r := range reqs {
		d := t.core.Acquire(now, region, AcquireRequest{
			RequestID: r.RequestId, Limit: r.LimitId, Next: r.Window == pb.WindowChoice_WINDOW_CHOICE_NEXT,
			Demand: r.DemandPerSecond, Held: r.HeldTokens, Want: r.WantTokens,
		})
		results[i] = &pb.LeaseResult{RequestId: r.RequestId, Code: d.Code, Message: d.Message, Replayed: d.Replayed}
		decs[i] = d
		switch {
		case d.New:
			op, err := a.store.putGrantOp(d.Grant)
			if err != nil {
				t.mu.Unlock()
				t.cancel(err) // the core holds an unpersistable grant
				return nil, unavailable(err)
			}
			d.Grant.pending = t.commit.enqueue(op)
			waits = append(waits, d.Grant.pending)
			a.m.grants.WithLabelValues("granted").Inc()
			a.m.grantedTokens.Add(float64(d.Grant.Tokens))
		case d.Replayed:
			if p := d.Grant.pending; p != nil && !p.isDone() {
				waits = append(waits, p)
			}
			a.m.grants.WithLabelValues("replayed").Inc()
		case d.Code != pb.ItemCode_ITEM_CODE_OK:
			a.m.grants.WithLabelValues("rejected").Inc()
		default:
			a.m.grants.WithLabelValues("empty").Inc()
		}
	}
	t.mu.Unlock()
	for _, p := range waits {
		if err := p.wait(ctx); err != nil {
			a.m.grants.WithLabelValues("failed").Inc()
			if ctx.Err() != nil {
				return nil, err
			}
			return nil, unavailable(err)
		}
	}
	// Durations are measured from now, after the commit: the agent measured
	// from its send, earlier, so its deadline stays before ours.
	now = a.opt.now()
	t.mu.Lock()
	for i, d := range decs {
		switch {
		case d.Grant != nil:
			results[i].Lease = d.Grant.ToProto(now)
		case d.Code == pb.ItemCode_ITEM_CODE_OK && d.Window.Length > 0:
			results[i].Lease = d.EmptyLease(now, reqs[i].LimitId, region, reqs[i].RequestId)
		}
	}
	t.mu.Unlock()
	return results, nil
}

// ReturnLeases closes leases of region and credits their unspent tokens.
func (a *Allocator) ReturnLeases(ctx context.Context, region string, rets []*pb.LeaseReturn) ([]*pb.ReturnResult, error) {
	t, err := a.currentTerm()
	if err != nil {
		return nil, err
	}
	results := make([]*pb.ReturnResult, len(rets))
	var waits []*pendingOp
	todo := make([]int, len(rets))
	for i := range rets {
		todo[i] = i
	}
	for len(todo) > 0 {
		var again []int
		var blockers []*pendingOp
		now := a.opt.now()
		t.mu.Lock()
		for _, i := range todo {
			r := rets[i]
			d, err := t.core.Return(now, region, ReturnRequest{Limit: r.LimitId, LeaseID: r.LeaseId, Unspent: r.Unspent})
			if err != nil {
				t.mu.Unlock()
				var fe *vocab.FieldError
				if errors.As(err, &fe) {
					fe.Field = fmt.Sprintf("returns[%d].%s", i, fe.Field)
				}
				return nil, err
			}
			if d.Wait != nil {
				again = append(again, i)
				blockers = append(blockers, d.Wait)
				continue
			}
			results[i] = &pb.ReturnResult{LeaseId: r.LeaseId, Code: d.Code, Message: d.Message, Credited: d.Credited, Duplicate: d.Duplicate}
			switch {
			case d.Duplicate:
				a.m.returns.WithLabelValues("duplicate").Inc()
			case d.Code == pb.ItemCode_ITEM_CODE_OK:
				a.m.returns.WithLabelValues("credited").Inc()
				a.m.returnTokens.WithLabelValues("true").Add(float64(d.Credited))
			case d.Code == pb.ItemCode_ITEM_CODE_WINDOW_CLOSED:
				a.m.returns.WithLabelValues("late").Inc()
				a.m.returnTokens.WithLabelValues("false").Add(float64(r.Unspent))
			default:
				a.m.returns.WithLabelValues("rejected").Inc()
			}
			if d.Grant != nil {
				op, err := a.store.putGrantOp(d.Grant)
				if err != nil {
					t.mu.Unlock()
					t.cancel(err)
					return nil, unavailable(err)
				}
				d.Grant.pending = t.commit.enqueue(op)
				waits = append(waits, d.Grant.pending)
			}
		}
		t.mu.Unlock()
		for _, p := range blockers {
			if err := p.wait(ctx); err != nil {
				return nil, unavailable(err)
			}
		}
		todo = again
	}
	for _, p := range waits {
		if err := p.wait(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			return nil, unavailable(err)
		}
	}
	return results, nil
}

// ReportUsage merges usage reports of one reporter in region.
func (a *Allocator) ReportUsage(ctx context.Context, region, reporter string, usage []*pb.Usage) (int32, error) {
	t, err := a.currentTerm()
	if err != nil {
		return 0, err
	}
	now := a.opt.now()
	var waits []*pendingOp
	t.mu.Lock()
	for _, u := range usage {
		if sum := t.core.ReportLate(region, u); sum != nil {
			op, err := a.store.putSummaryOp(sum)
			if err != nil {
				t.mu.Unlock()
				t.cancel(err)
				return 0, unavailable(err)
			}
			waits = append(waits, t.commit.enqueue(op))
			continue
		}
		rec := t.core.Report(now, region, reporter, u)
		if rec == nil {
			continue
		}
		op, err := a.store.putUsageOp(rec)
		if err != nil {
			t.mu.Unlock()
			t.cancel(err)
			return 0, unavailable(err)
		}
		waits = append(waits, t.commit.enqueue(op))
	}
	t.mu.Unlock()
	for _, p := range waits {
		if err := p.wait(ctx); err != nil {
			if ctx.Err() != nil {
				return 0, err
			}
			return 0, unavailable(err)
		}
	}
	a.m.usageReports.Add(float64(len(waits)))
	return int32(len(waits)), nil
}

// View runs fn with the leader's core locked, for reports and tests. It
// fails on a follower.
func (a *Allocator) View(fn func(now time.Time, c *Core)) error {
	t, err := a.currentTerm()
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fn(a.opt.now(), t.core)
	return nil
}

// LeadershipChanged returns a channel closed at the next start or end of a
// leadership term of this replica.
func (a *Allocator) LeadershipChanged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.termChange
}
