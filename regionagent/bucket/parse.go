package bucket

import (
	"fmt"
	"math"
	"strconv"
)

// Script replies are flat arrays of integers (and, in balance replies, ids
// and counter names). The parsers below take go-redis's generic reply value,
// check its shape with type switches (no reflection) and never panic on any
// input: a reply of another shape is ErrBadReply.

// replyArray returns v as an array of exactly n elements (any length if n < 0).
func replyArray(v any, n int) ([]any, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T, want array", ErrBadReply, v)
	}
	if n >= 0 && len(a) != n {
		return nil, fmt.Errorf("%w: %d elements, want %d", ErrBadReply, len(a), n)
	}
	return a, nil
}

// asInt returns v as an integer: go-redis gives Lua numbers as int64.
func asInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%w: %T %v, want integer", ErrBadReply, v, v)
}

// asString returns v as a string (lease ids, counter names).
func asString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	}
	return "", fmt.Errorf("%w: %T, want string", ErrBadReply, v)
}

// asBool returns a 0/1 flag.
func asBool(v any) (bool, error) {
	n, err := asInt(v)
	if err != nil {
		return false, err
	}
	switch n {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("%w: flag %d", ErrBadReply, n)
}

// ints fills dst from a, which must have len(dst) elements.
func ints(a []any, dst ...*int64) error {
	for i, p := range dst {
		n, err := asInt(a[i])
		if err != nil {
			return err
		}
		*p = n
	}
	return nil
}

// parseDeposit parses {status, balance}.
func parseDeposit(v any) (DepositResult, error) {
	a, err := replyArray(v, 2)
	if err != nil {
		return DepositResult{}, err
	}
	var status, bal int64
	if err := ints(a, &status, &bal); err != nil {
		return DepositResult{}, err
	}
	if status < int64(Deposited) || status > int64(RefusedKeyExpiry) {
		return DepositResult{}, fmt.Errorf("%w: deposit status %d", ErrBadReply, status)
	}
	return DepositResult{Status: DepositStatus(status), Balance: bal}, nil
}

// parseSpend parses the reply of a one-spend call into a SpendResult whose
// Keys use dst (len(dst) is the spend's key count).
func parseSpend(v any, dst []KeyResult) (SpendResult, error) {
	a, err := replyArray(v, 1+keyFields*len(dst))
	if err != nil {
		return SpendResult{}, err
	}
	r, _, err := parseSpendAt(a, 0, dst)
	return r, err
}

// parseSpendCall parses the reply of a call deciding the batch's spends
// idx, in order, into res[idx[k]] (whose Keys are preallocated).
func parseSpendCall(v any, idx []int, res []SpendResult) error {
	want := 0
	for _, i := range idx {
		want += 1 + keyFields*len(res[i].Keys)
	}
	a, err := replyArray(v, want)
	if err != nil {
		return err
	}
	off := 0
	for _, i := range idx {
		r, next, err := parseSpendAt(a, off, res[i].Keys)
		if err != nil {
			return err
		}
		res[i], off = r, next
	}
	return nil
}

// keyFields is the number of reply fields per key of a spend.
const keyFields = 6

// parseSpendAt parses one spend, {failed, (allowed, balance, earliest,
// admitted, denied, spent) x n}, starting at a[off], into dst (len(dst) == n). It
// returns the offset after it.
func parseSpendAt(a []any, off int, dst []KeyResult) (SpendResult, int, error) {
	n := len(dst)
	if off < 0 || off > len(a) || len(a)-off < 1+keyFields*n {
		return SpendResult{}, 0, fmt.Errorf("%w: spend reply too short", ErrBadReply)
	}
	failed, err := asInt(a[off])
	if err != nil {
		return SpendResult{}, 0, err
	}
	if failed < 0 || failed > int64(n) {
		return SpendResult{}, 0, fmt.Errorf("%w: failed index %d of %d keys", ErrBadReply, failed, n)
	}
	for i := range dst {
		j := off + 1 + keyFields*i
		ok, err := asBool(a[j])
		if err != nil {
			return SpendResult{}, 0, err
		}
		k := KeyResult{Allowed: ok}
		if err := ints(a[j+1:j+5], &k.Balance, &k.EarliestDeadlineMs, &k.Admitted, &k.Denied); err != nil {
			return SpendResult{}, 0, err
		}
		if k.PoolSpent, err = asBool(a[j+5]); err != nil {
			return SpendResult{}, 0, err
		}
		dst[i] = k
	}
	return SpendResult{Allowed: failed == 0, Failed: int(failed) - 1, Keys: dst}, off + 1 + keyFields*n, nil
}

// parseClose parses {unspent, already_closed, unknown, balance}.
func parseClose(v any) (CloseResult, error) {
	a, err := replyArray(v, 4)
	if err != nil {
		return CloseResult{}, err
	}
	var r CloseResult
	if err := ints(a[:1], &r.Unspent); err != nil {
		return CloseResult{}, err
	}
	if r.AlreadyClosed, err = asBool(a[1]); err != nil {
		return CloseResult{}, err
	}
	if r.Unknown, err = asBool(a[2]); err != nil {
		return CloseResult{}, err
	}
	if err := ints(a[3:], &r.Balance); err != nil {
		return CloseResult{}, err
	}
	return r, nil
}

// parseBalance parses {spendable, live, earliest, pending, admitted, denied,
// n_counters, (name, value)..., n_expired, (id, remaining)...}.
func parseBalance(v any) (BalanceResult, error) {
	a, err := replyArray(v, -1)
	if err != nil {
		return BalanceResult{}, err
	}
	const head = 7
	if len(a) < head+1 {
		return BalanceResult{}, fmt.Errorf("%w: %d elements in balance reply", ErrBadReply, len(a))
	}
	var r BalanceResult
	var live, nc int64
	if err := ints(a[:head], &r.Spendable, &live, &r.EarliestDeadlineMs, &r.Pending, &r.Admitted, &r.Denied, &nc); err != nil {
		return BalanceResult{}, err
	}
	if live < 0 || live > math.MaxInt32 {
		return BalanceResult{}, fmt.Errorf("%w: live %d", ErrBadReply, live)
	}
	r.Live = int(live)
	rest := a[head:]
	if nc < 0 || len(rest) < 1 || nc > int64(len(rest)-1)/2 {
		return BalanceResult{}, fmt.Errorf("%w: %d counters", ErrBadReply, nc)
	}
	if nc > 0 {
		r.Counters = make([]Counter, nc)
		for i := range r.Counters {
			if r.Counters[i].Name, err = asString(rest[2*i]); err != nil {
				return BalanceResult{}, err
			}
			if r.Counters[i].Value, err = asInt(rest[2*i+1]); err != nil {
				return BalanceResult{}, err
			}
		}
	}
	rest = rest[2*nc:]
	ne, err := asInt(rest[0])
	if err != nil {
		return BalanceResult{}, err
	}
	rest = rest[1:]
	if ne < 0 || len(rest) < 1 || ne > (int64(len(rest))-1)/2 {
		return BalanceResult{}, fmt.Errorf("%w: %d expired leases in %d elements", ErrBadReply, ne, len(rest))
	}
	if ne > 0 {
		r.Expired = make([]ExpiredLease, ne)
		for i := range r.Expired {
			if r.Expired[i].ID, err = asString(rest[2*i]); err != nil {
				return BalanceResult{}, err
			}
			if r.Expired[i].Remaining, err = asInt(rest[2*i+1]); err != nil {
				return BalanceResult{}, err
			}
		}
	}
	rest = rest[2*ne:]
	no, err := asInt(rest[0])
	if err != nil {
		return BalanceResult{}, err
	}
	rest = rest[1:]
	if len(rest)%4 != 0 || no != int64(len(rest)/4) {
		return BalanceResult{}, fmt.Errorf("%w: %d open leases in %d elements", ErrBadReply, no, len(rest))
	}
	if no > 0 {
		r.Open = make([]OpenLease, no)
		for i := range r.Open {
			o := &r.Open[i]
			if o.ID, err = asString(rest[4*i]); err != nil {
				return BalanceResult{}, err
			}
			if err := ints(rest[4*i+1:4*i+4], &o.Remaining, &o.StartMs, &o.DeadlineMs); err != nil {
				return BalanceResult{}, err
			}
		}
	}
	return r, nil
}

// parseUsage parses {epoch, (admitted, denied, n, name, value, ...) per window}.
func parseUsage(v any, windows []int64) (string, []WindowCounts, error) {
	a, err := replyArray(v, -1)
	if err != nil {
		return "", nil, err
	}
	if len(a) < 1 {
		return "", nil, fmt.Errorf("%w: empty usage reply", ErrBadReply)
	}
	epoch, err := asString(a[0])
	if err != nil {
		return "", nil, err
	}
	out := make([]WindowCounts, len(windows))
	p := 1
	for i, w := range windows {
		if len(a)-p < 3 {
			return "", nil, fmt.Errorf("%w: usage reply too short", ErrBadReply)
		}
		c := WindowCounts{Window: w}
		var n int64
		if err := ints(a[p:p+3], &c.Admitted, &c.Denied, &n); err != nil {
			return "", nil, err
		}
		p += 3
		if n < 0 || n > int64(len(a)-p)/2 {
			return "", nil, fmt.Errorf("%w: usage reply: %d counters", ErrBadReply, n)
		}
		for range n {
			name, err := asString(a[p])
			if err != nil {
				return "", nil, err
			}
			val, err := asInt(a[p+1])
			if err != nil {
				return "", nil, err
			}
			c.Counters = append(c.Counters, Counter{Name: name, Value: val})
			p += 2
		}
		out[i] = c
	}
	if p != len(a) {
		return "", nil, fmt.Errorf("%w: usage reply: %d trailing elements", ErrBadReply, len(a)-p)
	}
	return epoch, out, nil
}
