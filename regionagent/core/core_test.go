package core

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

func strictLimit(id string, g int64, window, ttl time.Duration) Limit {
	return Limit{ID: id, Tokens: g, Window: window, TTL: ttl, Mode: ModeStrict, Version: 1, Regions: 2}
}

func wantAnswer(t *testing.T, what string, got Answer, allowed bool, reason Reason) {
	t.Helper()
	if got.Allowed != allowed || got.Reason != reason {
		t.Fatalf("%s: got allowed %v reason %d, want %v %d (%+v)", what, got.Allowed, got.Reason, allowed, reason, got)
	}
}

// TestFirstCheckWaitsForItsLease: the region holds nothing; the first
// Check starts a round, the lease arrives and the Check is admitted from
// it, with one allocator call.
func TestFirstCheckWaitsForItsLease(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, 15*time.Second))
	got := w.check("a", 1)
	wantAnswer(t, "first check", got, true, ReasonOK)
	if got.Remaining != 9 || got.Limit != 100 || got.Window != time.Minute || got.ResetAfter != time.Minute {
		t.Fatalf("answer %+v", got)
	}
	if w.alloc.calls != 1 || w.rounds != 1 {
		t.Fatalf("%d allocator calls, %d rounds; want 1, 1", w.alloc.calls, w.rounds)
	}
	if len(w.deposits) != 1 || w.deposits[0].Store != Shared || w.deposits[0].Tokens != 10 {
		t.Fatalf("deposits %+v", w.deposits)
	}
	// The deadline is measured from the send, minus the margin (2 ms +
	// 1000 ppm of 15 s = 17 ms), and never later than the allocator's.
	if want := t0.Add(15*time.Second - 17*time.Millisecond); !w.deposits[0].Deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", w.deposits[0].Deadline.Sub(t0), want.Sub(t0))
	}
}

// TestWaitingCheckCountsOnce: a Check refused while its region waits for
// a lease, and admitted once the lease lands, counts once in the bucket's
// demand counters (admitted 1, denied 0), however often it spent; one
// that waits into the next window counts again there, and its refusal
// stays in the window that refused it.
func TestWaitingCheckCountsOnce(t *testing.T) {
	w := newWorld(t, 5, strictLimit("a", 5, time.Minute, time.Minute))
	_, chk := w.checkMulti(Item{Limit: "a", Cost: 1})
	wantAnswer(t, "first check", chk.Answers[0], true, ReasonOK)
	first := chk.Keys[0]
	if b := w.shared.Balance(first, ms(w.now)); b.Admitted != 1 || b.Denied != 0 {
		t.Fatalf("after the first Check: admitted %d, denied %d; want 1, 0", b.Admitted, b.Denied)
	}
	for range 4 {
		w.check("a", 1)
	}
	wantAnswer(t, "spent", w.check("a", 1), false, ReasonOverLimit)
	w.advance(time.Minute - 30*time.Millisecond)
	_, chk = w.checkMulti(Item{Limit: "a", Cost: 1}) // refused, waits for the next window
	wantAnswer(t, "at the boundary", chk.Answers[0], true, ReasonOK)
	if chk.Keys[0] == first {
		t.Fatalf("admitted in the first window's key %+v", first)
	}
	if b := w.shared.Balance(first, ms(w.now)); b.Admitted != 5 || b.Denied != 2 {
		t.Fatalf("the first window: admitted %d, denied %d; want 5, 2", b.Admitted, b.Denied)
	}
	if b := w.shared.Balance(chk.Keys[0], ms(w.now)); b.Admitted != 1 || b.Denied != 0 {
		t.Fatalf("the second window: admitted %d, denied %d; want 1, 0", b.Admitted, b.Denied)
	}
}

// TestOverLimitOnlyWhenThePoolIsSpent: denials say OVER_LIMIT only after
// the allocator said the window's pool is spent; the retry-after then
// points at the window's reset.
func TestOverLimitOnlyWhenThePoolIsSpent(t *testing.T) {
	w := newWorld(t, 5, strictLimit("a", 5, time.Minute, time.Minute))
	for i := range 5 {
		wantAnswer(t, "within G", w.check("a", 1), true, ReasonOK)
		_ = i
	}
	got := w.check("a", 1)
	wantAnswer(t, "past G", got, false, ReasonOverLimit)
	if got.RetryAfter < got.ResetAfter || got.RetryAfter > got.ResetAfter+got.ResetAfter/10 {
		t.Fatalf("retry-after %v, want the reset %v + up to 10%%", got.RetryAfter, got.ResetAfter)
	}
	calls := w.alloc.calls
	// Known spent: the next denials ask nobody for a second...
	wantAnswer(t, "still spent", w.check("a", 1), false, ReasonOverLimit)
	if w.alloc.calls != calls {
		t.Fatalf("asked the allocator again within spentRetry")
	}
	// ...then once more (returns may have refilled the pool).
	w.advance(time.Second)
	wantAnswer(t, "spent, asked again", w.check("a", 1), false, ReasonOverLimit)
	if w.alloc.calls != calls+1 {
		t.Fatalf("%d calls, want %d: a second later the pool is asked again", w.alloc.calls, calls+1)
	}
	// The next window starts afresh.
	w.advance(time.Minute)
	wantAnswer(t, "next window", w.check("a", 1), true, ReasonOK)
}

// TestNoLeaseInTimeIsUnavailable: a Check the region cannot pay for while
// the pool is not known spent waits, and if nothing arrives in time it is
// UNAVAILABLE with a short retry-after, never OVER_LIMIT.
func TestNoLeaseInTimeIsUnavailable(t *testing.T) {
	w := newWorld(t, 5, strictLimit("a", 100, time.Minute, time.Minute))
	w.otherLock = true // another replica renews, and never deposits
	got := w.check("a", 1)
	wantAnswer(t, "undecided", got, false, ReasonUnavailable)
	if got.RetryAfter < 50*time.Millisecond || got.RetryAfter > 100*time.Millisecond {
		t.Fatalf("retry-after %v, want 50-100 ms", got.RetryAfter)
	}
	if w.alloc.calls != 0 {
		t.Fatalf("%d allocator calls without the renewal lock", w.alloc.calls)
	}
}

