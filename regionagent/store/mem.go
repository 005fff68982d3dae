package store

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"leasehold/internal/seeded"
)

// Deposit describes one lease to store in a [Mem]: the arguments of
// deposit.lua. Times are milliseconds on the store's clock.
type Deposit struct {
	Key        Key
	LeaseID    string
	Tokens     int64
	StartMs    int64
	DeadlineMs int64
	ExpireAtMs int64
	NowMs      int64
}

// errMem reports an argument the Lua scripts would refuse.
var errMem = errors.New("store: mem: invalid argument")

// Mem is an in-memory region bucket with the semantics of the Redis
// scripts (package bucket, lua/*.lua), operation for operation. The simulator replays
// regions on it, and an agent whose Redis is down keeps the leases it
// acquires for itself in one:
//
//   - Deposit is idempotent by lease id, refused for a closed lease, and
//     refused (nothing written) when the key's expiry is not after now;
//     it only ever extends the key's expiry.
//   - Spend takes each cost from the leases with start <= now < deadline
//     (deadline exclusive), earliest deadline first (ties by id), splitting
//     across leases, all or nothing, counting admitted and denied; later
//     spends of one call see the earlier ones.
//   - Close returns the unspent amount exactly once and marks the lease
//     closed; later closes return the same amount as already closed; closing
//     an unknown lease records it closed with 0, so a late deposit is refused.
//   - Balance reports what balance.lua reports, open and expired leases
//     included.
//   - A key expires at its expiry (the deposit's expire-at, or the orphan
//     TTL for a key that another operation created), as Redis would expire
//     it.
//
// Every operation takes now in milliseconds on the bucket's clock, which the
// caller passes explicitly (the simulator's Redis clock, or an agent's
// monotonic clock). The zero value is not usable; call NewMem. Not safe for
// concurrent use.
type Mem struct {
	keys      map[Key]*memHash
	rates     map[RateKey]*memRate  // token buckets of bucket limits (rate.go)
	slots     map[SlotKey]*memSlots // slot sets of concurrency limits (slots.go)
	orphanTTL int64                 // ms
}

type memLease struct {
	id      string
	r, s, d int64
}

// memHash is one bucket key (one Redis hash).
type memHash struct {
	leases   []*memLease // open (not closed), sorted by (deadline, id)
	closed   map[string]int64
	admitted int64
	denied   int64
	counters map[string]int64 // other counters
	expireAt int64            // ms; 0: no expiry
}

// NewMem returns an empty bucket whose orphan keys live orphanTTLMs.
func NewMem(orphanTTLMs int64) *Mem {
	return &Mem{keys: map[Key]*memHash{}, rates: map[RateKey]*memRate{}, slots: map[SlotKey]*memSlots{}, orphanTTL: orphanTTLMs}
}

// get returns the live hash of key at now, nil if the key does not exist.
func (b *Mem) get(key Key, nowMs int64) *memHash {
	h := b.keys[key]
	if h != nil && h.expireAt > 0 && h.expireAt <= nowMs {
		delete(b.keys, key)
		return nil
	}
	return h
}

// create makes a key that an operation other than Deposit writes first:
// it carries the orphan TTL.
func (b *Mem) create(key Key, nowMs int64) *memHash {
	h := &memHash{}
	if b.orphanTTL > 0 {
		h.expireAt = nowMs + b.orphanTTL
	}
	b.keys[key] = h
	return h
}

// Keys returns how many keys the bucket holds (expired ones included until
// touched or swept).
func (b *Mem) Keys() int { return len(b.keys) }

// Sweep deletes the keys expired at now, as Redis's active expiry does.
func (b *Mem) Sweep(nowMs int64) {
	for k, h := range b.keys {
		if h.expireAt > 0 && h.expireAt <= nowMs {
			delete(b.keys, k)
		}
	}
	for k, r := range b.rates {
		if r.expireAt > 0 && r.expireAt <= nowMs {
			delete(b.rates, k)
		}
	}
}

func (h *memHash) lease(id string) *memLease {
	for _, l := range h.leases {
		if l.id == id {
			return l
		}
	}
	return nil
}

