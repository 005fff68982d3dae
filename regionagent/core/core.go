package core

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// Config is the required identity of a Core.
type Config struct {
	// Region is the agent's region.
	Region string
	// RequestPrefix starts every request id this Core makes (the replica
	// id and a process nonce, e.g. "eu-1-3fa2c9d1"): request ids must be new
	// across restarts of a replica, since the allocator remembers them for
	// its retention and would replay old leases.
	RequestPrefix string
	// Seed seeds the jitter of retry-after answers (0: random). The
	// simulator and the explorer pass one so that runs repeat.
	Seed uint64
	// SameSlotRequired: the region's shared store takes the keys of one
	// atomic call only from one slot (a Redis Cluster), so a Check of
	// several limits must name limits that share a hash tag; one that
	// does not is refused as invalid input, naming the limits, rather
	// than answered UNAVAILABLE with a retry that can never succeed. On a
	// single Redis (or Sentinel) any limits may be checked together.
	SameSlotRequired bool
}

// The shell's allocator calls: each attempt times out after
// DefaultCallTimeout, and a call is retried (with the same request ids)
// for DefaultCallRetry, which covers an allocator leader failover, before
// its requests count as failed (AcquireFailed). The region agent and the
// simulator's shell both use them.
const (
	DefaultCallTimeout = time.Second
	DefaultCallRetry   = 5 * time.Second
)

// settings are the optional settings, with their defaults in New.
type settings struct {
	lead        time.Duration // renewal lead time
	every       time.Duration // slack before a window's end for the next window's lease
	marginFixed time.Duration
	driftPPM    float64
	wait        time.Duration // how long a Check may wait for a lease
	lookupWait  time.Duration // how long a Check may wait for a limit sync
	spentRetry  time.Duration
	lockRetry   time.Duration
	activeFor   time.Duration
	idleAfter   time.Duration
	keyGrace    time.Duration
	reportEvery time.Duration
	// maxProgress bounds the limits whose windows in progress one report
	// round reads (windows that ended are read regardless).
	maxProgress int
	retryEvery  time.Duration // unacknowledged returns are sent again this often
	maxReturns  int           // unacknowledged returns kept per limit
}

// Option changes an optional setting.
type Option func(*settings)

// WithLead sets the renewal lead time (renew when the balance would last
// less than this at the current demand; also how long before a lease's
// deadline it is renewed while the limit has demand) and the slack before
// a window's end at which the next window's lease is fetched (lead +
// slack). Defaults 2 s and 250 ms.
func WithLead(lead, slack time.Duration) Option {
	return func(s *settings) { s.lead, s.every = max(lead, time.Millisecond), max(slack, 0) }
}

// WithSafetyMargin sets how much earlier than the allocator's expiry a
// lease's deadline falls: fixed + expires_in x driftPPM / 1e6. Deadlines
// are already measured from when the request was sent and converted to the
// store's clock with the conservative bound, so the margin only covers
// clock rate drift between hosts over the lease's life, plus rounding.
// Defaults 2 ms and 1000 ppm (5x the drift of commodity clocks).
func WithSafetyMargin(fixed time.Duration, driftPPM float64) Option {
	return func(s *settings) { s.marginFixed, s.driftPPM = max(fixed, 0), max(driftPPM, 0) }
}

// WithWait bounds how long a Check may wait for a lease when its region's
// store cannot pay for it and the pool is not known to be spent (a first
// Check of a limit, or a renewal in flight). A Check not decided in time
// is answered UNAVAILABLE with a short retry-after, never OVER_LIMIT.
// Default 500 ms; the caller's own deadline also bounds it.
func WithWait(d time.Duration) Option { return func(s *settings) { s.wait = max(d, 0) } }

// WithLookupWait bounds how long a Check of a limit not in the snapshot
// waits for a limit sync started after it arrived (see Begin). Not
// answered in time, it is UNAVAILABLE: the agent cannot say whether the
// limit exists. Default 1 s (the shell batches such syncs 100 ms apart,
// and a sync is one round trip to the allocator); the caller's deadline
// also bounds it.
func WithLookupWait(d time.Duration) Option { return func(s *settings) { s.lookupWait = max(d, 0) } }