// TestSpendBelowLowWaterRenews: a spend that leaves the balance below
// demand x lead starts a round before the region runs dry; no round while
// the balance is above it.
func TestSpendBelowLowWaterRenews(t *testing.T) {
	// The prior demand G/W/regions is 10 tokens/s, and so is the traffic:
	// low water 20.
	w := newWorld(t, 100, strictLimit("a", 1200, time.Minute, time.Minute))
	w.check("a", 1)
	rounds := w.rounds
	at := int64(-1)
	for range 95 {
		w.advance(100 * time.Millisecond)
		got := w.check("a", 1)
		if w.rounds > rounds && at < 0 {
			at = got.Remaining
		}
	}
	if w.rounds != rounds+1 || at < 15 || at > 21 {
		t.Fatalf("%d rounds, the first below balance %d: want one, at the low-water mark (about 20)", w.rounds-rounds, at)
	}
	var held int64
	for _, d := range w.deposits {
		held += d.Tokens
	}
	if held != 200 {
		t.Fatalf("deposited %d, want 200", held)
	}
}

// TestLeaseClosedAtItsDeadline: this replica's lease is closed at its
// deadline and its unspent tokens returned once, without a read; then an
// idle limit costs nothing and is forgotten.
func TestLeaseClosedAtItsDeadline(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, 15*time.Second))
	w.check("a", 3)
	at, ok := w.c.NextWake()
	if !ok || at.After(t0.Add(15*time.Second)) {
		t.Fatalf("next wake %v, %v: want by the lease's deadline", at.Sub(t0), ok)
	}
	w.advance(15 * time.Second)
	if w.alloc.returns != 1 || w.alloc.grants["eu-1-n-1"].credit != 7 {
		t.Fatalf("returns %d, credited %+v; want one return of 7", w.alloc.returns, w.alloc.grants["eu-1-n-1"])
	}
	rounds, calls := w.rounds, w.alloc.calls
	for range 10 {
		w.advance(time.Minute)
	}
	if w.rounds != rounds || w.alloc.calls != calls || w.alloc.returns != 1 {
		t.Fatalf("an idle limit made %d rounds, %d calls, %d returns", w.rounds-rounds, w.alloc.calls-calls, w.alloc.returns-1)
	}
	if _, ok := w.c.NextWake(); ok || w.c.Active() != 0 {
		t.Fatalf("idle core still has work (%v) or state for %d limits", ok, w.c.Active())
	}
}

// TestNextWindowFetchedAheadWhileActive: near the window's end an active
// limit fetches the next window's lease; an inactive one does not.
func TestNextWindowFetchedAheadWhileActive(t *testing.T) {
	w := newWorld(t, 1000, strictLimit("a", 100000, 10*time.Second, 10*time.Second),
		strictLimit("b", 100000, 10*time.Second, 10*time.Second))
	w.check("b", 1) // b goes quiet
	for range 80 {  // a sees traffic for the whole window
		w.advance(100 * time.Millisecond)
		w.check("a", 1)
	}
	nextA, nextB := 0, 0
	for _, d := range w.deposits {
		if d.Key.Window == 180_000_001 {
			switch d.Limit {
			case "a":
				nextA++
				if !d.Start.Equal(t0.Add(10 * time.Second)) {
					t.Fatalf("next window's lease starts at %v", d.Start.Sub(t0))
				}
			case "b":
				nextB++
			}
		}
	}
	if nextA != 1 || nextB != 0 {
		t.Fatalf("next-window leases: a %d, b %d; want 1, 0", nextA, nextB)
	}
	w.advance(2 * time.Second) // past the boundary: a spends at once
	calls := w.alloc.calls
	wantAnswer(t, "first check of the next window", w.check("a", 1), true, ReasonOK)
	if w.alloc.calls != calls {
		t.Fatalf("the next window's first check asked the allocator")
	}
}

// TestNextWindowFetchedAheadFromChunks: a limit decided from chunks
// reaches the core only through their reservations, a few seconds
// apart; that is traffic too, and its next window's lease is fetched
// ahead as a limit checked as often is (it was not: the first Checks of
// each window waited for a lease).
func TestNextWindowFetchedAheadFromChunks(t *testing.T) {
	w := newWorld(t, 40, strictLimit("a", 100000, 10*time.Second, 10*time.Second))
	wantAnswer(t, "first", w.check("a", 1), true, ReasonOK)
	for i := range 9 { // a chunk of 8 tokens a second, the window through
		w.advance(time.Second)
		_, key, ok, err := w.c.Reservation(w.now, "a")
		if !ok || err != nil {
			t.Fatalf("reservation %d: %v %v", i, ok, err)
		}
		res, _ := w.shared.Spend([]store.Key{key}, []int64{8}, nil, ms(w.now)) // the chunk's tokens leave the bucket
		w.c.Reserved(w.now, key, res.Allowed, res.Keys[0].Balance, 8)
		w.drain()
	}
	next := 0
	for _, d := range w.deposits {
		if d.Limit == "a" && d.Key.Window == 180_000_001 {
			next++
		}
	}
	if next != 1 {
		t.Fatalf("%d leases of the next window fetched ahead, want 1", next)
	}
}

// TestFallbackModes: with the allocator unreachable and the region dry,
// closed answers UNAVAILABLE, local:A admits A per window then OVER_LIMIT,
// open admits; each fallback admit is counted in the shared store.
func TestFallbackModes(t *testing.T) {
	closed := strictLimit("closed", 100, time.Minute, time.Minute)
	local := strictLimit("local", 100, time.Minute, time.Minute)
	local.Fallback = Fallback{Kind: FallbackLocal, LocalTokens: 2}
	open := strictLimit("open", 100, time.Minute, time.Minute)
	open.Fallback = Fallback{Kind: FallbackOpen}
	w := newWorld(t, 10, closed, local, open)
	w.c.SetAllocatorHealth(w.now, false)
	wantAnswer(t, "closed", w.check("closed", 1), false, ReasonUnavailable)
	wantAnswer(t, "local 1", w.check("local", 1), true, ReasonFallback)
	wantAnswer(t, "local 2", w.check("local", 1), true, ReasonFallback)
	wantAnswer(t, "local 3", w.check("local", 1), false, ReasonOverLimit)
	wantAnswer(t, "open", w.check("open", 5), true, ReasonFallback)
	win := int64(t0.UnixNano() / int64(time.Minute))
	if v := counter(w.shared.Balance(store.Key{Limit: "local", Window: win}, ms(w.now)), store.CounterFallback); v != 2 {
		t.Fatalf("local fallback counted %d, want 2 (the refused one taken back)", v)
	}
	if v := counter(w.shared.Balance(store.Key{Limit: "open", Window: win}, ms(w.now)), store.CounterModeOpen); v != 0 ||
		!hasCounter(w.shared.Balance(store.Key{Limit: "open", Window: win}, ms(w.now)), store.CounterModeOpen) {
		t.Fatalf("open mode not marked")
	}
	// The allocator answers again: leases, and the fallback is over.
	w.c.SetAllocatorHealth(w.now, true)
	w.drain()
	wantAnswer(t, "closed after", w.check("closed", 1), true, ReasonOK)
	wantAnswer(t, "local after", w.check("local", 1), true, ReasonOK)
}