// spendable is spendable() of common.lua: the tokens of leases with
// start <= now < deadline and the earliest deadline among those holding
// tokens.
func (h *memHash) spendable(nowMs int64) (sum, earliest int64) {
	if h == nil {
		return 0, 0
	}
	for _, l := range h.leases {
		if l.s <= nowMs && (nowMs < l.d || seeded.On(seeded.SpendAtDeadline) && nowMs == l.d) && l.r > 0 {
			sum += l.r
			if earliest == 0 {
				earliest = l.d
			}
		}
	}
	return sum, earliest
}

// counts are the window's cost counters (KeyResult.Admitted, Denied).
func (h *memHash) counts() (admitted, denied int64) {
	if h == nil {
		return 0, 0
	}
	return h.admitted, h.denied
}

// result is one key's part of a spend.
func (h *memHash) result(allowed bool, bal, earliest int64) KeyResult {
	a, d := h.counts()
	return KeyResult{Allowed: allowed, Balance: bal, EarliestDeadlineMs: earliest, Admitted: a, Denied: d,
		PoolSpent: h.poolSpent()}
}

// poolSpent reports whether CounterPoolSpent is set (KeyResult.PoolSpent).
func (h *memHash) poolSpent() bool { return h != nil && h.counters[CounterPoolSpent] > 0 }

// charge takes cost from the spendable leases, earliest deadline first.
// The caller checked the balance.
func (h *memHash) charge(cost, nowMs int64) {
	left := cost
	for _, l := range h.leases {
		if left == 0 {
			break
		}
		if l.s <= nowMs && (nowMs < l.d || seeded.On(seeded.SpendAtDeadline) && nowMs == l.d) && l.r > 0 {
			take := min(l.r, left)
			l.r -= take
			left -= take
		}
	}
	h.admitted += cost
}

// Deposit stores a lease (deposit.lua).
func (b *Mem) Deposit(d Deposit) (DepositResult, error) {
	switch {
	case d.LeaseID == "":
		return DepositResult{}, fmt.Errorf("%w: empty lease id", errMem)
	case d.Tokens <= 0 || d.StartMs < 0 || d.DeadlineMs <= d.StartMs:
		return DepositResult{}, fmt.Errorf("%w: bad lease", errMem)
	case d.ExpireAtMs < d.DeadlineMs:
		return DepositResult{}, fmt.Errorf("%w: key expiry before deadline", errMem)
	}
	h := b.get(d.Key, d.NowMs)
	if d.ExpireAtMs <= d.NowMs {
		bal, _ := h.spendable(d.NowMs)
		return DepositResult{Status: RefusedKeyExpiry, Balance: bal}, nil
	}
	var status DepositStatus
	if h == nil {
		h = &memHash{}
		b.keys[d.Key] = h
	}
	if _, ok := h.closed[d.LeaseID]; ok {
		status = RefusedClosed
	} else if h.lease(d.LeaseID) != nil {
		status = AlreadyDeposited
	} else {
		status = Deposited
		l := &memLease{id: d.LeaseID, r: d.Tokens, s: d.StartMs, d: d.DeadlineMs}
		i, _ := slices.BinarySearchFunc(h.leases, l, cmpLease)
		h.leases = slices.Insert(h.leases, i, l)
	}
	if h.expireAt == 0 || h.expireAt < d.ExpireAtMs {
		h.expireAt = d.ExpireAtMs
	}
	bal, _ := h.spendable(d.NowMs)
	return DepositResult{Status: status, Balance: bal}, nil
}

func cmpLease(a, b *memLease) int {
	if a.d != b.d {
		if a.d < b.d {
			return -1
		}
		return 1
	}
	return strings.Compare(a.id, b.id)
}

// Spend1 is Spend of one key and one cost, without allocating: the key's
// result (Allowed is the spend's).
func (b *Mem) Spend1(key Key, cost int64, counted bool, nowMs int64) KeyResult {
	h := b.get(key, nowMs)
	bal, earliest := h.spendable(nowMs)
	if bal >= cost {
		if cost > 0 {
			h.charge(cost, nowMs)
			bal, earliest = h.spendable(nowMs)
		}
		if counted {
			h.uncount(cost)
		}
		return h.result(true, bal, earliest)
	}
	if !counted {
		if h == nil {
			h = b.create(key, nowMs)
		}
		h.denied += cost
	}
	return h.result(false, bal, earliest)
}

