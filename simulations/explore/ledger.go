package explore

import (
	"fmt"
	"slices"
	"time"

	"leasehold/allocator"
	"leasehold/overshoot"
	"leasehold/regionagent/core"
	"leasehold/regionagent/store"
)

// ledger is what the explorer saw happen, independently of the product's
// own counters: every lease deposited and closed, every admission, every
// answer to a request id. The invariants are checked against it.
type ledger struct {
	leases  []leaseRec
	tally   map[int64]*tally // by window
	answers map[core.Reason]int
	// reqs: request id -> the lease first answered for it.
	reqs map[string]answer
	// durable: request id -> the lease id its durable record has.
	durable map[string]string
	// unreplicated: admits in a region's Redis since its replica last
	// caught up, by window; lost: what failovers forgot, by window.
	unreplicated [2]map[int64]int64
	lost         [2]map[int64]int64
	// modes: the worst fallback mode seen marked in a region's buckets.
	modes [2]map[int64]overshoot.FallbackMode
}

type leaseRec struct {
	region, replica int
	store           core.Store
	key             store.Key
	id              string
	tokens          int64
	startMs         int64
	deadlineMs      int64
	closed          bool
	closedUnrepl    bool // closed since Redis's replica caught up
}

type tally struct{ lease, fallback [2]int64 }

type answer struct {
	lease  string
	tokens int64
}

func newLedger() ledger {
	l := ledger{tally: map[int64]*tally{}, answers: map[core.Reason]int{}, reqs: map[string]answer{}, durable: map[string]string{}}
	for i := range 2 {
		l.unreplicated[i] = map[int64]int64{}
		l.lost[i] = map[int64]int64{}
		l.modes[i] = map[int64]overshoot.FallbackMode{}
	}
	return l
}

func (l *ledger) win(w int64) *tally {
	t := l.tally[w]
	if t == nil {
		t = &tally{}
		l.tally[w] = t
	}
	return t
}

// deposit records a lease stored in a bucket, and checks it is clamped to
// its window (on the one clock of the model).
func (l *ledger) deposit(w *world, ri, i int, s core.Store, d store.Deposit) {
	end := w.limit.Windows().ByIndex(d.Key.Window).End()
	if d.DeadlineMs > ms(end) {
		w.fail("clamp", "lease %s deposited in %s with deadline %s, after its window's end %s",
			d.LeaseID, regionNames[ri], fmtMs(d.DeadlineMs), fmtMs(ms(end)))
	}
	if s == core.Shared {
		i = -1
	}
	l.leases = append(l.leases, leaseRec{region: ri, replica: i, store: s, key: d.Key, id: d.LeaseID, tokens: d.Tokens,
		startMs: d.StartMs, deadlineMs: d.DeadlineMs})
}

func (l *ledger) find(ri, i int, s core.Store, key store.Key, id string) *leaseRec {
	if s == core.Shared {
		i = -1
	}
	for j := range l.leases {
		r := &l.leases[j]
		if r.region == ri && r.replica == i && r.store == s && r.key == key && r.id == id {
			return r
		}
	}
	return nil
}

func (l *ledger) close(ri, i int, s core.Store, key store.Key, id string) {
	if r := l.find(ri, i, s, key, id); r != nil && !r.closed {
		r.closed = true
		r.closedUnrepl = s == core.Shared
	}
}

