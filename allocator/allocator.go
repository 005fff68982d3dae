package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	hist "leasehold/internal/history"
	"leasehold/internal/vocab"
	"leasehold/internal/zones"
	"leasehold/lease"
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
	commit       commitTiming
	retention    time.Duration
	gcInterval   time.Duration
	keepWindows  int
	reportLimits int
	retryBackoff func() backoff.BackOff
	recorder     *hist.Recorder // nil: no history (WithHistory)
	// audit log
	auditRetention time.Duration
	auditSweep     time.Duration
	refusalAudit   refusalAudit
	// allocator groups
	group     string
	groupView *MapView
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

// WithCommitTimeouts sets how long an etcd transaction's first attempt
// may take (a retry sends the transaction again beside the copies in
// flight after each half of that without an answer, and waits up to 4x
// it for any of them), and how long a transaction that etcd could not
// answer is retried, fenced, within the term before the term ends. A raft
// leader change of etcd costs its election, not the allocator's
// leadership, while the election ends within the budget. Defaults 500ms
// and the session TTL (budget 0): a leader that etcd could not answer for
// that long may have lost its session anyway, and the fence would refuse
// the retry.
func WithCommitTimeouts(attempt, budget time.Duration) Option {
	return func(o *options) {
		o.commit.attempt, o.commit.budget = attempt, budget
	}
}

// WithRefusalAudit sets the audit rate limit of refused admin attempts:
// per principal, rate records per second with a burst; what is dropped is
// summarized in one record per principal and outcome once no drop came
// for quiet, or every interval while the flood lasts. At most 1000
// principals are tracked (the rest share one bucket). Defaults 0.1/s
// (6 a minute), burst 10, 2s, 1m.
func WithRefusalAudit(rate float64, burst int, quiet, every time.Duration) Option {
	return func(o *options) {
		o.refusalAudit.rate, o.refusalAudit.burst, o.refusalAudit.quiet, o.refusalAudit.every = rate, burst, quiet, every
	}
}

// WithHistory records every grant (new or replayed), return and usage
// report this replica answers, after their commit, to rec (package
// internal/history checks them offline). Grants and returns are written
// before the answer leaves (Recorder.Durable), so a replica killed after
// answering loses none of them. Off by default.
func WithHistory(rec *hist.Recorder) Option { return func(o *options) { o.recorder = rec } }

// WithGroup makes this allocator one group of several (issue 20's
// allocator groups): it grants only the windows that view's group map
// gives to group, and nothing while no map is stored or its view of the
// map is stale (MapView.Owner). Run keeps the view current. Without it the
// allocator owns every limit.
func WithGroup(group string, view *MapView) Option {
	return func(o *options) { o.group, o.groupView = group, view }
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
	// refusals rate-limits the audit records of refused attempts.
	refusals *refusalLimiter
	sync     syncCache

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
		now:        time.Now,
		sessionTTL: 5,
		maxOps:     128,
		committers: 2,
		commit: commitTiming{
			attempt: 500 * time.Millisecond, // budget: the session TTL
			backoff: func() backoff.BackOff {
				b := backoff.NewExponentialBackOff()
				b.InitialInterval = 20 * time.Millisecond
				b.MaxInterval = 200 * time.Millisecond
				b.MaxElapsedTime = 0 // the budget bounds the retries
				return b
			},
		},
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
		refusalAudit:   refusalAudit{rate: 0.1, burst: 10, quiet: 2 * time.Second, every: time.Minute, max: 1000},
	}
	for _, f := range opts {
		f(&o)
	}
	if o.commit.budget == 0 {
		o.commit.budget = time.Duration(o.sessionTTL) * time.Second
	}
	if o.commit.hedge() <= 0 || o.commit.budget < 0 {
		return nil, errors.New("allocator: the commit attempt timeout must be > 0 and the retry budget >= 0")
	}
	if ra := o.refusalAudit; ra.rate <= 0 || ra.burst < 1 || ra.quiet <= 0 || ra.every <= 0 {
		return nil, errors.New("allocator: the refusal audit rate, burst, quiet time and interval must be > 0")
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
		refusals:   newRefusalLimiter(o.refusalAudit),
		termChange: make(chan struct{}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(newWindowCollector(a))
		cfg.Registerer.MustRegister(newBucketCollector(a))
		cfg.Registerer.MustRegister(newSlotCollector(a))
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
	wg.Add(2)
	go func() { defer wg.Done(); a.observeLeader(ctx) }()
	go func() { defer wg.Done(); a.summarizeLoop(ctx) }()
	if a.opt.groupView != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.followMap(ctx) }()
	}
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

// owns says whether this allocator's group owns limit's window starting
// at start, and else which group does ("" when the map cannot say).
func (a *Allocator) owns(limit string, start time.Time) (string, bool) {
	g, _, ok := a.opt.groupView.Owner(limit, start)
	return g, ok && g == a.opt.group
}

