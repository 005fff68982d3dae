package core

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// chaos drives one Core through random events over a model network and
// model stores, and checks the agent's invariants against its own ledger
// (a brute-force reference: every lease, every deposit, every return):
//
//   - no lease is spendable after the allocator's expiry, nor before its
//     start (a deposit's deadline and start are conservative);
//   - a lease is deposited in one store only, so no token is spendable
//     twice; a closed lease is never spent again (the stores refuse it);
//     a deposit Redis did not answer may have landed (the model lands half
//     of them), so it must be neither returned nor used elsewhere;
//   - every lease is credited at most once, never more than it had left,
//     and only once it cannot be spent any more;
//   - per (limit, window), what the stores admitted is at most G (closed
//     fallback), and nothing is negative;
//   - OVER_LIMIT only after the allocator said the window's pool is spent;
//   - a standing share (limit a has one in some seeds) is spendable only
//     inside its window.
type chaos struct {
	t     *testing.T
	rng   *rand.Rand
	w     *world
	late  []lateReply // acquire replies delivered later
	lostR float64     // probability a reply is lost
	dupR  float64     // probability a reply is delivered twice
	lateR float64     // probability a reply is delivered late
	// ledger
	storeOf    map[string]Store // lease id -> the store it was deposited in
	spentSaid  map[store.Key]bool
	maxG       map[string]int64
	overLimits int
	admits     int
	shares     int // standing shares deposited
}

type lateReply struct {
	sent time.Time
	reqs []Acquire
	gs   []Grant
}

func newChaos(t *testing.T, seed uint64) *chaos {
	rng := rand.New(rand.NewPCG(seed, 7))
	ttl := time.Duration(3+rng.IntN(8)) * time.Second
	a := strictLimit("a", 12, 10*time.Second, ttl)
	a.Standing = int64(rng.IntN(3))
	b := strictLimit("b", 6, 10*time.Second, 10*time.Second)
	ch := &chaos{t: t, rng: rng, w: newWorld(t, int64(1+rng.IntN(4)), a, b),
		lostR: 0.15, dupR: 0.1, lateR: 0.15, storeOf: map[string]Store{}, spentSaid: map[store.Key]bool{},
		maxG: map[string]int64{"a": 12, "b": 6}}
	ch.w.landUnanswered = func() bool { return rng.IntN(2) == 0 }
	return ch
}

// run carries out the world's actions, with the network's faults on the
// allocator's replies.
func (ch *chaos) drain() {
	w := ch.w
	for range 1000 {
		rd := w.c.Ready()
		if rd.Empty() {
			return
		}
		acq, rets := rd.Acquires, rd.Returns
		rd.Acquires, rd.Returns = nil, nil
		for _, d := range rd.Deposits {
			ch.checkDeposit(d)
		}
		w.run(rd)
		for _, r := range rets {
			ch.checkReturn(r)
		}
		if len(rets) > 0 {
			switch {
			case w.dropAcquire:
				w.c.ReturnsDone(w.now, rets, fmt.Errorf("unreachable"))
			default:
				for _, r := range rets {
					w.alloc.giveBack(w.now, r)
				}
				var err error
				if ch.rng.Float64() < ch.lostR {
					err = fmt.Errorf("the acknowledgement was lost")
				}
				w.c.ReturnsDone(w.now, rets, err)
			}
		}
		if len(acq) == 0 {
			continue
		}
		w.alloc.calls++
		if w.dropAcquire {
			w.c.AcquireFailed(w.now, acq, false)
			continue
		}
		gs := make([]Grant, len(acq))
		for i, a := range acq {
			if _, ok := w.sentAt[a.RequestID]; !ok {
				w.sentAt[a.RequestID] = w.now
			}
			gs[i] = w.alloc.acquire(w.now, a)
			if gs[i].OK && gs[i].Tokens == 0 && gs[i].PoolLeft == 0 {
				ch.spentSaid[store.Key{Limit: a.Limit, Window: gs[i].Window}] = true
			}
		}
		switch r := ch.rng.Float64(); {
		case r < ch.lostR:
			w.c.AcquireFailed(w.now, acq, false)
		case r < ch.lostR+ch.lateR:
			w.c.AcquireFailed(w.now, acq, false) // the call timed out; the reply comes later
			ch.late = append(ch.late, lateReply{sent: w.now, reqs: acq, gs: gs})
		case r < ch.lostR+ch.lateR+ch.dupR:
			w.c.Acquired(w.now, w.now, acq, gs)
			w.c.Acquired(w.now, w.now, acq, gs)
		default:
			w.c.Acquired(w.now, w.now, acq, gs)
		}
	}
	ch.t.Fatal("actions never settle")
}

