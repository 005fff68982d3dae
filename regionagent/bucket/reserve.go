package bucket

import (
	"context"
	"fmt"
	"strings"

	"leasehold/regionagent/store"
)

// The outcomes of reservations and releases are package store's (a batch
// of spends carries them: SpendOp.Reserve, SpendOp.Release); these names
// keep this package's API.
type (
	ReserveStatus = store.ReserveStatus
	Reservation   = store.Reservation
	ReleaseStatus = store.ReleaseStatus
	ReleaseResult = store.ReleaseResult
)

// Outcomes of Reserve and Release (see store.ReserveStatus and
// store.ReleaseStatus).
const (
	NotEnough           = store.NotEnough
	Reserved            = store.Reserved
	ReplayedReservation = store.ReplayedReservation
	AlreadyReleased     = store.AlreadyReleased
	Released            = store.Released
	ReleasedBefore      = store.ReleasedBefore
	UnknownReservation  = store.UnknownReservation
)

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
	op := ReserveOp{Key: key, ID: id, Want: want, Min: min, LastMs: lastMs, GraceMs: graceMs, NowMs: nowMs}
	if err := op.validate(); err != nil {
		return Reservation{}, err
	}
	v, err := b.eval(ctx, reserveScript, op.keys(), op.args()...)
	if err != nil {
		return Reservation{}, err
	}
	return parseReserve(v)
}

// ReserveOp is a reservation's arguments (Buckets.ReserveLasting's, with
// GraceMs > 0 ReserveToSettle's), as one op of a batch of spends
// (SpendOp.Reserve).
type ReserveOp struct {
	Key, ID         string
	Want, Min       int64
	LastMs, GraceMs int64
	NowMs           int64 // 0: Redis TIME
}

func (op *ReserveOp) validate() error {
	switch {
	case op.LastMs < 0 || !checkInt(op.LastMs):
		return invalid("last %d", op.LastMs)
	case op.GraceMs < 0 || !checkInt(op.GraceMs):
		return invalid("settle grace %d", op.GraceMs)
	case op.Key == "":
		return invalid("empty key")
	case op.ID == "" || strings.Contains(op.ID, ":") || len(op.ID) > 200:
		return invalid("reservation id %q", op.ID)
	case op.Want < 1 || op.Min < 1 || op.Min > op.Want || !checkInt(op.Want):
		return invalid("want %d, min %d", op.Want, op.Min)
	case op.NowMs < 0 || !checkInt(op.NowMs):
		return invalid("now %d", op.NowMs)
	}
	return nil
}

func (op *ReserveOp) keys() []string { return op.appendKeys(nil) }

func (op *ReserveOp) args() []any {
	return []any{op.NowMs, op.ID, op.Want, op.Min, op.LastMs, op.GraceMs}
}

func (op *ReserveOp) bucketKey() string { return op.Key }

func (op *ReserveOp) now() int64 { return op.NowMs }

func (op *ReserveOp) appendKeys(keys []string) []string {
	return append(keys, op.Key, RecordsKey(op.Key), RecordsIndexKey(op.Key))
}

func (op *ReserveOp) appendArgs(args []any) []any {
	return append(args, "r", op.ID, op.Want, op.Min, op.LastMs, op.GraceMs)
}

func (op *ReserveOp) result(v any, r *SpendResult) error {
	res, err := parseReserve(v)
	if err == nil {
		*r = SpendResult{Failed: -1, Reserved: res}
	}
	return err
}

// parseReserve parses reserve.lua's reply.
func parseReserve(v any) (Reservation, error) {
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
	op := ReleaseOp{Key: key, ID: id, Unspent: unspent, NowMs: nowMs}
	if err := op.validate(); err != nil {
		return ReleaseResult{}, err
	}
	v, err := b.eval(ctx, releaseScript, op.keys(), op.args()...)
	if err != nil {
		return ReleaseResult{}, err
	}
	return op.parse(v)
}

// ReleaseOp is Release's arguments, as one op of a batch of spends
// (SpendOp.Release).
type ReleaseOp struct {
	Key, ID string
	Unspent int64
	NowMs   int64 // 0: Redis TIME
}

func (op *ReleaseOp) validate() error {
	switch {
	case op.Key == "":
		return invalid("empty key")
	case op.ID == "" || strings.Contains(op.ID, ":") || len(op.ID) > 200:
		return invalid("reservation id %q", op.ID)
	case op.Unspent < 0 || !checkInt(op.Unspent):
		return invalid("unspent %d", op.Unspent)
	case op.NowMs < 0 || !checkInt(op.NowMs):
		return invalid("now %d", op.NowMs)
	}
	return nil
}

func (op *ReleaseOp) keys() []string { return op.appendKeys(nil) }

func (op *ReleaseOp) args() []any { return []any{op.NowMs, op.ID, op.Unspent} }

func (op *ReleaseOp) bucketKey() string { return op.Key }

func (op *ReleaseOp) now() int64 { return op.NowMs }

func (op *ReleaseOp) appendKeys(keys []string) []string {
	return append(keys, op.Key, RecordsKey(op.Key))
}

func (op *ReleaseOp) appendArgs(args []any) []any { return append(args, "l", op.ID, op.Unspent) }

func (op *ReleaseOp) result(v any, r *SpendResult) error {
	res, err := op.parse(v)
	if err == nil {
		*r = SpendResult{Failed: -1, Released: res}
	}
	return err
}

// parse parses release.lua's reply to op.
func (op *ReleaseOp) parse(v any) (ReleaseResult, error) {
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
		return ReleaseResult{}, fmt.Errorf("%w: unspent %d", ErrUnspentTooLarge, op.Unspent)
	case st < 1 || st > 3:
		return ReleaseResult{}, fmt.Errorf("%w: release status %d", ErrBadReply, st)
	}
	r.Status = ReleaseStatus(st)
	return r, nil
}

// SubLeasePrefix marks the lease a released reservation's unspent tokens
// return as (see [store.SubLeasePrefix]).
const SubLeasePrefix = store.SubLeasePrefix
