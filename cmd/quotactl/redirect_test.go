package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"leasehold/internal/etcdtest"
)

// TestFollowerRedirect runs two real allocators on one etcd and calls the
// follower.
func TestFollowerRedirect(t *testing.T) {
	c := etcdtest.Start(t, 1)
	leader := startAllocator(t, c)
	waitLeader(t, leader)
	follower := startAllocator(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for follower.a.Leader() != leader.addr || follower.a.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatalf("follower never learned the leader: leader %q, follower sees %q", leader.addr, follower.a.Leader())
		case <-time.After(10 * time.Millisecond):
		}
	}
	setArgs := func(addr, id string) []string {
		return []string{"--allocator", addr, "limits", "set", "--reason", "test", id, "--limit", "100",
			"--window", "1m", "--regions", "eu", "--mode", "strict"}
	}

	t.Run("follower serves admin from etcd", func(t *testing.T) {
		quotactl(setArgs(leader.addr, "tenant/a")...).want(t, 0)
		r := quotactl("--allocator", follower.addr, "limits", "get", "tenant/a").want(t, 0)
		checkKV(t, kv(t, r.stdout), map[string]string{"id": "tenant/a", "limit": "100", "version": "1"})
	})

	// A follower refusing with the leader's address in the trailer, as it
	// does for Allocator calls: quotactl asks the leader once and prints
	// its answer; later pages go straight to the leader.
	t.Run("refusing follower redirects to the leader", func(t *testing.T) {
		follower.gate.refuse.Store(true)
		defer follower.gate.refuse.Store(false)
		refused, served := follower.gate.refused.Load(), leader.gate.served.Load()
		r := quotactl(setArgs(follower.addr, "tenant/b")...).want(t, 0)
		checkKV(t, kv(t, r.stdout), map[string]string{"id": "tenant/b", "version": "1"})
		if got := follower.gate.refused.Load() - refused; got != 1 {
			t.Errorf("follower refused %d calls, want 1", got)
		}
		if got := leader.gate.served.Load() - served; got != 1 {
			t.Errorf("leader served %d calls, want 1", got)
		}
		quotactl(setArgs(leader.addr, "tenant/c")...).want(t, 0)

		refused, served = follower.gate.refused.Load(), leader.gate.served.Load()
		r = quotactl("--allocator", follower.addr, "limits", "list", "--page-size", "1").want(t, 0)
		for _, id := range []string{"tenant/a", "tenant/b", "tenant/c"} {
			if !strings.Contains(r.stdout, id) {
				t.Errorf("list via follower lacks %s:\n%s", id, r.stdout)
			}
		}
		if got := follower.gate.refused.Load() - refused; got != 1 {
			t.Errorf("follower refused %d of the list's calls, want only the first", got)
		}
		if got := leader.gate.served.Load() - served; got < 3 {
			t.Errorf("leader served %d pages, want >= 3", got)
		}

		r = quotactl("--allocator", follower.addr, "limits", "get", "tenant/none").want(t, 1)
		if !strings.Contains(r.stderr, "not found") {
			t.Errorf("leader's not found not passed on: %q", r.stderr)
		}
	})

	// Both replicas name the other: one redirect only, then a failure.
	t.Run("redirect only once", func(t *testing.T) {
		follower.gate.refuse.Store(true)
		leader.gate.refuse.Store(true)
		leader.gate.claim.Store(&follower.addr)
		defer func() {
			follower.gate.refuse.Store(false)
			leader.gate.refuse.Store(false)
			leader.gate.claim.Store(nil)
		}()
		fr, lr := follower.gate.refused.Load(), leader.gate.refused.Load()
		r := quotactl("--allocator", follower.addr, "--timeout", "2s", "limits", "get", "tenant/a").want(t, 1)
		if !strings.Contains(r.stderr, "unavailable") || !strings.Contains(r.stderr, "leader named by "+follower.addr) {
			t.Errorf("stderr %q", r.stderr)
		}
		if f, l := follower.gate.refused.Load()-fr, leader.gate.refused.Load()-lr; f != 1 || l != 1 {
			t.Errorf("refusals: follower %d, leader %d; want 1 and 1", f, l)
		}
	})
}