// followMap keeps the group map's view current, logging when reading it
// starts and stops failing (not every failed read).
func (a *Allocator) followMap(ctx context.Context) {
	failing := false
	a.opt.groupView.Run(ctx, time.Second, func(err error) {
		switch {
		case err != nil && !failing:
			a.log.Warn("allocator: reading the group map failed; windows past the view's horizon are not granted until it is read again",
				"group", a.opt.group, "horizon", a.opt.groupView.Horizon(), "err", err)
		case err == nil && failing:
			a.log.Info("allocator: the group map is read again", "group", a.opt.group)
		}
		failing = err != nil
	})
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
	cur := sess                    // the session keeping the lease alive; a resumed one replaces it
	defer func() { cur.Close() }() // revokes the lease: leadership is released at once
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
	if err := a.store.ClearOnce(ctx); err != nil {
		a.log.Warn("allocator: clearing earlier terms' commit marks", "err", err)
	}
	core := NewCore()
	if a.opt.groupView != nil {
		core.SetOwnership(a.owns)
	}
	for _, lp := range st.Limits {
		core.SetLimit(decodeLimit(lp))
	}
	for _, g := range st.Shares {
		core.RestoreShare(g)
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
	t.commit = newCommitter(tctx, a.store, fence, a.opt.maxOps, a.opt.committers, a.opt.commit, a.m,
		func(err error) { cancel(fmt.Errorf("commit failed: %w", err)) })
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); a.watchLimits(t, st.Revision) }()
	go func() { defer wg.Done(); a.sweep(t) }()
	go func() { defer wg.Done(); a.sweepAuditLoop(t) }()

	a.m.leaderChanges.Inc()
	a.setTerm(t)
	a.log.Info("allocator: leading", "advertise", a.cfg.Advertise, "limits", len(st.Limits), "grants", len(st.Grants), "revision", st.Revision)

