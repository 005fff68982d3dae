// Package bucket keeps a region's token leases in Redis and spends them
// atomically, shared by every agent replica of the region.
//
// # Model
//
// One Redis hash per (limit, window), under [Key]: lh:{<limitID>}:w:<window>,
// or lh:{<hashTag>}:<limitID>:w:<window> for a limit with a hash tag of its
// own. The braces are a Redis Cluster hash tag: all keys of a limit share one
// slot, and so do the keys of limits that share a hash tag (which one
// CheckMulti needs on Cluster).
// Every value is an integer (milliseconds on Redis's clock, tokens). Per lease
// id L the hash holds
//
//	r:<L>  remaining tokens
//	s:<L>  start ms (Redis clock): spendable from here on
//	d:<L>  deadline ms (Redis clock, exclusive): spendable strictly before it
//	c:<L>  closed marker: the unspent amount that closing the lease returned
//
// and per window the cost counters admitted and denied (plus any counter
// added with [Buckets.AddCounter]), and z:spend, the spend summary: the
// lease a spend pays from first, the tokens of the others and the span of
// time in which that holds, which a warm spend reads instead of the whole
// hash (lua/common.lua's summarize says how; every script that changes a
// lease deletes it or writes it again, and so does a spend that read the
// whole hash). A lease is spendable at now when
// start <= now < deadline and it is not closed. The agent converts its lease
// deadline to Redis's clock with [ClockSync.ToRedis], which rounds so that a
// Redis deadline is never later in real time than the agent's: no token is
// spent after its lease's agent deadline (invariant 4).
//
// A bucket limit (rate and burst, no windows) has one token bucket per
// region instead, under [RateKey], refilled by the region's rate share and
// spent by [Buckets.Take]: see rate.go and lua/rate.lua.
//
// # Scripts and time
//
// Each operation is one atomic Lua script call (lua/*.lua, embedded; the
// helpers of lua/common.lua are prepended), loaded once with SCRIPT LOAD and
// run with EVALSHA; after a NOSCRIPT reply (restart, failover, SCRIPT FLUSH)
// the script is loaded again and only the calls that failed with NOSCRIPT
// are re-sent (they did not run), in pipelines too. The same source runs on
// redis-server and on miniredis, and the tests run both.
//
// [Buckets.SpendBatch] sends a batch of concurrent spends as one pipeline;
// spends on the same limit go to one script call that decides them in
// order, so Redis reads a hot bucket once per batch rather than once per
// spend.
//
// Every operation takes nowMs. Production passes 0: the script then reads
// Redis's own clock with TIME, so all replicas judge deadlines on one clock.
// Tests pass an explicit nowMs > 0 to drive that clock step by step.
//
// # Retries
//
// Deposit and Close are idempotent by lease id and may be retried freely.
// Spend is not: a Spend whose reply was lost may have run. go-redis retries
// commands after network errors (Options.MaxRetries); a re-run Spend charges
// twice, which under-admits and never over-admits.
package bucket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel errors. Errors from Redis itself are wrapped with the operation's
// name and can be tested with errors.Is / errors.As as go-redis documents.
var (
	// ErrInvalid reports an argument the call refuses before reaching Redis.
	ErrInvalid = errors.New("bucket: invalid argument")
	// ErrBadReply reports a script reply of an unexpected shape.
	ErrBadReply = errors.New("bucket: malformed script reply")
	// ErrNotHeld reports that Unlock or ExtendLock found the lock missing or
	// held by another owner.
	ErrNotHeld = errors.New("bucket: lock not held")
	// ErrClockSample reports a TIME sample that cannot be used (received
	// before sent).
	ErrClockSample = errors.New("bucket: bad clock sample")
)

// maxExact is the largest integer the Lua scripts handle exactly (Lua numbers
// are float64). Every integer argument must lie in [-maxExact, maxExact].
const maxExact = 1 << 53

// DefaultOrphanTTL is the TTL given to a bucket key that a call other than
// Deposit created (a denied counter before any deposit, or the tombstone of a
// lease closed before it was deposited). A later Deposit extends it with the
// window's PEXPIREAT.
const DefaultOrphanTTL = 24 * time.Hour

// maxReloads bounds how often one call reloads a script after NOSCRIPT.
const maxReloads = 3

// Buckets runs the bucket scripts against one Redis deployment (a single
// node, Sentinel or Cluster through redis.UniversalClient).
//
// A Buckets holds no state besides its settings; it is safe for concurrent
// use. Create it with [New].
type Buckets struct {
	rdb       redis.UniversalClient
	orphanTTL int64 // ms
	ttlArg    any   // orphanTTL boxed once, so Spend does not allocate it
	// anySlot: rdb is one Redis (not a Cluster), where one script call may
	// touch keys of any hash tags: SpendBatch then puts the spends of
	// several limits in one call.
	anySlot bool
}

// Option configures a Buckets.
type Option func(*Buckets)

// WithOrphanTTL sets the TTL of bucket keys created without a deposit
// (default [DefaultOrphanTTL]). It should exceed the longest window.
// Values below one millisecond are ignored.
func WithOrphanTTL(d time.Duration) Option {
	return func(b *Buckets) {
		if d >= time.Millisecond {
			b.orphanTTL = d.Milliseconds()
		}
	}
}

// New returns a Buckets using rdb. It does not contact Redis; scripts load
// on first use, or up front with [Buckets.Load].
func New(rdb redis.UniversalClient, opts ...Option) *Buckets {
	_, cluster := rdb.(*redis.ClusterClient)
	b := &Buckets{rdb: rdb, orphanTTL: DefaultOrphanTTL.Milliseconds(), anySlot: !cluster}
	for _, o := range opts {
		o(b)
	}
	b.ttlArg = b.orphanTTL
	return b
}

// Load loads every script into Redis's script cache (SCRIPT LOAD; on a
// Cluster client, on every primary). Calling it is optional: calls load a
// missing script themselves.
func (b *Buckets) Load(ctx context.Context) error {
	for _, s := range allScripts {
		if err := b.load(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func (b *Buckets) load(ctx context.Context, s *script) error {
	sha, err := b.rdb.ScriptLoad(ctx, s.src).Result()
	if err != nil {
		return fmt.Errorf("bucket: load %s: %w", s.name, err)
	}
	if sha != s.sha {
		return fmt.Errorf("bucket: load %s: server digest %s, want %s", s.name, sha, s.sha)
	}
	return nil
}

// eval runs s by EVALSHA, loading it after NOSCRIPT (bounded).
func (b *Buckets) eval(ctx context.Context, s *script, keys []string, args ...any) (any, error) {
	for try := 0; ; try++ {
		v, err := b.rdb.EvalSha(ctx, s.sha, keys, args...).Result()
		if err == nil {
			return v, nil
		}
		if !isNoScript(err) || try >= maxReloads {
			return nil, wrapRedis(s.name, err)
		}
		if err := b.load(ctx, s); err != nil {
			return nil, err
		}
	}
}

// isNoScript reports a NOSCRIPT reply, normalized by go-redis or raw (as
// pipelined commands return it).
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// checkInt reports whether v is an integer the scripts handle exactly.
func checkInt(v int64) bool { return v >= -maxExact && v <= maxExact }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// wrapRedis names the operation in an error from Redis.
func wrapRedis(op string, err error) error {
	return fmt.Errorf("bucket: %s: %w", op, err)
}
