package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// t0 is the fixed instant the step tables count from: a minute boundary.
var t0 = time.Unix(1_800_000_000, 0).Truncate(time.Minute)

// fakeAlloc is a minimal allocator for the Core's tests: a pool of G per
// (limit, window), leases of a fixed chunk (or the want) clamped to the
// window's end, idempotent by request id, returns credited once while the
// window is open. Its clock is the test's (no offset).
type fakeAlloc struct {
	limits   map[string]Limit
	chunk    int64
	pools    map[store.Key]int64 // granted - credited
	grants   map[string]fakeGrant
	credited map[string]bool
	calls    int
	returns  int
}

type fakeGrant struct {
	g       Grant
	expiry  time.Time // allocator clock
	start   time.Time
	limit   string
	credit  int64
	settled bool
}

func newFakeAlloc(chunk int64, ls ...Limit) *fakeAlloc {
	a := &fakeAlloc{limits: map[string]Limit{}, chunk: chunk, pools: map[store.Key]int64{},
		grants: map[string]fakeGrant{}, credited: map[string]bool{}}
	for _, l := range ls {
		a.limits[l.ID] = l
	}
	return a
}

func (a *fakeAlloc) acquire(now time.Time, r Acquire) Grant {
	if g, ok := a.grants[r.RequestID]; ok {
		out := g.g
		out.Replayed = true
		out.ExpiresIn = max(0, g.expiry.Sub(now))
		out.StartsIn = max(0, g.start.Sub(now))
		out.WindowLeft = max(0, lease.WindowsOf(out.WindowLen, out.WindowPhase).ByIndex(out.Window).End().Sub(now))
		return out
	}
	l, ok := a.limits[r.Limit]
	if !ok {
		return Grant{Message: "no limit"}
	}
	w := l.Windows().Of(now)
	if r.Next {
		w = w.Next()
	}
	k := store.Key{Limit: l.ID, Window: w.Index}
	pool := l.Tokens - l.Standing*int64(l.Regions) - a.pools[k] // standing shares: granted from the window's start
	tm := lease.Schedule(now, w, l.TTL)
	g := Grant{OK: true, Window: w.Index, WindowLen: l.Window, WindowPhase: w.Phase, WindowLeft: w.End().Sub(now), PoolLeft: pool}
	if pool <= 0 || tm.ExpiresIn <= 0 {
		return g
	}
	n := min(max(a.chunk, r.Want), pool)
	a.pools[k] += n
	g.Tokens, g.PoolLeft = n, pool-n
	g.LeaseID = fmt.Sprintf("%d/eu/%s", w.Index, r.RequestID)
	g.StartsIn, g.ExpiresIn = tm.StartsIn, tm.ExpiresIn
	a.grants[r.RequestID] = fakeGrant{g: g, expiry: now.Add(tm.ExpiresIn), start: now.Add(tm.StartsIn), limit: l.ID}
	return g
}

func (a *fakeAlloc) giveBack(now time.Time, r Return) {
	a.returns++
	id := r.LeaseID[strings.LastIndex(r.LeaseID, "/")+1:]
	g, ok := a.grants[id]
	if !ok || g.settled {
		return
	}
	g.settled = true
	w := lease.WindowsOf(g.g.WindowLen, g.g.WindowPhase).ByIndex(g.g.Window)
	if now.Before(w.End()) {
		g.credit = r.Unspent
		a.pools[store.Key{Limit: g.limit, Window: g.g.Window}] -= r.Unspent
	}
	a.grants[id] = g
}