func hasCounter(b store.BalanceResult, name string) bool {
	for _, c := range b.Counters {
		if c.Name == name {
			return true
		}
	}
	return false
}

// TestRedisDownInProcess: while Redis is down the replica acquires leases
// for itself and spends them in process; a local fallback denies (it
// needs the shared count); when Redis is back the in-process leases are
// closed and returned, and the shared store is used again.
func TestRedisDownInProcess(t *testing.T) {
	l := strictLimit("a", 100, time.Minute, time.Minute)
	l.Fallback = Fallback{Kind: FallbackLocal, LocalTokens: 50}
	w := newWorld(t, 10, l)
	wantAnswer(t, "shared", w.check("a", 1), true, ReasonOK)
	w.redisDown = true
	w.c.SetRedisHealth(w.now, false)
	got := w.check("a", 1)
	wantAnswer(t, "in process", got, true, ReasonOK)
	if n := len(w.deposits); n != 2 || w.deposits[1].Store != Local {
		t.Fatalf("deposits %+v: want a second, in process", w.deposits)
	}
	w.dropAcquire = true
	for range 9 {
		w.check("a", 1)
	}
	w.c.SetAllocatorHealth(w.now, false)
	wantAnswer(t, "local fallback without Redis", w.check("a", 1), false, ReasonUnavailable)
	w.dropAcquire = false
	w.c.SetAllocatorHealth(w.now, true)
	w.redisDown = false
	w.c.SetRedisHealth(w.now, true)
	w.drain()
	g := w.alloc.grants["eu-1-n-2"]
	if !g.settled {
		t.Fatalf("the in-process lease was not returned: %+v", g)
	}
	wantAnswer(t, "shared again", w.check("a", 1), true, ReasonOK)
}

// TestRedisDownSpentPoolIsUnavailable: while Redis is down the replica
// takes the rest of the pool in process, but the region's shared bucket
// still holds unspent tokens of the window (the allocator counts them as
// granted): a spent pool then says nothing of what the region spent, so
// the replica answers UNAVAILABLE, never OVER_LIMIT. When Redis is back
// that mark is forgotten: the region spends what its bucket holds, then
// renews (the pool took 5 tokens back meanwhile) before it says
// OVER_LIMIT, and only once the pool is spent with the bucket dry.
func TestRedisDownSpentPoolIsUnavailable(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	wantAnswer(t, "shared", w.check("a", 1), true, ReasonOK) // a lease of 10 in the shared bucket: 9 left
	w.redisDown = true
	w.c.SetRedisHealth(w.now, false)
	local := 0
	var last Answer
	for i := 0; i < 200; i++ {
		last = w.check("a", 1)
		if !last.Allowed {
			break
		}
		local++
	}
	if local != 90 {
		t.Fatalf("admitted %d in process, want the pool's 90", local)
	}
	wantAnswer(t, "pool spent, the shared bucket unreachable", last, false, ReasonUnavailable)
	if last.RetryAfter < time.Second || last.RetryAfter > 2*time.Second {
		t.Fatalf("retry_after %v, want 1-2 s", last.RetryAfter)
	}
	wantAnswer(t, "again", w.check("a", 1), false, ReasonUnavailable)
	// Another region returns 5 tokens; Redis answers again.
	w.alloc.pools[store.Key{Limit: "a", Window: lease.WindowOf(w.now, time.Minute).Index}] -= 5
	w.redisDown = false
	w.c.SetRedisHealth(w.now, true)
	w.drain()
	for i := range 9 + 5 {
		wantAnswer(t, fmt.Sprintf("shared again, %d", i), w.check("a", 1), true, ReasonOK)
	}
	wantAnswer(t, "region spent, pool spent", w.check("a", 1), false, ReasonOverLimit)
}

// TestUnansweredDepositSpentPoolIsUnavailable: a deposit a slow Redis
// did not answer may land later; while it may, a spent pool (the lease
// took it) is UNAVAILABLE, not OVER_LIMIT. It lands: its tokens are
// spent, and once a round read the bucket and found it, a spent pool is
// OVER_LIMIT again.
func TestUnansweredDepositSpentPoolIsUnavailable(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 10, time.Minute, time.Minute))
	_, acq := w.firstRound("a")
	w.c.Acquired(w.now, w.now, acq, []Grant{w.alloc.acquire(w.now, acq[0])})
	deps := w.c.Ready().Deposits
	if len(deps) != 1 || deps[0].Tokens != 10 {
		t.Fatalf("deposits %+v, want one of the pool's 10", deps)
	}
	d := deps[0]
	w.c.Deposited(w.now, d, store.DepositResult{}, errors.New("i/o timeout"), true)
	w.drain()
	wantAnswer(t, "the deposit may land yet", w.check("a", 1), false, ReasonUnavailable)
	if v := counter(w.shared.Balance(d.Key, ms(w.now)), store.CounterPoolSpent); v != 0 {
		t.Fatalf("pool-spent mark %d in the shared bucket while the deposit may land: other replicas would say OVER_LIMIT", v)
	}
	if a := w.c.Reserved(w.now, d.Key, false, 0, 1); a.Reason != ReasonUnavailable {
		t.Fatalf("a refused sub-lease reservation while the deposit may land: %+v, want UNAVAILABLE", a)
	}
	w.drain()
	// It lands.
	if _, err := w.shared.Deposit(store.Deposit{Key: d.Key, LeaseID: d.LeaseID, Tokens: d.Tokens,
		DeadlineMs: ms(d.Deadline), ExpireAtMs: ms(d.KeyExpiry), NowMs: ms(w.now)}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		wantAnswer(t, fmt.Sprintf("landed, %d", i), w.check("a", 1), true, ReasonOK)
	}
	// The spends below the low-water mark renewed: that round read the
	// bucket and found the lease.
	wantAnswer(t, "found, region spent, pool spent", w.check("a", 1), false, ReasonOverLimit)
	if a := w.c.Reserved(w.now, d.Key, false, 0, 1); a.Reason != ReasonOverLimit {
		t.Fatalf("a refused sub-lease reservation, the region spent: %+v, want OVER_LIMIT", a)
	}
}

