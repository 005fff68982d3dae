// Package store is the vocabulary of a region's lease store, and an
// in-memory store with the Redis scripts' semantics.
//
// A store keeps, per (limit, window) — a [Key] —, the leases deposited for
// it (remaining tokens, start, deadline), the leases closed, and the
// window's cost counters. Spends take tokens from the leases that are
// spendable at now (start <= now < deadline, not closed), earliest
// deadline first, all or nothing; a closed lease is never spent again.
// Package bucket keeps a region's shared store in Redis (Lua scripts);
// [Mem] is the same semantics in memory, for the agent's in-process store
// while Redis is down and for the simulator. The agent core (package
// regionagent/core) reads these types as the results of the actions it
// asks for.
//
// A bucket limit's region keeps one token bucket per limit instead
// ([RateKey], rate.go): its rate share refills it, spends take from it,
// with the semantics of lease.TokenBucket.
//
// Standard library and package lease only; no I/O; every operation takes
// now as an argument (milliseconds on the store's own clock).
package store

import (
	"errors"
	"strconv"
)

// ErrCrossSlot reports a call whose keys a store cannot take in one
// atomic call: a Redis Cluster's CROSSSLOT (keys of different hash tags,
// in different slots). Retrying never helps; the keys must share a hash
// tag.
var ErrCrossSlot = errors.New("store: keys in different slots")

// Key names one bucket: the leases and counters of one (limit, window).
// HashTag is the limit's hash tag, "" when it has none of its own (the id
// is its tag): it places the bucket in the region's Redis (package bucket,
// Key), and limits that share one can be spent together on Redis Cluster.
type Key struct {
	Limit   string
	Window  int64
	HashTag string
}

// CounterPoolSpent is the counter an agent replica sets in a window's
// bucket when the allocator answered that the window's pool is spent, so
// that every replica's spends report it ([KeyResult.PoolSpent]) and answer
// over-limit until the window's reset.
const CounterPoolSpent = "pool_spent"

// Other counters an agent keeps per window beside admitted and denied.
const (
	// CounterFallback is the cost admitted under a fallback mode (local or
	// open) while the region could not get leases.
	CounterFallback = "fallback_admitted"
	// CounterModeLocal and CounterModeOpen are set when the fallback mode
	// local or open was in force during the window.
	CounterModeLocal = "mode_local"
	CounterModeOpen  = "mode_open"
	// CounterReleased is the tokens of sub-lease reservations that came
	// back unspent: admitted counts them from the reservation on, so what
	// was admitted is admitted minus released. (Every counter only grows.)
	CounterReleased = "released"
	// CounterSettleOverrun is the cost settle-later decisions admitted
	// beyond the window's leases when settled (bucket's settle.lua):
	// the window's settlement term.
	CounterSettleOverrun = "settle_overrun"
	// CounterWouldDeny and CounterWouldDenyChecks are, for a limit in
	// shadow mode, the cost and the number of the Checks admitted although
	// enforcement would have denied them (not in admitted).
	CounterWouldDeny       = "would_deny"
	CounterWouldDenyChecks = "would_deny_checks"
)

// SubLeasePrefix marks the lease that a released sub-lease reservation's
// unspent tokens go back as: it is no allocator lease, and is never
// returned to the allocator.
const SubLeasePrefix = "sub:"

// DepositStatus says what a deposit did.
type DepositStatus int

const (
	// Deposited: the lease was stored.
	Deposited DepositStatus = 1
	// AlreadyDeposited: a lease with this id was there; nothing changed.
	AlreadyDeposited DepositStatus = 2
	// RefusedClosed: the lease was closed before (possibly as unknown); its
	// tokens were settled and must not become spendable.
	RefusedClosed DepositStatus = 3
	// RefusedKeyExpiry: ExpireAtMs is not after the store's current time
	// (Redis: TIME, whatever NowMs says); nothing was written, since PEXPIREAT in
	// the past would delete the bucket.
	RefusedKeyExpiry DepositStatus = 4
)

func (s DepositStatus) String() string {
	switch s {
	case Deposited:
		return "deposited"
	case AlreadyDeposited:
		return "already-deposited"
	case RefusedClosed:
		return "refused-closed"
	case RefusedKeyExpiry:
		return "refused-key-expiry"
	}
	return "DepositStatus(" + strconv.Itoa(int(s)) + ")"
}

// DepositResult is the outcome of a deposit.
type DepositResult struct {
	Status  DepositStatus
	Balance int64 // spendable tokens of the bucket at now, after the deposit
}

// KeyResult is one key's part of a spend.
type KeyResult struct {
	// Allowed: this key had enough spendable tokens for its cost (the spend
	// as a whole may still be denied by another key).
	Allowed bool
	// Balance is the key's spendable tokens after the spend.
	Balance int64
	// EarliestDeadlineMs is the earliest deadline (store ms) among the key's
	// remaining spendable tokens, 0 if none: when the agent must have renewed.
	EarliestDeadlineMs int64
	// Admitted and Denied are the key's cost counters after the spend: the
	// region's admissions and demand in the window so far, every replica
	// included. The agent estimates demand from them without reading the
	// bucket again.
	Admitted, Denied int64
	// PoolSpent: the key's CounterPoolSpent is set, i.e. some replica
	// learned from the allocator that the window's pool is spent.
	PoolSpent bool
}

// ReserveStatus says what a reservation did.
type ReserveStatus int

