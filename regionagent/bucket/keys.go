package bucket

import (
	"strconv"
	"strings"

	"leasehold/regionagent/store"
)

// Keys. Every key of a limit starts with its hash tag in braces, so on
// Redis Cluster all of them live in one slot, the slot of the tag:
//
//	no hash tag (or the id itself)   with hash tag T
//	lh:{<id>}:w:<window>             lh:{T}:<id>:w:<window>   a bucket (Key)
//	lh:{<id>}:w:<window>:res         lh:{T}:<id>:w:<window>:res   its reservation records (RecordsKey)
//	lh:{<id>}:w:<window>:rexp        lh:{T}:<id>:w:<window>:rexp  when they may be dropped (RecordsIndexKey)
//	lh:{<id>}:renew                  lh:{T}:<id>:renew        the renewal lock (LockKey)
//	lh:{<id>}:epoch                  lh:{T}:<id>:epoch        the buckets' incarnation (EpochKey)
//	lh:{<id>}:rate                   lh:{T}:<id>:rate         a bucket limit's token bucket (RateKey)
//
// A limit without a tag keeps the names it had before hash tags existed,
// so an upgraded agent finds the buckets, locks and epochs of the running
// window. Neither an id nor a tag may hold '{', '}' or ':' (see
// vocab.ValidateHashTag), so the two forms cannot meet: a tagged key has
// one more ':'-separated part than an untagged key of the same kind, and
// a bucket's last part is a number where a lock's or an epoch's is a word.

// Key returns the bucket key of (limitID, window) under the limit's hash
// tag ("" or limitID: none).
func Key(hashTag, limitID string, window int64) string {
	// Built in one allocation: a warm Check names its bucket each time.
	var num [20]byte
	return prefixed(hashTag, limitID, ":w:", strconv.AppendInt(num[:0], window, 10))
}

// KeyOf is Key of a store key.
func KeyOf(k store.Key) string { return Key(k.HashTag, k.Limit, k.Window) }

// RecordsKey returns the hash of a bucket's reservation records and
// RecordsIndexKey the sorted set of when each may be dropped
// (lua/common.lua): beside the bucket, in its hash slot, and expiring
// with it.
func RecordsKey(bucketKey string) string { return bucketKey + ":res" }

// RecordsIndexKey: see RecordsKey.
func RecordsIndexKey(bucketKey string) string { return bucketKey + ":rexp" }

// LockKey returns the renewal lock key of a limit. It shares the limit's
// hash slot with its buckets.
func LockKey(hashTag, limitID string) string { return prefixed(hashTag, limitID, ":renew", nil) }

// EpochKey returns the key that names the incarnation of a limit's buckets
// in one Redis deployment. It shares the limit's hash slot with its
// buckets, so on Redis Cluster it lives and dies with them.
func EpochKey(hashTag, limitID string) string { return prefixed(hashTag, limitID, ":epoch", nil) }

func prefix(hashTag, limitID string) string { return prefixed(hashTag, limitID, "", nil) }

// prefixed is prefix(hashTag, limitID) + suffix + tail, in one
// allocation.
func prefixed(hashTag, limitID, suffix string, tail []byte) string {
	tagged := hashTag != "" && hashTag != limitID
	n := len("lh:{}") + len(limitID) + len(suffix) + len(tail)
	if tagged {
		n += len(hashTag) + len(":")
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString("lh:{")
	if tagged {
		b.WriteString(hashTag)
		b.WriteString("}:")
		b.WriteString(limitID)
	} else {
		b.WriteString(limitID)
		b.WriteString("}")
	}
	b.WriteString(suffix)
	b.Write(tail)
	return b.String()
}

// LimitRef names a limit's keys: its id and its hash tag ("": the id).
type LimitRef struct {
	ID      string
	HashTag string
}

// RateKey returns the token bucket key of a bucket limit (one per limit:
// bucket limits have no windows). It shares the limit's hash slot with
// its lock and epoch.
func RateKey(hashTag, limitID string) string { return prefixed(hashTag, limitID, ":rate", nil) }

// RateKeyOf is RateKey of a store rate key.
func RateKeyOf(k store.RateKey) string { return RateKey(k.HashTag, k.Limit) }