// TestStoreErrorFallbackSpentIsUnavailable: a spend Redis did not answer
// gets the limit's fail mode; a local:2 fallback admits 2 (counted in the
// shared store, which answers that call), then its allowance is spent.
// The region's bucket may still hold unspent tokens, so that is
// UNAVAILABLE, not OVER_LIMIT; with the allocator unreachable instead, a
// spent allowance is OVER_LIMIT as before.
func TestStoreErrorFallbackSpentIsUnavailable(t *testing.T) {
	l := strictLimit("a", 100, time.Minute, time.Minute)
	l.Fallback = Fallback{Kind: FallbackLocal, LocalTokens: 2}
	w := newWorld(t, 10, l)
	wantAnswer(t, "shared", w.check("a", 1), true, ReasonOK)
	w.redisDown = true // spends go unanswered; the breaker has not tripped
	wantAnswer(t, "fallback 1", w.check("a", 1), true, ReasonFallback)
	wantAnswer(t, "fallback 2", w.check("a", 1), true, ReasonFallback)
	wantAnswer(t, "allowance spent, spend unanswered", w.check("a", 1), false, ReasonUnavailable)
	w.redisDown = false
	for range 8 {
		wantAnswer(t, "the bucket's tokens", w.check("a", 1), true, ReasonOK)
	}
	// Cut off from the allocator once the bucket is dry: the allowance,
	// spent, is OVER_LIMIT.
	w.dropAcquire = true
	w.c.SetAllocatorHealth(w.now, false)
	for i := 0; ; i++ {
		a := w.check("a", 1)
		if !a.Allowed {
			wantAnswer(t, "allowance spent, allocator unreachable", a, false, ReasonOverLimit)
			break
		}
		if i == 20 {
			t.Fatal("admitted 20 with the allocator unreachable")
		}
	}
}

// TestUnansweredRequestIsReplayed: a request whose call failed is sent
// again with the same id, and the allocator's replay is deposited once.
func TestUnansweredRequestIsReplayed(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	w.dropAcquire = true
	wantAnswer(t, "allocator down", w.check("a", 1), false, ReasonUnavailable)
	// The grant was made (the reply was lost): the allocator has it.
	w.alloc.acquire(w.now, Acquire{Limit: "a", RequestID: "eu-1-n-1"})
	w.dropAcquire = false
	w.c.SetAllocatorHealth(w.now, true)
	w.advance(time.Second)
	wantAnswer(t, "after", w.check("a", 1), true, ReasonOK)
	if len(w.alloc.grants) != 1 {
		t.Fatalf("%d grants, want the one, replayed", len(w.alloc.grants))
	}
	if len(w.deposits) != 1 || w.deposits[0].LeaseID != "30000000/eu/eu-1-n-1" {
		t.Fatalf("deposits %+v", w.deposits)
	}
}

// TestDuplicateReplyIgnored: a second answer to one request changes
// nothing.
func TestDuplicateReplyIgnored(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	_, acq := w.firstRound("a")
	g := w.alloc.acquire(w.now, acq[0])
	w.c.Acquired(w.now, w.now, acq, []Grant{g})
	w.c.Acquired(w.now, w.now, acq, []Grant{g})
	if d := w.c.Ready().Deposits; len(d) != 1 {
		t.Fatalf("%d deposits from a duplicated reply, want 1", len(d))
	}
}

// TestReturnsKeptWhileUnreachable: returns that cannot be sent are kept
// and sent when the allocator answers again, and counted once.
func TestReturnsKeptWhileUnreachable(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, 15*time.Second))
	w.check("a", 4)
	w.dropAcquire = true
	w.c.SetAllocatorHealth(w.now, false)
	w.advance(15 * time.Second)
	if g := w.alloc.grants["eu-1-n-1"]; g.settled {
		t.Fatal("returned while unreachable")
	}
	w.dropAcquire = false
	w.c.SetAllocatorHealth(w.now, true)
	w.drain()
	if g := w.alloc.grants["eu-1-n-1"]; !g.settled || g.credit != 6 {
		t.Fatalf("after the heal: %+v, want 6 credited", g)
	}
	returns := w.alloc.returns
	w.advance(10 * time.Second)
	if w.alloc.returns != returns {
		t.Fatalf("returned again after it was acknowledged")
	}
}

// TestReportsFollowTraffic: a report asks for the windows spent in since
// the last report, then each window once after its end, then nothing.
func TestReportsFollowTraffic(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, 10*time.Second, 10*time.Second))
	var reads []ReportRead
	report := func() {
		rd := w.c.Ready()
		reads = append(reads, rd.Reports...)
		w.run(rd)
		w.drain()
	}
	w.check("a", 1)
	w.now = w.now.Add(2 * time.Second)
	w.c.Tick(w.now)
	report()
	if len(reads) != 1 || reads[0].Windows[0] != 180_000_000 {
		t.Fatalf("reads %+v", reads)
	}
	w.now = w.now.Add(2 * time.Second)
	w.c.Tick(w.now)
	report()
	if len(reads) != 1 {
		t.Fatalf("a window without new spends was read again: %+v", reads)
	}
	w.now = t0.Add(12 * time.Second) // the window ended 2 s ago
	w.c.Tick(w.now)
	report()
	if len(reads) != 2 {
		t.Fatalf("no final read after the window's end: %+v", reads)
	}
	for range 5 {
		w.now = w.now.Add(2 * time.Second)
		w.c.Tick(w.now)
		report()
	}
	if len(reads) != 2 {
		t.Fatalf("reads after the final one: %+v", reads[2:])
	}
}

