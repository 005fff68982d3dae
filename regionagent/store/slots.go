package store

import (
	"sort"
	"strconv"
	"strings"
)

// A concurrency limit (at most N held at once, all regions together)
// keeps one slot set per region: the region's slot share in force (seq,
// n slots, deadline) and the held slots, each with its expiry. The rules,
// the same in lua/slots.lua (package bucket) and here:
//
//   - Time never goes back: an instant before the latest one seen counts
//     as that one.
//   - Acquire admits when fewer than admit (<= n) slots are held and the
//     share's deadline is ahead; the slot expires at min(now + ttl,
//     deadline).
//     Acquire is idempotent by holder: a holder whose slot is held gets
//     it back.
//   - Heartbeat extends a held slot x, of expiry e, to min(now + ttl,
//     deadline) only while fewer than n other slots expire after e.
//     Otherwise the slot keeps e. This keeps, at every later instant u,
//     the slots held at u at most n of the share in force at u (or at
//     most what they were under an older share, until it ends): a
//     smaller share never lets more slots live past the larger one's
//     deadline.
//   - Release removes a held slot; a slot not held (released, expired,
//     unknown) is answered "not held", not an error.
//
// So at every instant of the store's clock the held slots are at most the
// n of a share whose deadline is still ahead, the allocator's invariant's
// region term (docs/overshoot.md, concurrency limits).

// SlotKey names a region's slot set of one concurrency limit.
type SlotKey struct {
	Limit   string
	HashTag string
}

// SlotShare is a region's slot share as installed: Seq orders the shares,
// N is how many slots may be held, Admit (<= N) how many may be held
// after admitting a new one, DeadlineMs when the share ends (the store's
// clock, exclusive).
type SlotShare struct {
	Seq, N, Admit, DeadlineMs int64
}

// Valid reports whether s can be installed.
func (s SlotShare) Valid() bool {
	return s.Seq > 0 && s.N >= 0 && s.Admit >= 0 && s.Admit <= s.N && s.DeadlineMs > 0
}

// SlotInstall describes a slot share to install: the arguments of
// slots.lua's install.
type SlotInstall struct {
	Key        SlotKey
	Share      SlotShare
	ExpireAtMs int64 // the keys' expiry (only ever extended), >= Share.DeadlineMs
	NowMs      int64
}

// SlotInstallResult is the outcome of installing a slot share: Status as
// a rate share's (ShareInstalled, ShareStale, ShareRefusedKeyExpiry) and
// the slots held after the call.
type SlotInstallResult struct {
	Status ShareStatus
	Held   int64
}

// SlotAcquireResult is the outcome of one acquire.
type SlotAcquireResult struct {
	Allowed bool
	SlotID  string // the held slot (allowed)
	// ExpiresInMs is the slot's expiry from now (allowed); RetryMs, when
	// denied, how long until the earliest held slot expires (0: no share
	// in force, ask again when one is).
	ExpiresInMs, RetryMs int64
	Held, N              int64 // slots held after the call, the share's n (0: none in force)
	DeadlineMs           int64 // the share in force's deadline (0: none)
}

// SlotHeartbeatResult is the outcome of one heartbeat.
type SlotHeartbeatResult struct {
	Held        bool  // false: the slot is not held (released, expired, unknown)
	ExpiresInMs int64 // the slot's expiry from now (held)
}

// HolderOf returns the holder id of a slot id ("<holder>~<n>").
func HolderOf(slotID string) string {
	i := strings.LastIndexByte(slotID, '~')
	if i < 0 {
		return ""
	}
	return slotID[:i]
}

// memSlots is one slot set of a [Mem].
type memSlots struct {
	share    SlotShare
	t        int64            // the latest instant seen
	gen      int64            // slot ids issued
	slots    map[string]int64 // slot id -> expiry ms
	holders  map[string]string
	expireAt int64
}

func (b *Mem) slotSet(key SlotKey, nowMs int64) *memSlots {
	s := b.slots[key]
	if s != nil && s.expireAt > 0 && s.expireAt <= nowMs {
		delete(b.slots, key)
		return nil
	}
	return s
}

// advance brings s to now (never backward) and drops expired slots.
func (s *memSlots) advance(nowMs int64) int64 {
	now := max(nowMs, s.t)
	s.t = now
	for id, e := range s.slots {
		if e <= now {
			delete(s.slots, id)
			if s.holders[HolderOf(id)] == id {
				delete(s.holders, HolderOf(id))
			}
		}
	}
	return now
}

