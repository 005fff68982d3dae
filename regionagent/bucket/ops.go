package bucket

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Deposit describes one lease to store in a bucket. All times are
// milliseconds on Redis's clock (see [ClockSync]).
type Deposit struct {
	Key        string // bucket key, from Key(limitID, window)
	LeaseID    string // the allocator's lease id; deposits are idempotent by it
	Tokens     int64  // > 0
	StartMs    int64  // >= 0; the lease is spendable from StartMs on
	DeadlineMs int64  // > StartMs; spendable strictly before DeadlineMs
	// ExpireAtMs is the bucket key's PEXPIREAT (usually the window's end
	// plus a grace period); >= DeadlineMs. It only ever extends the key's
	// expiry.
	ExpireAtMs int64
	NowMs      int64 // 0: Redis TIME; > 0: explicit (tests)
}

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
	// RefusedKeyExpiry: ExpireAtMs is not after Redis's current time
	// (TIME, whatever NowMs says); nothing was written, since PEXPIREAT in
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

// Deposit stores a lease in its bucket. It is idempotent by lease id: a
// repeated deposit returns AlreadyDeposited and changes nothing; a deposit of
// a closed lease returns RefusedClosed. Refusals are results, not errors.
func (b *Buckets) Deposit(ctx context.Context, d Deposit) (DepositResult, error) {
	if err := d.validate(); err != nil {
		return DepositResult{}, err
	}
	v, err := b.eval(ctx, depositScript, []string{d.Key},
		d.LeaseID, d.Tokens, d.StartMs, d.DeadlineMs, d.ExpireAtMs, d.NowMs)
	if err != nil {
		return DepositResult{}, err
	}
	return parseDeposit(v)
}

func (d Deposit) validate() error {
	switch {
	case d.Key == "":
		return invalid("empty key")
	case d.LeaseID == "":
		return invalid("empty lease id")
	case d.Tokens <= 0 || !checkInt(d.Tokens):
		return invalid("tokens %d", d.Tokens)
	case d.StartMs < 0 || !checkInt(d.StartMs):
		return invalid("start %d", d.StartMs)
	case d.DeadlineMs <= d.StartMs || !checkInt(d.DeadlineMs):
		return invalid("deadline %d not after start %d", d.DeadlineMs, d.StartMs)
	case d.ExpireAtMs < d.DeadlineMs || !checkInt(d.ExpireAtMs):
		return invalid("key expiry %d before deadline %d", d.ExpireAtMs, d.DeadlineMs)
	case d.NowMs < 0 || !checkInt(d.NowMs):
		return invalid("now %d", d.NowMs)
	}
	return nil
}

// KeyResult is one key's part of a spend.
type KeyResult struct {
	// Allowed: this key had enough spendable tokens for its cost (the spend
	// as a whole may still be denied by another key).
	Allowed bool
	// Balance is the key's spendable tokens after the spend.
	Balance int64
	// EarliestDeadlineMs is the earliest deadline (Redis ms) among the key's
	// remaining spendable tokens, 0 if none: when the agent must have renewed.
	EarliestDeadlineMs int64
}

// SpendResult is the outcome of one all-or-nothing spend.
type SpendResult struct {
	// Allowed: every key paid its cost. Otherwise nothing was charged.
	Allowed bool
	// Failed is the index of the first key that lacked tokens, -1 if none.
	Failed int
	// Keys has one entry per key, in order.
	Keys []KeyResult
	// Err is set only by SpendBatch, for an op that was not decided
	// (invalid, or its script call failed). Allowed is then false, Failed
	// -1 and Keys nil.
	Err error
}

// SpendOp is one spend of a batch: the arguments of one Spend call.
type SpendOp struct {
	Keys  []string // bucket keys, sharing a hash tag on Redis Cluster
	Costs []int64  // one cost >= 0 per key
	NowMs int64    // 0: Redis TIME; > 0: explicit (tests)
}