// TestNotSyncedIsUnavailable: before its first sync the agent does not
// know any limit and says so.
func TestNotSyncedIsUnavailable(t *testing.T) {
	c := New(Config{Region: "eu", RequestPrefix: "p", Seed: 1})
	chk := c.Begin(t0, []Item{{Limit: "a"}}, time.Time{})
	if chk.Step != StepDone || chk.Err != nil || chk.Answers[0].Reason != ReasonUnavailable || chk.Result != ResultNotSynced {
		t.Fatalf("%+v", chk)
	}
	c.SetLimits(c.SyncStart(), 1, nil, time.Time{})
	chk = c.Begin(t0, []Item{{Limit: "a"}}, time.Time{})
	if !chk.Lookup() {
		t.Fatalf("unknown limit after a sync: %+v, want a wait for a sync of its own", chk)
	}
	c.Synced(c.SyncStart(), time.Time{})
	c.Woke(t0, chk)
	if chk.Err == nil {
		t.Fatalf("unknown limit after a sync: %+v", chk)
	}
}

// TestShareSpentIsOverLimitBriefly: the allocator keeps the rest of the
// pool for other regions: OVER_LIMIT, retried after about spentRetry.
func TestShareSpentIsOverLimitBriefly(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	chk, acq := w.firstRound("a")
	w.c.Acquired(w.now, w.now, acq, []Grant{{OK: true, Window: 30_000_000, WindowLen: time.Minute,
		PoolLeft: 40, ShareSpent: true}})
	w.drain()
	w.c.Woke(w.now, chk)
	res, _ := w.shared.Spend(chk.Keys, chk.Costs, chk.Counted, ms(w.now))
	w.c.Spent(w.now, chk, res, nil)
	if chk.Step != StepDone || chk.Answers[0].Reason != ReasonOverLimit {
		t.Fatalf("%+v", chk)
	}
	if ra := chk.Answers[0].RetryAfter; ra < time.Second || ra > 2*time.Second {
		t.Fatalf("retry-after %v, want 1-2 s", ra)
	}
}

// TestPoolSpentSeenFromAnotherReplica: a replica whose spend finds the
// pool-spent mark answers OVER_LIMIT at once, without a round.
func TestPoolSpentSeenFromAnotherReplica(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	key := store.Key{Limit: "a", Window: t0.UnixNano() / int64(time.Minute)}
	_, _ = w.shared.AddCounter(key, store.CounterPoolSpent, 1, ms(w.now))
	wantAnswer(t, "marked", w.check("a", 1), false, ReasonOverLimit)
	if w.rounds != 0 {
		t.Fatalf("%d rounds, want none", w.rounds)
	}
}

// TestEmptyPoolWhileReturnInFlight: a lease closed at its deadline
// leaves the bucket before the allocator credits its return; a dry spend
// meanwhile asks, and the allocator, not credited yet, answers that the
// pool is empty. That is not a spent pool: no OVER_LIMIT, no pool-spent
// mark for the other replicas, and once the return is acknowledged the
// limit renews at once and gets the returned tokens (it used to wait out
// the spent mark's second, and lose what was left of short windows).
func TestEmptyPoolWhileReturnInFlight(t *testing.T) {
	w := newWorld(t, 100, strictLimit("a", 100, time.Minute, 15*time.Second))
	wantAnswer(t, "first", w.check("a", 30), true, ReasonOK)
	w.holdReturns = true
	w.advance(15 * time.Second) // the lease's deadline: closed, its 70 on their way back
	if len(w.heldReturns) != 1 || w.heldReturns[0].Unspent != 70 {
		t.Fatalf("returns %+v, want the lease's 70", w.heldReturns)
	}
	calls := w.alloc.calls
	got := w.check("a", 1)
	if w.alloc.calls != calls+1 {
		t.Fatalf("%d allocator calls, want the dry spend's one", w.alloc.calls-calls)
	}
	if got.Allowed || got.Reason == ReasonOverLimit {
		t.Fatalf("dry while the return is on its way: %+v, want not OVER_LIMIT", got)
	}
	key := store.Key{Limit: "a", Window: lease.WindowOf(w.now, time.Minute).Index}
	if v := counter(w.shared.Balance(key, ms(w.now)), store.CounterPoolSpent); v != 0 {
		t.Fatalf("pool-spent mark %d while the pool's tokens are on their way back", v)
	}
	w.deliverReturns()
	if w.alloc.calls != calls+2 {
		t.Fatalf("%d allocator calls after the return, want one more (the renewal it waited for)", w.alloc.calls-calls-1)
	}
	for i := range 70 {
		wantAnswer(t, fmt.Sprintf("returned tokens, %d", i), w.check("a", 1), true, ReasonOK)
	}
	wantAnswer(t, "all 100 spent", w.check("a", 1), false, ReasonOverLimit)
}

// TestReturnLiftsSpentMark: another replica marked the window's pool
// spent (the allocator answered it empty while this replica's return was
// on its way), and this replica's dry spend learned the mark from the
// bucket. Once its return is acknowledged, the pool has tokens again: the
// mark is lifted, the bucket's counter no longer marks it, and the limit
// renews at once.
func TestReturnLiftsSpentMark(t *testing.T) {
	w := newWorld(t, 100, strictLimit("a", 100, time.Minute, 15*time.Second))
	wantAnswer(t, "first", w.check("a", 30), true, ReasonOK)
	w.holdReturns = true
	w.advance(15 * time.Second)
	key := store.Key{Limit: "a", Window: lease.WindowOf(w.now, time.Minute).Index}
	_, _ = w.shared.AddCounter(key, store.CounterPoolSpent, 1, ms(w.now)) // the other replica's mark
	wantAnswer(t, "marked by the other replica", w.check("a", 1), false, ReasonOverLimit)
	w.deliverReturns()
	for i := range 70 {
		wantAnswer(t, fmt.Sprintf("returned tokens, %d", i), w.check("a", 1), true, ReasonOK)
	}
	wantAnswer(t, "all 100 spent", w.check("a", 1), false, ReasonOverLimit)
}

