package bucket

import (
	"context"
	"fmt"
	"strings"
)

// SettleStatus says what a settle did.
type SettleStatus int

// Outcomes of Settle.
const (
	// Settled: the decision was settled now.
	Settled SettleStatus = 1
	// SettledBefore: it was settled before with the same actual cost; the
	// result is the first settle's.
	SettledBefore SettleStatus = 2
	// UnknownDecision: no such settle-later decision in this bucket (never
	// made, released, or its key has expired).
	UnknownDecision SettleStatus = 3
	// SettleTooLate: its settle-by time has passed; nothing changed.
	SettleTooLate SettleStatus = 4
	// SettledOtherwise: it was settled before with another actual cost;
	// the result is the first settle's, nothing changed.
	SettledOtherwise SettleStatus = 5
)

// Settlement is the outcome of Settle.
type Settlement struct {
	Status   SettleStatus
	Estimate int64 // what the decision charged
	Charged  int64 // extra taken from the window's leases
	Refunded int64 // tokens given back to the window's balance
	// Overrun is the extra the window's leases could not hold: admitted
	// beyond the window's leases (its settlement term).
	Overrun int64
	// Debt is the part of Overrun carried into the next window.
	Debt int64
}

// Settle settles decision id of the bucket key (a ReserveToSettle) with
// its actual cost: the difference with the estimate is charged to the
// window or refunded; an overrun beyond the window's leases is carried as
// debt into nextKey (the next window's bucket of the same limit) when
// carry is set. Idempotent by id. settle.lua says how.
func (b *Buckets) Settle(ctx context.Context, key, nextKey, id string, actual int64, carry bool, nowMs int64) (Settlement, error) {
	switch {
	case key == "" || nextKey == "" || key == nextKey:
		return Settlement{}, invalid("keys %q, %q", key, nextKey)
	case id == "" || strings.Contains(id, ":") || len(id) > 200:
		return Settlement{}, invalid("decision id %q", id)
	case actual < 0 || !checkInt(actual):
		return Settlement{}, invalid("actual %d", actual)
	case nowMs < 0 || !checkInt(nowMs):
		return Settlement{}, invalid("now %d", nowMs)
	}
	c := 0
	if carry {
		c = 1
	}
	v, err := b.eval(ctx, settleScript, []string{key, nextKey, RecordsKey(key)}, nowMs, id, actual, c, b.ttlArg)
	if err != nil {
		return Settlement{}, err
	}
	a, err := replyArray(v, 6)
	if err != nil {
		return Settlement{}, err
	}
	var r Settlement
	var st int64
	if err := ints(a, &st, &r.Estimate, &r.Charged, &r.Refunded, &r.Overrun, &r.Debt); err != nil {
		return Settlement{}, err
	}
	if st < 1 || st > 5 {
		return Settlement{}, fmt.Errorf("%w: settle status %d", ErrBadReply, st)
	}
	r.Status = SettleStatus(st)
	return r, nil
}
