package faulttest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"leasehold/internal/faulttest"
)

// redisUpMetric is the agents' gauge: 1 on the shared Redis bucket, 0 on
// in-process leases.
const redisUpMetric = "leasehold_agent_redis_up"

// TestScenario5RedisKilled: eu runs two agent replicas on one
// redis-server, us one on its own; strict G = 300 per 10 s, each replica
// driven at 20 Checks/s. Mid-window, eu's Redis is SIGKILLed under load
// and restarted empty 20 s later. Every full window admits <= G; while
// Redis is down each eu replica keeps admitting from leases it acquired
// for itself and holds in process; once Redis is back the replicas return
// them and spend the shared bucket again, and the allocator's admitted
// counts catch up with the test's although the bucket's counters
// restarted from zero.
func TestScenario5RedisKilled(t *testing.T) {
	skipShort(t)
	s, rs, eu1, eu2, us1 := startReplicas(t)
	start, killAt, restartAt, end, load := s.outageLoad(eu1, eu2, us1)
	eus := []*faulttest.Process{eu1, eu2}

	sleepUntil(killAt)
	rs["eu"].Kill()
	killed := time.Now()
	// Each eu replica must say it runs on in-process leases (bounded wait;
	// the gauge is polled).
	wentLocal := waitGauge(t, eus, 0, 10*time.Second)
	sleepUntil(restartAt)
	rs["eu"].Restart()
	restarted := time.Now()
	cameBack := waitGauge(t, eus, 1, 15*time.Second)
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	// While Redis was down, every eu replica admitted in every full window
	// of the outage (from its in-process leases: nothing else is left to
	// spend), and the first in-process admission came soon after the kill,
	// or after the next window's start if the kill window's pool was spent.
	killW, restartW := killed.UnixNano()/int64(W), restarted.UnixNano()/int64(W)
	var outage []int64
	for w := killW + 1; w < restartW; w++ {
		outage = append(outage, w)
		for _, tg := range []string{"eu-1", "eu-2"} {
			if okIn(events, tg, "", windowStart(w), windowStart(w+1)) == 0 {
				t.Errorf("window %+.0fs: %s admitted nothing while eu's Redis was down", windowStart(w).Sub(s.origin).Seconds(), tg)
			}
		}
	}
	if len(outage) == 0 {
		t.Fatalf("no full window while Redis was down (killed %v, restarted %v)", killed, restarted)
	}
	firstLocal := map[string]time.Time{}
	firstBack := map[string]time.Time{}
	for _, e := range faulttest.Between(events, killed, end) {
		if e.Mode != faulttest.ModeOK || e.Region != "eu" {
			continue
		}
		if w, ok := wentLocal[e.Target]; ok && firstLocal[e.Target].IsZero() && e.At.After(w) {
			firstLocal[e.Target] = e.At
		}
		if b, ok := cameBack[e.Target]; ok && firstBack[e.Target].IsZero() && e.At.After(b) {
			firstBack[e.Target] = e.At
		}
	}
	for _, tg := range []string{"eu-1", "eu-2"} {
		if f := firstLocal[tg]; f.IsZero() || f.After(windowStart(killW+1).Add(2*time.Second)) {
			t.Errorf("%s: first admission from in-process leases %v after the kill, want by 2 s into the next window (%v)",
				tg, f.Sub(killed), windowStart(killW+1).Add(2*time.Second).Sub(killed))
		}
		if firstBack[tg].IsZero() {
			t.Errorf("%s admitted nothing after Redis came back", tg)
		}
	}
	// Both logs name the outage (at warn; the agents run with
	// --log-level warn, so the info line of the recovery is not there).
	for _, p := range eus {
		if !strings.Contains(p.Stderr(), "Redis unreachable") {
			t.Errorf("%s logged no %q line", p.Name(), "Redis unreachable")
		}
	}

	ws := fullWindows(start, end)
	// Admits eu's Redis counted since the last usage report (every 2 s)
	// died with it: the kill window's eu count may stay below the test's.
	s.lost = map[int64]string{killW: "eu"}
	notes := map[int64]string{killW: "eu Redis SIGKILLed", restartW: "eu Redis restarted empty"}
	for _, w := range outage {
		notes[w] = "eu on in-process leases"
	}
	rows := s.checkWindows(ws, tally, notes)
	var stranded int64
	for _, r := range rows {
		if r.Note == notes[killW] {
			stranded = r.Stranded
		}
	}
	facts := [][2]string{
		{"eu Redis SIGKILLed", since(s.origin, killed)},
		{"eu Redis restarted (empty)", since(s.origin, restarted)},
	}
	for _, tg := range []string{"eu-1", "eu-2"} {
		facts = append(facts,
			[2]string{tg + " on in-process leases (gauge 0) after", secs(wentLocal[tg].Sub(killed))},
			[2]string{tg + " first in-process admission after the kill", secs(firstLocal[tg].Sub(killed))},
			[2]string{tg + " back on the shared bucket (gauge 1) after the restart", secs(cameBack[tg].Sub(restarted))})
	}
	facts = append(facts,
		[2]string{"eu admitted per full window while Redis was down", fmt.Sprint(admittedIn(tally, outage, "eu"))},
		[2]string{"stranded in the kill window (all regions)", fmt.Sprint(stranded)},
		[2]string{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
		[2]string{"answers", answers(tally)})
	faulttest.WriteReport(t, faulttest.Report{
		Title: "5. Redis SIGKILLed in one region, restarted empty",
		Summary: "One allocator (embedded etcd); eu runs two agent replicas (eu-1, eu-2) on one redis-server, us one on " +
			"its own; strict G = 300 per 10 s; each replica driven at 20 Checks/s (600 per window in all). Mid-window " +
			"eu's redis-server is SIGKILLed under load and restarted 20 s later with no data (no persistence).",
		Facts:   facts,
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
		Notes: []string{"While Redis is down each eu replica acquires leases for itself (its own request ids, its own " +
			"demand) and spends them in process: no Redis call per Check. What the region held in the dead Redis is " +
			"stranded (undershoot: the allocator counts it as granted, it is neither spent nor returned). When Redis " +
			"answers again, the replicas return what they hold in process and renew into the new, empty bucket. The " +
			"allocator sums each replica's in-process counts (reported under the replica's own name) and the bucket's " +
			"counts of each Redis incarnation (named by its epoch): the bucket's counters restarting from zero hide " +
			"nothing. In the kill window the allocator's eu count can be below the test's: admits the dead Redis " +
			"counted since the last usage report (every 2 s) died with it. The load asks twice G per window, so the kill " +
			"window's pool is usually spent before the kill: the first in-process admission then comes when the next " +
			"window opens, from a lease fetched for it in process."},
	}, s.origin)
}

// waitGauge polls each agent's leasehold_agent_redis_up until it reads
// want, for up to timeout, and returns when each did (by "eu-1", ...).
func waitGauge(t *testing.T, agents []*faulttest.Process, want float64, timeout time.Duration) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := strings.TrimPrefix(p.Name(), "agent ")
			deadline := time.Now().Add(timeout)
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				v, ok, err := faulttest.ScrapeMetric(ctx, p.HTTPAddr, redisUpMetric)
				cancel()
				if err == nil && ok && v == want {
					mu.Lock()
					out[name] = time.Now()
					mu.Unlock()
					return
				}
				time.Sleep(50 * time.Millisecond) // polling the agent's gauge
			}
			t.Errorf("%s: %s never read %v within %v", name, redisUpMetric, want, timeout)
		}()
	}
	wg.Wait()
	return out
}