// world is one Core with its region's shared store, its in-process store,
// a fake allocator, and a clock the test moves. Actions run synchronously
// unless the test intercepts them.
type world struct {
	t      *testing.T
	now    time.Time
	c      *Core
	shared *store.Mem
	local  *store.Mem
	alloc  *fakeAlloc
	// dropAcquire, when set, fails every allocator call (unreachable).
	dropAcquire bool
	// holdReturns keeps the returns the Core hands out in heldReturns,
	// on their way to the allocator, until deliverReturns.
	holdReturns bool
	heldReturns []Return
	// otherLock: another replica holds every renewal lock.
	otherLock bool
	// redisDown: the shared store does not answer.
	redisDown bool
	// landUnanswered, if set, says whether a deposit Redis did not answer
	// landed all the same (a timeout after the write).
	landUnanswered func() bool
	// deposits lists every deposit made, for invariant checks.
	deposits []Deposit
	// sentAt is when each request id was first sent.
	sentAt map[string]time.Time
	wakes  map[string]int
	rounds int
	syncs  int
	// shareReply answers a bucket limit's share request (nil: a fixed
	// share of 10 tokens per second, burst 5, for 10 s); shareReqs lists
	// every share request sent, installs every share installed.
	shareReply func(r ShareAcquire) ShareReply
	shareReqs  []ShareAcquire
	installs   []Install
}