// uncount moves cost, just paid by a counted key, out of denied (never
// below 0): spend.lua's uncount.
func (h *memHash) uncount(cost int64) {
	if h != nil { // a cost of 0 on a key that does not exist
		h.denied -= min(cost, h.denied)
	}
}

// Spend decides one all-or-nothing spend over keys (spend.lua with one
// spend): each key pays its cost, or nothing is charged and the cost is
// added to denied on each key that lacked it. A key named twice pays both
// costs. counted (nil, or one per key) names the keys an earlier attempt
// of the same request was denied on (spend.lua's counted keys): such a
// key adds nothing to denied when it lacks the cost again, and moves the
// cost from denied to admitted when it pays.
func (b *Mem) Spend(keys []Key, costs []int64, counted []bool, nowMs int64) (SpendResult, error) {
	if len(keys) == 0 || len(keys) != len(costs) {
		return SpendResult{}, fmt.Errorf("%w: %d keys, %d costs", errMem, len(keys), len(costs))
	}
	if counted != nil && len(counted) != len(keys) {
		return SpendResult{}, fmt.Errorf("%w: %d keys, %d counted flags", errMem, len(keys), len(counted))
	}
	isCounted := func(i int) bool { return counted != nil && counted[i] }
	for _, c := range costs {
		if c < 0 {
			return SpendResult{}, fmt.Errorf("%w: negative cost", errMem)
		}
	}
	type state struct {
		key      Key
		h        *memHash
		bal      int64
		earliest int64
		need     int64
	}
	sts := make([]*state, len(keys))
	byKey := map[Key]*state{}
	for i, k := range keys {
		st := byKey[k]
		if st == nil {
			h := b.get(k, nowMs)
			bal, e := h.spendable(nowMs)
			st = &state{key: k, h: h, bal: bal, earliest: e}
			byKey[k] = st
		}
		st.need += costs[i]
		sts[i] = st
	}
	res := SpendResult{Failed: -1, Keys: make([]KeyResult, len(keys))}
	for i, st := range sts {
		if st.bal < st.need {
			res.Failed = i
			break
		}
	}
	if res.Failed >= 0 {
		for i, st := range sts {
			ok := st.bal >= st.need
			if !ok && !isCounted(i) {
				if st.h == nil {
					st.h = b.create(st.key, nowMs)
				}
				st.h.denied += costs[i]
			}
			res.Keys[i] = st.h.result(ok, st.bal, st.earliest)
		}
		return res, nil
	}
	res.Allowed = true
	for i, st := range sts {
		if costs[i] > 0 {
			st.h.charge(costs[i], nowMs)
			st.bal, st.earliest = st.h.spendable(nowMs)
		}
		if isCounted(i) {
			st.h.uncount(costs[i])
		}
	}
	for i, st := range sts {
		res.Keys[i] = st.h.result(true, st.bal, st.earliest)
	}
	return res, nil
}

// Close removes a lease and returns its unspent tokens, once (close.lua).
func (b *Mem) Close(key Key, id string, nowMs int64) (CloseResult, error) {
	if id == "" {
		return CloseResult{}, fmt.Errorf("%w: empty lease id", errMem)
	}
	h := b.get(key, nowMs)
	var res CloseResult
	if h != nil {
		if v, ok := h.closed[id]; ok {
			res.Unspent, res.AlreadyClosed = v, true
			res.Balance, _ = h.spendable(nowMs)
			return res, nil
		}
	}
	if l := h.leaseOrNil(id); l != nil {
		res.Unspent = l.r
		h.leases = slices.DeleteFunc(h.leases, func(x *memLease) bool { return x == l })
	} else {
		res.Unknown = true
		if h == nil {
			h = b.create(key, nowMs)
		}
	}
	if h.closed == nil {
		h.closed = map[string]int64{}
	}
	h.closed[id] = res.Unspent
	res.Balance, _ = h.spendable(nowMs)
	return res, nil
}

func (h *memHash) leaseOrNil(id string) *memLease {
	if h == nil {
		return nil
	}
	return h.lease(id)
}

