package bucket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// epochTries bounds how often Epoch retries when the key vanishes between
// its SET NX and its GET (a restart in between).
const epochTries = 3

// Epoch returns the epoch of the limit's buckets: an id that stays the same
// while Redis keeps its data and changes when the data is lost. It is the
// key EpochKey, set when missing (a new Redis, or one restarted empty) to
// the server's run_id (INFO server; a random id if Redis gives none).
// Every caller sees the same epoch until the data set is lost, so the
// epoch tells bucket counters of one incarnation from those of the next:
// a restart that empties Redis starts the counters again from zero under a
// new epoch, while a failover to a replica keeps the key, and the epoch,
// with the data. Using the run_id makes every limit of one server, and
// every agent replica, choose the same epoch. (On Redis Cluster INFO
// answers from one node; the epoch then changes with that node's
// restarts, which only costs an extra reporter name.)
func (b *Buckets) Epoch(ctx context.Context, l LimitRef) (string, error) {
	if l.ID == "" {
		return "", invalid("empty limit id")
	}
	key := EpochKey(l.HashTag, l.ID)
	for range epochTries {
		v, err := b.rdb.Get(ctx, key).Result()
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, redis.Nil) {
			return "", wrapRedis("epoch", err)
		}
		candidate := b.runID(ctx)
		ok, err := b.rdb.SetNX(ctx, key, candidate, 0).Result()
		if err != nil {
			return "", wrapRedis("epoch", err)
		}
		if ok {
			return candidate, nil
		}
		// Another caller set it first: read theirs.
	}
	return "", wrapRedis("epoch", errors.New("the epoch key keeps vanishing"))
}

// runID is the server's run_id (new at every start), or a random id.
func (b *Buckets) runID(ctx context.Context) string {
	if info, err := b.rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && v != "" {
				return v
			}
		}
	}
	r := make([]byte, 16)
	_, _ = rand.Read(r)
	return hex.EncodeToString(r)
}

// WindowCounts are one window's cost counters.
type WindowCounts struct {
	Window           int64
	Admitted, Denied int64
	Counters         []Counter // the others, sorted by name
}

// MaxUsageWindows bounds the windows of one Usage call.
const MaxUsageWindows = 64

// Usage reads a limit's epoch and the counters of windows, in one atomic
// script call, for a usage report: the counts and the name of the
// incarnation they belong to cannot come from two different ones. The
// epoch is "" when the key is missing (a limit never reported, or Redis
// lost its data): set it with SetEpochs and read again.
func (b *Buckets) Usage(ctx context.Context, l LimitRef, windows []int64) (string, []WindowCounts, error) {
	keys, err := usageKeys(l, windows)
	if err != nil {
		return "", nil, err
	}
	v, err := b.eval(ctx, usageScript, keys)
	if err != nil {
		return "", nil, err
	}
	return parseUsage(v, windows)
}

// usageKeys checks a Usage call and names its keys: the limit's epoch
// key, then each window's bucket.
func usageKeys(l LimitRef, windows []int64) ([]string, error) {
	switch {
	case l.ID == "":
		return nil, invalid("empty limit id")
	case len(windows) == 0 || len(windows) > MaxUsageWindows:
		return nil, invalid("%d windows, want 1..%d", len(windows), MaxUsageWindows)
	}
	keys := make([]string, 0, 1+len(windows))
	keys = append(keys, EpochKey(l.HashTag, l.ID))
	for _, w := range windows {
		keys = append(keys, Key(l.HashTag, l.ID, w))
	}
	return keys, nil
}

// SetEpochs sets the epoch keys of limits that have none (as Epoch does)
// with one read of the server's run_id for them all: when many limits are
// reported for the first time at once, one INFO serves every one.
func (b *Buckets) SetEpochs(ctx context.Context, limits []LimitRef) error {
	if len(limits) == 0 {
		return nil
	}
	candidate := b.runID(ctx)
	pipe := b.rdb.Pipeline()
	for _, l := range limits {
		if l.ID == "" {
			return invalid("empty limit id")
		}
		pipe.SetNX(ctx, EpochKey(l.HashTag, l.ID), candidate, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return wrapRedis("epoch", err)
	}
	return nil
}

// SnapshotKey is the key of a region's snapshot of its limits:
// lh:snapshot:<region>.
func SnapshotKey(region string) string { return "lh:snapshot:" + region }

// SaveSnapshot stores a region's snapshot of its limits (data, opaque
// here) unless the one stored is newer: by rev, the allocator's etcd
// revision (>= 0), then by takenMs, when it was taken on the allocator's
// clock. It reports whether it was stored.
func (b *Buckets) SaveSnapshot(ctx context.Context, region string, rev, takenMs int64, data []byte) (bool, error) {
	switch {
	case region == "":
		return false, invalid("empty region")
	case rev < 0 || !checkInt(rev) || takenMs < 0 || !checkInt(takenMs):
		return false, invalid("revision %d, taken %d", rev, takenMs)
	}
	v, err := b.eval(ctx, snapshotScript, []string{SnapshotKey(region)}, rev, takenMs, data)
	if err != nil {
		return false, err
	}
	return asBool(v)
}

// LoadSnapshot returns a region's stored snapshot (nil if there is none).
func (b *Buckets) LoadSnapshot(ctx context.Context, region string) ([]byte, error) {
	v, err := b.rdb.HGet(ctx, SnapshotKey(region), "data").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, wrapRedis("snapshot", err)
	}
	return v, nil
}