// Spend takes costs[i] tokens from keys[i] for every i, or nothing at all.
//
// Each key pays from its spendable leases (start <= now < deadline, not
// closed) in order of earliest deadline, splitting across leases. If a key
// lacks tokens, nothing is charged anywhere and its cost is added to its
// denied counter; keys that had enough count neither. On success every key
// adds its cost to admitted. A key may appear twice (its costs add up).
// Costs must be >= 0. The keys must share one hash slot on Redis Cluster
// (one limit's keys do; different limits need a common hash tag).
//
// A denied spend is a result (Allowed false), not an error.
func (b *Buckets) Spend(ctx context.Context, keys []string, costs []int64, nowMs int64) (SpendResult, error) {
	if err := validateSpend(keys, costs, nowMs); err != nil {
		return SpendResult{}, err
	}
	// ARGV: now, orphan TTL, 1 spend, n, (key index, cost) x n. Small
	// integers box without allocating; the TTL was boxed once in New.
	args := make([]any, 0, 4+2*len(keys))
	args = append(args, nowMs, b.ttlArg, int64(1), int64(len(keys)))
	for i, c := range costs {
		args = append(args, int64(i+1), c)
	}
	v, err := b.eval(ctx, spendScript, keys, args...)
	if err != nil {
		return SpendResult{}, err
	}
	return parseSpend(v, make([]KeyResult, len(keys)))
}

// maxSpendsPerCall bounds how many spends one script call decides, so one
// call keeps Redis busy for a bounded time.
const maxSpendsPerCall = 128

// spendCall is one spend.lua call of a batch: spends whose keys share one
// hash tag (so one slot) and one NowMs, decided in slice order.
type spendCall struct {
	tag   string
	now   int64
	solo  bool     // keys of several hash tags: a call of its own
	keys  []string // distinct keys, KEYS of the call
	spend []int    // indices into the batch
	args  []any
}

// SpendBatch decides every op as Spend would, in one pipeline: one round
// trip to Redis for the whole batch (two or more only after NOSCRIPT, when
// the calls that failed with NOSCRIPT, and only those, are re-sent).
//
// Ops whose keys share one hash tag and NowMs are decided by one script
// call (up to 128 per call), in slice order, each op atomic and
// all-or-nothing by itself and seeing the effect of the ops before it,
// exactly as separate Spend calls would; they share one reading of Redis's
// TIME. This is what makes a batch on a few hot limits cheap for Redis. Ops
// of different tags are separate calls in the same pipeline, sent in the
// order of their first op. An op whose keys span several hash tags gets a
// call of its own (on Redis Cluster it then fails with CROSSSLOT, alone,
// unless the tags share a slot).
//
// The results have one entry per op, in order. An op that was not decided
// has its Err set (an invalid op alone; a failed script call every op of
// the call). The returned error is non-nil only when no op was decided (it
// is then the first op's Err, e.g. Redis unreachable): a caller may treat
// it as "the whole batch failed", but must check each result's Err too. A
// result without Err was decided, and its tokens charged if Allowed.
func (b *Buckets) SpendBatch(ctx context.Context, ops []SpendOp) ([]SpendResult, error) {
	res := make([]SpendResult, len(ops))
	total := 0
	for _, op := range ops {
		total += len(op.Keys)
	}
	backing := make([]KeyResult, total) // one allocation for every op's Keys
	off := 0
	calls := make([]spendCall, 0, 4)
	for i, op := range ops {
		n := len(op.Keys)
		res[i].Keys = backing[off : off+n : off+n]
		off += n
		if err := validateSpend(op.Keys, op.Costs, op.NowMs); err != nil {
			res[i] = SpendResult{Failed: -1, Err: err}
			continue
		}
		calls = b.addToCall(calls, ops, i)
	}

	cmds := make([]*redis.Cmd, len(calls))
	pending := make([]int, len(calls))
	for i := range pending {
		pending[i] = i
	}
	for try := 0; len(pending) > 0; try++ {
		pipe := b.rdb.Pipeline()
		for _, ci := range pending {
			cmds[ci] = pipe.EvalSha(ctx, spendScript.sha, calls[ci].keys, calls[ci].args...)
		}
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		retry := pending[:0]
		for _, ci := range pending {
			c := &calls[ci]
			v, err := cmds[ci].Result()
			if err != nil && isNoScript(err) && try < maxReloads {
				retry = append(retry, ci) // did not run: safe to re-send
				continue
			}
			if err == nil {
				err = parseSpendCall(v, c.spend, res)
			} else {
				err = wrapRedis(spendScript.name, err)
			}
			if err != nil {
				for _, i := range c.spend {
					res[i] = SpendResult{Failed: -1, Err: err}
				}
			}
		}
		pending = retry
		if len(pending) > 0 {
			if err := b.load(ctx, spendScript); err != nil {
				for _, ci := range pending {
					for _, i := range calls[ci].spend {
						res[i] = SpendResult{Failed: -1, Err: err}
					}
				}
				break
			}
		}
	}
	for i := range res {
		if res[i].Err == nil {
			return res, nil
		}
	}
	if len(res) > 0 {
		return res, res[0].Err
	}
	return res, nil
}