// TestWindowsOfMultiCheck: a Check of several limits is admitted by all or
// none, each answer naming its own limit.
func TestWindowsOfMultiCheck(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute), strictLimit("b", 3, 10*time.Second, 10*time.Second))
	as, _ := w.checkMulti(Item{Limit: "a", Cost: 2}, Item{Limit: "b", Cost: 3})
	if !as[0].Allowed || !as[1].Allowed || as[0].Limit != 100 || as[1].Limit != 3 || as[1].Window != 10*time.Second {
		t.Fatalf("%+v", as)
	}
	as, _ = w.checkMulti(Item{Limit: "a", Cost: 2}, Item{Limit: "b", Cost: 1})
	if as[0].Allowed || as[1].Allowed || as[0].Reason != ReasonOverLimit {
		t.Fatalf("b is spent: %+v", as)
	}
	if b := w.shared.Balance(store.Key{Limit: "a", Window: t0.UnixNano() / int64(time.Minute)}, ms(w.now)); b.Admitted != 2 {
		t.Fatalf("a admitted %d, want 2: the refused multi-check charged nothing", b.Admitted)
	}
	_, chk := w.checkMulti(Item{Limit: "a", Cost: 101})
	if e, ok := chk.Err.(*ItemError); !ok || e.Field != "cost" {
		t.Fatalf("cost above G: %v", chk.Err)
	}
}

// TestSpentPoolAtTheBoundaryWaits: a Check refused by the window's spent
// pool in the window's last moments waits for the next window (the agent
// names windows on an estimate of the allocator's clock) and is admitted
// there, not answered OVER_LIMIT.
func TestSpentPoolAtTheBoundaryWaits(t *testing.T) {
	w := newWorld(t, 5, strictLimit("a", 5, time.Minute, time.Minute))
	for range 5 {
		w.check("a", 1)
	}
	wantAnswer(t, "spent", w.check("a", 1), false, ReasonOverLimit)
	w.advance(time.Minute - 30*time.Millisecond) // 30 ms before the end
	got := w.check("a", 1)
	wantAnswer(t, "at the boundary", got, true, ReasonOK)
	if !w.now.After(t0.Add(time.Minute)) {
		t.Fatalf("admitted at %v, before the window's end", w.now.Sub(t0))
	}
}

// TestWindowNamedFromHalfTheRoundTrip: a lease reply names the allocator's
// clock at about half the call's round trip before it arrived, so the
// agent moves to the next window when the allocator does (a late naming
// would spend a new window's first Checks against the old window's pool).
func TestWindowNamedFromHalfTheRoundTrip(t *testing.T) {
	c := New(Config{Region: "eu", RequestPrefix: "p", Seed: 1})
	l := strictLimit("a", 100, time.Minute, time.Minute)
	c.SetLimits(c.SyncStart(), 1, []Limit{l}, time.Time{})
	st := c.state(&l)
	req := Acquire{Limit: "a", RequestID: "p-1"}
	c.byRequest[req.RequestID], st.pending = st, &req
	// The allocator answered 200 ms before its window's end; the call
	// took 100 ms, sent at t0+59.7 s.
	sent := t0.Add(59700 * time.Millisecond)
	recv := sent.Add(100 * time.Millisecond)
	c.Acquired(sent, recv, []Acquire{req}, []Grant{{OK: true, LeaseID: "x", Tokens: 1, Window: 30_000_000,
		WindowLen: time.Minute, ExpiresIn: 200 * time.Millisecond, WindowLeft: 200 * time.Millisecond}})
	// Answered at about sent + 50 ms = t0+59.75 s (allocator: 59.8 s), so
	// the allocator's boundary is at about t0+59.95 s on the agent's clock.
	if got := c.WindowOf(sent.Add(255*time.Millisecond), &l).Index; got != 30_000_001 {
		t.Fatalf("window %d at the allocator's boundary, want the next one", got)
	}
	if got := c.WindowOf(sent.Add(245*time.Millisecond), &l).Index; got != 30_000_000 {
		t.Fatalf("window %d just before it", got)
	}
}

// TestUnknownLimitLooksUp: a Check of a limit the snapshot does not have
// waits for a limit sync sent after it arrived: a limit created a moment
// ago is enforced from its first Check, and one that does not exist is
// NOT_FOUND only once such a sync said so; with the allocator unreachable
// the agent cannot say, and answers UNAVAILABLE.
func TestUnknownLimitLooksUp(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 100, time.Minute, time.Minute))
	w.advance(time.Second)
	w.alloc.limits["new"] = strictLimit("new", 100, time.Minute, time.Minute) // created after the last sync
	got := w.check("new", 1)
	wantAnswer(t, "a limit created a moment ago", got, true, ReasonOK)
	if w.syncs != 1 {
		t.Fatalf("%d syncs, want the one the Check asked for", w.syncs)
	}
	_, chk := w.checkMulti(Item{Limit: "none", Cost: 1})
	if !errors.Is(chk.Err, ErrUnknownLimit) || w.syncs != 2 {
		t.Fatalf("a limit that does not exist: %v after %d syncs, want ErrUnknownLimit after a sync of its own", chk.Err, w.syncs)
	}
	w.c.SetAllocatorHealth(w.now, false)
	w.dropAcquire = true
	if got := w.check("none", 1); got.Reason != ReasonUnavailable {
		t.Fatalf("allocator unreachable: %+v, want UNAVAILABLE (it cannot say the limit does not exist)", got)
	}
}

