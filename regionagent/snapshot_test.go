package regionagent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"leasehold/internal/ports"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

// TestLimitCreatedAMomentAgo: a limit created after the agent's last sync
// is enforced from its first Check (the Check asks for a sync of its own;
// the periodic one is an hour away), and a limit that does not exist is
// NOT_FOUND only after such a sync; the lookups of many unknown limits at
// once share a few syncs.
func TestLimitCreatedAMomentAgo(t *testing.T) {
	var calls callCounter
	w := startWorldOpts(t, false, []grpc.ServerOption{grpc.ChainUnaryInterceptor(calls.intercept)}, "eu")
	w.putLimit(limit("tenant/old", 100, time.Minute, 15*time.Second, "eu"))
	// Long waits: this test is about what is decided, not how fast; a
	// loaded machine's slow sync or lease must not turn the first Check
	// UNAVAILABLE (as the 1 s and 500 ms defaults did in a CI run).
	a := w.liveAgentOpts("eu", "r1", WithIntervals(time.Hour, 2*time.Second), WithLookupWait(10*time.Second), WithColdWait(10*time.Second))
	ctx := context.Background()
	syncs := calls.get("SyncLimits")

	w.putLimit(limit("tenant/new", 3, time.Minute, 15*time.Second, "eu"))
	var got []pb.Reason
	for range 4 {
		d, err := a.Check(ctx, "tenant/new", 1)
		if err != nil {
			t.Fatalf("Check of a limit just created: %v", err)
		}
		got = append(got, d.Reason)
	}
	want := []pb.Reason{pb.Reason_REASON_OK, pb.Reason_REASON_OK, pb.Reason_REASON_OK, pb.Reason_REASON_OVER_LIMIT}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("G = 3 created a moment ago, four Checks: %v, want %v", got, want)
	}
	if n := calls.get("SyncLimits") - syncs; n != 1 {
		t.Fatalf("%d syncs for the new limit, want the one its first Check asked for", n)
	}

	if _, err := a.Check(ctx, "tenant/none", 1); !errorsIs(err, ErrUnknownLimit) {
		t.Fatalf("Check of a limit that does not exist: %v, want ErrUnknownLimit", err)
	}
	// 200 unknown limits at once: every one NOT_FOUND, from a few syncs.
	syncs = calls.get("SyncLimits")
	var wg sync.WaitGroup
	errs := make([]error, 200)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = a.Check(ctx, fmt.Sprintf("tenant/none-%03d", i), 1)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errorsIs(err, ErrUnknownLimit) {
			t.Fatalf("unknown limit %d: %v", i, err)
		}
	}
	if n := calls.get("SyncLimits") - syncs; n < 1 || n > 5 {
		t.Fatalf("%d syncs for 200 concurrent lookups, want 1 to 5 (one sync answers every Check waiting)", n)
	}
}