// WithIdle sets how long after its last Check a limit still counts as
// active (its leases are renewed before they expire, its next window's
// lease is fetched) and how long until an idle limit is forgotten.
// Defaults 5 s and 5 min.
func WithIdle(active, forget time.Duration) Option {
	return func(s *settings) { s.activeFor, s.idleAfter = max(active, 0), max(forget, active) }
}

// WithReports sets how often usage is reported (only windows with spends
// since the last report, and each window once more after its end) and how
// long a window's bucket outlives it (reports cover that long). Defaults
// 2 s and 2 min.
func WithReports(every, keyGrace time.Duration) Option {
	return func(s *settings) { s.reportEvery, s.keyGrace = max(every, time.Millisecond), max(keyGrace, 0) }
}

// WithReportBudget bounds how many limits one report round reads the
// windows in progress of (at least 1): with more limits busy than that,
// the ones that waited longest go first, and each is still read at least
// every ceil(busy/n) rounds. A window that ended is read once more
// regardless, so every window's final count is as prompt as before.
// Default 1000 (500 reads a second at the default 2 s rounds): an agent
// deciding 10,000 limits spread thin otherwise read each limit's counters
// about once per Check.
func WithReportBudget(n int) Option {
	return func(s *settings) { s.maxProgress = max(n, 1) }
}

// Core is one agent replica's decision state machine; see the package
// documentation. The zero value is not usable; call New. Not safe for
// concurrent use.
type Core struct {
	cfg Config
	opt settings
	rng *rand.Rand

	limits   map[string]*Limit // the snapshot
	rev      int64
	synced   bool      // a snapshot came from the allocator in this process
	syncs    SyncToken // limit syncs started
	syncedTo SyncToken // the latest started sync that answered
	restored bool      // the snapshot came from the region's store (a restart while the allocator was unreachable)
	takenAt  time.Time // when the snapshot was taken, on the allocator's clock
	lookups  map[string]bool
	// resolver gives the limits of ids the plans bind (plans.go); bound
	// are the ids resolved into limits, each kept while its state is.
	resolver  Resolver
	bound     map[string]bool
	offset    time.Duration // allocator clock - agent clock; only names windows
	offsetSet bool
	// clock bounds the allocator's clock from the latest SetAllocatorClock:
	// at agent time t it is within [t + clock.lo, t + clock.hi], less the
	// drift since clock.at. Only standing shares use it (standing.go).
	// With allocator groups (SetShareGroups), shareOwner names the group
	// whose allocator counts a window's share, and groupClocks hold each
	// group's bounds and snapshot time (SetGroupClock) instead.
	clock       clockBounds
	shareOwner  func(limit string, start time.Time) (group string, ok bool)
	groupClocks map[string]groupClock

	states    map[string]*limitState
	byRequest map[string]*limitState // unanswered request id -> its limit
	seq       uint64                 // request ids
	roundSeq  uint64

	redisDown bool
	episode   uint64 // Redis-down episodes
	allocDown bool

	timers   timerHeap
	reportAt time.Time // zero: no report scheduled
	// pending are the limits with windows to report or returns to send:
	// the report timer looks at these only, not at every limit.
	pending map[string]*limitState
	// progress and ends drive the report rounds (report.go): the limits
	// whose windows in progress wait for a read, and the windows' final
	// reads and forgetting by when they are due; late are ended windows
	// spent in again, read at the next round; retrying are the limits
	// with returns the allocator has not acknowledged.
	progress  progressHeap
	ends      endHeap
	late      []seenRef
	retrying  map[string]*limitState
	lastRound time.Time // the last report round
	unfinal   int       // windows kept whose final read has not been asked for
	// seen are the windows of the shared store whose admitted count rose
	// since the last Seen: Seen reads these, not every limit's windows.
	// They are kept only once Seen was called (seenUsed): a Core nobody
	// asks keeps none.
	seen     []seenRef
	seenUsed bool

	ready   Ready
	changed map[string]bool // limits whose waiting Checks should look again

	stats Stats
}

// Stats are the Core's cumulative counts, for the agent's metrics.
type Stats struct {
	RenewalsGranted, RenewalsEmpty, RenewalsFailed, RenewalsRejected int64
	LeasedTokens                                                     [2]int64 // by Store
	Rounds, RoundsLocked                                             int64
}

