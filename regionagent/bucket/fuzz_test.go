package bucket

import (
	"errors"
	"testing"
)

// decodeReply turns fuzz bytes into a go-redis-like reply value: arrays of
// integers, strings, nils, floats and nested arrays.
func decodeReply(data []byte, depth int) (any, []byte) {
	if len(data) == 0 {
		return nil, data
	}
	tag, data := data[0], data[1:]
	switch tag % 7 {
	case 0:
		return nil, data
	case 1, 2: // small integer: the common case
		if len(data) == 0 {
			return int64(0), data
		}
		return int64(int8(data[0])), data[1:]
	case 3: // large integer
		var n int64
		for i := 0; i < 8 && len(data) > 0; i++ {
			n = n<<8 | int64(data[0])
			data = data[1:]
		}
		return n, data
	case 4:
		l := 0
		if len(data) > 0 {
			l, data = int(data[0]%12), data[1:]
		}
		l = min(l, len(data))
		return string(data[:l]), data[l:]
	case 5:
		return float64(tag), data
	default:
		if depth > 3 {
			return []any{}, data
		}
		l := 0
		if len(data) > 0 {
			l, data = int(data[0]%40), data[1:]
		}
		a := make([]any, 0, l)
		for range l {
			var v any
			v, data = decodeReply(data, depth+1)
			a = append(a, v)
		}
		return a, data
	}
}

// FuzzParse feeds arbitrary reply values to every parser: none may panic,
// and each either succeeds or fails with ErrBadReply.
func FuzzParse(f *testing.F) {
	f.Add([]byte{6, 4, 1, 2, 1, 1, 1, 5, 1, 9})
	f.Add([]byte{6, 7, 1, 0, 1, 1, 1, 100, 1, 0, 1, 1})
	f.Add([]byte{6, 8, 1, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 4, 2, 'L', '1', 1, 3})
	f.Add([]byte{6, 2, 1, 1, 1, 100})
	f.Add([]byte{3, 255, 255, 255, 255, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, data []byte) {
		v, rest := decodeReply(data, 0)
		n := 1
		if len(rest) > 0 {
			n = int(rest[0] % 5)
		}
		check := func(name string, err error) {
			if err != nil && !errors.Is(err, ErrBadReply) {
				t.Fatalf("%s: error %v is not ErrBadReply", name, err)
			}
		}
		_, err := parseDeposit(v)
		check("deposit", err)
		r, err := parseSpend(v, make([]KeyResult, n))
		check("spend", err)
		if err == nil && (len(r.Keys) != n || r.Failed < -1 || r.Failed >= n || r.Allowed != (r.Failed == -1)) {
			t.Fatalf("spend parsed an inconsistent result %+v for %d keys", r, n)
		}
		if a, ok := v.([]any); ok {
			off := 0
			if len(rest) > 1 {
				off = int(rest[1]%8) - 1
			}
			r, next, err := parseSpendAt(a, off, make([]KeyResult, n))
			check("spend at", err)
			if err == nil && (next != off+1+keyFields*n || len(r.Keys) != n) {
				t.Fatalf("parseSpendAt(off %d, n %d) = %+v, next %d", off, n, r, next)
			}
		}
		batch := make([]SpendResult, 3)
		for i := range batch {
			batch[i].Keys = make([]KeyResult, (n+i)%4)
		}
		check("spend call", parseSpendCall(v, []int{2, 0}, batch))
		_, counts, err := parseUsage(v, make([]int64, n))
		check("usage", err)
		if err == nil && len(counts) != n {
			t.Fatalf("parseUsage gave %d windows, want %d", len(counts), n)
		}
		_, err = parseClose(v)
		check("close", err)
		_, err = parseBalance(v)
		check("balance", err)
		_, err = asBool(v)
		check("bool", err)
		tr, err := parseTake(v)
		check("take", err)
		if err == nil && (tr.Tokens < 0 || tr.WaitMs < -1 || tr.WouldDeny < 0 || tr.WouldDenyChecks < 0 || tr.Allowed && tr.Shadowed) {
			t.Fatalf("parseTake accepted %+v", tr)
		}
	})
}

// FuzzValidate feeds arbitrary arguments to the input checks: they never
// panic, and whatever they accept is within the scripts' exact range.
func FuzzValidate(f *testing.F) {
	f.Add("k", "L", int64(1), int64(0), int64(1), int64(1), int64(0), int64(3))
	f.Add("", "", int64(-1), int64(-1), int64(-1), int64(-1), int64(-1), int64(-1))
	f.Fuzz(func(t *testing.T, key, id string, tokens, start, dl, exp, now, cost int64) {
		d := Deposit{Key: key, LeaseID: id, Tokens: tokens, StartMs: start, DeadlineMs: dl, ExpireAtMs: exp, NowMs: now}
		if err := d.validate(); err == nil {
			for _, v := range []int64{tokens, start, dl, exp, now} {
				if !checkInt(v) || v < 0 {
					t.Fatalf("accepted %+v", d)
				}
			}
			if tokens == 0 || dl <= start || exp < dl || key == "" || id == "" {
				t.Fatalf("accepted %+v", d)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
		if err := validateSpend([]string{key}, []int64{cost}, now); err == nil && (cost < 0 || !checkInt(cost) || key == "") {
			t.Fatalf("accepted spend %q %d", key, cost)
		}
	})
}