// InstallSlots installs a slot share as slots.lua's install does.
func (b *Mem) InstallSlots(in SlotInstall) (SlotInstallResult, error) {
	if !in.Share.Valid() || in.ExpireAtMs < in.Share.DeadlineMs {
		return SlotInstallResult{}, errMem
	}
	if in.ExpireAtMs <= in.NowMs {
		s := b.slotSet(in.Key, in.NowMs)
		var held int64
		if s != nil {
			s.advance(in.NowMs)
			held = int64(len(s.slots))
		}
		return SlotInstallResult{Status: ShareRefusedKeyExpiry, Held: held}, nil
	}
	s := b.slotSet(in.Key, in.NowMs)
	if s == nil {
		s = &memSlots{slots: map[string]int64{}, holders: map[string]string{}}
		b.slots[in.Key] = s
	}
	now := s.advance(in.NowMs)
	st := ShareInstalled
	if s.share.Seq >= in.Share.Seq && now < s.share.DeadlineMs {
		st = ShareStale
	} else {
		s.share = in.Share
	}
	s.expireAt = max(s.expireAt, in.ExpireAtMs)
	return SlotInstallResult{Status: st, Held: int64(len(s.slots))}, nil
}

// AcquireSlot takes a slot for holder for ttlMs, as slots.lua's acquire.
func (b *Mem) AcquireSlot(key SlotKey, holder string, ttlMs, nowMs int64) (SlotAcquireResult, error) {
	if holder == "" || strings.ContainsRune(holder, '~') || ttlMs <= 0 {
		return SlotAcquireResult{}, errMem
	}
	s := b.slotSet(key, nowMs)
	if s == nil {
		return SlotAcquireResult{}, nil
	}
	now := s.advance(nowMs)
	r := SlotAcquireResult{N: s.share.N, DeadlineMs: s.share.DeadlineMs}
	if now >= s.share.DeadlineMs {
		r.N, r.DeadlineMs = 0, 0
	}
	if id, ok := s.holders[holder]; ok {
		r.Allowed, r.SlotID, r.ExpiresInMs, r.Held = true, id, s.slots[id]-now, int64(len(s.slots))
		return r, nil
	}
	held := int64(len(s.slots))
	if r.N == 0 || held >= s.share.Admit {
		r.Held = held
		if r.N > 0 {
			first := int64(-1)
			for _, e := range s.slots {
				if first < 0 || e < first {
					first = e
				}
			}
			r.RetryMs = max(first-now, 0)
		}
		return r, nil
	}
	s.gen++
	id := holder + "~" + strconv.FormatInt(s.gen, 10)
	e := min(now+ttlMs, s.share.DeadlineMs)
	s.slots[id], s.holders[holder] = e, id
	r.Allowed, r.SlotID, r.ExpiresInMs, r.Held = true, id, e-now, held+1
	return r, nil
}

// HeartbeatSlot extends a held slot as slots.lua's heartbeat.
func (b *Mem) HeartbeatSlot(key SlotKey, slotID string, ttlMs, nowMs int64) (SlotHeartbeatResult, error) {
	if slotID == "" || ttlMs <= 0 {
		return SlotHeartbeatResult{}, errMem
	}
	s := b.slotSet(key, nowMs)
	if s == nil {
		return SlotHeartbeatResult{}, nil
	}
	now := s.advance(nowMs)
	e, ok := s.slots[slotID]
	if !ok {
		return SlotHeartbeatResult{}, nil
	}
	target := min(now+ttlMs, s.share.DeadlineMs)
	if target > e {
		var after int64
		for id, o := range s.slots {
			if id != slotID && o > e {
				after++
			}
		}
		if after < s.share.N {
			e = target
			s.slots[slotID] = e
		}
	}
	return SlotHeartbeatResult{Held: true, ExpiresInMs: e - now}, nil
}

// ReleaseSlot frees a held slot as slots.lua's release: false when it was
// not held.
func (b *Mem) ReleaseSlot(key SlotKey, slotID string, nowMs int64) (bool, error) {
	if slotID == "" {
		return false, errMem
	}
	s := b.slotSet(key, nowMs)
	if s == nil {
		return false, nil
	}
	s.advance(nowMs)
	if _, ok := s.slots[slotID]; !ok {
		return false, nil
	}
	delete(s.slots, slotID)
	if s.holders[HolderOf(slotID)] == slotID {
		delete(s.holders, HolderOf(slotID))
	}
	return true, nil
}

// HeldSlots lists the held slots of key at now, sorted (for tests and
// status).
func (b *Mem) HeldSlots(key SlotKey, nowMs int64) []string {
	s := b.slotSet(key, nowMs)
	if s == nil {
		return nil
	}
	s.advance(nowMs)
	out := make([]string, 0, len(s.slots))
	for id := range s.slots {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
