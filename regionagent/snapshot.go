package regionagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/core"
)

// The agent keeps the last snapshot of its region's limits it had from
// the allocator beside its buckets in Redis (one key per region, written
// by any replica, the newest kept), and in a file when WithSnapshotFile
// names one. An agent that starts while the allocator is unreachable loads
// the newest of the two and enforces each limit's mode and fallback from
// it, instead of knowing no limit at all (and answering every Check
// UNAVAILABLE). A snapshot from the allocator always replaces a restored
// one; a restored one never replaces the allocator's.

// WithSnapshotFile also keeps the region's snapshot of its limits in a
// file (written atomically after every sync that changed it), for an
// agent that restarts while both the allocator and Redis are unreachable.
func WithSnapshotFile(path string) Option { return func(o *options) { o.snapshotFile = path } }

// saveSnapshot stores a snapshot the allocator sent (Redis, the file).
func (a *Agent) saveSnapshot(ctx context.Context, resp *pb.SyncLimitsResponse) {
	data, err := proto.Marshal(resp)
	if err != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	_, err = a.shared.b.SaveSnapshot(rctx, a.cfg.Region, core.EtcdRevision(resp.Revision), resp.AllocatorUnixNanos/int64(time.Millisecond), data)
	cancel()
	a.observeRedis(err)
	if err != nil {
		a.notes.callFailed(a.log, "saving the limits snapshot in Redis", 1, err)
	}
	if a.opt.snapshotFile != "" {
		if err := writeFileAtomic(a.opt.snapshotFile, data); err != nil {
			a.notes.callFailed(a.log, "saving the limits snapshot file", 1, err)
		}
	}
}

// restoreSnapshot loads the newest kept snapshot (Redis, the file) into
// the core, unless the allocator already answered. It reports where it
// came from ("" if nowhere).
func (a *Agent) restoreSnapshot(ctx context.Context) string {
	var best *pb.SyncLimitsResponse
	from := ""
	consider := func(data []byte, where string) {
		var s pb.SyncLimitsResponse
		if len(data) == 0 || proto.Unmarshal(data, &s) != nil || s.AllocatorUnixNanos == 0 {
			return
		}
		if best == nil || core.SnapshotNewer(s.Revision, time.Unix(0, s.AllocatorUnixNanos), best.Revision,
			time.Unix(0, best.AllocatorUnixNanos)) {
			best, from = &s, where
		}
	}
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	data, err := a.shared.b.LoadSnapshot(rctx, a.cfg.Region)
	cancel()
	if err == nil {
		consider(data, "redis")
	}
	if a.opt.snapshotFile != "" {
		if data, err := os.ReadFile(a.opt.snapshotFile); err == nil {
			consider(data, "file")
		} else if !errors.Is(err, os.ErrNotExist) {
			a.log.Warn("reading the limits snapshot file failed", "file", a.opt.snapshotFile, "err", err)
		}
	}
	if best == nil {
		return ""
	}
	ls, plans := coreLimits(best.Limits, a.cfg.Region)
	taken := time.Unix(0, best.AllocatorUnixNanos)
	restored := false
	a.withCore(func(c *core.Core) {
		if restored = c.RestoreLimits(best.Revision, ls, taken); restored {
			c.SetPlans(plans)
		}
	})
	if !restored {
		return ""
	}
	// Not reached since the agent started: down, so each limit's fallback
	// applies from its first Check rather than after breakerTrip failures.
	if a.alloc.br.assumeDown(a.opt.now()) {
		a.allocatorHealth(false)
	}
	a.syncOnce.Do(func() { close(a.synced) })
	a.log.Warn("the allocator has not answered yet: enforcing the last snapshot of the region's limits",
		"from", from, "limits", len(ls), "taken", taken.UTC().Format(time.RFC3339))
	return from
}

// writeFileAtomic writes data to path through a temporary file and a
// rename, so a reader never sees half a snapshot.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return errors.Join(werr, cerr)
	}
	return os.Rename(tmp.Name(), path)
}

// Status says whether the agent serves and why, for /healthz: it serves
// once it has a snapshot of its region's limits, from the allocator or
// restored from what it kept (then with the snapshot's age).
func (a *Agent) Status() (serving bool, text string) {
	a.mu.Lock()
	synced, restored, taken := a.core.Snapshot()
	down := a.core.AllocatorDown()
	a.mu.Unlock()
	age := a.snapshotAge(taken)
	switch {
	case synced && !down:
		return true, "ok: region " + a.cfg.Region
	case synced:
		return true, fmt.Sprintf("ok: region %s; allocator unreachable, limits from a sync %.0f s old (fallback modes apply when leases run out)",
			a.cfg.Region, age.Seconds())
	case restored:
		return true, fmt.Sprintf("ok: region %s; allocator not reached since start: enforcing a restored snapshot of its limits, %.0f s old",
			a.cfg.Region, age.Seconds())
	}
	return false, "starting: no limits from the allocator yet (and no snapshot kept): every Check is UNAVAILABLE"
}

// snapshotAge is how old a snapshot taken at taken (the allocator's clock)
// is now, as this host's clock reads it.
func (a *Agent) snapshotAge(taken time.Time) time.Duration {
	if taken.IsZero() {
		return 0
	}
	return max(0, a.opt.now().Sub(taken))
}

var (
	snapshotAgeDesc = prometheus.NewDesc("leasehold_agent_limits_snapshot_age_seconds",
		"Age of the agent's snapshot of its region's limits (since the allocator took it); NaN without one. It grows while the allocator is unreachable.",
		nil, nil)
	snapshotSourceDesc = prometheus.NewDesc("leasehold_agent_limits_snapshot_restored",
		"1 while the agent enforces a snapshot of its limits restored from Redis or its file (the allocator not reached since it started), else 0.",
		nil, nil)
)