// checkDeposit holds a deposit against the allocator's record of its lease.
func (ch *chaos) checkDeposit(d Deposit) {
	w := ch.w
	for _, g := range w.alloc.grants {
		if g.g.LeaseID != d.LeaseID {
			continue
		}
		if d.Deadline.After(g.expiry) {
			ch.t.Fatalf("lease %s deposited with deadline %v after the allocator's expiry %v", d.LeaseID, d.Deadline.Sub(t0), g.expiry.Sub(t0))
		}
		if !d.Start.IsZero() && d.Start.Before(g.start) || d.Start.IsZero() && g.start.After(w.now) {
			ch.t.Fatalf("lease %s spendable from %v, before its start %v", d.LeaseID, d.Start.Sub(t0), g.start.Sub(t0))
		}
	}
	if strings.HasSuffix(d.LeaseID, "/"+lease.StandingRequestID) {
		l := w.alloc.limits[d.Limit]
		win := l.Windows().ByIndex(d.Key.Window)
		if d.Deadline.After(win.End()) || d.Start.Before(win.Start()) || d.Store != Shared {
			ch.t.Fatalf("standing share %s in %v spendable %v..%v, outside its window %v..%v",
				d.LeaseID, d.Store, d.Start.Sub(t0), d.Deadline.Sub(t0), win.Start().Sub(t0), win.End().Sub(t0))
		}
		ch.shares++
	}
	if s, ok := ch.storeOf[d.LeaseID]; ok && s != d.Store {
		ch.t.Fatalf("lease %s deposited in both stores", d.LeaseID)
	}
	ch.storeOf[d.LeaseID] = d.Store
}

// checkReturn: a lease returned to the allocator (its unspent tokens go
// back to the pool) must not be spendable in any store, now or later.
func (ch *chaos) checkReturn(r Return) {
	var win int64
	if _, err := fmt.Sscanf(r.LeaseID, "%d/", &win); err != nil {
		ch.t.Fatalf("lease id %q", r.LeaseID)
	}
	k := store.Key{Limit: r.Limit, Window: win}
	for _, m := range []*store.Mem{ch.w.shared, ch.w.local} {
		for _, o := range m.Balance(k, ms(ch.w.now)).Open {
			if o.ID == r.LeaseID && o.Remaining > 0 {
				ch.t.Fatalf("lease %s returned with %d unspent while %d are still spendable", r.LeaseID, r.Unspent, o.Remaining)
			}
		}
	}
}

func (ch *chaos) check(limit string, cost int64) {
	w := ch.w
	chk := w.c.Begin(w.now, []Item{{Limit: limit, Cost: cost}}, time.Time{})
	for range 2000 {
		switch chk.Step {
		case StepSpend:
			if d := chk.Deposit; d != nil {
				ch.checkDeposit(*d)
			}
			w.spend(chk)
		case StepWait:
			ch.drain()
			if ch.rng.IntN(3) == 0 {
				w.now = chk.Until // the wait runs out
				w.c.Tick(w.now)
				ch.drain()
			}
			w.c.Woke(w.now, chk)
		case StepCount:
			w.count(chk)
		case StepDone:
			if chk.Err != nil {
				ch.t.Fatalf("check %s: %v", limit, chk.Err)
			}
			a := chk.Answers[0]
			if a.Remaining < 0 {
				ch.t.Fatalf("negative remaining %+v", a)
			}
			if a.Reason == ReasonOverLimit && !ch.spentSaid[chk.Keys[0]] {
				ch.t.Fatalf("OVER_LIMIT for %v at %v, but the allocator never said its pool is spent", chk.Keys[0], w.now.Sub(t0))
			}
			if a.Reason == ReasonOverLimit && w.redisDown {
				if b := w.shared.Balance(chk.Keys[0], ms(w.now)); b.Spendable > 0 {
					ch.t.Fatalf("OVER_LIMIT for %v at %v with Redis down and its bucket holding %d unspent: the region did not spend its grant",
						chk.Keys[0], w.now.Sub(t0), b.Spendable)
				}
			}
			if a.Reason == ReasonOverLimit {
				ch.overLimits++
			}
			if a.Allowed {
				ch.admits++
			}
			ch.drain()
			return
		}
	}
	ch.t.Fatal("check never ends")
}