func newWorld(t *testing.T, chunk int64, ls ...Limit) *world {
	w := &world{t: t, now: t0, shared: store.NewMem(0), local: store.NewMem(0), alloc: newFakeAlloc(chunk, ls...),
		sentAt: map[string]time.Time{}, wakes: map[string]int{}}
	w.c = New(Config{Region: "eu", RequestPrefix: "eu-1-n", Seed: 1})
	w.c.SetLimits(w.c.SyncStart(), 1, ls, w.now)
	w.c.SetAllocatorClock(w.now, w.now, w.now)
	return w
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// syncLimits is a limit sync sent now: the allocator's limits, sorted.
func (w *world) syncLimits() {
	ids := make([]string, 0, len(w.alloc.limits))
	for id := range w.alloc.limits {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ls := make([]Limit, len(ids))
	for i, id := range ids {
		ls[i] = w.alloc.limits[id]
	}
	w.syncs++
	w.c.SetLimits(w.c.SyncStart(), int64(100+w.syncs), ls, w.now)
}

func (w *world) mem(s Store) *store.Mem {
	if s == Local {
		return w.local
	}
	return w.shared
}

func (w *world) advance(d time.Duration) {
	w.now = w.now.Add(d)
	w.c.Tick(w.now)
	w.drain()
}

// drain carries out every ready action (and the ones they lead to).
func (w *world) drain() {
	for range 1000 {
		rd := w.c.Ready()
		if rd.Empty() {
			return
		}
		w.run(rd)
	}
	w.t.Fatal("actions never settle")
}

func (w *world) run(rd Ready) {
	for _, id := range rd.Wake {
		w.wakes[id]++
	}
	for _, r := range rd.Rounds {
		w.rounds++
		switch {
		case r.Store == Shared && w.redisDown:
			w.c.RoundRead(w.now, r, RoundResult{Err: fmt.Errorf("redis down")})
		case r.Lock && w.otherLock:
			w.c.RoundRead(w.now, r, RoundResult{})
		default:
			w.c.RoundRead(w.now, r, RoundResult{Locked: true, Balance: w.mem(r.Store).Balance(r.Key, ms(w.now)), NowMs: ms(w.now)})
		}
	}
	if len(rd.Acquires) > 0 {
		w.alloc.calls++
		for _, a := range rd.Acquires {
			if _, ok := w.sentAt[a.RequestID]; !ok {
				w.sentAt[a.RequestID] = w.now
			}
		}
		if w.dropAcquire {
			w.c.AcquireFailed(w.now, rd.Acquires, false)
		} else {
			gs := make([]Grant, len(rd.Acquires))
			for i, a := range rd.Acquires {
				gs[i] = w.alloc.acquire(w.now, a)
			}
			w.c.Acquired(w.now, w.now, rd.Acquires, gs)
		}
	}
	for _, d := range rd.Deposits {
		w.deposits = append(w.deposits, d)
		dep := w.onStore(d)
		if d.Store == Shared && w.redisDown {
			if w.landUnanswered != nil && w.landUnanswered() {
				_, _ = w.shared.Deposit(dep)
			}
			w.c.Deposited(w.now, d, store.DepositResult{}, fmt.Errorf("redis down"), true)
			continue
		}
		res, err := w.mem(d.Store).Deposit(dep)
		w.c.Deposited(w.now, d, res, err, false)
	}
	for _, cl := range rd.Closes {
		res := make([]store.CloseResult, len(cl.IDs))
		errs := make([]error, len(cl.IDs))
		for i, id := range cl.IDs {
			if cl.Store == Shared && w.redisDown {
				errs[i] = fmt.Errorf("redis down")
				continue
			}
			res[i], errs[i] = w.mem(cl.Store).Close(cl.Key, id, ms(w.now))
		}
		w.c.Closed(w.now, cl, res, errs)
	}
	switch {
	case len(rd.Returns) == 0:
	case w.holdReturns:
		w.heldReturns = append(w.heldReturns, rd.Returns...)
	case w.dropAcquire:
		w.c.ReturnsDone(w.now, rd.Returns, fmt.Errorf("unreachable"))
	default:
		w.deliver(rd.Returns)
	}
	for _, op := range rd.Counters {
		if op.Store == Shared && w.redisDown {
			continue
		}
		_, _ = w.mem(op.Store).AddCounter(op.Key, op.Name, op.Delta, ms(w.now))
	}
	for _, r := range rd.Reports {
		w.c.ReportDone(w.now, r, !w.dropAcquire)
	}
	if len(rd.Shares) > 0 {
		w.alloc.calls++
		w.shareReqs = append(w.shareReqs, rd.Shares...)
		if w.dropAcquire {
			w.c.ShareAcquireFailed(w.now, rd.Shares, false)
		} else {
			replies := make([]ShareReply, len(rd.Shares))
			for i, r := range rd.Shares {
				replies[i] = ShareReply{OK: true, Seq: int64(len(w.shareReqs) - len(rd.Shares) + i + 1), Rate: 10_000, Burst: 5, ExpiresIn: 10 * time.Second}
				if w.shareReply != nil {
					replies[i] = w.shareReply(r)
				}
			}
			w.c.SharesAcquired(w.now, w.now, rd.Shares, replies)
		}
	}
	for _, in := range rd.Installs {
		w.installs = append(w.installs, in)
		if in.Store == Shared && w.redisDown {
			w.c.ShareInstalled(w.now, in, store.ShareResult{}, fmt.Errorf("redis down"))
			continue
		}
		sh := in.Share
		sh.DeadlineMs = ms(in.Deadline)
		res, err := w.mem(in.Store).InstallShare(store.ShareInstall{Key: in.Key, Share: sh, ExpireAtMs: sh.DeadlineMs + 60_000, NowMs: ms(w.now)})
		w.c.ShareInstalled(w.now, in, res, err)
	}
}

// deliverReturns lets the held returns reach the allocator, and what the
// Core does then.
func (w *world) deliverReturns() {
	rets := w.heldReturns
	w.heldReturns, w.holdReturns = nil, false
	w.deliver(rets)
	w.drain()
}

// deliver credits rets at the allocator and tells the Core they landed.
func (w *world) deliver(rets []Return) {
	for _, r := range rets {
		w.alloc.giveBack(w.now, r)
	}
	w.c.ReturnsDone(w.now, rets, nil)
}

// spend carries out a Check's StepSpend: the deposit it carries, if any,
// then the spend, as the shell's pipeline does.
func (w *world) spend(chk *Check) {
	if chk.Store == Shared && w.redisDown {
		if d := chk.Deposit; d != nil {
			w.deposits = append(w.deposits, *d)
			if w.landUnanswered != nil && w.landUnanswered() {
				_, _ = w.shared.Deposit(w.onStore(*d))
			}
			w.c.Deposited(w.now, *d, store.DepositResult{}, fmt.Errorf("redis down"), true)
		}
		w.c.Spent(w.now, chk, store.SpendResult{}, fmt.Errorf("redis down"))
		return
	}
	if d := chk.Deposit; d != nil {
		w.deposits = append(w.deposits, *d)
		res, err := w.mem(d.Store).Deposit(w.onStore(*d))
		w.c.Deposited(w.now, *d, res, err, false)
	}
	res, err := w.mem(chk.Store).Spend(chk.Keys, chk.Costs, chk.Counted, ms(w.now))
	w.c.Spent(w.now, chk, res, err)
}

// onStore is a deposit on the store's clock (milliseconds; the start
// rounded up).
func (w *world) onStore(d Deposit) store.Deposit {
	start := int64(0)
	if !d.Start.IsZero() {
		start = ms(d.Start.Add(time.Millisecond - 1))
	}
	return store.Deposit{Key: d.Key, LeaseID: d.LeaseID, Tokens: d.Tokens, StartMs: start,
		DeadlineMs: ms(d.Deadline), ExpireAtMs: ms(d.KeyExpiry), NowMs: ms(w.now)}
}

// count carries out a Check's StepCount on its store.
func (w *world) count(chk *Check) {
	ok, vals, err := w.mem(chk.Store).AdmitFallback(chk.Count, ms(w.now))
	w.c.Counted(w.now, chk, ok, vals, err)
}

// firstRound starts a Check of limit that finds the region dry and reads
// its bucket for the round it kicks: the acquires are what the round asks
// (the test answers them itself).
func (w *world) firstRound(limit string) (*Check, []Acquire) {
	w.t.Helper()
	chk := w.c.Begin(w.now, []Item{{Limit: limit, Cost: 1}}, time.Time{})
	w.spend(chk)
	rd := w.c.Ready()
	w.c.RoundRead(w.now, rd.Rounds[0], RoundResult{Locked: true, NowMs: ms(w.now)})
	return chk, w.c.Ready().Acquires
}

// check runs one Check to its end, waiting as it asks (the wait ends at
// once when nothing else will happen: the test moves time itself).
func (w *world) check(limit string, cost int64) Answer {
	w.t.Helper()
	a, _ := w.checkMulti(Item{Limit: limit, Cost: cost})
	return a[0]
}

func (w *world) checkMulti(items ...Item) ([]Answer, *Check) {
	w.t.Helper()
	chk := w.c.Begin(w.now, items, time.Time{})
	for range 100 {
		switch chk.Step {
		case StepSpend:
			w.spend(chk)
		case StepWait:
			if chk.Lookup() && !w.dropAcquire {
				w.syncLimits()
			}
			// Whatever the wait is for happens now; if it wakes none of the
			// Check's limits, the wait runs out.
			before := 0
			for _, k := range chk.Keys {
				before += w.wakes[k.Limit]
			}
			w.drain()
			after := 0
			for _, k := range chk.Keys {
				after += w.wakes[k.Limit]
			}
			if after == before {
				w.now = chk.Until
				w.c.Tick(w.now)
				w.drain()
			}
			w.c.Woke(w.now, chk)
		case StepCount:
			w.count(chk)
		case StepTake:
			if chk.Store == Shared && w.redisDown {
				w.c.Taken(w.now, chk, store.TakeResult{}, fmt.Errorf("redis down"))
				break
			}
			res, err := w.mem(chk.Store).Take(chk.RateKey, chk.Costs[0], ms(w.now), chk.TakeShadow)
			w.c.Taken(w.now, chk, res, err)
		case StepDone:
			w.drain()
			if chk.Err != nil {
				return nil, chk
			}
			return chk.Answers, chk
		}
	}
	w.t.Fatal("check never ends")
	return nil, nil
}
