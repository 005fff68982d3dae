package bucket

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batch gathers renewal-round calls (the lock, balance reads, deposits,
// unlocks, lock extensions) and usage reads of many limits and sends them
// in one Redis pipeline: one round trip (per Cluster node) for all of
// them, however many limits they touch, where one call each would cost a
// round trip and a pair of system calls on both sides per limit. Each call keeps its own outcome and its
// own errors, exactly as if it had been made alone: a Batch only changes
// how the calls travel. Queue calls, Exec once, then read each outcome by
// the index its queuing returned. A Batch belongs to one goroutine.
type Batch struct {
	b     *Buckets
	calls []batchCall
}

// batchCall is one queued call: a script (EVALSHA) or, for the lock, a
// SET NX PX (s nil).
type batchCall struct {
	s     *script
	keys  []string
	args  []any
	ttl   time.Duration // SET NX: the lock's TTL
	wins  []int64       // Usage: the windows read
	reply any
	err   error // invalid input (not sent), or the call's error
}

// Batch returns an empty batch of calls on b.
func (b *Buckets) Batch() *Batch { return &Batch{b: b} }

// Len is the number of calls queued.
func (x *Batch) Len() int { return len(x.calls) }

func (x *Batch) add(c batchCall) int {
	x.calls = append(x.calls, c)
	return len(x.calls) - 1
}

// TryLock queues Buckets.TryLock; read it with Locked.
func (x *Batch) TryLock(key, owner string, ttl time.Duration) int {
	c := batchCall{keys: []string{key}, args: []any{owner}, ttl: ttl.Truncate(time.Millisecond)}
	c.err = checkLock(key, owner, ttl)
	return x.add(c)
}

// Balance queues Buckets.Balance; read it with BalanceOf.
func (x *Batch) Balance(key string, nowMs int64) int {
	c := batchCall{s: balanceScript, keys: []string{key}, args: []any{nowMs}}
	switch {
	case key == "":
		c.err = invalid("empty key")
	case nowMs < 0 || !checkInt(nowMs):
		c.err = invalid("now %d", nowMs)
	}
	return x.add(c)
}

// Deposit queues Buckets.Deposit; read it with DepositOf.
func (x *Batch) Deposit(d Deposit) int {
	c := batchCall{s: depositScript, keys: []string{d.Key}, args: d.args()}
	c.err = d.validate()
	return x.add(c)
}

// Unlock queues Buckets.Unlock; read it with Unlocked.
func (x *Batch) Unlock(key, owner string) int {
	c := batchCall{s: unlockScript, keys: []string{key}, args: []any{owner}}
	c.err = checkLock(key, owner, time.Millisecond)
	return x.add(c)
}

// ExtendLock queues Buckets.ExtendLock; read it with Extended.
func (x *Batch) ExtendLock(key, owner string, ttl time.Duration) int {
	c := batchCall{s: extendScript, keys: []string{key}, args: []any{owner, ttl.Milliseconds()}}
	c.err = checkLock(key, owner, ttl)
	return x.add(c)
}

// Usage queues Buckets.Usage; read it with UsageOf.
func (x *Batch) Usage(l LimitRef, windows []int64) int {
	keys, err := usageKeys(l, windows)
	return x.add(batchCall{s: usageScript, keys: keys, wins: windows, err: err})
}

// Exec sends every queued call in one pipeline and keeps their outcomes.
// A script Redis does not know (NOSCRIPT: a restart, a failover, SCRIPT
// FLUSH) is loaded and its calls sent again, as Buckets' single calls do;
// those calls did not run, so sending them again is safe. Exec reports
// nothing itself: every call's outcome, an error included, is read by its
// index.
func (x *Batch) Exec(ctx context.Context) {
	pending := make([]int, 0, len(x.calls))
	for i := range x.calls {
		if x.calls[i].err == nil {
			pending = append(pending, i)
		}
	}
	cmds := make([]redis.Cmder, len(x.calls))
	for try := 0; len(pending) > 0; try++ {
		pipe := x.b.rdb.Pipeline()
		for _, i := range pending {
			c := &x.calls[i]
			if c.s == nil {
				cmds[i] = pipe.SetNX(ctx, c.keys[0], c.args[0], c.ttl)
			} else {
				cmds[i] = pipe.EvalSha(ctx, c.s.sha, c.keys, c.args...)
			}
		}
		_, _ = pipe.Exec(ctx) // per-command outcomes are read below
		retry := pending[:0]
		var reload []*script
		for _, i := range pending {
			c := &x.calls[i]
			if c.s == nil {
				c.reply, c.err = cmds[i].(*redis.BoolCmd).Result()
				if c.err != nil {
					c.err = wrapRedis("lock", c.err)
				}
				continue
			}
			c.reply, c.err = cmds[i].(*redis.Cmd).Result()
			switch {
			case c.err == nil:
			case isNoScript(c.err) && try < maxReloads:
				retry = append(retry, i)
				if !containsScript(reload, c.s) {
					reload = append(reload, c.s)
				}
			default:
				c.err = wrapRedis(c.s.name, c.err)
			}
		}
		pending = retry
		for _, s := range reload {
			if err := x.b.load(ctx, s); err != nil {
				kept := pending[:0]
				for _, i := range pending {
					if x.calls[i].s == s {
						x.calls[i].err = err
					} else {
						kept = append(kept, i)
					}
				}
				pending = kept
			}
		}
	}
}

func containsScript(ss []*script, s *script) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Err is the error of call i (nil: it was answered).
func (x *Batch) Err(i int) error { return x.calls[i].err }

// Locked is TryLock's outcome.
func (x *Batch) Locked(i int) (bool, error) {
	c := x.calls[i]
	if c.err != nil {
		return false, c.err
	}
	ok, _ := c.reply.(bool)
	return ok, nil
}

// BalanceOf is Balance's outcome.
func (x *Batch) BalanceOf(i int) (BalanceResult, error) {
	c := x.calls[i]
	if c.err != nil {
		return BalanceResult{}, c.err
	}
	return parseBalance(c.reply)
}

// DepositOf is Deposit's outcome.
func (x *Batch) DepositOf(i int) (DepositResult, error) {
	c := x.calls[i]
	if c.err != nil {
		return DepositResult{}, c.err
	}
	return parseDeposit(c.reply)
}

// UsageOf is Usage's outcome.
func (x *Batch) UsageOf(i int) (string, []WindowCounts, error) {
	c := x.calls[i]
	if c.err != nil {
		return "", nil, c.err
	}
	return parseUsage(c.reply, c.wins)
}

// Unlocked is Unlock's outcome (ErrNotHeld: the lock had expired or
// another owner held it).
func (x *Batch) Unlocked(i int) error { return x.owned(i) }

// Extended is ExtendLock's outcome (ErrNotHeld: the lock had expired or
// another owner held it).
func (x *Batch) Extended(i int) error { return x.owned(i) }

// owned is the outcome of a call that acts only for the lock's owner.
func (x *Batch) owned(i int) error {
	c := x.calls[i]
	if c.err != nil {
		return c.err
	}
	ok, err := asBool(c.reply)
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotHeld
	}
	return nil
}