// admit records an admission of cost from key's bucket at now, and checks
// it against the leases: one from a lease must be made inside the
// lease's window, while a lease of that bucket is open (deposited, not
// closed, started, strictly before its deadline).
func (l *ledger) admit(w *world, ri, i int, s core.Store, key store.Key, cost int64, fallback bool) {
	t := l.win(key.Window)
	if fallback {
		t.fallback[ri] += cost
	} else {
		t.lease[ri] += cost
		if wi := w.limit.Windows().Of(w.now).Index; wi != key.Window {
			w.fail("spend-in-window", "%s admitted %d from window %d's bucket during window %d", regionNames[ri], cost, key.Window, wi)
		}
		nowMs := ms(w.now)
		rep := i
		if s == core.Shared {
			rep = -1
		}
		if !slices.ContainsFunc(l.leases, func(r leaseRec) bool {
			return r.region == ri && r.replica == rep && r.store == s && r.key == key && !r.closed &&
				r.startMs <= nowMs && nowMs < r.deadlineMs
		}) {
			w.fail("spend-before-deadline", "%s admitted %d from its %s bucket of window %d at %s with no lease open then",
				regionNames[ri], cost, s, key.Window, fmtMs(nowMs))
		}
	}
	if s == core.Shared {
		l.unreplicated[ri][key.Window] += cost
	}
}

// persist checks a record about to become durable: a request id keeps one
// lease, a lease id keeps its tokens, and a lease never outlives its
// window (Clamp, on the allocator's clock).
func (l *ledger) persist(w *world, g allocator.Grant) {
	rk := g.Region + "/" + g.RequestID
	if id, ok := l.durable[rk]; ok && id != g.LeaseID {
		w.fail("idempotency", "request %s has two durable leases: %s and %s", rk, id, g.LeaseID)
	}
	l.durable[rk] = g.LeaseID
	if old, ok := w.etcd.grants[g.LeaseID]; ok && old.Tokens != g.Tokens {
		w.fail("idempotency", "lease %s committed again with %d tokens (was %d): a retried request granted twice",
			g.LeaseID, g.Tokens, old.Tokens)
	}
	end := g.Schedule().ByIndex(g.Window).End()
	if g.ExpiresAt > end.UnixNano() {
		w.fail("clamp", "lease %s expires at %s, after its window's end %s", g.LeaseID,
			fmtMs(time.Unix(0, g.ExpiresAt).UnixMilli()), fmtMs(ms(end)))
	}
}

// answered checks one item of an answer an agent received: a request id
// always names the same lease and tokens.
func (l *ledger) answered(w *world, reqID string, g core.Grant) {
	if !g.OK || g.LeaseID == "" {
		return
	}
	a := answer{g.LeaseID, g.Tokens}
	if old, ok := l.reqs[reqID]; ok && old != a {
		w.fail("idempotency", "request %s answered with %s (%d tokens), earlier with %s (%d tokens)",
			reqID, a.lease, a.tokens, old.lease, old.tokens)
	}
	l.reqs[reqID] = a
}

// replicated: region r's replica caught up with its primary.
func (l *ledger) replicated(r *region) {
	ri := slices.Index(regionNames[:], r.name)
	clear(l.unreplicated[ri])
	for j := range l.leases {
		if l.leases[j].region == ri {
			l.leases[j].closedUnrepl = false
		}
	}
}

// rolledBack: region r's Redis lost what it took since its replica caught
// up. Its admits are forgotten (counted as the failover's loss, which
// the bound allows); closes are undone (the leases are open again).
func (l *ledger) rolledBack(r *region) {
	ri := slices.Index(regionNames[:], r.name)
	for win, n := range l.unreplicated[ri] {
		l.lost[ri][win] += n
	}
	clear(l.unreplicated[ri])
	for j := range l.leases {
		if lr := &l.leases[j]; lr.region == ri && lr.closedUnrepl {
			lr.closed, lr.closedUnrepl = false, false
		}
	}
}

// ---- invariants ----

// Violation is an invariant broken in a state.
type Violation struct {
	Invariant string // budget, idempotency, clamp, spend-before-deadline, spend-in-window, fencing, bound, pool, check, return, panic
	Detail    string
}

func (v *Violation) Error() string { return v.Invariant + ": " + v.Detail }

// fail records the first violation of a run.
func (w *world) fail(inv, format string, args ...any) {
	if w.bad == nil {
		w.bad = &Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)}
	}
}

