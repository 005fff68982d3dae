package bucket

import (
	"context"
	"time"
)

// The renewal lock lets exactly one agent replica renew a limit at a time.
// It is a plain SET NX PX under LockKey(hashTag, limitID); only its owner may delete
// or extend it (compare-and-delete, compare-and-expire in one script each).
// Owners must be unique per replica and attempt (e.g. hostname + random).
// The lock is advisory and time-bounded: a holder that pauses longer than the
// TTL may find it taken (Unlock and ExtendLock then report ErrNotHeld); the
// allocator's request ids keep a duplicated renewal harmless.

// TryLock takes the lock at key for owner for ttl (>= 1ms, whole
// milliseconds) if nobody holds it. It reports whether owner got it.
func (b *Buckets) TryLock(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if err := checkLock(key, owner, ttl); err != nil {
		return false, err
	}
	ok, err := b.rdb.SetNX(ctx, key, owner, ttl.Truncate(time.Millisecond)).Result()
	if err != nil {
		return false, wrapRedis("lock", err)
	}
	return ok, nil
}

// ExtendLock resets the lock's TTL to ttl if owner still holds it, else it
// returns ErrNotHeld.
func (b *Buckets) ExtendLock(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := checkLock(key, owner, ttl); err != nil {
		return err
	}
	return b.ownerScript(ctx, extendScript, key, owner, ttl.Milliseconds())
}

// Unlock deletes the lock if owner still holds it, else it returns
// ErrNotHeld (it expired, or another replica holds it now).
func (b *Buckets) Unlock(ctx context.Context, key, owner string) error {
	if err := checkLock(key, owner, time.Millisecond); err != nil {
		return err
	}
	return b.ownerScript(ctx, unlockScript, key, owner)
}

func (b *Buckets) ownerScript(ctx context.Context, s *script, key string, args ...any) error {
	v, err := b.eval(ctx, s, []string{key}, args...)
	if err != nil {
		return err
	}
	ok, err := asBool(v)
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotHeld
	}
	return nil
}

func checkLock(key, owner string, ttl time.Duration) error {
	switch {
	case key == "":
		return invalid("empty lock key")
	case owner == "":
		return invalid("empty lock owner")
	case ttl < time.Millisecond:
		return invalid("lock ttl %v", ttl)
	}
	return nil
}