lead:
	for {
		select {
		case <-cur.Done():
			if tctx.Err() != nil {
				break lead
			}
			next, err := a.resumeSession(ctx, tctx, cur.Lease())
			if err != nil {
				cancel(fmt.Errorf("etcd session lost: %w", err))
				break lead
			}
			cur.Orphan() // its keep-alives ended; closing it would revoke the lease
			cur = next
			a.m.resumes.Inc()
			a.log.Info("allocator: etcd session resumed on its live lease; still leading", "lease", cur.Lease())
		case <-tctx.Done():
			break lead
		}
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
// A watch that fails while the term goes on (etcd had no raft leader, the
// member it spoke to died) is started again from the revision after the
// last one seen; only a compacted revision (changes were missed) ends the
// term, whose successor reloads everything.
func (a *Allocator) watchLimits(t *term, rev int64) {
	next := rev + 1
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 20*time.Millisecond, time.Second, 0
	for t.ctx.Err() == nil {
		wch := a.cfg.Client.Watch(clientv3.WithRequireLeader(t.ctx), a.store.limitsPrefix(),
			clientv3.WithPrefix(), clientv3.WithRev(next))
		var werr error
		for resp := range wch {
			if resp.CompactRevision != 0 {
				t.cancel(fmt.Errorf("limits watch: revision %d compacted: changes were missed", resp.CompactRevision))
				return
			}
			if err := resp.Err(); err != nil {
				werr = err
				break
			}
			bo.Reset()
			a.applyLimitEvents(t, resp.Events)
			if n := len(resp.Events); n > 0 {
				next = resp.Events[n-1].Kv.ModRevision + 1
			}
		}
		if t.ctx.Err() != nil {
			return
		}
		a.m.watchRestarts.Inc()
		wait := bo.NextBackOff()
		a.log.Warn("allocator: limits watch ended; watching again", "from_revision", next, "err", werr, "retry_in", wait)
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (a *Allocator) applyLimitEvents(t *term, events []*clientv3.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range events {
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
}

// resumeSession is called when the leader's session stopped hearing
// keep-alive answers: during an etcd election there is no raft leader to
// answer them for a while, and the client gives the session up after its
// TTL, although etcd extends every lease when a new raft leader takes
// over. If the lease is still alive the term goes on with a new session
// on the same lease (the election key, and so the fence, are unchanged);
// if etcd says it is gone, or cannot tell within the commit retry budget,
// the term ends. Safety never depends on this: every write is fenced.
func (a *Allocator) resumeSession(ctx, tctx context.Context, id clientv3.LeaseID) (*concurrency.Session, error) {
	start := time.Now()
	bo := a.opt.commit.backoff()
	for {
		actx, cancel := context.WithTimeout(tctx, a.opt.commit.attempt)
		resp, err := a.cfg.Client.KeepAliveOnce(actx, id)
		cancel()
		if err == nil && resp.TTL > 0 {
			return concurrency.NewSession(a.cfg.Client, concurrency.WithLease(id), concurrency.WithTTL(a.opt.sessionTTL),
				concurrency.WithContext(ctx))
		}
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || tctx.Err() != nil || !retryable(err) {
			return nil, fmt.Errorf("lease %x: %v", id, err)
		}
		wait := bo.NextBackOff()
		if time.Since(start)+wait >= a.opt.commit.budget {
			return nil, fmt.Errorf("lease %x: no answer for %v: %w", id, time.Since(start).Round(time.Millisecond), err)
		}
		select {
		case <-tctx.Done():
			return nil, tctx.Err()
		case <-time.After(wait):
		}
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

// sweepOnce records the end of overrides that ended, removes the expired
// windows' records (fenced, batched) and then forgets them in the core.
func (a *Allocator) sweepOnce(t *term) error {
	a.recordOverrideEnds(t)
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
	if err := a.sweepIdleTenants(t); err != nil {
		return err
	}
	return a.sweepShares(t)
}

// sweepIdleTenants removes the window summaries of plan tenants and deleted limits idle for
// as many windows as reports keep (Core.IdleTenants), fenced and batched.
func (a *Allocator) sweepIdleTenants(t *term) error {
	t.mu.Lock()
	ids := t.core.IdleTenants(a.opt.now(), a.opt.keepWindows)
	t.mu.Unlock()
	for len(ids) > 0 {
		var ops []*pendingOp
		n := 0
		t.mu.Lock()
		for _, id := range ids {
			ws := t.core.summaryWindows(id)
			if n > 0 && len(ops)+len(ws) > a.opt.maxOps {
				break
			}
			for _, w := range ws {
				ops = append(ops, t.commit.enqueue(clientv3.OpDelete(a.store.summaryKey(id, w))))
			}
			n++
		}
		t.mu.Unlock()
		for _, p := range ops {
			if err := p.wait(t.ctx); err != nil {
				return err
			}
		}
		t.mu.Lock()
		for _, id := range ids[:n] {
			t.core.DropSummaries(id)
		}
		t.core.ForgetDemand(ids[:n])
		t.mu.Unlock()
		ids = ids[n:]
	}
	return nil
}

// sweepShares removes the records of rate shares that expired more than
// the retention ago (fenced, batched), then forgets them in the core.
func (a *Allocator) sweepShares(t *term) error {
	t.mu.Lock()
	gs := t.core.ExpiredShares(a.opt.now(), a.opt.retention)
	t.mu.Unlock()
	for len(gs) > 0 {
		n := min(len(gs), max(1, a.opt.maxOps))
		ops := make([]*pendingOp, 0, n)
		for _, g := range gs[:n] {
			ops = append(ops, t.commit.enqueue(clientv3.OpDelete(a.store.shareKey(g))))
		}
		for _, p := range ops {
			if err := p.wait(t.ctx); err != nil {
				return err
			}
		}
		t.mu.Lock()
		for _, g := range gs[:n] {
			t.core.ForgetShare(g)
		}
		t.mu.Unlock()
		gs = gs[n:]
	}
	return nil
}

// AcquireShares grants rate shares of bucket limits to region. The
// requests must already be validated (see ValidateAcquireShares). New
// shares are durable when it returns; a replay of one not yet committed
// waits for its commit.
func (a *Allocator) AcquireShares(ctx context.Context, region string, reqs []*pb.ShareRequest) ([]*pb.ShareResult, error) {
	t, err := a.currentTerm()
	if err != nil {
		return nil, err
	}
	now := a.opt.now()
	results := make([]*pb.ShareResult, len(reqs))
	decs := make([]ShareDecision, len(reqs))
	var waits []*pendingOp
	t.mu.Lock()
	for i, r := range reqs {
		d := t.core.AcquireShare(now, region, ShareAcquire{RequestID: r.RequestId, Limit: r.LimitId, Demand: r.DemandPerSecond, Holder: r.Holder,
			Admitted: r.AdmittedTokens, HeldSlots: r.HeldSlots, WouldDeny: r.WouldDenyTokens, WouldDenyChecks: r.WouldDenyChecks})
		results[i] = &pb.ShareResult{RequestId: r.RequestId, Code: d.Code, Message: d.Message, Replayed: d.Replayed, OwnerGroup: d.OwnerGroup}
		decs[i] = d
		switch {
		case d.New:
			op, err := a.store.putShareOp(d.Grant)
			if err != nil {
				t.mu.Unlock()
				t.cancel(err) // the core holds an unpersistable share
				return nil, unavailable(err)
			}
			d.Grant.pending = t.commit.enqueue(op)
			waits = append(waits, d.Grant.pending)
			a.m.grants.WithLabelValues("granted").Inc()
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
	// expires_in is measured from now, after the commit, as for leases:
	// the agent measures from its send, earlier.
	now = a.opt.now()
	for i, d := range decs {
		switch {
		case d.Grant != nil:
			results[i].Share = d.Grant.ToProto(now)
		case d.Code == pb.ItemCode_ITEM_CODE_OK:
			results[i].Share = &pb.RateShare{LimitId: reqs[i].LimitId, Region: region, RequestId: reqs[i].RequestId,
				ExpiresIn: durpb(0), RatePeriod: durpb(0)}
		}
	}
	return results, nil
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
		results[i] = &pb.LeaseResult{RequestId: r.RequestId, Code: d.Code, Message: d.Message, Replayed: d.Replayed, OwnerGroup: d.OwnerGroup}
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
	var recs []hist.Record
	t.mu.Lock()
	for i, d := range decs {
		switch {
		case d.Grant != nil:
			results[i].Lease = d.Grant.ToProto(now)
			if a.opt.recorder != nil {
				recs = append(recs, a.grantRecord(now, d.Grant, d.Replayed))
			}
		case d.Code == pb.ItemCode_ITEM_CODE_OK && d.Window.Length > 0:
			results[i].Lease = d.EmptyLease(now, reqs[i].LimitId, region, reqs[i].RequestId)
		}
	}
	t.mu.Unlock()
	a.durable(recs)
	return results, nil
}

// grantRecord is the history's record of grant g answered at now (under
// the term's lock: a return may change the grant).
func (a *Allocator) grantRecord(now time.Time, g *Grant, replayed bool) hist.Record {
	w := g.window()
	return hist.Record{Kind: hist.KindGrant, T: now.UnixNano(), Proc: a.cfg.Advertise, Region: g.Region,
		Limit: g.Limit, Window: g.Window, WindowLen: int64(w.Length), WindowPhase: int64(w.Phase), Cal: zones.Format(w.Cal), G: g.G, Request: g.RequestID, Lease: g.LeaseID,
		Tokens: g.Tokens, Start: g.StartsAt, Expiry: g.ExpiresAt, End: w.End().UnixNano(), Replayed: replayed}
}

// durable writes history records before the answer they belong to leaves.
// A history that cannot be written does not fail the call (the recorder
// keeps its first error, and Close returns it).
func (a *Allocator) durable(recs []hist.Record) {
	if len(recs) > 0 {
		if err := a.opt.recorder.Durable(recs...); err != nil {
			a.log.Warn("history: writing grants and returns", "err", err)
		}
	}
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
				if d.Credited > 0 {
					// The credit reaches the pool once the record is
					// durable, whether or not this caller still waits.
					g, p := d.Grant, d.Grant.pending
					go func() {
						if p.wait(t.ctx) == nil {
							t.mu.Lock()
							t.core.Credit(g)
							t.mu.Unlock()
						}
					}()
				}
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
	if a.opt.recorder != nil {
		now := a.opt.now().UnixNano()
		recs := make([]hist.Record, 0, len(rets))
		for i, r := range rets {
			res := results[i]
			rec := hist.Record{Kind: hist.KindReturn, T: now, Proc: a.cfg.Advertise, Region: region, Limit: r.LimitId,
				Lease: r.LeaseId, Unspent: r.Unspent, Credited: res.Credited, Duplicate: res.Duplicate, Code: itemCode(res.Code)}
			if w, _, _, err := ParseLeaseID(r.LeaseId); err == nil {
				rec.Window = max(0, w)
			}
			recs = append(recs, rec)
		}
		a.durable(recs)
	}
	return results, nil
}

// itemCode names an item code for the history: ok, window_closed, ...
func itemCode(c pb.ItemCode) string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "ITEM_CODE_"))
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
	if a.opt.recorder != nil {
		at := a.opt.now().UnixNano()
		scheds := make([]lease.Windows, len(usage))
		t.mu.Lock()
		for i, u := range usage {
			if l, ok := t.core.Limit(u.LimitId); ok {
				scheds[i] = l.forIndex(u.WindowIndex, time.Unix(0, at)).Windows()
			}
		}
		t.mu.Unlock()
		for i, u := range usage {
			a.opt.recorder.Record(hist.Record{Kind: hist.KindReport, T: at, Proc: a.cfg.Advertise, Region: region,
				Reporter: reporter, Limit: u.LimitId, Window: max(0, u.WindowIndex), WindowLen: int64(scheds[i].Length),
				WindowPhase: int64(scheds[i].Phase), Admitted: max(0, u.Admitted),
				Denied: max(0, u.Denied), FallbackAdmitted: max(0, u.FallbackAdmitted), Released: max(0, u.Released),
				Rollback: max(0, u.RedisRollbackTokens)})
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