// addToCall puts ops[i] into the call of its hash tag and NowMs, or a new
// call, and appends its arguments.
func (b *Buckets) addToCall(calls []spendCall, ops []SpendOp, i int) []spendCall {
	op := ops[i]
	tag := hashTag(op.Keys[0])
	solo := false
	for _, k := range op.Keys[1:] {
		if hashTag(k) != tag {
			solo = true
			break
		}
	}
	ci := -1
	if !solo {
		for j := range calls {
			c := &calls[j]
			if !c.solo && c.tag == tag && c.now == op.NowMs && len(c.spend) < maxSpendsPerCall {
				ci = j
				break
			}
		}
	}
	if ci < 0 {
		calls = append(calls, spendCall{tag: tag, now: op.NowMs, solo: solo,
			args: []any{op.NowMs, b.ttlArg, int64(0)}})
		ci = len(calls) - 1
	}
	c := &calls[ci]
	c.spend = append(c.spend, i)
	c.args[2] = int64(len(c.spend))
	c.args = append(c.args, int64(len(op.Keys)))
	for j, k := range op.Keys {
		idx := -1
		for x, have := range c.keys {
			if have == k {
				idx = x
				break
			}
		}
		if idx < 0 {
			c.keys = append(c.keys, k)
			idx = len(c.keys) - 1
		}
		c.args = append(c.args, int64(idx+1), op.Costs[j])
	}
	return calls
}

// hashTag returns the part of key Redis Cluster hashes: the text between
// the first '{' and the next '}' if non-empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

func validateSpend(keys []string, costs []int64, nowMs int64) error {
	if len(keys) == 0 {
		return invalid("no keys")
	}
	if len(costs) != len(keys) {
		return invalid("%d keys, %d costs", len(keys), len(costs))
	}
	for i, k := range keys {
		if k == "" {
			return invalid("empty key")
		}
		if costs[i] < 0 || !checkInt(costs[i]) {
			return invalid("cost %d", costs[i])
		}
	}
	if nowMs < 0 || !checkInt(nowMs) {
		return invalid("now %d", nowMs)
	}
	return nil
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

// Close removes a lease from its bucket and returns its unspent tokens. It
// is idempotent: retries return the same Unspent with AlreadyClosed set. A
// closed lease is never spent again.
func (b *Buckets) Close(ctx context.Context, key, leaseID string, nowMs int64) (CloseResult, error) {
	switch {
	case key == "":
		return CloseResult{}, invalid("empty key")
	case leaseID == "":
		return CloseResult{}, invalid("empty lease id")
	case nowMs < 0 || !checkInt(nowMs):
		return CloseResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, closeScript, []string{key}, leaseID, nowMs, b.ttlArg)
	if err != nil {
		return CloseResult{}, err
	}
	return parseClose(v)
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

// Balance reads a bucket without changing it.
func (b *Buckets) Balance(ctx context.Context, key string, nowMs int64) (BalanceResult, error) {
	if key == "" {
		return BalanceResult{}, invalid("empty key")
	}
	if nowMs < 0 || !checkInt(nowMs) {
		return BalanceResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, balanceScript, []string{key}, nowMs)
	if err != nil {
		return BalanceResult{}, err
	}
	return parseBalance(v)
}

// AddCounter adds delta to a named counter of a bucket (e.g.
// "fallback_admitted") and returns its new value. name must be non-empty,
// free of ':' and not "admitted" or "denied", which only Spend moves.
func (b *Buckets) AddCounter(ctx context.Context, key, name string, delta int64) (int64, error) {
	switch {
	case key == "":
		return 0, invalid("empty key")
	case name == "" || strings.Contains(name, ":") || name == "admitted" || name == "denied":
		return 0, invalid("counter name %q", name)
	case !checkInt(delta):
		return 0, invalid("delta %d", delta)
	}
	v, err := b.eval(ctx, addScript, []string{key}, name, delta, b.ttlArg)
	if err != nil {
		return 0, err
	}
	return asInt(v)
}