// Outcomes of a reservation (bucket.Buckets.Reserve).
const (
	// NotEnough: fewer than min tokens were spendable (in leases lasting
	// lastMs, for ReserveLasting); nothing was taken.
	NotEnough ReserveStatus = 0
	// Reserved: tokens were taken now.
	Reserved ReserveStatus = 1
	// ReplayedReservation: the id was reserved before; the same answer.
	ReplayedReservation ReserveStatus = 2
	// AlreadyReleased: the id was released before; nothing was taken.
	AlreadyReleased ReserveStatus = 3
)

// Reservation is the outcome of a reservation (bucket.Buckets.Reserve).
type Reservation struct {
	Granted    int64 // tokens taken (0 unless Reserved or ReplayedReservation)
	DeadlineMs int64 // Redis ms: no token may be spent at or after it
	Balance    int64 // spendable tokens left in the bucket
	NowMs      int64 // the script's now (Redis TIME unless given)
	Status     ReserveStatus
}

// ReleaseStatus says what a release did.
type ReleaseStatus int

// Outcomes of a release (bucket.Buckets.Release).
const (
	// Released: the reservation ended now.
	Released ReleaseStatus = 1
	// ReleasedBefore: it had ended before; Returned is what it returned then.
	ReleasedBefore ReleaseStatus = 2
	// UnknownReservation: no such reservation in this bucket.
	UnknownReservation ReleaseStatus = 3
)

// ReleaseResult is the outcome of a release (bucket.Buckets.Release).
type ReleaseResult struct {
	Returned int64 // tokens back in the bucket (0 after the deadline)
	Status   ReleaseStatus
}

// SpendResult is the outcome of one all-or-nothing spend.
type SpendResult struct {
	// Allowed: every key paid its cost. Otherwise nothing was charged.
	Allowed bool
	// Failed is the index of the first key that lacked tokens, -1 if none.
	Failed int
	// Keys has one entry per key, in order.
	Keys []KeyResult
	// Err is set only by a batch of spends (bucket.SpendBatch), for an op
	// that was not decided (invalid, or its script call failed). Allowed is then false, Failed
	// -1 and Keys nil.
	Err error
	// Take is a take's result, for a take in a batch of spends
	// (bucket.SpendOp.Take); Allowed is then Take.Allowed.
	Take TakeResult
	// Reserved and Released are a reservation's and a release's results,
	// for those ops in a batch of spends (bucket.SpendOp.Reserve and
	// .Release); Allowed is then false and Failed -1.
	Reserved Reservation
	Released ReleaseResult
	// Deposited is, for a spend that carried a deposit (bucket.SpendOp's
	// Deposit: made before the batch's spends, in the same pipeline), the
	// deposit's result, or DepositErr when the deposit was not decided;
	// the spend's own result is in the fields above either way.
	Deposited  DepositResult
	DepositErr error
}

// CloseResult is the outcome of closing a lease.
type CloseResult struct {
	// Unspent is what the lease had left when it was first closed; every
	// retry returns the same amount.
	Unspent int64
	// AlreadyClosed: an earlier call closed the lease; count Unspent once,
	// on the call where AlreadyClosed is false.
	AlreadyClosed bool
	// Unknown: the lease was never deposited here; it is now recorded as
	// closed with 0, so a late deposit of it is refused.
	Unknown bool
	// Balance is the bucket's spendable tokens at now, after the close.
	Balance int64
}

// Counter is a named per-window counter.
type Counter struct {
	Name  string
	Value int64
}

// ExpiredLease is a lease past its deadline that nobody closed yet.
type ExpiredLease struct {
	ID        string
	Remaining int64
}

// BalanceResult describes a bucket at now.
type BalanceResult struct {
	Spendable          int64 // tokens of leases with start <= now < deadline
	Live               int   // number of such leases, drained ones included
	EarliestDeadlineMs int64 // earliest deadline among spendable tokens, 0 if none
	Pending            int64 // tokens of leases that start after now
	Admitted           int64 // cost admitted in this window
	Denied             int64 // cost denied in this window
	// Counters are the other counters (AddCounter), sorted by name.
	Counters []Counter
	// Expired are leases with deadline <= now, not closed yet, sorted by
	// (deadline, id): the agent closes them and returns their tokens.
	Expired []ExpiredLease
	// Open are the leases with now < deadline, started or pending, sorted
	// by (deadline, id): what the region holds, lease by lease.
	Open []OpenLease
}

// OpenLease is a lease that has not reached its deadline.
type OpenLease struct {
	ID         string
	Remaining  int64
	StartMs    int64
	DeadlineMs int64
}

// Lasting returns the tokens spendable at nowMs that are still spendable
// at nowMs+horizonMs: what the region can count on for that long.
func (r BalanceResult) Lasting(nowMs, horizonMs int64) int64 {
	var n int64
	for _, o := range r.Open {
		if o.StartMs <= nowMs && o.DeadlineMs > nowMs+horizonMs {
			n += o.Remaining
		}
	}
	return n
}

// FallbackAdd is one key's part of a fallback admission: Cost added to
// its CounterFallback unless that would pass Cap (a local:A fallback's A;
// 0 for none), and Mode (CounterModeLocal, CounterModeOpen, or "") marked
// as in force during the window. An admission is all or nothing.
type FallbackAdd struct {
	Key  Key
	Cost int64
	Cap  int64
	Mode string
}