// Balance reads a bucket without changing it (balance.lua).
func (b *Mem) Balance(key Key, nowMs int64) BalanceResult {
	h := b.get(key, nowMs)
	var r BalanceResult
	if h == nil {
		return r
	}
	r.Spendable, r.EarliestDeadlineMs = h.spendable(nowMs)
	r.Admitted, r.Denied = h.admitted, h.denied
	for _, l := range h.leases {
		switch {
		case nowMs < l.s:
			r.Pending += l.r
			r.Open = append(r.Open, OpenLease{ID: l.id, Remaining: l.r, StartMs: l.s, DeadlineMs: l.d})
		case nowMs < l.d:
			r.Live++
			r.Open = append(r.Open, OpenLease{ID: l.id, Remaining: l.r, StartMs: l.s, DeadlineMs: l.d})
		default:
			r.Expired = append(r.Expired, ExpiredLease{ID: l.id, Remaining: l.r})
		}
	}
	if len(h.counters) > 0 {
		for name, v := range h.counters {
			r.Counters = append(r.Counters, Counter{Name: name, Value: v})
		}
		slices.SortFunc(r.Counters, func(a, b Counter) int { return strings.Compare(a.Name, b.Name) })
	}
	return r
}

// AddCounter adds delta to a named counter (add.lua) and returns its value.
func (b *Mem) AddCounter(key Key, name string, delta, nowMs int64) (int64, error) {
	if name == "" || strings.Contains(name, ":") || name == "admitted" || name == "denied" {
		return 0, fmt.Errorf("%w: counter name %q", errMem, name)
	}
	h := b.get(key, nowMs)
	if h == nil {
		h = b.create(key, nowMs)
	}
	if h.counters == nil {
		h.counters = map[string]int64{}
	}
	h.counters[name] += delta
	return h.counters[name], nil
}

// AdmitFallback is fallback.lua: every key's CounterFallback grows by its
// cost, and its mode is marked, unless one would pass its cap; then
// nothing is written. It returns ok and each key's counter after (or as
// it is, when refused).
func (b *Mem) AdmitFallback(adds []FallbackAdd, nowMs int64) (bool, []int64, error) {
	if len(adds) == 0 {
		return false, nil, fmt.Errorf("%w: no keys", errMem)
	}
	need := map[Key]int64{}
	for _, a := range adds {
		if a.Cost < 0 || a.Cap < 0 {
			return false, nil, fmt.Errorf("%w: negative cost or cap", errMem)
		}
		if a.Mode != "" && a.Mode != CounterModeLocal && a.Mode != CounterModeOpen {
			return false, nil, fmt.Errorf("%w: mode counter %q", errMem, a.Mode)
		}
		need[a.Key] += a.Cost
	}
	vals := make([]int64, len(adds))
	ok := true
	for i, a := range adds {
		h := b.get(a.Key, nowMs)
		if h != nil {
			vals[i] = h.counters[CounterFallback]
		}
		if a.Cap > 0 && vals[i]+need[a.Key] > a.Cap {
			ok = false
		}
	}
	if !ok {
		return false, vals, nil
	}
	for i, a := range adds {
		h := b.get(a.Key, nowMs)
		if h == nil {
			h = b.create(a.Key, nowMs)
		}
		if h.counters == nil {
			h.counters = map[string]int64{}
		}
		h.counters[CounterFallback] += a.Cost
		if _, set := h.counters[a.Mode]; a.Mode != "" && !set {
			h.counters[a.Mode] = 0
		}
		vals[i] = h.counters[CounterFallback]
	}
	return true, vals, nil
}

// Clone returns a deep copy of b: a replica's view of the same Redis, for
// models of a failover that loses the writes made since the copy.
func (b *Mem) Clone() *Mem {
	c := &Mem{keys: make(map[Key]*memHash, len(b.keys)), rates: make(map[RateKey]*memRate, len(b.rates)), orphanTTL: b.orphanTTL}
	for k, r := range b.rates {
		n := *r // a memRate holds no pointers: a copy is a deep copy
		c.rates[k] = &n
	}
	for k, h := range b.keys {
		n := *h
		n.leases = make([]*memLease, len(h.leases))
		for i, l := range h.leases {
			cl := *l
			n.leases[i] = &cl
		}
		if h.closed != nil {
			n.closed = maps.Clone(h.closed)
		}
		if h.counters != nil {
			n.counters = maps.Clone(h.counters)
		}
		c.keys[k] = &n
	}
	return c
}
