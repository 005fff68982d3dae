package bucket

import (
	"context"
	"strings"

	"leasehold/regionagent/store"
)

// A concurrency limit keeps one slot set per region (lua/slots.lua): the
// region's slot share in force and the held slots, each with its expiry,
// decided in one atomic script on Redis's clock. The rules are
// store.memSlots's, rule for rule (store/slots.go says why they keep the
// limit).

// The vocabulary of slot sets is package store's.
type (
	SlotKey             = store.SlotKey
	SlotShare           = store.SlotShare
	SlotInstall         = store.SlotInstall
	SlotInstallResult   = store.SlotInstallResult
	SlotAcquireResult   = store.SlotAcquireResult
	SlotHeartbeatResult = store.SlotHeartbeatResult
)

var slotsScript = newScript("slots.lua", true)

// SlotKeys returns the two keys of a limit's slot set: the share hash and
// the sorted set of held slots. Both share the limit's hash slot.
func SlotKeys(k SlotKey) []string {
	p := prefix(k.HashTag, k.Limit)
	return []string{p + ":slots", p + ":slotz"}
}

// InstallSlots puts a slot share in force, unless the share in force has
// an equal or greater Seq and has not ended (ShareStale). Refusals are
// results, not errors.
func (b *Buckets) InstallSlots(ctx context.Context, in SlotInstall) (SlotInstallResult, error) {
	s := in.Share
	switch {
	case in.Key.Limit == "":
		return SlotInstallResult{}, invalid("empty key")
	case !s.Valid() || !checkInt(s.Seq) || !checkInt(s.N) || !checkInt(s.DeadlineMs):
		return SlotInstallResult{}, invalid("slot share %+v", s)
	case in.ExpireAtMs < s.DeadlineMs || !checkInt(in.ExpireAtMs):
		return SlotInstallResult{}, invalid("key expiry %d before deadline %d", in.ExpireAtMs, s.DeadlineMs)
	case in.NowMs < 0 || !checkInt(in.NowMs):
		return SlotInstallResult{}, invalid("now %d", in.NowMs)
	}
	v, err := b.eval(ctx, slotsScript, SlotKeys(in.Key), "install", in.NowMs, s.Seq, s.N, s.Admit, s.DeadlineMs, in.ExpireAtMs)
	if err != nil {
		return SlotInstallResult{}, err
	}
	a, err := replyArray(v, 2)
	if err != nil {
		return SlotInstallResult{}, err
	}
	var st, held int64
	if err := ints(a, &st, &held); err != nil {
		return SlotInstallResult{}, err
	}
	if st != int64(ShareInstalled) && st != int64(ShareStale) && st != int64(ShareRefusedKeyExpiry) || held < 0 {
		return SlotInstallResult{}, ErrBadReply
	}
	return SlotInstallResult{Status: ShareStatus(st), Held: held}, nil
}

// AcquireSlot takes a slot for holder (no "~") for ttlMs (> 0), or
// answers the holder's slot if it holds one. A denial is a result.
func (b *Buckets) AcquireSlot(ctx context.Context, key SlotKey, holder string, ttlMs, nowMs int64) (SlotAcquireResult, error) {
	switch {
	case key.Limit == "":
		return SlotAcquireResult{}, invalid("empty key")
	case holder == "" || strings.Contains(holder, "~"):
		return SlotAcquireResult{}, invalid("holder %q", holder)
	case ttlMs <= 0 || !checkInt(ttlMs):
		return SlotAcquireResult{}, invalid("ttl %d", ttlMs)
	case nowMs < 0 || !checkInt(nowMs):
		return SlotAcquireResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, slotsScript, SlotKeys(key), "acquire", nowMs, holder, ttlMs)
	if err != nil {
		return SlotAcquireResult{}, err
	}
	a, err := replyArray(v, 7)
	if err != nil {
		return SlotAcquireResult{}, err
	}
	var r SlotAcquireResult
	if r.Allowed, err = asBool(a[0]); err != nil {
		return SlotAcquireResult{}, err
	}
	if r.SlotID, err = asString(a[1]); err != nil {
		return SlotAcquireResult{}, err
	}
	if err := ints(a[2:], &r.ExpiresInMs, &r.RetryMs, &r.Held, &r.N, &r.DeadlineMs); err != nil {
		return SlotAcquireResult{}, err
	}
	if r.Allowed != (r.SlotID != "") || r.ExpiresInMs < 0 || r.RetryMs < 0 || r.Held < 0 || r.N < 0 {
		return SlotAcquireResult{}, ErrBadReply
	}
	return r, nil
}

// HeartbeatSlot extends a held slot; Held is false for a slot not held.
func (b *Buckets) HeartbeatSlot(ctx context.Context, key SlotKey, slotID string, ttlMs, nowMs int64) (SlotHeartbeatResult, error) {
	switch {
	case key.Limit == "":
		return SlotHeartbeatResult{}, invalid("empty key")
	case slotID == "":
		return SlotHeartbeatResult{}, invalid("empty slot id")
	case ttlMs <= 0 || !checkInt(ttlMs):
		return SlotHeartbeatResult{}, invalid("ttl %d", ttlMs)
	case nowMs < 0 || !checkInt(nowMs):
		return SlotHeartbeatResult{}, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, slotsScript, SlotKeys(key), "heartbeat", nowMs, slotID, ttlMs)
	if err != nil {
		return SlotHeartbeatResult{}, err
	}
	a, err := replyArray(v, 2)
	if err != nil {
		return SlotHeartbeatResult{}, err
	}
	var r SlotHeartbeatResult
	if r.Held, err = asBool(a[0]); err != nil {
		return SlotHeartbeatResult{}, err
	}
	if err := ints(a[1:], &r.ExpiresInMs); err != nil || r.ExpiresInMs < 0 {
		return SlotHeartbeatResult{}, ErrBadReply
	}
	return r, nil
}

// ReleaseSlot frees a held slot: false when it was not held.
func (b *Buckets) ReleaseSlot(ctx context.Context, key SlotKey, slotID string, nowMs int64) (bool, error) {
	switch {
	case key.Limit == "":
		return false, invalid("empty key")
	case slotID == "":
		return false, invalid("empty slot id")
	case nowMs < 0 || !checkInt(nowMs):
		return false, invalid("now %d", nowMs)
	}
	v, err := b.eval(ctx, slotsScript, SlotKeys(key), "release", nowMs, slotID)
	if err != nil {
		return false, err
	}
	a, err := replyArray(v, 1)
	if err != nil {
		return false, err
	}
	return asBool(a[0])
}