// verify checks the invariants that are about a whole state rather than
// one step (the step ones are checked where they happen).
func (w *world) verify() {
	w.readModes()
	wins := map[int64]bool{}
	for win := range w.led.tally {
		wins[win] = true
	}
	type sums struct{ granted, credited, maxG int64 }
	dur := map[int64]*sums{}
	for _, g := range w.etcd.grants {
		s := dur[g.Window]
		if s == nil {
			s = &sums{}
			dur[g.Window] = s
		}
		s.granted += g.Tokens
		s.credited += g.Credited
		s.maxG = max(s.maxG, g.G)
		wins[g.Window] = true
	}
	for win := range wins {
		s := dur[win]
		if s == nil {
			s = &sums{}
		}
		// Budget: net granted within the largest G in force at any grant.
		if net := s.granted - s.credited; net > max(s.maxG, w.limit.Tokens) {
			w.fail("budget", "window %d: %d tokens granted net of returns, G = %d", win, net, max(s.maxG, w.limit.Tokens))
		}
		// The leader's core agrees with what is durable plus what it
		// decided and has not committed.
		st, _ := w.leader.core.Stats(limitID, win)
		pg := w.pendingGranted(win)
		if st.Granted != s.granted+pg || st.Credited != s.credited {
			w.fail("pool", "window %d: the leader's core counts %d granted, %d credited; durable %d, %d and %d granted uncommitted",
				win, st.Granted, st.Credited, s.granted, s.credited, pg)
		}
		// Bound: observed never above the computed bound.
		ow := overshoot.Window{Limit: w.limit.Tokens, LimitAtGrant: s.maxG, Granted: s.granted, Returned: s.credited}
		t := w.led.tally[win]
		if t == nil {
			t = &tally{}
		}
		for ri := range regionNames {
			reg := overshoot.Region{Name: regionNames[ri], Admitted: t.lease[ri], FallbackAdmitted: t.fallback[ri],
				Fallback: w.led.modes[ri][win], LocalAllowance: w.sc.Fallback.LocalTokens}
			if n := w.led.lost[ri][win]; n > 0 {
				reg.Failovers = []overshoot.Failover{{Observed: n}}
			}
			ow.Regions = append(ow.Regions, reg)
		}
		b := overshoot.Compute(ow)
		if obs := overshoot.Observed(ow); obs > b.Total {
			w.fail("bound", "window %d: admitted %d (leases %v, fallback %v) with G = %d: overshoot %d above the bound %d (%+v)",
				win, t.lease[0]+t.lease[1]+t.fallback[0]+t.fallback[1], t.lease, t.fallback, w.limit.Tokens, obs, b.Total, b)
		}
	}
}

// pendingGranted is the tokens the leader granted for window win and has
// not committed (a return's credit reaches the core's pool only once it
// is durable: Core.Credit, so no credit is ever pending in the core).
func (w *world) pendingGranted(win int64) int64 {
	var granted int64
	for _, b := range w.leader.pending {
		for _, g := range b.records {
			if _, had := w.etcd.grants[g.LeaseID]; g.Window == win && !had {
				granted += g.Tokens
			}
		}
	}
	return granted
}

// readModes reads the fallback modes marked in every bucket of the limit
// (the counters an agent's report carries), keeping the worst seen.
func (w *world) readModes() {
	nowMs := ms(w.now)
	for ri, r := range w.regions {
		for win := range w.led.tally {
			k := store.Key{Limit: limitID, Window: win}
			mems := []*store.Mem{r.redis}
			for _, rep := range r.reps {
				mems = append(mems, rep.local)
			}
			for _, m := range mems {
				for _, c := range m.Balance(k, nowMs).Counters {
					mode := overshoot.FallbackNone
					switch c.Name {
					case store.CounterModeLocal:
						mode = overshoot.FallbackLocal
					case store.CounterModeOpen:
						mode = overshoot.FallbackOpen
					}
					w.led.modes[ri][win] = max(w.led.modes[ri][win], mode)
				}
			}
		}
	}
}

func fmtMs(v int64) string {
	return fmt.Sprintf("t0%+dms", v-ms(t0))
}