// TestRestoredSnapshot: an agent restarted while the allocator is
// unreachable enforces the snapshot the region kept: each limit's fallback
// (closed: UNAVAILABLE; local:A: A admitted), UNAVAILABLE for a limit it
// does not have; an older snapshot never replaces a newer one, and the
// allocator's replaces any.
func TestRestoredSnapshot(t *testing.T) {
	closed := strictLimit("closed", 100, time.Minute, time.Minute)
	local := strictLimit("local", 100, time.Minute, time.Minute)
	local.Fallback = Fallback{Kind: FallbackLocal, LocalTokens: 2}
	w := newWorld(t, 10)
	w.c = New(Config{Region: "eu", RequestPrefix: "eu-2-n", Seed: 1}) // restarted: no sync yet
	w.c.SetAllocatorHealth(w.now, false)
	w.dropAcquire = true
	if got := w.check("closed", 1); got.Reason != ReasonUnavailable {
		t.Fatalf("before any snapshot: %+v", got)
	}
	if !w.c.RestoreLimits(50, []Limit{closed, local}, t0.Add(-time.Minute)) {
		t.Fatal("snapshot not restored")
	}
	if w.c.RestoreLimits(49, []Limit{closed}, t0) || w.c.RestoreLimits(-(50<<20|1), []Limit{closed}, t0.Add(-2*time.Minute)) {
		t.Fatal("an older snapshot replaced a newer one")
	}
	wantAnswer(t, "closed", w.check("closed", 1), false, ReasonUnavailable)
	wantAnswer(t, "local 1", w.check("local", 1), true, ReasonFallback)
	wantAnswer(t, "local 2", w.check("local", 1), true, ReasonFallback)
	wantAnswer(t, "local 3", w.check("local", 1), false, ReasonOverLimit)
	if got := w.check("other", 1); got.Reason != ReasonUnavailable {
		t.Fatalf("a limit the snapshot does not have: %+v, want UNAVAILABLE", got)
	}
	if synced, restored, _ := w.c.Snapshot(); synced || !restored {
		t.Fatalf("snapshot synced %v restored %v", synced, restored)
	}
	w.c.SetLimits(w.c.SyncStart(), 51, []Limit{closed}, w.now)
	if w.c.RestoreLimits(60, []Limit{local}, w.now) {
		t.Fatal("a kept snapshot replaced the allocator's")
	}
	if _, ok := w.c.Limit("local"); ok {
		t.Fatal("the allocator's snapshot did not replace the restored one")
	}
}

// TestOwnExpiringLeaseIsNotASpentPool: the region took the whole pool in
// one lease that expires (TTL 2.5 s) long before the window's end. Its
// renewal finds the pool empty, but the pool is not spent: the region's
// own lease holds it and returns its unspent tokens when it expires. No
// Check is OVER_LIMIT; after the expiry the return refills the pool and
// the next lease is granted from it. (The agent once marked the window
// spent, and the gateway's denial cache held that OVER_LIMIT for the
// rest of the window: 430 of 700 requests refused with 390 tokens free.)
func TestOwnExpiringLeaseIsNotASpentPool(t *testing.T) {
	w := newWorld(t, 100, strictLimit("a", 100, 10*time.Second, 2500*time.Millisecond))
	w.advance(time.Second) // 1 s into the window
	admitted := 0
	for i := range 60 { // 10 Checks a second for 6 s
		got := w.check("a", 1)
		if got.Reason == ReasonOverLimit {
			t.Fatalf("Check %d at %v: OVER_LIMIT with %d of 100 admitted", i, w.now.Sub(t0), admitted)
		}
		if got.Allowed {
			admitted++
		}
		w.advance(100 * time.Millisecond)
	}
	if admitted < 55 {
		t.Fatalf("%d of 60 Checks admitted (the pool had 100)", admitted)
	}
	if w.alloc.returns == 0 {
		t.Fatal("the expired lease was never returned")
	}
}

// TestReportBudget: with more limits in progress than the report budget,
// a round reads the windows in progress of the budget's worth, those read
// longest ago first, so each limit is read at least every ceil(busy /
// budget) rounds; windows that ended are read regardless, all in the
// round after their end.
func TestReportBudget(t *testing.T) {
	var ls []Limit
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		ls = append(ls, strictLimit(id, 1000, time.Minute, time.Minute))
	}
	w := newWorld(t, 100, ls...)
	w.c = New(Config{Region: "eu", RequestPrefix: "eu-1-n", Seed: 1}, WithReportBudget(2))
	w.c.SetLimits(w.c.SyncStart(), 1, ls, w.now)
	w.c.SetAllocatorClock(w.now, w.now, w.now)
	round := func(spend bool) []string {
		t.Helper()
		if spend {
			for _, l := range ls {
				if a := w.check(l.ID, 1); !a.Allowed {
					t.Fatalf("check %s: %+v", l.ID, a)
				}
			}
		}
		w.now = w.now.Add(2 * time.Second)
		w.c.Tick(w.now)
		rd := w.c.Ready()
		var ids []string
		for _, r := range rd.Reports {
			ids = append(ids, r.Limit)
		}
		w.run(rd)
		w.drain()
		return ids
	}
	// (Reported in id order; picked by when last read, then id.)
	want := [][]string{{"a", "b"}, {"c", "d"}, {"a", "e"}, {"b", "c"}, {"a", "d"}}
	for i, wnt := range want {
		if got := round(true); !slices.Equal(got, wnt) {
			t.Fatalf("round %d read %v, want %v (the two read longest ago)", i, got, wnt)
		}
	}
	// No more spends: the two rounds after read what is still unread (e,
	// read longest ago, and b; then c); then nothing until the window (t0's minute) has ended, and
	// in the round after its end every limit's window once more, whatever
	// the budget.
	if got := round(false); !slices.Equal(got, []string{"b", "e"}) {
		t.Fatalf("first quiet round read %v, want b, e", got)
	}
	if got := round(false); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("second quiet round read %v, want c", got)
	}
	end := t0.Add(time.Minute + 2*time.Second)
	for w.now.Add(2 * time.Second).Before(end) {
		if got := round(false); len(got) != 0 {
			t.Fatalf("at %v, before the window's end, read %v", w.now.Sub(t0), got)
		}
	}
	if got := round(false); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("the round after the window's end (%v) read %v, want every limit", w.now.Sub(t0), got)
	}
	if got := round(false); len(got) != 0 {
		t.Fatalf("read again after the final reads: %v", got)
	}
}