// event is one random step.
func (ch *chaos) event() {
	w := ch.w
	switch r := ch.rng.IntN(100); {
	case r < 45:
		lim := "a"
		if ch.rng.IntN(3) == 0 {
			lim = "b"
		}
		ch.check(lim, 1+ch.rng.Int64N(3))
	case r < 70:
		w.now = w.now.Add(time.Duration(1+ch.rng.IntN(600)) * time.Millisecond)
		if ch.rng.IntN(2) == 0 && !w.dropAcquire {
			w.c.Synced(w.c.SyncStart(), w.now) // a limit sync: the snapshot is current
		}
		w.c.Tick(w.now)
		ch.drain()
	case r < 78 && len(ch.late) > 0:
		l := ch.late[0]
		ch.late = ch.late[1:]
		w.c.Acquired(l.sent, w.now, l.reqs, l.gs)
		ch.drain()
	case r < 83:
		// Redis fails or comes back; the Core learns it later (the shell's
		// health tracking needs a few failed calls), or at once.
		if ch.rng.IntN(2) == 0 {
			w.redisDown = !w.redisDown
		}
		if ch.rng.IntN(2) == 0 {
			w.c.SetRedisHealth(w.now, !w.redisDown)
		}
		ch.drain()
	case r < 88:
		w.dropAcquire = !w.dropAcquire
		if !w.dropAcquire || ch.rng.IntN(2) == 0 {
			w.c.SetAllocatorHealth(w.now, !w.dropAcquire)
		}
		ch.drain()
	case r < 92:
		// A limit change: a's G moves between 8 and 12.
		g := int64(8 + ch.rng.IntN(5))
		ch.maxG["a"] = max(ch.maxG["a"], g)
		a := w.alloc.limits["a"]
		a.Tokens, a.Version = g, a.Version+1
		w.alloc.limits["a"] = a
		w.c.SetLimits(w.c.SyncStart(), a.Version, []Limit{a, w.alloc.limits["b"]}, w.now)
	default:
		w.otherLock = ch.rng.IntN(4) == 0
	}
}

// budget checks every window's admits against G.
func (ch *chaos) budget() {
	for _, lim := range []string{"a", "b"} {
		for win := int64(180_000_000); win < 180_000_000+200; win++ {
			k := store.Key{Limit: lim, Window: win}
			s := ch.w.shared.Balance(k, 0)
			l := ch.w.local.Balance(k, 0)
			if adm := s.Admitted + l.Admitted; adm > ch.maxG[lim] {
				ch.t.Fatalf("%s window %d admitted %d > G %d", lim, win, adm, ch.maxG[lim])
			}
		}
	}
	for id, g := range ch.w.alloc.grants {
		if g.credit < 0 || g.credit > g.g.Tokens {
			ch.t.Fatalf("lease of %s credited %d of %d", id, g.credit, g.g.Tokens)
		}
	}
	for k, pool := range ch.w.alloc.pools {
		if pool < 0 {
			ch.t.Fatalf("%v: granted - credited = %d < 0 (a return counted twice)", k, pool)
		}
	}
}

// TestCoreRandomEvents runs the chaos model over many seeds.
func TestCoreRandomEvents(t *testing.T) {
	seeds, events := 300, 400
	if testing.Short() {
		seeds = 60
	}
	var admits, overs, shares int
	for seed := range uint64(seeds) {
		ch := newChaos(t, seed+1)
		for range events {
			ch.event()
		}
		ch.budget()
		admits += ch.admits
		overs += ch.overLimits
		shares += ch.shares
	}
	if admits == 0 || overs == 0 || shares == 0 {
		t.Fatalf("the random runs admitted %d, refused %d as over limit and deposited %d standing shares: they do not exercise all three", admits, overs, shares)
	}
	t.Logf("%d seeds x %d events: %d admitted, %d over limit, %d standing shares", seeds, events, admits, overs, shares)
}
