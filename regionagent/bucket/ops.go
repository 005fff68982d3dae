package bucket

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"leasehold/regionagent/store"
)

// Deposit describes one lease to store in a bucket. All times are
// milliseconds on Redis's clock (see [ClockSync]).
type Deposit struct {
	Key        string // bucket key, from Key(hashTag, limitID, window)
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

// The vocabulary of spends, deposits, closes and balances is package
// store's (shared with the in-memory store and the agent core); these names
// keep this package's API.
type (
	DepositStatus = store.DepositStatus
	DepositResult = store.DepositResult
	KeyResult     = store.KeyResult
	SpendResult   = store.SpendResult
	CloseResult   = store.CloseResult
	Counter       = store.Counter
	ExpiredLease  = store.ExpiredLease
	BalanceResult = store.BalanceResult
	OpenLease     = store.OpenLease
)

// Deposit statuses (see [store.DepositStatus]).
const (
	Deposited        = store.Deposited
	AlreadyDeposited = store.AlreadyDeposited
	RefusedClosed    = store.RefusedClosed
	RefusedKeyExpiry = store.RefusedKeyExpiry
)

// Deposit stores a lease in its bucket. It is idempotent by lease id: a
// repeated deposit returns AlreadyDeposited and changes nothing; a deposit of
// a closed lease returns RefusedClosed. Refusals are results, not errors.
func (b *Buckets) Deposit(ctx context.Context, d Deposit) (DepositResult, error) {
	if err := d.validate(); err != nil {
		return DepositResult{}, err
	}
	v, err := b.eval(ctx, depositScript, []string{d.Key}, d.args()...)
	if err != nil {
		return DepositResult{}, err
	}
	return parseDeposit(v)
}

// args are d's ARGV for deposit.lua (KEYS: d.Key), in every way a
// deposit is sent: alone, in a Batch, carried by a spend.
func (d Deposit) args() []any {
	return []any{d.LeaseID, d.Tokens, d.StartMs, d.DeadlineMs, d.ExpireAtMs, d.NowMs}
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

// SpendOp is one spend of a batch: the arguments of one Spend call.
type SpendOp struct {
	Keys  []string // bucket keys, sharing a hash tag on Redis Cluster
	Costs []int64  // one cost >= 0 per key
	NowMs int64    // 0: Redis TIME; > 0: explicit (tests)
	// Counted, when set (one per key), names the keys on which an earlier
	// attempt of the same request was denied, its cost counted as
	// denied: a counted key lacking the cost again adds nothing to the
	// denied counter, and one that pays moves its cost from denied to
	// admitted. A request the agent retries while its region waits for a
	// lease then counts once in admitted + denied (the region's demand).
	Counted []bool
	// Take makes the op a take from a bucket limit's token bucket
	// (Keys[0], a RateKey; Costs[0]), as Take does; its result is the
	// SpendResult's Take.
	Take bool
	// Shadow: a take of a limit in shadow mode (Buckets.Take's shadow).
	Shadow bool
	// Reserve or Release, when set, makes the op a reservation
	// (Buckets.ReserveLasting, or ReserveToSettle with a grace) or a
	// release (Buckets.Release) instead; Keys and Costs are then unused,
	// and the result is the SpendResult's Reserved or Released. The
	// reservations and releases of a batch share script calls of their
	// own (reservations.lua), as its spends share theirs.
	Reserve *ReserveOp
	Release *ReleaseOp
	// Deposit, when set on a spend, is deposited before any spend of the
	// batch, in the same pipeline (a call of deposit.lua of its own): a
	// region's first Check of a window deposits its standing share and
	// spends from it in one round trip. Its outcome is the SpendResult's
	// Deposited (or DepositErr), beside the spend's. Only after NOSCRIPT
	// (Redis lost its scripts) may the spend run before it.
	Deposit *Deposit
}

// ownOp is an op of a batch of spends that is not a spend: a reservation
// (ReserveOp) or a release (ReleaseOp), decided by reservations.lua.
type ownOp interface {
	validate() error
	bucketKey() string
	now() int64
	// appendKeys and appendArgs append the op's KEYS and ARGV in a
	// reservations.lua call.
	appendKeys(keys []string) []string
	appendArgs(args []any) []any
	// result parses the op's reply into r (its Reserved or Released).
	result(v any, r *SpendResult) error
}

// own is the op as a reservation or a release, if it is one.
func (op *SpendOp) own() ownOp {
	switch {
	case op.Reserve != nil:
		return op.Reserve
	case op.Release != nil:
		return op.Release
	}
	return nil
}

// Spend takes costs[i] tokens from keys[i] for every i, or nothing at all.
//
// Each key pays from its spendable leases (start <= now < deadline, not
// closed) in order of earliest deadline, splitting across leases. If a key
// lacks tokens, nothing is charged anywhere and its cost is added to its
// denied counter; keys that had enough count neither. On success every key
// adds its cost to admitted. A key may appear twice (its costs add up).
// Costs must be >= 0. The keys must share one hash slot on Redis Cluster
// (one limit's keys do; different limits need a common hash tag: see Key).
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
	take  bool     // a rate.lua 'takes' call, not a spend.lua one
	owns  bool     // a reservations.lua call: reservations and releases
	dep   bool     // a deposit.lua call: the deposit of ops[spend[0]]
	solo  bool     // a call of its own: keys of several hash tags
	keys  []string // distinct keys, KEYS of the call
	spend []int    // indices into the batch
	args  []any
}

// SpendBatch decides every op as Spend would, in one pipeline: one round
// trip to Redis for the whole batch (two or more only after NOSCRIPT, when
// the calls that failed with NOSCRIPT, and only those, are re-sent).
//
// Ops with the same NowMs are decided by one script call (up to 128 per
// call), in slice order, each op atomic and all-or-nothing by itself and
// seeing the effect of the ops before it, exactly as separate Spend calls
// would; they share one reading of Redis's TIME. This is what makes a
// batch cheap for Redis: one call, not one per limit. On a Redis Cluster
// client a call holds the ops of one hash tag only: ops of different tags
// are separate calls in the same pipeline, sent in the order of their
// first op, and an op whose keys span several hash tags gets a call of
// its own (it then fails with CROSSSLOT, alone, unless the tags share a
// slot).
//
// The results have one entry per op, in order. An op that was not decided
// has its Err set (an invalid op alone; a failed script call every op of
// the call). The returned error is non-nil only when no op was decided (it
// is then the first op's Err, e.g. Redis unreachable): a caller may treat
// it as "the whole batch failed", but must check each result's Err too. A
// result without Err was decided, and its tokens charged if Allowed.
func (b *Buckets) SpendBatch(ctx context.Context, ops []SpendOp) ([]SpendResult, error) {
	return b.SpendBatchInto(ctx, ops, &SpendScratch{})
}

// SpendScratch keeps SpendBatchInto's buffers (the results and their
// keys, the script calls and their arguments, the commands) from one call
// to the next, so that a caller sending batch after batch allocates them
// once. The zero value is ready to use. A SpendScratch belongs to one
// goroutine.
type SpendScratch struct {
	res     []SpendResult
	backing []KeyResult
	calls   []spendCall
	cmds    []*redis.Cmd
	pending []int
}

// SpendBatchInto is SpendBatch with its buffers in s: the results, their
// Keys included, are s's and valid until the next call with s.
func (b *Buckets) SpendBatchInto(ctx context.Context, ops []SpendOp, s *SpendScratch) ([]SpendResult, error) {
	res := resize(s.res, len(ops))
	clear(res)
	total := 0
	for _, op := range ops {
		total += len(op.Keys)
	}
	backing := resize(s.backing, total) // one buffer for every op's Keys
	clear(backing)
	off := 0
	calls := s.calls[:0]
	defer func() {
		// Kept for the next call (grown, perhaps).
		s.res, s.backing, s.calls = res, backing, calls
	}()
	// Deposits first: every spend of the pipeline sees them. Their
	// outcomes are kept aside (deps) and set in the results at the end,
	// whatever the spends' own outcomes write there.
	var deps map[int]SpendResult
	for i, op := range ops {
		if d := op.Deposit; d != nil {
			if deps == nil {
				deps = map[int]SpendResult{}
			}
			if err := d.validate(); err != nil {
				deps[i] = SpendResult{DepositErr: err}
				continue
			}
			calls = append(calls, spendCall{dep: true, keys: []string{d.Key}, spend: []int{i},
				args: d.args()})
		}
	}
	if deps != nil {
		defer func() {
			for i, d := range deps {
				res[i].Deposited, res[i].DepositErr = d.Deposited, d.DepositErr
			}
		}()
	}
	for i, op := range ops {
		n := len(op.Keys)
		res[i].Keys = backing[off : off+n : off+n]
		off += n
		if o := op.own(); o != nil {
			if err := o.validate(); err != nil {
				res[i] = SpendResult{Failed: -1, Err: err}
				continue
			}
			calls = b.addToOwnCall(calls, o, i)
			continue
		}
		if err := validateSpend(op.Keys, op.Costs, op.NowMs); err != nil {
			res[i] = SpendResult{Failed: -1, Err: err}
			continue
		}
		if op.Counted != nil && (len(op.Counted) != len(op.Keys) || op.Take) {
			res[i] = SpendResult{Failed: -1, Err: invalid("%d counted flags for %d keys (a take has none)", len(op.Counted), len(op.Keys))}
			continue
		}
		if op.Take && len(op.Keys) != 1 {
			res[i] = SpendResult{Failed: -1, Err: invalid("a take names one key, got %d", len(op.Keys))}
			continue
		}
		calls = b.addToCall(calls, ops, i)
	}

	cmds := resize(s.cmds, len(calls))
	pending := resize(s.pending, len(calls))
	s.cmds, s.pending = cmds, pending
	for i := range pending {
		pending[i] = i
	}
	defer clear(cmds) // no reply kept alive until the next call
	for try := 0; len(pending) > 0; try++ {
		pipe := b.rdb.Pipeline()
		for _, ci := range pending {
			cmds[ci] = pipe.EvalSha(ctx, calls[ci].script().sha, calls[ci].keys, calls[ci].args...)
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
			if c.dep {
				// The deposit's outcome only: its spend is decided by
				// its own call.
				var d SpendResult
				if err != nil {
					d.DepositErr = wrapRedis(c.script().name, err)
				} else {
					d.Deposited, d.DepositErr = parseDeposit(v)
				}
				deps[c.spend[0]] = d
				continue
			}
			switch {
			case err != nil:
				err = wrapRedis(c.script().name, err)
			case c.owns:
				err = parseOwnCall(v, ops, c.spend, res)
			case c.take:
				err = parseTakeCall(v, c.spend, res)
			default:
				err = parseSpendCall(v, c.spend, res)
			}
			if err != nil {
				for _, i := range c.spend {
					res[i] = SpendResult{Failed: -1, Err: err}
				}
			}
		}
		pending = retry
		if len(pending) > 0 {
			if err := b.loadFor(ctx, calls, pending); err != nil {
				for _, ci := range pending {
					for _, i := range calls[ci].spend {
						if calls[ci].dep {
							deps[i] = SpendResult{DepositErr: err}
						} else {
							res[i] = SpendResult{Failed: -1, Err: err}
						}
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
	tag, solo := "", false
	if !b.anySlot {
		tag = hashTag(op.Keys[0])
		for _, k := range op.Keys[1:] {
			if hashTag(k) != tag {
				solo = true
				break
			}
		}
	}
	calls, ci, fresh := joinCall(calls, spendCall{tag: tag, now: op.NowMs, take: op.Take, solo: solo})
	c := &calls[ci]
	if fresh {
		if op.Take {
			c.args = append(c.args, "takes", op.NowMs, b.ttlArg, int64(0))
		} else {
			c.args = append(c.args, op.NowMs, b.ttlArg, int64(0))
		}
	}
	c.spend = append(c.spend, i)
	if c.take {
		c.args[3] = int64(len(c.spend))
	} else {
		c.args[2] = int64(len(c.spend))
		c.args = append(c.args, int64(len(op.Keys)))
	}
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
		arg := int64(idx + 1)
		if op.Counted != nil && op.Counted[j] {
			arg = -arg // spend.lua: a counted key
		}
		c.args = append(c.args, arg, op.Costs[j])
		if c.take {
			c.args = append(c.args, boolArg(op.Shadow))
		}
	}
	return calls
}

// addToOwnCall puts reservation or release o, ops[i], into the
// reservations.lua call of its hash tag and now, or a new one, and
// appends its keys and arguments.
func (b *Buckets) addToOwnCall(calls []spendCall, o ownOp, i int) []spendCall {
	tag := ""
	if !b.anySlot {
		tag = hashTag(o.bucketKey()) // its records share it
	}
	calls, ci, fresh := joinCall(calls, spendCall{tag: tag, now: o.now(), owns: true})
	c := &calls[ci]
	if fresh {
		c.args = append(c.args, c.now, int64(0))
	}
	c.spend = append(c.spend, i)
	c.args[1] = int64(len(c.spend))
	c.keys, c.args = o.appendKeys(c.keys), o.appendArgs(c.args)
	return calls
}

// parseOwnCall parses a reservations.lua reply into the results of its
// ops (ops[idx[j]] for the j-th reply): a reply that does not parse fails
// its op alone.
func parseOwnCall(v any, ops []SpendOp, idx []int, res []SpendResult) error {
	a, err := replyArray(v, len(idx))
	if err != nil {
		return err
	}
	for j, i := range idx {
		if err := ops[i].own().result(a[j], &res[i]); err != nil {
			res[i] = SpendResult{Failed: -1, Err: err}
		}
	}
	return nil
}

// joinCall returns calls and the index of the call an op of kind k (its
// tag, now, take, owns and solo; nothing else of k is read) joins: the
// first call of that kind that is not solo and not full, or (fresh) a new
// one appended.
func joinCall(calls []spendCall, k spendCall) (_ []spendCall, ci int, fresh bool) {
	if !k.solo {
		for j := range calls {
			c := &calls[j]
			if !c.solo && !c.dep && c.owns == k.owns && c.take == k.take && c.tag == k.tag && c.now == k.now && len(c.spend) < maxSpendsPerCall {
				return calls, j, false
			}
		}
	}
	calls = nextCall(calls)
	c := &calls[len(calls)-1]
	c.tag, c.now, c.take, c.owns, c.solo = k.tag, k.now, k.take, k.owns, k.solo
	return calls, len(calls) - 1, true
}

// nextCall appends an empty call to calls, reusing the slices of the call
// that held its place in an earlier batch (SpendScratch).
func nextCall(calls []spendCall) []spendCall {
	if len(calls) == cap(calls) {
		return append(calls, spendCall{})
	}
	calls = calls[:len(calls)+1]
	c := &calls[len(calls)-1]
	clear(c.keys[:cap(c.keys)]) // no key kept alive by the buffer
	clear(c.args[:cap(c.args)])
	*c = spendCall{keys: c.keys[:0], spend: c.spend[:0], args: c.args[:0]}
	return calls
}

// resize returns buf with length n, reallocated only when its capacity is
// short.
func resize[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, n+n/4)
	}
	return buf[:n]
}

// script is the script a call runs.
func (c *spendCall) script() *script {
	if c.owns {
		return reservesScript
	}
	if c.dep {
		return depositScript
	}
	if c.take {
		return rateScript
	}
	return spendScript
}

// loadFor loads the scripts of the pending calls (after NOSCRIPT).
func (b *Buckets) loadFor(ctx context.Context, calls []spendCall, pending []int) error {
	loaded := map[*script]bool{}
	for _, ci := range pending {
		if s := calls[ci].script(); !loaded[s] {
			if err := b.load(ctx, s); err != nil {
				return err
			}
			loaded[s] = true
		}
	}
	return nil
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

// FallbackAdd is store.FallbackAdd (Key is a bucket key: Key(hashTag, limit, window)).
type FallbackAdd struct {
	Key  string
	Cost int64
	Cap  int64
	Mode string
}

// AdmitFallback admits one request under its limits' fallback modes, all
// or nothing and atomically (fallback.lua): each key's fallback_admitted
// grows by its cost unless that would pass its cap, and then nothing is
// written; the counter is never above its cap, not even for a moment. The
// keys must share a hash slot on Redis Cluster. It returns ok and each
// key's counter after the adds (or as it is, when refused).
func (b *Buckets) AdmitFallback(ctx context.Context, adds []FallbackAdd) (bool, []int64, error) {
	if len(adds) == 0 {
		return false, nil, invalid("no keys")
	}
	keys := make([]string, len(adds))
	args := make([]any, 0, 1+3*len(adds))
	args = append(args, b.ttlArg)
	for i, a := range adds {
		switch {
		case a.Key == "":
			return false, nil, invalid("empty key")
		case a.Cost < 0 || !checkInt(a.Cost) || a.Cap < 0 || !checkInt(a.Cap):
			return false, nil, invalid("cost %d, cap %d", a.Cost, a.Cap)
		case a.Mode != "" && a.Mode != store.CounterModeLocal && a.Mode != store.CounterModeOpen:
			return false, nil, invalid("mode counter %q", a.Mode)
		}
		keys[i] = a.Key
		args = append(args, a.Cost, a.Cap, a.Mode)
	}
	v, err := b.eval(ctx, fallbackScript, keys, args...)
	if err != nil {
		return false, nil, err
	}
	a, err := replyArray(v, 1+len(adds))
	if err != nil {
		return false, nil, err
	}
	ok, err := asBool(a[0])
	if err != nil {
		return false, nil, err
	}
	vals := make([]int64, len(adds))
	for i := range vals {
		if vals[i], err = asInt(a[1+i]); err != nil {
			return false, nil, err
		}
	}
	return ok, vals, nil
}