// TestRestartedAgentEnforcesKeptSnapshot: an agent started while the
// allocator is unreachable enforces the snapshot of the region's limits
// another replica kept in Redis (each limit's fallback: closed answers
// UNAVAILABLE, local:2 admits 2 then OVER_LIMIT), answers UNAVAILABLE
// (never NOT_FOUND) for a limit the snapshot does not have, and says so in
// /healthz's status and its metrics; with Redis emptied too, the file.
func TestRestartedAgentEnforcesKeptSnapshot(t *testing.T) {
	w := startWorld(t, false, "eu")
	w.putLimit(limit("tenant/closed", 100, time.Minute, 15*time.Second, "eu"))
	local := limit("tenant/local", 100, time.Minute, 15*time.Second, "eu")
	local.Mode = pb.Mode_MODE_BOUNDED
	local.Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 2}}
	w.putLimit(local)
	file := filepath.Join(t.TempDir(), "limits.snapshot")
	reg1 := prometheus.NewRegistry()
	_, stop := w.runAgent("eu", "r1", w.addr, reg1, WithSnapshotFile(file))
	waitFor(t, "the first agent synced", func() bool { return metricValue(t, reg1, "leasehold_agent_synced") == 1 })
	rdb := redis.NewClient(&redis.Options{Addr: w.redis["eu"].Addr()})
	defer rdb.Close()
	b := bucket.New(rdb)
	ctx := context.Background()
	waitFor(t, "the snapshot kept in Redis", func() bool {
		d, err := b.LoadSnapshot(ctx, "eu")
		return err == nil && len(d) > 0
	})
	stop()

	dead := ports.Addr(t) // nothing listens: the allocator is unreachable
	for _, from := range []string{"redis", "file"} {
		t.Run(from, func(t *testing.T) {
			if from == "file" {
				// Redis lost too: the snapshot and the region's fallback counts.
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			reg := prometheus.NewRegistry()
			a, stop := w.runAgent("eu", "r2-"+from, dead, reg, WithSnapshotFile(file),
				WithTimeouts(200*time.Millisecond, time.Second, 250*time.Millisecond))
			defer stop()
			select {
			case <-a.Ready():
			case <-time.After(10 * time.Second):
				t.Fatal("the restarted agent never restored the kept snapshot")
			}
			check := func(id string) pb.Reason {
				t.Helper()
				d, err := a.Check(ctx, id, 1)
				if err != nil {
					t.Fatalf("Check(%s): %v, want an answer from the restored snapshot", id, err)
				}
				return d.Reason
			}
			if r := check("tenant/closed"); r != pb.Reason_REASON_UNAVAILABLE {
				t.Errorf("closed fallback: %v, want UNAVAILABLE", r)
			}
			var got []pb.Reason
			for range 3 {
				got = append(got, check("tenant/local"))
			}
			if fmt.Sprint(got) != fmt.Sprint([]pb.Reason{pb.Reason_REASON_FALLBACK, pb.Reason_REASON_FALLBACK, pb.Reason_REASON_OVER_LIMIT}) {
				t.Errorf("local:2 fallback, three Checks: %v", got)
			}
			if r := check("tenant/other"); r != pb.Reason_REASON_UNAVAILABLE {
				t.Errorf("a limit the snapshot does not have: %v, want UNAVAILABLE (never NOT_FOUND)", r)
			}
			serving, text := a.Status()
			if !serving || !strings.Contains(text, "restored snapshot") {
				t.Errorf("status %v %q, want serving from a restored snapshot", serving, text)
			}
			if v := metricValue(t, reg, "leasehold_agent_limits_snapshot_restored"); v != 1 {
				t.Errorf("leasehold_agent_limits_snapshot_restored = %v", v)
			}
			if v := metricValue(t, reg, "leasehold_agent_synced"); v != 0 {
				t.Errorf("leasehold_agent_synced = %v with a restored snapshot, want 0", v)
			}
			if v := metricValue(t, reg, "leasehold_agent_limits_snapshot_age_seconds"); !(v >= 0 && v < 60) {
				t.Errorf("leasehold_agent_limits_snapshot_age_seconds = %v", v)
			}
		})
	}
}

// TestNeverSyncedIsUnavailable: an agent with no snapshot anywhere and no
// allocator answers UNAVAILABLE for every limit and says it is starting.
func TestNeverSyncedIsUnavailable(t *testing.T) {
	w := startWorld(t, false, "eu")
	a, _ := w.runAgent("eu", "r1", ports.Addr(t), nil, WithTimeouts(200*time.Millisecond, time.Second, 250*time.Millisecond))
	d, err := a.Check(context.Background(), "tenant/any", 1)
	if err != nil || d.Reason != pb.Reason_REASON_UNAVAILABLE || d.RetryAfter <= 0 {
		t.Fatalf("Check before any sync: %+v %v, want UNAVAILABLE with a retry-after", d, err)
	}
	if serving, text := a.Status(); serving || !strings.HasPrefix(text, "starting") {
		t.Fatalf("status %v %q", serving, text)
	}
}

// waitFor polls cond (every 10 ms, for at most 10 s): the effect of a
// background loop.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a background loop's effect
	}
}

// metricValue is the value of reg's gauge named name whose label values
// are labels, in the order of their label names (a gathered metric has
// its labels sorted by name; none: its one series).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetValue())
			}
			if slices.Equal(got, labels) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}
