package core

import (
	"time"

	"leasehold/lease"
)

// Concurrency limits (at most N slots held at once, all regions
// together) are granted to regions as slot shares: n slots (admit <= n
// of them to new acquires) until a deadline. The region's slots live in
// its store (package store's slot set, lua/slots.lua); this file is the
// agent's pure part: when to ask for a share, how much to ask for, and
// the share's deadline, with time as an argument. The shell
// (regionagent/slots.go) carries the calls out.
//
// A share's deadline is measured as a lease's is: from when its request
// was sent, minus the safety margin (Core.Margin), so the region's slots
// end before the allocator gives them to another region. Every slot's
// expiry is capped by the share it was acquired or heartbeated under:
// a region cut off from the allocator loses its slots at the share's
// deadline (strict mode's price), and no more than N are ever held.

// IsConcurrency reports whether l is a concurrency limit (Slots > 0).
func (l *Limit) IsConcurrency() bool { return l.Slots > 0 }

// SlotPlan is what a replica knows of one concurrency limit's slot share.
// The zero value knows no share. Not safe for concurrent use: the shell
// guards it.
type SlotPlan struct {
	Seq, N, Admit int64
	Deadline      time.Time // agent clock; zero: no share
	RenewAt       time.Time // ask again from then on while the limit is used
	Pending       bool      // a request is in flight
	EmptyAt       time.Time // the allocator said nothing was free
	FailedAt      time.Time // the last request failed (refused or unanswered)
	// Denied counts the acquires denied since the last request, sent at
	// AskedAt: the demand beyond what is held.
	Denied  int64
	AskedAt time.Time
	UsedAt  time.Time // the last acquire or heartbeat (Used)
}

// Used records an acquire or a heartbeat at now.
func (p *SlotPlan) Used(now time.Time) { p.UsedAt = later(p.UsedAt, now) }

// Idle reports whether a replica may forget the plan at now: no request
// in flight, no share in force, and no use, request or answer for after.
// Forgetting it loses nothing: with no share in force the region holds
// no slot (every slot's expiry is capped by its share's deadline), its
// seq is only the one to beat until that share ended (Answered takes a
// lower one then), and the next acquire asks for a share as a new
// plan's would. The allocator forgets a tenant of a plan on its side
// too (its seq restarts at 1 once its last share is past the
// retention).
func (p *SlotPlan) Idle(now time.Time, after time.Duration) bool {
	if p.Pending || p.InForce(now) {
		return false
	}
	last := later(later(p.Deadline, p.AskedAt), later(later(p.EmptyAt, p.FailedAt), p.UsedAt))
	return now.Sub(last) >= after
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// SlotRetry is how long a replica waits before asking again after an
// empty or failed answer.
const SlotRetry = 500 * time.Millisecond

// InForce reports whether the plan's share may be used at now.
func (p *SlotPlan) InForce(now time.Time) bool { return !p.Deadline.IsZero() && now.Before(p.Deadline) }

// ShouldAsk reports whether a replica should ask for the limit's next
// share at now: none in force, or the one in force is half through its
// life, and no request in flight, and no empty or failed answer within
// SlotRetry.
func (p *SlotPlan) ShouldAsk(now time.Time) bool {
	if p.Pending {
		return false
	}
	if !p.EmptyAt.IsZero() && now.Sub(p.EmptyAt) < SlotRetry || !p.FailedAt.IsZero() && now.Sub(p.FailedAt) < SlotRetry {
		return false
	}
	return !p.InForce(now) || !now.Before(p.RenewAt)
}

// Demand is the slots the region wants at now, reported with a request:
// those held, plus the acquires denied since the last request per
// SlotRetry (a rate, not a count: a replica renewing a share it holds asks
// every half share life, one without a share every SlotRetry, and a count
// would weigh the same callers more the longer the region waited between
// requests, keeping slots where they are). The allocator shares N in
// proportion to it.
func (p *SlotPlan) Demand(now time.Time, held int64) float64 {
	waiting := float64(p.Denied)
	if !p.AskedAt.IsZero() {
		if since := now.Sub(p.AskedAt); since > SlotRetry {
			waiting = waiting * float64(SlotRetry) / float64(since)
		}
	}
	return float64(max(held, 0)) + waiting
}

// Asked records a request sent at now: the denials it reported are
// counted.
func (p *SlotPlan) Asked(now time.Time) { p.Pending, p.Denied, p.AskedAt = true, 0, now }

// SlotReply is the allocator's answer to a slot share request.
type SlotReply struct {
	OK            bool // false: refused or unanswered
	Seq, N, Admit int64
	ExpiresIn     time.Duration
}

// Answered records the answer to the request sent at sent (agent clock)
// and answered at recv, with margin the safety margin for its expires_in:
// it returns the share's deadline and true when a share is to be
// installed.
func (p *SlotPlan) Answered(sent, recv time.Time, r SlotReply, margin time.Duration) (time.Time, bool) {
	p.Pending = false
	switch {
	case !r.OK:
		p.FailedAt = recv
		return time.Time{}, false
	case r.N == 0:
		p.EmptyAt, p.FailedAt = recv, time.Time{}
		return time.Time{}, false
	}
	p.EmptyAt, p.FailedAt = time.Time{}, time.Time{}
	d := lease.Deadline(sent, r.ExpiresIn, margin)
	if r.Seq > p.Seq || !p.InForce(recv) {
		p.Seq, p.N, p.Admit, p.Deadline = r.Seq, r.N, r.Admit, d
	}
	p.RenewAt = sent.Add(r.ExpiresIn / 2)
	return d, true
}

// FallbackSlots is the share a region installs in its store when it cannot
// get one from the allocator: with the allocator unreachable (allocDown),
// no share of its own in force (p) and the limit's fallback in this
// region local:A (bounded mode), A slots, every one open to new
// acquires, until now plus the share ttl; ok false otherwise (closed: the
// acquire is UNAVAILABLE). Its seq is the last share's (at least 1), so
// the allocator's next share, whose seq is greater, replaces it at once
// when the allocator answers again; until then it is installed again
// when it ends. A fallback share is the region's own, never counted by
// the allocator: the bound adds A for every region with a local fallback
// (N + the sum of the A's at any instant, docs/overshoot.md), and its
// slots, like any, end with it unless a share from the allocator counts
// them.
func (p *SlotPlan) FallbackSlots(l Limit, allocDown bool, now time.Time) (seq, n int64, deadline time.Time, ok bool) {
	if !allocDown || p.InForce(now) || l.Fallback.kind() != FallbackLocal || l.Fallback.LocalTokens <= 0 {
		return 0, 0, time.Time{}, false
	}
	return max(p.Seq, 1), l.Fallback.LocalTokens, now.Add(l.TTL), true
}
