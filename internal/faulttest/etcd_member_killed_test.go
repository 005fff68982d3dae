package faulttest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"leasehold/internal/etcdtest"
	"leasehold/internal/faulttest"
)

// TestScenario8EtcdMemberKilled: three etcd members, each its own process
// with etcd's default raft timings (1 s election timeout); one allocator
// with the command's default session TTL (2 s); strict G = 1000 per 10 s
// with 1 s leases, so the regions ask for grants all the time; eu and us
// at 25 Checks/s each (below G: every denial is the fault's). The etcd
// member that leads raft is SIGKILLed mid-window. The allocator must keep
// its leadership (the same election key, no new term), and each region's
// longest run of denials, counted from the answers it got, must stay
// within the longest election the configured timings allow (2 x the
// election timeout: a follower's randomized timeout is below that) plus
// 0.5 s for the retries to notice its end (the allocator's commit retry
// backs off at most 200 ms, the agent's acquire retry starts at 50-75 ms,
// a Check comes every 40 ms).
func TestScenario8EtcdMemberKilled(t *testing.T) {
	skipShort(t)
	etcd := etcdtest.StartProcesses(t, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s := &scenario{t: t, G: 1000}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{
		EtcdEndpoints: etcd.Endpoints(), Retention: 10 * time.Minute})}
	alloc := s.allocs[0]
	s.grants = faulttest.WatchGrants(t, etcd.Endpoints())
	rs := redisOf(t)
	var agents []*faulttest.Process
	for _, region := range []string{"eu", "us"} {
		agents = append(agents, faulttest.StartAgent(t, faulttest.AgentOptions{Region: region,
			Allocators: []string{alloc.GRPCAddr}, Redis: rs[region].Addr()}))
	}
	s.putLimit(time.Second)
	s.waitKnown(agents...)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	killAt := s.origin.Add(W + W/2)
	end := killAt.Add(W + W/2)
	targets := []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: agents[0].GRPCAddr}, {Name: "us-1", Region: "us", Addr: agents[1].GRPCAddr}}
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 25, Duration: end.Sub(start), Targets: targets})

	sleepUntil(killAt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	termsBefore := allocatorTerms(ctx, t, alloc)
	keyBefore := electionKeys(ctx, t, cli)
	old := etcd.Leader(ctx, cli)
	if old < 0 {
		t.Fatal("etcd has no raft leader before the kill")
	}
	killed := time.Now()
	etcd.Kill(old)
	var elected time.Time
	for {
		if i := etcd.Leader(ctx, cli); i >= 0 && i != old {
			elected = time.Now()
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no new etcd raft leader after the kill")
		}
		time.Sleep(10 * time.Millisecond) // polling the members for the election's end
	}
	election := elected.Sub(killed)
	bound := 2*etcd.ElectionTimeout() + 500*time.Millisecond
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	termsAfter := allocatorTerms(ctx, t, alloc)
	keyAfter := electionKeys(ctx, t, cli)
	if termsAfter != termsBefore {
		t.Errorf("the allocator started %v leadership terms after the etcd member was killed, want none", termsAfter-termsBefore)
	}
	if keyAfter != keyBefore {
		t.Errorf("the election key changed: %s before the kill, %s after", keyBefore, keyAfter)
	}
	if !alloc.IsLeader() {
		t.Errorf("the allocator no longer leads")
	}
	facts := [][2]string{
		{fmt.Sprintf("etcd member %d (raft leader) SIGKILLed", old), since(s.origin, killed)},
		{"a new raft leader after (the election, measured by asking the members)", secs(election)},
		{"longest denial run allowed (2 x election timeout + 0.5 s)", secs(bound)},
		{"allocator leadership terms started after the kill", fmt.Sprint(termsAfter - termsBefore)},
		{"election key before / after", keyBefore + " / " + keyAfter},
	}
	for _, tg := range targets {
		denied, longest := deniedAfter(events, tg.Name, killed.Add(-time.Second), end)
		facts = append(facts, [2]string{tg.Name + " denied answers after the kill (longest run)", fmt.Sprintf("%d (%s)", denied, secs(longest))})
		if longest > bound {
			t.Errorf("%s was denied for %v in a row, longer than the longest election allowed and the retries (%v; this election took %v)",
				tg.Name, longest.Round(time.Millisecond), bound, election.Round(time.Millisecond))
		}
		if okIn(events, tg.Name, "", elected.Add(time.Second), end) == 0 {
			t.Errorf("%s admitted nothing after the election", tg.Name)
		}
	}
	ws := fullWindows(start, end)
	rows := s.checkWindows(ws, tally, map[int64]string{killed.UnixNano() / int64(W): "etcd raft leader SIGKILLed"})
	facts = append(facts, [2]string{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))}, [2]string{"answers", answers(tally)})
	faulttest.WriteReport(t, faulttest.Report{
		Title: "8. etcd raft leader SIGKILLed under load",
		Summary: "Three etcd members, each its own process with etcd's default raft timings (100 ms heartbeat, 1 s " +
			"election), one allocator on them with the default `--session-ttl` (2 s), strict G = 1000 per 10 s with " +
			"1 s leases (the regions ask for grants all the time), eu and us at 25 Checks/s each (below G: a denial is " +
			"the fault's). The member that leads raft is SIGKILLed in the middle of the second window. Each region's " +
			"longest run of denials, counted from its answers, must stay within 2 x the election timeout (the longest " +
			"election the timings allow) + 0.5 s for the retries to notice its end.",
		Facts:   facts,
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
		Notes: []string{"A commit that etcd could not answer (its raft leader died) is retried, still fenced, within the " +
			"allocator's term; the leader's session, which hears no keep-alive answer during the election, is resumed " +
			"on its live lease. Denials are bounded by the election, not by a commit timeout and a new term."},
	}, s.origin)
}

// deniedAfter counts target's answers other than OK in [from, to) and the
// longest run of them: from the first of a run to the OK answer that ends
// it (or to), so a run is measured as the clients saw it.
func deniedAfter(events []faulttest.Event, target string, from, to time.Time) (n int, longest time.Duration) {
	var runStart time.Time
	for _, e := range faulttest.Between(events, from, to) {
		if e.Target != target {
			continue
		}
		if e.Mode == faulttest.ModeOK {
			if !runStart.IsZero() {
				longest = max(longest, e.At.Sub(runStart))
				runStart = time.Time{}
			}
			continue
		}
		n++
		if runStart.IsZero() {
			runStart = e.At
		}
	}
	if !runStart.IsZero() {
		longest = max(longest, to.Sub(runStart))
	}
	return n, longest
}

// allocatorTerms reads the allocator's leadership terms started.
func allocatorTerms(ctx context.Context, t *testing.T, p *faulttest.Process) float64 {
	t.Helper()
	v, ok, err := faulttest.ScrapeMetric(ctx, p.HTTPAddr, "leasehold_allocator_leader_terms_total")
	if err != nil || !ok {
		t.Fatalf("%s: leasehold_allocator_leader_terms_total: %v (exported %v)", p.Name(), err, ok)
	}
	return v
}

// electionKeys names the allocators' election keys and their create
// revisions: a new term of any replica makes a new key.
func electionKeys(ctx context.Context, t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	resp, err := cli.Get(ctx, "/leasehold/leader/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, kv := range resp.Kvs {
		out += fmt.Sprintf("%s@%d ", kv.Key, kv.CreateRevision)
	}
	return out
}