// TestSeenFollowsTraffic: Seen lists each window whose admitted count rose
// since the last Seen, once, and nothing for limits with no spends since:
// its cost follows traffic, whatever the number of limits held.
func TestSeenFollowsTraffic(t *testing.T) {
	var ls []Limit
	for _, id := range []string{"a", "b", "c"} {
		ls = append(ls, strictLimit(id, 1000, time.Minute, time.Minute))
	}
	w := newWorld(t, 100, ls...)
	names := func(ws []WindowSeen) []string {
		var out []string
		for _, s := range ws {
			out = append(out, fmt.Sprintf("%s:%d", s.Limit, s.Admitted))
		}
		return out
	}
	// The watcher asks from its start: the Core keeps the list from then.
	if got := w.c.Seen(time.Time{}); len(got) != 0 {
		t.Fatalf("Seen before any spend = %v", names(got))
	}
	for _, id := range []string{"c", "a", "c"} {
		if a := w.check(id, 1); !a.Allowed {
			t.Fatalf("check %s: %+v", id, a)
		}
	}
	if got := names(w.c.Seen(time.Time{})); !slices.Equal(got, []string{"a:1", "c:2"}) {
		t.Fatalf("first Seen = %v, want a:1 c:2 (sorted, each window once, its largest count)", got)
	}
	if got := w.c.Seen(time.Time{}); len(got) != 0 {
		t.Fatalf("Seen with no spends since = %v, want nothing", names(got))
	}
	w.advance(time.Second)
	if a := w.check("b", 2); !a.Allowed {
		t.Fatalf("check b: %+v", a)
	}
	if got := names(w.c.Seen(time.Time{})); !slices.Equal(got, []string{"b:2"}) {
		t.Fatalf("Seen after one spend of b = %v, want b:2 only", got)
	}
}

// TestReleasedCheckReused: a warm Check of one limit, begun, spent and
// given back with Release, allocates nothing (the agent's Check path makes
// no Check of its own per request); a released Check comes back reset,
// and Release leaves alone a Check that is not done or not of one item.
func TestReleasedCheckReused(t *testing.T) {
	w := newWorld(t, 1_000_000, strictLimit("a", 1<<40, time.Hour, time.Hour))
	wantAnswer(t, "first check", w.check("a", 1), true, ReasonOK)
	key := store.Key{}
	krs := []store.KeyResult{{Allowed: true, Balance: 1 << 30}} // the store's, not the Check's
	one := func() {
		chk := w.c.BeginOne(w.now, Item{Limit: "a", Cost: 1}, time.Time{})
		if chk.Step != StepSpend || chk.Counted != nil || chk.Answers != nil {
			t.Fatalf("a Check from the pool: step %v, counted %v, answers %v", chk.Step, chk.Counted, chk.Answers)
		}
		key = chk.Keys[0]
		w.c.Spent(w.now, chk, store.SpendResult{Allowed: true, Failed: -1, Keys: krs}, nil)
		if chk.Step != StepDone || !chk.Answers[0].Allowed {
			t.Fatalf("a warm Check: step %v, answers %+v", chk.Step, chk.Answers)
		}
		Release(chk)
		if chk.Step != 0 || chk.Costs != nil || chk.sts != nil {
			t.Fatalf("a released Check was not reset: %+v", chk)
		}
	}
	one()
	if key.Limit != "a" {
		t.Fatalf("key %+v", key)
	}
	if n := testing.AllocsPerRun(200, one); n != 0 {
		t.Fatalf("a warm Check begun, spent and released makes %v allocations, want 0", n)
	}
	// Not done, or of two items: left alone.
	chk := w.c.BeginOne(w.now, Item{Limit: "a", Cost: 1}, time.Time{})
	Release(chk)
	if chk.Step != StepSpend {
		t.Fatalf("Release reset a Check that was not done: %+v", chk)
	}
	multi := w.c.Begin(w.now, []Item{{Limit: "a", Cost: 1}, {Limit: "a", Cost: 1}}, time.Time{})
	w.c.Spent(w.now, multi, store.SpendResult{Allowed: true, Failed: -1, Keys: []store.KeyResult{{Allowed: true}, {Allowed: true}}}, nil)
	Release(multi)
	if multi.Step != StepDone || len(multi.Answers) != 2 {
		t.Fatalf("Release reset a Check of two items: %+v", multi)
	}
}

// TestCheckSince: a Check of one limit says how long before it this
// replica last checked the limit (0 for its first), whatever the measured
// demand: the agent tells the chunks' client of a limit checked again
// within a minute, so traffic that resumes after a rest gets a chunk from
// its second Check, while the demand measure, which still counts the
// rest, is below the chunks' gate.
func TestCheckSince(t *testing.T) {
	w := newWorld(t, 1000, strictLimit("a", 1<<40, time.Hour, time.Hour))
	since := func() time.Duration {
		t.Helper()
		a, chk := w.checkMulti(Item{Limit: "a", Cost: 1})
		wantAnswer(t, "check", a[0], true, ReasonOK)
		return chk.Since
	}
	if s := since(); s != 0 {
		t.Fatalf("a limit's first Check: since %v, want 0", s)
	}
	w.advance(20 * time.Second)
	if s := since(); s != 20*time.Second {
		t.Fatalf("a Check 20 s after the one before: since %v, want 20s", s)
	}
	w.advance(500 * time.Millisecond)
	if measured := w.c.states["a"].demand.Measured(w.now); measured >= 0.5 {
		t.Fatalf("measured demand %v before the third Check: the test wants it < 0.5", measured)
	}
	if s := since(); s != 500*time.Millisecond {
		t.Fatalf("a Check 0.5 s after the one before: since %v, want 500ms", s)
	}
}

// TestRoundDepositsScheduleOnce: a limit renewed again and again keeps a
// handful of entries in the Core's timer heap, not one left behind per
// lease: a deposit made by a round leaves the rescheduling to the round's
// end (a deposit rescheduling too left 47 entries after these 24 leases).
func TestRoundDepositsScheduleOnce(t *testing.T) {
	w := newWorld(t, 10, strictLimit("a", 1000, time.Minute, 15*time.Second))
	for range 200 {
		wantAnswer(t, "check", w.check("a", 1), true, ReasonOK)
		w.advance(50 * time.Millisecond)
	}
	if len(w.deposits) < 20 {
		t.Fatalf("%d deposits in 200 Checks of 10-token leases, want 20 or more", len(w.deposits))
	}
	if n := len(w.c.timers); n > 4 {
		t.Fatalf("the timer heap holds %d entries after %d leases of one limit, want at most 4", n, len(w.deposits))
	}
}