// New returns a Core with no limits (not synced).
func New(cfg Config, opts ...Option) *Core {
	o := settings{lead: 2 * time.Second, every: 250 * time.Millisecond, marginFixed: 2 * time.Millisecond, driftPPM: 1000,
		wait: 500 * time.Millisecond, lookupWait: time.Second, spentRetry: time.Second, lockRetry: 50 * time.Millisecond,
		activeFor: 5 * time.Second, idleAfter: 5 * time.Minute, keyGrace: 2 * time.Minute,
		reportEvery: 2 * time.Second, maxProgress: 1000, retryEvery: 5 * time.Second, maxReturns: 1024}
	for _, f := range opts {
		f(&o)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Core{
		cfg: cfg, opt: o, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		limits: map[string]*Limit{}, states: map[string]*limitState{}, byRequest: map[string]*limitState{},
		changed: map[string]bool{}, pending: map[string]*limitState{}, lookups: map[string]bool{}, bound: map[string]bool{},
		retrying: map[string]*limitState{},
	}
}

// limitState is the Core's view of one limit it has seen a Check for.
type limitState struct {
	id string
	l  Limit // the definition, kept after a delete so that holdings close

	// demand is the region's, from the shared store's counters;
	// localDemand this replica's own, while it spends in process (made
	// on first use: most limits never do). Read both with demandIn.
	demand      Demand
	localDemand *Demand
	lastCheck   time.Time
	prevCheck   time.Time // the Check before the last

	round       *round
	bucket      bucketState // a bucket limit's share (bucket.go)
	lockedUntil time.Time   // another replica holds the renewal lock: do not try before
	pending     *Acquire    // unanswered current-window request, sent again as is
	pendingNext *Acquire
	spentWindow int64 // window whose pool (or this region's share) the allocator said is spent
	spentAt     time.Time
	shareSpent  bool // spentWindow is spent for this region only (its share)
	// spentLocal: spentWindow was learned while this replica spent in
	// process (Redis down, or a round of the in-process store): the
	// allocator's books count the leases the region holds in its shared
	// bucket, which this replica cannot reach, so the pool being spent
	// does not say the region spent what it was granted.
	spentLocal bool
	// unanswered are this limit's deposits the shared store did not
	// answer (Deposited, unanswered): each may have landed, or may land
	// yet, so while one of a window is listed a spent pool in that window
	// does not say the region spent what it was granted. A read of the
	// bucket that finds the lease takes it off; at most maxUnanswered are
	// kept (the oldest dropped).
	unanswered []unansweredDeposit
	nextWindow int64
	localNext  int64
	// standingWin is the latest window whose standing share this replica
	// deposited (or tried to): one try per window.
	standingWin int64
	prefetched  int64 // window whose end's renewal round ran
	failing     bool  // the last acquire failed for good
	failedAt    time.Time
	kickCost    int64 // largest cost denied since the last grant
	// comingBack: tokens of window comingBackWin the region held when it
	// last asked (in leases that end before the window does): they go
	// back to the pool, so an empty pool then is not a spent one.
	comingBack    int64
	comingBackWin int64
	awaitReturn   bool // renew once a return is acknowledged
	// awaitUntil: until then, while awaitReturn, nothing but the return's
	// acknowledgement starts a round (a dry spend asking the allocator
	// again would get the same empty answer, as often as Checks come);
	// after it, a return that is slow to land no longer holds renewals.
	awaitUntil time.Time
	// returning are this limit's returns handed out (Ready.Returns) and
	// not yet done (ReturnsDone): their unspent tokens are on their way
	// back to the pool, so an empty pool meanwhile is not a spent one.
	returning []Return
	// liftedWindow is the window whose spent mark a return lifted: its
	// unspent tokens went back to the pool after the mark, so the
	// bucket's pool_spent counter (which stays) no longer says it is
	// spent; only the allocator's next empty answer does.
	liftedWindow int64
	fallbackOn   bool // a fallback mode was applied since the last grant

	holdings   []holding // leases this replica deposited and has not closed
	unreturned []Return  // returns the allocator has not acknowledged
	windows    map[winKey]*winUse
	// reportedAt: when the limit's windows in progress were last asked
	// for; progressAt orders it in the report budget's queue while
	// inProgress; reads collects a report round's windows, by Store.
	reportedAt time.Time
	progressAt time.Time
	inProgress bool
	reads      [2][]int64

	wakeAt  time.Time // when the limit's timer is due (zero: none)
	wakeGen uint64
	// timedBusy: the timer was set while the limit was busy (with its
	// renewals); a limit that becomes busy is scheduled again.
	timedBusy bool
}

// unansweredDeposit is a deposit to the shared store that went
// unanswered.
type unansweredDeposit struct {
	window int64
	id     string
}

// maxUnanswered bounds a limit's unanswered deposits.
const maxUnanswered = 16

// noteUnanswered lists a deposit of window w the shared store did not
// answer, forgetting those of earlier windows.
func (st *limitState) noteUnanswered(w int64, id string) {
	st.unanswered = slices.DeleteFunc(st.unanswered, func(u unansweredDeposit) bool { return u.window < w })
	if len(st.unanswered) >= maxUnanswered {
		st.unanswered = slices.Delete(st.unanswered, 0, 1)
	}
	st.unanswered = append(st.unanswered, unansweredDeposit{window: w, id: id})
}

// foundUnanswered takes off the unanswered deposits a read of the shared
// bucket of window w found (open or expired: they landed) and those of
// earlier windows.
func (st *limitState) foundUnanswered(w int64, b store.BalanceResult) {
	if len(st.unanswered) == 0 {
		return
	}
	st.unanswered = slices.DeleteFunc(st.unanswered, func(u unansweredDeposit) bool {
		if u.window < w {
			return true
		}
		if u.window > w {
			return false
		}
		for _, o := range b.Open {
			if o.ID == u.id {
				return true
			}
		}
		for _, e := range b.Expired {
			if e.ID == u.id {
				return true
			}
		}
		return false
	})
}

// unansweredIn reports whether a deposit of window w may still land.
func (st *limitState) unansweredIn(w int64) bool {
	for _, u := range st.unanswered {
		if u.window == w {
			return true
		}
	}
	return false
}

// holding is a lease this replica deposited.
type holding struct {
	store    Store
	key      store.Key
	id       string
	deadline time.Time
	start    time.Time
	renewed  bool // a renewal before its deadline was started
}

// winKey is a window of one store.
type winKey struct {
	store  Store
	window int64
}

// seenRef names a window in Core.seen.
type seenRef struct {
	st *limitState
	k  winKey
	u  *winUse
}

// winUse is what the Core knows of a window it spent in.
type winUse struct {
	end      time.Time // the window's end, agent clock
	dirty    bool      // spends since the last report
	final    bool      // reported once after its end
	admitted int64     // the largest admitted count a spend returned
	seenAt   time.Time // when that count was seen
	seenNew  bool      // in Core.seen: seen since the last Seen
}

func (c *Core) state(l *Limit) *limitState {
	st := c.states[l.ID]
	if st == nil {
		st = &limitState{id: l.ID, l: *l, standingWin: -1, spentWindow: -1, nextWindow: -1, localNext: -1, prefetched: -1,
			liftedWindow: -1, windows: map[winKey]*winUse{}}
		st.demand.init(l.prior())
		c.states[l.ID] = st
	}
	return st
}

// demandIn is the limit's demand as the store s counts it: the region's
// (the shared store's counters) or, in process, this replica's own.
func (st *limitState) demandIn(s Store) *Demand {
	if s != Local {
		return &st.demand
	}
	if st.localDemand == nil {
		st.localDemand = NewDemand(st.l.prior())
	}
	return st.localDemand
}

// ---- limits and clocks ----

// SyncToken names a limit sync by when it started, in the order of the
// Core's events: a sync started after a Check arrived read the limits
// after the Check's question was asked.
type SyncToken uint64

// SyncStart is called just before a limit sync is sent; its answer is
// given to SetLimits or Synced with the token returned.
func (c *Core) SyncStart() SyncToken {
	c.syncs++
	return c.syncs
}

// SetLimits replaces the snapshot of the region's limits with the
// allocator's (rev is its revision of it; tok is the sync's SyncStart;
// taken is the allocator's clock when it answered). A limit that
// disappears keeps its state until its leases are closed and returned.
func (c *Core) SetLimits(tok SyncToken, rev int64, ls []Limit, taken time.Time) {
	m := make(map[string]*Limit, len(ls))
	for i := range ls {
		l := ls[i]
		m[l.ID] = &l
		if st := c.states[l.ID]; st != nil {
			st.l = l
		}
	}
	c.limits, c.rev = m, rev
	c.rebind()
	c.restored = false
	c.Synced(tok, taken)
}

// Synced records a sync (tok: its SyncStart) that found the snapshot
// unchanged (taken: the allocator's clock when it answered). Checks that
// wait for a lookup look again.
func (c *Core) Synced(tok SyncToken, taken time.Time) {
	c.synced = true
	c.syncedTo = max(c.syncedTo, tok)
	if !taken.IsZero() {
		c.takenAt = taken
	}
	for id := range c.lookups {
		c.changed[id] = true
	}
	clear(c.lookups)
}

// RestoreLimits sets a snapshot the agent kept in its region (the region's
// store, a file) when it has none from the allocator yet: an agent
// restarted while the allocator is unreachable enforces each limit's mode
// and fallback from it. A snapshot older than the one held (by the
// allocator's revision, then the time it was taken) is ignored, and so is
// every snapshot once the allocator answered. It reports whether the
// snapshot was taken.
func (c *Core) RestoreLimits(rev int64, ls []Limit, taken time.Time) bool {
	if c.synced || c.restored && !SnapshotNewer(rev, taken, c.rev, c.takenAt) {
		return false
	}
	m := make(map[string]*Limit, len(ls))
	for i := range ls {
		l := ls[i]
		m[l.ID] = &l
	}
	c.limits, c.rev, c.takenAt, c.restored = m, rev, taken, true
	c.rebind()
	return true
}

// SnapshotNewer reports whether a snapshot (rev, taken) is newer than
// (rev0, taken0): by the etcd revision it was read at, then by when it was
// taken. The allocator's revision is negative while changes wait for a
// window boundary (see SyncLimits): -(etcd revision << 20 | changes).
func SnapshotNewer(rev int64, taken time.Time, rev0 int64, taken0 time.Time) bool {
	e, e0 := EtcdRevision(rev), EtcdRevision(rev0)
	if e != e0 {
		return e > e0
	}
	return taken.After(taken0)
}

// EtcdRevision is the etcd revision a snapshot revision was read at.
func EtcdRevision(rev int64) int64 {
	if rev < 0 {
		return -rev >> 20
	}
	return rev
}

// Snapshot says where the limits come from and when they were taken (on
// the allocator's clock): from the allocator (synced), restored from the
// region's store, or none.
func (c *Core) Snapshot() (synced, restored bool, taken time.Time) {
	return c.synced, c.restored, c.takenAt
}

// Revision is the snapshot's revision (0 before the first sync).
func (c *Core) Revision() int64 { return c.rev }

// IsSynced reports whether the allocator's snapshot was ever set.
func (c *Core) IsSynced() bool { return c.synced }

// Limit returns a limit of the snapshot.
func (c *Core) Limit(id string) (Limit, bool) {
	l, ok := c.limits[id]
	if !ok {
		return Limit{}, false
	}
	return *l, true
}

// SetAllocatorClock records the allocator's clock as read by a call sent
// at sent and answered at recv (its midpoint), if no lease reply has set it
// yet: the estimate only names windows; no lease timing depends on it.
// Each call also sets the bounds on that clock a standing share is spent
// within (standing.go).
func (c *Core) SetAllocatorClock(sent, recv time.Time, alloc time.Time) {
	c.clock = boundsOf(sent, recv, alloc)
	if c.offsetSet {
		return
	}
	mid := sent.Add(recv.Sub(sent) / 2)
	c.offset, c.offsetSet = alloc.Sub(mid), true
}

// WindowOf names the window of l that contains the agent's now, on the
// allocator's clock as estimated.
func (c *Core) WindowOf(now time.Time, l *Limit) lease.Window {
	return l.Windows().Of(now.Add(c.offset))
}

// WindowEnd is the end of w on the agent's clock.
func (c *Core) WindowEnd(w lease.Window) time.Time { return w.End().Add(-c.offset) }

// Margin is the safety margin taken off a grant's expires_in of d when
// its deadline is measured (lease.Deadline).
func (c *Core) Margin(d time.Duration) time.Duration { return c.margin(d) }

func (c *Core) margin(d time.Duration) time.Duration {
	return c.opt.marginFixed + time.Duration(float64(d)*c.opt.driftPPM/1e6)
}

// ---- health ----

// SetRedisHealth tells the Core whether the region's Redis answers. While
// it does not, Checks spend from this replica's in-process store (leases
// it acquires for itself); when it answers again, every in-process lease
// is closed and returned, and the shared store is used again.
func (c *Core) SetRedisHealth(now time.Time, up bool) {
	if up == !c.redisDown {
		return
	}
	c.redisDown = !up
	if !up {
		c.episode++
		for _, id := range c.sortedStates() {
			c.changed[id] = true
		}
		return
	}
	for _, id := range c.sortedStates() {
		st := c.states[id]
		if st.spentLocal {
			// Learned without the shared bucket, and the in-process leases
			// go back to the pool now: the next dry spend asks again.
			st.spentWindow, st.spentLocal = -1, false
		}
		st.nextWindow = -1 // Redis may have lost the next window's lease
		st.lockedUntil = time.Time{}
		st.localNext = -1
		c.drainLocal(now, st)
		if c.busy(st, now) {
			c.kick(st, now)
		}
		c.changed[id] = true
	}
}

// RedisDown reports whether the in-process store is in use.
func (c *Core) RedisDown() bool { return c.redisDown }

// SetAllocatorHealth tells the Core whether the allocator answers. When it
// answers again, unanswered requests are sent again and unacknowledged
// returns too, and limits in a fallback mode renew.
func (c *Core) SetAllocatorHealth(now time.Time, up bool) {
	if up == !c.allocDown {
		return
	}
	c.allocDown = !up
	for _, id := range c.sortedStates() {
		st := c.states[id]
		c.changed[id] = true
		if !up {
			continue
		}
		st.failing = false
		if st.pending != nil || st.pendingNext != nil || st.fallbackOn || c.busy(st, now) {
			c.kick(st, now)
		}
		c.queueUnreturned(st)
	}
}

// AllocatorDown reports whether the allocator is known unreachable.
func (c *Core) AllocatorDown() bool { return c.allocDown }

func (c *Core) store() Store {
	if c.redisDown {
		return Local
	}
	return Shared
}

// active reports whether a limit had a Check recently.
func (c *Core) active(st *limitState, now time.Time) bool {
	return !st.lastCheck.IsZero() && now.Sub(st.lastCheck) < c.opt.activeFor
}

// busy reports whether a limit has traffic worth keeping leases for: two
// Checks recently and a measured demand of at least a token per lead time.
// Its leases are then renewed before they expire and its next window's
// lease fetched ahead; a limit used once is not (its next Check waits for
// a lease instead: one round trip).
func (c *Core) busy(st *limitState, now time.Time) bool {
	if !c.active(st, now) || st.prevCheck.IsZero() || now.Sub(st.prevCheck) >= c.opt.activeFor {
		return false // one Check is no traffic (its retries inside a wait count as demand, not as Checks)
	}
	return st.demandIn(c.store()).Measured(now)*c.opt.lead.Seconds() >= 1
}

func (c *Core) sortedStates() []string { return sortedIDs(c.states) }

// sortedIDs lists m's keys in order: every iteration that reaches an
// action or an answer is ordered, so the simulator's runs repeat.
func sortedIDs(m map[string]*limitState) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ---- actions ----

// Ready is what the Core asks the caller to do. Each action's result goes
// back as an event; actions of one Ready are independent of one another
// and may run concurrently.
type Ready struct {
	Rounds   []Round
	Acquires []Acquire
	Deposits []Deposit
	Closes   []Close
	Returns  []Return
	// Counters are counter writes that need no answer (marks).
	Counters []CounterOp
	// Unlocks name limits whose renewal lock this replica releases.
	Unlocks []Unlock
	Reports []ReportRead
	// Wake names limits whose waiting Checks should look again.
	Wake []string
	// Fallback are changes of the fail mode in force per limit (the
	// agent's gauge): Kind 0 when a fallback ended.
	Fallback []FallbackMark
	Notes    []Note
	// Shares are rate share requests of bucket limits, Installs the shares
	// to put in force in their stores (bucket.go).
	Shares   []ShareAcquire
	Installs []Install
}

// Empty reports whether there is nothing to do.
func (r *Ready) Empty() bool {
	return len(r.Rounds)+len(r.Acquires)+len(r.Deposits)+len(r.Closes)+len(r.Returns)+len(r.Counters)+
		len(r.Unlocks)+len(r.Reports)+len(r.Wake)+len(r.Fallback)+len(r.Notes)+len(r.Shares)+len(r.Installs) == 0
}

// Unlock names a limit whose renewal lock this replica releases; the
// limit's hash tag places the lock (as store.Key's does a bucket).
type Unlock struct {
	Limit   string
	HashTag string
}

// CounterOp adds Delta to the named counter of a bucket.
type CounterOp struct {
	Store Store
	Key   store.Key
	Name  string
	Delta int64
}

// FallbackMark is a change of the fail mode in force for a limit.
type FallbackMark struct {
	Limit string
	Kind  FallbackKind // 0: no fallback in force any more
}

// Note is something worth logging. The Core says what happened; the
// caller decides how loudly (and how often) to say it.
type Note struct {
	Kind  NoteKind
	Limit string
	Lease string
	Text  string
}

// NoteKind classifies notes.
type NoteKind int8

// Note kinds.
const (
	NoteRefused    NoteKind = iota + 1 // the allocator refused a request (Text: its message)
	NoteFallback                       // a lease request failed: the limit's fallback applies until the allocator answers
	NoteStranded                       // a deposit went unanswered: the lease stays stranded
	NoteReturning                      // a deposit failed: the lease is returned whole
	NoteDrained                        // in-process leases closed after Redis came back
	NoteReturnLost                     // returns dropped: more than the limit's cap were unacknowledged
	NoteCrossSlot                      // a Check's limits cannot be spent in one call: different hash tags on Redis Cluster (Text: the limits)
)

// Ready takes the actions accumulated since the last call.
func (c *Core) Ready() Ready {
	if len(c.changed) > 0 {
		for id := range c.changed {
			c.ready.Wake = append(c.ready.Wake, id)
		}
		slices.Sort(c.ready.Wake)
		clear(c.changed)
	}
	rd := c.ready
	c.ready = Ready{}
	return rd
}

// HasReady reports whether Ready would return anything.
func (c *Core) HasReady() bool { return len(c.changed) > 0 || !c.ready.Empty() }

// Stats returns the cumulative counts.
func (c *Core) Stats() Stats { return c.stats }

// Active counts the limits the Core holds state for.
func (c *Core) Active() int { return len(c.states) }

func (c *Core) requestID() string {
	c.seq++
	return c.cfg.RequestPrefix + "-" + strconv.FormatUint(c.seq, 10)
}

// ---- time ----

// timer is one limit's wake-up; stale entries (an older gen) are skipped.
type timer struct {
	at  time.Time
	st  *limitState
	gen uint64
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// NextWake returns when the Core next has work of its own (ok false: none
// until an event arrives).
func (c *Core) NextWake() (time.Time, bool) {
	for len(c.timers) > 0 {
		t := c.timers[0]
		if t.gen == t.st.wakeGen && c.states[t.st.id] == t.st {
			if !c.reportAt.IsZero() && c.reportAt.Before(t.at) {
				return c.reportAt, true
			}
			return t.at, true
		}
		heap.Pop(&c.timers)
	}
	return c.reportAt, !c.reportAt.IsZero()
}

// Tick does the work due at now: closing leases at their deadline,
// renewing active limits before their leases expire and before their
// window ends, usage reports, and forgetting idle limits. Each limit's
// timer fires at most once per call.
func (c *Core) Tick(now time.Time) {
	var due []*limitState
	for len(c.timers) > 0 && !c.timers[0].at.After(now) {
		t := heap.Pop(&c.timers).(timer)
		if t.gen != t.st.wakeGen || c.states[t.st.id] != t.st {
			continue
		}
		t.st.wakeAt = time.Time{}
		due = append(due, t.st)
	}
	for _, st := range due {
		c.due(st, now)
	}
	if !c.reportAt.IsZero() && !c.reportAt.After(now) {
		c.reportAt = time.Time{}
		c.report(now, false)
	}
}

// schedule sets a limit's timer to the earliest instant it has work at.
func (c *Core) schedule(st *limitState, now time.Time) {
	st.timedBusy = c.busy(st, now)
	at := c.nextDue(st, now)
	if at.Equal(st.wakeAt) {
		return
	}
	st.wakeAt = at
	st.wakeGen++
	if !at.IsZero() {
		heap.Push(&c.timers, timer{at: at, st: st, gen: st.wakeGen})
	}
}

// nextDue is the earliest instant at which the limit has timed work:
// a lease's deadline (close it), for an active limit a lease's deadline
// minus the lead time and its window's end minus lead and slack (renew,
// once each, not while a round is in flight), and for a limit with
// nothing left, its forgetting.
func (c *Core) nextDue(st *limitState, now time.Time) time.Time {
	var at time.Time
	earlier := func(t time.Time) {
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	renewal := func(t time.Time) {
		if st.round != nil {
			return // its end reschedules
		}
		if t.Before(st.lockedUntil) {
			t = st.lockedUntil
		}
		earlier(t)
	}
	busy := c.busy(st, now)
	for _, h := range st.holdings {
		earlier(h.deadline)
		if busy && !h.renewed {
			renewal(h.deadline.Add(-c.opt.lead))
		}
	}
	if st.l.IsBucket() && c.active(st, now) && st.bucket.pending == nil && !st.bucket.renewAt.IsZero() && !c.allocDown {
		earlier(st.bucket.renewAt) // the share's renewal at half its life
	}
	if busy && !st.l.IsBucket() {
		if l, ok := c.limits[st.id]; ok {
			if w := c.WindowOf(now, l); st.prefetched < w.Index && !c.nextHeld(st, now, l) {
				renewal(c.WindowEnd(w).Add(-c.opt.lead - c.opt.every))
			}
		}
	}
	if c.forgettable(st) {
		earlier(st.lastCheck.Add(c.opt.idleAfter))
	}
	if !at.IsZero() && at.Before(now) {
		at = now
	}
	return at
}

// nextHeld reports whether the next window's lease is held already.
func (c *Core) nextHeld(st *limitState, now time.Time, l *Limit) bool {
	next := c.WindowOf(now, l).Index + 1
	if c.redisDown {
		return st.localNext == next
	}
	return st.nextWindow == next
}

func (c *Core) forgettable(st *limitState) bool {
	return st.round == nil && st.pending == nil && st.pendingNext == nil && st.bucket.pending == nil && len(st.holdings) == 0 &&
		len(st.unreturned) == 0 && !c.hasReports(st)
}

// due does a limit's timed work at now.
func (c *Core) due(st *limitState, now time.Time) {
	// Leases at their deadline are closed and returned: no read needed,
	// the Core knows their keys and ids.
	var closing []holding
	kept := st.holdings[:0]
	renew := false
	busy := c.busy(st, now)
	for _, h := range st.holdings {
		switch {
		case !now.Before(h.deadline):
			closing = append(closing, h)
			continue
		case busy && !h.renewed && st.round == nil && !now.Before(h.deadline.Add(-c.opt.lead)) &&
			!now.Before(st.lockedUntil):
			h.renewed = true
			renew = true
		}
		kept = append(kept, h)
	}
	st.holdings = kept
	c.closeHoldings(st, closing)
	if st.l.IsBucket() {
		if c.active(st, now) && !st.bucket.renewAt.IsZero() && !now.Before(st.bucket.renewAt) {
			c.kickShare(st, now)
		}
	} else if busy && st.round == nil && !now.Before(st.lockedUntil) {
		if l, ok := c.limits[st.id]; ok && !c.nextHeld(st, now, l) {
			w := c.WindowOf(now, l)
			if st.prefetched < w.Index && !now.Before(c.WindowEnd(w).Add(-c.opt.lead-c.opt.every)) {
				st.prefetched = w.Index
				renew = true
			}
		}
	}
	if renew {
		c.kick(st, now)
	}
	if !c.active(st, now) && c.forgettable(st) && now.Sub(st.lastCheck) >= c.opt.idleAfter {
		delete(c.states, st.id)
		delete(c.pending, st.id)
		delete(c.retrying, st.id)
		c.unbind(st.id)
		return
	}
	c.schedule(st, now)
}

// closeHoldings closes leases this replica deposited (their returns follow
// from Closed).
func (c *Core) closeHoldings(st *limitState, hs []holding) {
	for _, h := range hs {
		c.ready.Closes = append(c.ready.Closes, Close{Limit: st.id, Store: h.store, Key: h.key, IDs: []string{h.id}})
	}
}
