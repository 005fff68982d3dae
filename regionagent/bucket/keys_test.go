package bucket

import (
	"math"
	"strconv"
	"testing"

	"leasehold/regionagent/store"
)

// Limits without a hash tag keep the key names they had before tags
// existed (an upgraded agent finds the running window's buckets); a tagged
// limit's keys all carry its tag, so limits sharing a tag share a slot.
func TestKeys(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Key("", "tenant/atlas", 28_333_333), "lh:{tenant/atlas}:w:28333333"},
		{LockKey("", "tenant/atlas"), "lh:{tenant/atlas}:renew"},
		{EpochKey("", "tenant/atlas"), "lh:{tenant/atlas}:epoch"},
		// The id as its own tag is no tag.
		{Key("tenant/atlas", "tenant/atlas", 7), "lh:{tenant/atlas}:w:7"},
		{LockKey("tenant/atlas", "tenant/atlas"), "lh:{tenant/atlas}:renew"},
		{Key("atlas", "tenant/atlas/api", 7), "lh:{atlas}:tenant/atlas/api:w:7"},
		{LockKey("atlas", "tenant/atlas/api"), "lh:{atlas}:tenant/atlas/api:renew"},
		{EpochKey("atlas", "tenant/atlas/api"), "lh:{atlas}:tenant/atlas/api:epoch"},
		{KeyOf(store.Key{Limit: "tenant/atlas/api", Window: 7, HashTag: "atlas"}), "lh:{atlas}:tenant/atlas/api:w:7"},
		{KeyOf(store.Key{Limit: "tenant/atlas", Window: 7}), "lh:{tenant/atlas}:w:7"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for _, k := range []string{Key("atlas", "a", 1), LockKey("atlas", "b"), EpochKey("atlas", "c/d"), Key("atlas", "atlas", 1)} {
		if hashTag(k) != "atlas" {
			t.Errorf("%s: hash tag %q, want atlas", k, hashTag(k))
		}
	}
}

// TestKeysDistinct: no two (kind, tag, id, window) name one key, whatever
// the ids (words the layout uses included) and tags, tagged or not.
func TestKeysDistinct(t *testing.T) {
	names := []string{"", "w", "renew", "epoch", "a", "a/w", "t", "1", "lh"}
	seen := map[string]string{}
	add := func(key, what string) {
		if prev, ok := seen[key]; ok && prev != what {
			t.Errorf("%s and %s are both %q", prev, what, key)
		}
		seen[key] = what
	}
	for _, tag := range names {
		for _, id := range names[1:] {
			eff := tag // keys depend only on the effective tag
			if eff == "" {
				eff = id
			}
			who := "tag " + eff + " id " + id
			add(LockKey(tag, id), "lock of "+who)
			add(EpochKey(tag, id), "epoch of "+who)
			for _, w := range []int64{0, 1, -1, 12} {
				add(Key(tag, id, w), "bucket "+string(rune('0'+w+1))+" of "+who)
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no keys")
	}
}

// FuzzKey: Key names exactly what the plain concatenation of its parts
// names (prefix, ":w:", the window in decimal), in one allocation.
func FuzzKey(f *testing.F) {
	f.Add("", "tenant/atlas", int64(28_333_333))
	f.Add("atlas", "tenant/atlas/api", int64(7))
	f.Add("x", "x", int64(-1))
	f.Add("", "", int64(math.MinInt64))
	f.Fuzz(func(t *testing.T, hashTag, limitID string, window int64) {
		want := prefix(hashTag, limitID) + ":w:" + strconv.FormatInt(window, 10)
		if got := Key(hashTag, limitID, window); got != want {
			t.Fatalf("Key(%q, %q, %d) = %q, want %q", hashTag, limitID, window, got, want)
		}
	})
}

// TestKeyAllocs: naming a bucket allocates its name only.
func TestKeyAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = Key("atlas", "tenant/atlas/api", 29_416_123) }); n != 1 {
		t.Fatalf("Key: %.0f allocations, want 1", n)
	}
}
