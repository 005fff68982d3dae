package core

import (
	"time"

	"leasehold/lease"
	"leasehold/regionagent/store"
)

// Mode is a limit's mode (see the architecture brief: strict or bounded).
type Mode int8

// Modes, numbered as in the protocol.
const (
	ModeStrict  Mode = 1
	ModeBounded Mode = 2
)

// FallbackKind is what a region does when it cannot get leases.
type FallbackKind int8

// Fallback kinds, numbered as in the protocol (the agent's fallback gauge
// exports these numbers).
const (
	// FallbackClosed denies (UNAVAILABLE). The zero value of Fallback is
	// closed too.
	FallbackClosed FallbackKind = 1
	// FallbackLocal admits at most Fallback.LocalTokens per window in the
	// region, counted in the region's shared store.
	FallbackLocal FallbackKind = 2
	// FallbackOpen admits everything (counted).
	FallbackOpen FallbackKind = 3
)

// Fallback is one region's fail mode for a limit.
type Fallback struct {
	Kind        FallbackKind // 0 counts as FallbackClosed
	LocalTokens int64        // FallbackLocal: A, the tokens admitted per window
}

func (f Fallback) kind() FallbackKind {
	if f.Kind == 0 {
		return FallbackClosed
	}
	return f.Kind
}

// Limit is what the Core needs of a limit, for its own region.
type Limit struct {
	ID     string
	Tokens int64         // G per window
	Window time.Duration // W
	// Phase is the windows' phase offset φ (0 <= φ < W): window k is [k x
	// W + φ, (k+1) x W + φ) on the allocator's clock. 0: epoch-aligned.
	Phase time.Duration
	// Cal, when its Loc is set, gives the limit calendar windows (a day,
	// week, month or year in a zone) instead: Window and Phase are then
	// 0, and each window has its own length (Windows().Of(t).Length).
	Cal lease.Calendar
	TTL time.Duration // lease ttl (<= W)
	// Standing is the region's standing share of every window: tokens the
	// allocator counts as granted to the region from the window's start
	// (lease.StandingLeaseID names it). 0: none.
	Standing int64
	Mode     Mode
	Fallback Fallback // this region's
	Version  int64
	Regions  int // how many regions share G
	// HashTag places the limit's keys in the region's store ("" or the
	// id: the id is its tag). Limits checked together must share one when
	// the store is a Redis Cluster (Config.SameSlotRequired).
	HashTag string
	// SettleGrace is how long a settle-later decision can be settled;
	// CarryDebt carries a settlement overrun into the next window.
	SettleGrace time.Duration
	CarryDebt   bool
	// Shadow: the limit is tried, not enforced. Its Checks are decided as
	// if enforced, then admitted; one that would have been denied says so
	// (Answer.WouldDeny) and is counted in the window's CounterWouldDeny.
	Shadow bool
	// Plan names the plan the limit was resolved from ("" for a limit of
	// the snapshot).
	Plan string
	// A bucket limit (Rate > 0: IsBucket) admits Rate tokens per
	// RatePeriod with bursts of Burst, all regions together, from rate
	// shares (bucket.go); Tokens and Window are then 0.
	Rate       int64
	RatePeriod time.Duration
	Burst      int64
	// A concurrency limit (Slots > 0: IsConcurrency) holds at most Slots
	// (N) at once, all regions together, from slot shares (slots.go);
	// Tokens and Window are then 0, and TTL is the share ttl. Checks and
	// sub-leases of it are refused: it is acquired, not checked.
	Slots int64
}

// Windows is the limit's window schedule (W and φ): every window of the
// limit is named from it.
func (l *Limit) Windows() lease.Windows {
	if l.Cal.Loc != nil {
		return lease.CalendarWindows(l.Cal)
	}
	return lease.WindowsOf(l.Window, l.Phase)
}

// lengthOf is the length of w, a window of l, for an answer's Window: a
// calendar window's own length, W for fixed windows (also when w was not
// named).
func (l *Limit) lengthOf(w lease.Window) time.Duration {
	if l.Cal.Loc != nil {
		return w.Length
	}
	return l.Window
}

// Tag is the limit's effective hash tag: HashTag, or the id.
func (l *Limit) Tag() string {
	if l.HashTag == "" {
		return l.ID
	}
	return l.HashTag
}

// key names the limit's bucket of window in a store.
func (l *Limit) key(window int64) store.Key {
	k := store.Key{Limit: l.ID, Window: window}
	if l.HashTag != l.ID {
		k.HashTag = l.HashTag
	}
	return k
}

// prior is the demand assumed for a limit before any is observed: the
// contract rate G/W shared by its regions. It sizes only the first lease.
// A calendar limit's windows have no one length: its prior is G over the
// unit's nominal length (a month: 30 days), close enough for a first
// lease, which the observed demand replaces at once.
func (l *Limit) prior() float64 {
	if l.Cal.Loc != nil {
		return float64(l.Tokens) / l.Cal.Unit.Nominal().Seconds() / float64(max(1, l.Regions))
	}
	if l.IsBucket() && l.RatePeriod > 0 {
		return float64(l.Rate) / l.RatePeriod.Seconds() / float64(max(1, l.Regions))
	}
	if l.Window <= 0 {
		return 0
	}
	return float64(l.Tokens) / l.Window.Seconds() / float64(max(1, l.Regions))
}

// Store names where a Check spends and a lease is deposited.
type Store uint8

const (
	// Shared is the region's store (Redis), shared by every replica.
	Shared Store = iota
	// Local is this replica's in-process store, used while Redis is down:
	// leases it acquires for itself and spends alone.
	Local
)

func (s Store) String() string {
	if s == Local {
		return "local"
	}
	return "shared"
}

// Reason says why a Check was answered as it was (numbered as in the
// protocol's Reason).
type Reason int8

// Reasons.
const (
	// ReasonOK: the region's leases paid for the request.
	ReasonOK Reason = 1
	// ReasonOverLimit: the window's global pool is spent, or this region's
	// demand-weighted share of it, or a local fallback's allowance.
	ReasonOverLimit Reason = 2
	// ReasonUnavailable: the agent cannot decide (not synced, allocator
	// unreachable under a closed fallback, no lease in time); retry soon.
	ReasonUnavailable Reason = 3
	// ReasonFallback: admitted under a local or open fallback.
	ReasonFallback Reason = 4
)

// Result names a Check's outcome for the agent's metrics.
type Result string

// Results.
const (
	ResultOK             Result = "ok"
	ResultOverLimit      Result = "over_limit"
	ResultUnavailable    Result = "unavailable"
	ResultFallback       Result = "fallback"
	ResultFallbackDenied Result = "fallback_denied"
	ResultStoreError     Result = "redis_error"
	ResultNotSynced      Result = "not_synced"
	// ResultWouldDeny: admitted although enforcement would have denied it
	// (its limits in shadow mode).
	ResultWouldDeny Result = "would_deny"
)
