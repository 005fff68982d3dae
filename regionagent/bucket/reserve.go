package bucket

import (
	"context"
	"fmt"
	"strings"

	"leasehold/regionagent/store"
)

// ReserveStatus says what a reservation did.
type ReserveStatus int

// Outcomes of Reserve.
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

// Reservation is the outcome of Reserve.
type Reservation struct {
	Granted    int64 // tokens taken (0 unless Reserved or ReplayedReservation)
	DeadlineMs int64 // Redis ms: no token may be spent at or after it
	Balance    int64 // spendable tokens left in the bucket
	NowMs      int64 // the script's now (Redis TIME unless given)
	Status     ReserveStatus
}

// Reserve takes up to want (at least min) tokens of a bucket for one
// client to spend in process, earliest deadline first. The reservation's
// deadline is that of the first lease taken from: never later than any
// lease its tokens came from. Taken tokens count as admitted until
// Release gives the unspent back. Idempotent by id.
func (b *Buckets) Reserve(ctx context.Context, key, id string, want, min, nowMs int64) (Reservation, error) {
	return b.ReserveLasting(ctx, key, id, want, min, 0, nowMs)
}

// ReserveLasting is Reserve taking only from leases that last at least
// lastMs more, and nothing (NotEnough) when those hold fewer than min: a
// reservation taken from a lease about to end would have to be given back
// before its holder could spend it, and lost to the window if that lease
// closed first; Checks spend those leases' last moments.
func (b *Buckets) ReserveLasting(ctx context.Context, key, id string, want, min, lastMs, nowMs int64) (Reservation, error) {
	return b.reserve(ctx, key, id, want, min, lastMs, 0, nowMs)
}

// ReserveToSettle is Reserve of exactly estimate tokens (or nothing) as a
// settle-later decision: Settle settles it with its actual cost until
// graceMs after the script's now (on Redis's clock, as every settle).
func (b *Buckets) ReserveToSettle(ctx context.Context, key, id string, estimate, graceMs, nowMs int64) (Reservation, error) {
	if graceMs < 1 || !checkInt(graceMs) {
		return Reservation{}, invalid("settle grace %d", graceMs)
	}
	return b.reserve(ctx, key, id, estimate, estimate, 0, graceMs, nowMs)
}

func (b *Buckets) reserve(ctx context.Context, key, id string, want, min, lastMs, graceMs, nowMs int64) (Reservation, error) {
	switch {
	case lastMs < 0 || !checkInt(lastMs):
		return Reservation{}, invalid("last %d", lastMs)
	case key == "":
		return Reservation{}, invalid("empty key")
	case id == "" || strings.Contains(id, ":") || len(id) > 200:
		return Reservation{}, invalid("reservation id %q", id)
	case want < 1 || min < 1 || min > want || !checkInt(want):
		return Reservation{}, invalid("want %d, min %d", want, min)
	case nowMs < 0 || !checkInt(nowMs):
		return Reservation{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, reserveScript, []string{key, RecordsKey(key), RecordsIndexKey(key)}, nowMs, id, want, min, lastMs, graceMs)
	if err != nil {
		return Reservation{}, err
	}
	a, err := replyArray(v, 5)
	if err != nil {
		return Reservation{}, err
	}
	var r Reservation
	var st int64
	if err := ints(a, &r.Granted, &r.DeadlineMs, &r.Balance, &r.NowMs, &st); err != nil {
		return Reservation{}, err
	}
	if st < 0 || st > 3 {
		return Reservation{}, fmt.Errorf("%w: reserve status %d", ErrBadReply, st)
	}
	r.Status = ReserveStatus(st)
	return r, nil
}

// ReleaseStatus says what a release did.
type ReleaseStatus int

// Outcomes of Release.
const (
	// Released: the reservation ended now.
	Released ReleaseStatus = 1
	// ReleasedBefore: it had ended before; Returned is what it returned then.
	ReleasedBefore ReleaseStatus = 2
	// UnknownReservation: no such reservation in this bucket.
	UnknownReservation ReleaseStatus = 3
)

// ReleaseResult is the outcome of Release.
type ReleaseResult struct {
	Returned int64 // tokens back in the bucket (0 after the deadline)
	Status   ReleaseStatus
}

// ErrUnspentTooLarge reports a Release whose unspent tokens exceed what the
// reservation holds. It matches ErrInvalid: the caller's input is wrong,
// and retrying it cannot help.
var ErrUnspentTooLarge = fmt.Errorf("%w: unspent exceeds the reservation", ErrInvalid)

// releaseOutOfRange is release.lua's status for it.
const releaseOutOfRange = 4

// Release ends a reservation: unspent tokens leave the admitted count and,
// before the reservation's deadline, return to the bucket as a lease of
// their own with that deadline. Idempotent by id.
func (b *Buckets) Release(ctx context.Context, key, id string, unspent, nowMs int64) (ReleaseResult, error) {
	switch {
	case key == "":
		return ReleaseResult{}, invalid("empty key")
	case id == "" || strings.Contains(id, ":") || len(id) > 200:
		return ReleaseResult{}, invalid("reservation id %q", id)
	case unspent < 0 || !checkInt(unspent):
		return ReleaseResult{}, invalid("unspent %d", unspent)
	case nowMs < 0 || !checkInt(nowMs):
		return ReleaseResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, releaseScript, []string{key, RecordsKey(key)}, nowMs, id, unspent)
	if err != nil {
		return ReleaseResult{}, err
	}
	a, err := replyArray(v, 2)
	if err != nil {
		return ReleaseResult{}, err
	}
	var r ReleaseResult
	var st int64
	if err := ints(a, &r.Returned, &st); err != nil {
		return ReleaseResult{}, err
	}
	switch {
	case st == releaseOutOfRange:
		return ReleaseResult{}, fmt.Errorf("%w: unspent %d", ErrUnspentTooLarge, unspent)
	case st < 1 || st > 3:
		return ReleaseResult{}, fmt.Errorf("%w: release status %d", ErrBadReply, st)
	}
	r.Status = ReleaseStatus(st)
	return r, nil
}

// SubLeasePrefix marks the lease a released reservation's unspent tokens
// return as (see [store.SubLeasePrefix]).
const SubLeasePrefix = store.SubLeasePrefix
