package regionagent

import (
	"sync"
	"time"

	"leasehold/regionagent/bucket"
	"leasehold/regionagent/store"
)

// localStore holds the leases an agent replica acquires for itself while
// its region's Redis is down, and spends them in process. It is a
// [store.Mem] (the Redis scripts' semantics: idempotent deposits,
// all-or-nothing spends from the earliest deadline, closes counted once)
// on the agent's own monotonic clock: milliseconds since the store was
// made. Deadlines round down and starts round up to the millisecond, so a
// token is never spent after its lease's agent deadline (invariant 4).
//
// Its per-window counters (admitted, denied, fallback) are this replica's
// alone and are reported under the replica's own reporter name.
//
// The zero value is not usable; call newLocalStore. Safe for concurrent
// use.
type localStore struct {
	epoch time.Time // the instant of ms 0 on the agent's clock

	mu   sync.Mutex // protects mem, held
	mem  *store.Mem
	held map[string]int // per limit: leases deposited and not closed
}

// localOrphanTTL is how long a local bucket that no deposit created
// (denied or fallback counts only) is kept: as in Redis.
const localOrphanTTL = bucket.DefaultOrphanTTL

func newLocalStore(now time.Time) *localStore {
	return &localStore{epoch: now, mem: store.NewMem(localOrphanTTL.Milliseconds()), held: map[string]int{}}
}

// ms is t on the store's clock, rounded down.
func (s *localStore) ms(t time.Time) int64 {
	d := t.Sub(s.epoch)
	ms := int64(d / time.Millisecond)
	if d < 0 && d%time.Millisecond != 0 {
		ms--
	}
	return ms
}

// msUp is t on the store's clock, rounded up.
func (s *localStore) msUp(t time.Time) int64 {
	ms := s.ms(t)
	if t.Sub(s.epoch)%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// spend is SpendOp on the local buckets (one all-or-nothing spend).
func (s *localStore) spend(limits []string, windows, costs []int64, now time.Time) bucket.SpendResult {
	nowMs := s.ms(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(limits) == 1 {
		k := store.Key{Limit: limits[0], Window: windows[0]}
		kr := s.mem.Spend1(k, costs[0], nowMs)
		r := bucket.SpendResult{Allowed: kr.Allowed, Failed: -1, Keys: []bucket.KeyResult{kr}}
		if !kr.Allowed {
			r.Failed = 0
		}
		return r
	}
	keys := make([]store.Key, len(limits))
	for i := range limits {
		keys[i] = store.Key{Limit: limits[i], Window: windows[i]}
	}
	r, err := s.mem.Spend(keys, costs, nowMs)
	if err != nil { // costs were validated by CheckMulti
		return bucket.SpendResult{Failed: 0, Keys: make([]bucket.KeyResult, len(keys))}
	}
	return r
}

// deposit stores a lease.
func (s *localStore) deposit(d store.Deposit) (bucket.DepositResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.mem.Deposit(d)
	if err == nil && r.Status == bucket.Deposited {
		s.held[d.Key.Limit]++
	}
	return r, err
}

// close closes a lease; Unspent counts once (AlreadyClosed on repeats).
func (s *localStore) close(limit string, window int64, id string, now time.Time) bucket.CloseResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _ := s.mem.Close(store.Key{Limit: limit, Window: window}, id, s.ms(now)) // id is never empty
	if !r.AlreadyClosed && !r.Unknown {
		if s.held[limit]--; s.held[limit] <= 0 {
			delete(s.held, limit)
		}
	}
	return r
}

// balance reads a local bucket at now.
func (s *localStore) balance(limit string, window int64, now time.Time) bucket.BalanceResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.Balance(store.Key{Limit: limit, Window: window}, s.ms(now))
}

// add adds delta to a named counter of a local bucket and returns its value.
func (s *localStore) add(limit string, window int64, name string, delta int64, now time.Time) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, _ := s.mem.AddCounter(store.Key{Limit: limit, Window: window}, name, delta, s.ms(now)) // names are constants
	return v
}

// holds reports whether the store may hold open leases of limit.
func (s *localStore) holds(limit string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[limit] > 0
}

// sweep forgets the buckets expired at now.
func (s *localStore) sweep(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem.Sweep(s.ms(now))
}
