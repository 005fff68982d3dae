package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/etcdtest"
	"leasehold/internal/faulttest"
	"leasehold/internal/ports"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/bucket"
)

func TestMain(m *testing.M) { os.Exit(faulttest.Main(m)) }

// The scenarios share one shape: a strict limit over two regions (eu, us),
// real allocator and agent processes, one redis-server per region, a load
// of a few tens of Checks per second per agent, faults on a timeline of
// wall-clock seconds, then checks of every window the load covered.
const (
	limitID = "tenant/faults"
	W       = 10 * time.Second
)

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault scenario (~1 min of real processes): runs without -short (make test LONG=1, CI)")
	}
}

// scenario is what a scenario's checks need.
type scenario struct {
	t      *testing.T
	G      int64
	allocs []*faulttest.Process
	grants *faulttest.GrantLog
	origin time.Time // time 0 of the report
	// lost names, per window, a region whose last usage may never reach
	// the allocator (every agent of the region was killed).
	lost map[int64]string
}

// putLimit creates the strict limit on whichever allocator answers.
func (s *scenario) putLimit(ttl time.Duration) {
	s.t.Helper()
	l := &pb.Limit{Id: limitID, LimitTokens: s.G, Window: durationpb.New(W), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT}
	if ttl > 0 {
		l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(ttl)}
	}
	faulttest.HistoryLimit(s.t, l)
	s.admin(func(ctx context.Context, a pb.AdminClient) error {
		_, err := a.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l})
		return err
	})
}

// admin runs fn against the allocators in turn until one answers (reports
// are served by the leader), for up to 30 s.
func (s *scenario) admin(fn func(ctx context.Context, a pb.AdminClient) error) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		for _, p := range s.allocs {
			if !p.Running() {
				continue
			}
			conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				s.t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			last = fn(ctx, pb.NewAdminClient(conn))
			cancel()
			conn.Close()
			if last == nil {
				return
			}
		}
		time.Sleep(200 * time.Millisecond) // polling for a leader
	}
	s.t.Fatalf("no allocator answered the admin call: %v", last)
}

// waitKnown waits until every agent knows the limit (a probe Check is
// answered without error). Probes spend tokens of a window the load does
// not cover from its start, so they are never counted.
func (s *scenario) waitKnown(agents ...*faulttest.Process) {
	s.t.Helper()
	waitLimitKnown(s.t, limitID, agents...)
}

// redisOf starts one redis-server per region.
func redisOf(t *testing.T) map[string]*redistest.Server {
	return map[string]*redistest.Server{"eu": redistest.Start(t), "us": redistest.Start(t)}
}

// startReplicas starts one allocator, a Redis per region, two eu agent
// replicas sharing eu's Redis and one us agent, and stores the limit
// (G = 300) once they all know it.
func startReplicas(t *testing.T) (s *scenario, rs map[string]*redistest.Server, eu1, eu2, us1 *faulttest.Process) {
	s = &scenario{t: t, G: 300}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, []string{s.allocs[0].EtcdEndpoint})
	rs = redisOf(t)
	alloc := []string{s.allocs[0].GRPCAddr}
	eu1 = faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", ReplicaID: "eu-1", Allocators: alloc, Redis: rs["eu"].Addr()})
	eu2 = faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", ReplicaID: "eu-2", Allocators: alloc, Redis: rs["eu"].Addr()})
	us1 = faulttest.StartAgent(t, faulttest.AgentOptions{Region: "us", ReplicaID: "us-1", Allocators: alloc, Redis: rs["us"].Addr()})
	s.putLimit(0)
	s.waitKnown(eu1, eu2, us1)
	return s, rs, eu1, eu2, us1
}

// outageLoad drives the three agents at 20 Checks/s each from now: the
// fault starts one and a half windows after the next boundary (killAt),
// ends two windows later (restartAt), and the load stops a window and a
// half after that (end).
func (s *scenario) outageLoad(eu1, eu2, us1 *faulttest.Process) (start, killAt, restartAt, end time.Time, load *faulttest.Load) {
	start = time.Now()
	s.origin = nextWindowStart(start, 0)
	killAt = s.origin.Add(W + W/2)
	restartAt = killAt.Add(2 * W)
	end = restartAt.Add(W + W/2)
	load = faulttest.StartLoad(s.t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 20, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu1.GRPCAddr}, {Name: "eu-2", Region: "eu", Addr: eu2.GRPCAddr},
			{Name: "us-1", Region: "us", Addr: us1.GRPCAddr}}})
	return start, killAt, restartAt, end, load
}

// fullWindows lists the windows that lie entirely in [from, to).
func fullWindows(from, to time.Time) []int64 {
	var out []int64
	for w := from.UnixNano()/int64(W) + 1; (w+1)*int64(W) <= to.UnixNano(); w++ {
		out = append(out, w)
	}
	return out
}

func windowStart(w int64) time.Time { return time.Unix(0, w*int64(W)) }

// sleepUntil waits for a point of the scenario's wall-clock timeline.
func sleepUntil(at time.Time) {
	time.Sleep(time.Until(at)) // the scenario's timeline
}

// nextWindowStart is the first window start at or after t plus lead.
func nextWindowStart(t time.Time, lead time.Duration) time.Time {
	x := t.Add(lead).UnixNano()
	return time.Unix(0, (x+int64(W)-1)/int64(W)*int64(W))
}

// reports waits until the allocator reports every window in ws as closed
// and at least what the test counted per region (the agents report usage
// every 2 s; after an outage they report the windows they missed), then
// returns the reports by window. It fails the test if they never do.
func (s *scenario) reports(ws []int64, tally faulttest.Tally) map[int64]*pb.WindowReport {
	s.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		byW := map[int64]*pb.WindowReport{}
		s.admin(func(ctx context.Context, a pb.AdminClient) error {
			resp, err := a.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: limitID, Last: 30})
			if err != nil {
				return err
			}
			for _, r := range resp.Windows {
				byW[r.WindowStart.AsTime().UnixNano()/int64(W)] = r
			}
			return nil
		})
		missing := ""
		for _, w := range ws {
			r := byW[w]
			if r == nil || !r.Closed {
				missing = fmt.Sprintf("window %d not reported closed", w)
				break
			}
			for region, n := range tally.Admitted[w] {
				if r.Admitted[region] < n && s.lost[w] != region {
					missing = fmt.Sprintf("window %d: %s reported %d admitted, the test counted %d", w, region, r.Admitted[region], n)
				}
			}
		}
		if missing == "" {
			return byW
		}
		if time.Now().After(deadline) {
			s.t.Errorf("the allocator's reports never caught up with the test's counts: %s", missing)
			return byW
		}
		time.Sleep(500 * time.Millisecond) // polling until the agents' usage reports arrive
	}
}

// checkWindows holds every full window against G, the reported bound and
// the grant records in etcd, and returns the report rows. notes adds a
// note to a window's row.
func (s *scenario) checkWindows(ws []int64, tally faulttest.Tally, notes map[int64]string) []faulttest.WindowRow {
	s.t.Helper()
	reps := s.reports(ws, tally)
	s.grants.SyncNow(s.t)
	byW := s.grants.ByWindow(limitID)
	var rows []faulttest.WindowRow
	for _, w := range ws {
		at := windowStart(w).Sub(s.origin).Seconds()
		r := reps[w]
		rows = append(rows, faulttest.Row(windowStart(w), s.G, tally.Admitted[w], r))
		rows[len(rows)-1].Note = notes[w]
		// The test's own count: strict admits <= G.
		if n := tally.Total(w); n > s.G {
			s.t.Errorf("window %+.0fs: the test counted %d admitted, above G = %d", at, n, s.G)
		}
		// Nothing spent twice: a region admitted no more than its leases
		// held (granted minus what came back unspent).
		g := byW[w]
		for region, n := range tally.Admitted[w] {
			var leased int64
			if g != nil {
				leased = g.PerRegion[region]
			}
			if n > leased {
				s.t.Errorf("window %+.0fs: %s admitted %d, its leases held %d: tokens spent twice", at, region, n, leased)
			}
		}
		if r == nil {
			continue
		}
		if r.BoundInfinite || r.Bound != 0 {
			s.t.Errorf("window %+.0fs: strict limit reports bound %d (infinite %v), want 0 (terms %v)", at, r.Bound, r.BoundInfinite, r.Terms)
		}
		if r.ObservedOvershoot > r.Bound || r.AdmittedTotal > s.G+r.Bound {
			s.t.Errorf("window %+.0fs: admitted %d, observed overshoot %d above the bound %d", at, r.AdmittedTotal, r.ObservedOvershoot, r.Bound)
		}
		if r.Granted-r.Returned > s.G {
			s.t.Errorf("window %+.0fs: granted %d - returned %d > G = %d", at, r.Granted, r.Returned, s.G)
		}
		if g != nil {
			if g.Granted != r.Granted {
				s.t.Errorf("window %+.0fs: the allocator reports %d granted, etcd holds grants of %d", at, r.Granted, g.Granted)
			}
			if g.Granted-g.Credited > s.G {
				s.t.Errorf("window %+.0fs: etcd's grants: granted %d - credited %d > G = %d", at, g.Granted, g.Credited, s.G)
			}
		}
		for region, n := range r.Admitted {
			if g != nil && n > g.PerRegion[region] {
				s.t.Errorf("window %+.0fs: allocator reports %s admitted %d, its leases held %d", at, region, n, g.PerRegion[region])
			}
		}
	}
	if d := s.grants.Duplicates(); len(d) > 0 {
		s.t.Errorf("duplicate leases:\n%s", strings.Join(d, "\n"))
	}
	return rows
}

// grantsSeen counts grant records of the limit first seen in [from, to).
func (s *scenario) grantsSeen(from, to time.Time) (n int, tokens int64) {
	for _, r := range s.grants.Records() {
		if r.Limit == limitID && !r.Seen.Before(from) && r.Seen.Before(to) {
			n++
			tokens += r.Tokens
		}
	}
	return n, tokens
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func since(origin, t time.Time) string { return fmt.Sprintf("%+.1f s", t.Sub(origin).Seconds()) }

// okIn counts OK answers of a target (or region, if target is "") in [from, to).
func okIn(events []faulttest.Event, target, region string, from, to time.Time) int {
	n := 0
	for _, e := range faulttest.Between(events, from, to) {
		if e.Mode == faulttest.ModeOK && (target == "" || e.Target == target) && (region == "" || e.Region == region) {
			n++
		}
	}
	return n
}

// ---------------------------------------------------------------------------

// TestScenario1LeaderKilled: three etcd members with etcd's default raft
// timings, two allocator replicas behind 40 ms-each-way proxies (an 80 ms
// WAN), agents in eu and us driven at 500 tokens per window against
// G = 300. The leader is SIGKILLed mid-window. A follower must lead within
// 3 s, no request id may get two leases, and every strict window admits
// <= G.
func TestScenario1LeaderKilled(t *testing.T) {
	skipShort(t)
	etcd := etcdtest.Start(t, 3, etcdtest.WithDefaultTimings())
	s := &scenario{t: t, G: 300}
	var proxies []*faulttest.Proxy
	for i := range 2 {
		addr := ports.Addr(t)
		px := faulttest.NewProxy(t, addr)
		px.SetDelay(40 * time.Millisecond)
		proxies = append(proxies, px)
		s.allocs = append(s.allocs, faulttest.StartAllocator(t, faulttest.AllocatorOptions{
			Name: fmt.Sprintf("allocator-%d", i), EtcdEndpoints: etcd.Endpoints(), GRPCAddr: addr,
			Advertise: px.Addr(), Retention: 10 * time.Minute}))
	}
	s.grants = faulttest.WatchGrants(t, etcd.Endpoints())
	rs := redisOf(t)
	var agents []*faulttest.Process
	for _, region := range []string{"eu", "us"} {
		agents = append(agents, faulttest.StartAgent(t, faulttest.AgentOptions{Region: region,
			Allocators: []string{proxies[0].Addr(), proxies[1].Addr()}, Redis: rs[region].Addr()}))
	}
	s.putLimit(0)
	s.waitKnown(agents...)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	killAt := s.origin.Add(W + W/2) // mid second window
	end := killAt.Add(2*W + W/2)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 25, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: agents[0].GRPCAddr}, {Name: "us-1", Region: "us", Addr: agents[1].GRPCAddr}}})

	sleepUntil(killAt)
	leader, follower := -1, -1
	for i, p := range s.allocs {
		if p.IsLeader() {
			leader, follower = i, 1-i
		}
	}
	if leader < 0 {
		t.Fatal("no allocator leads before the kill")
	}
	killed := time.Now()
	s.allocs[leader].Kill()
	var takeover time.Duration
	for deadline := killed.Add(20 * time.Second); ; {
		if s.allocs[follower].IsLeader() {
			takeover = time.Since(killed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no follower leads 20 s after the leader was killed")
		}
		time.Sleep(20 * time.Millisecond) // polling for the new leader
	}
	t.Logf("%s killed at %s; %s leads %v later", s.allocs[leader].Name(), since(s.origin, killed), s.allocs[follower].Name(), takeover)
	if takeover > 3*time.Second {
		t.Errorf("a follower took %v to lead after the leader was SIGKILLed, want <= 3 s", takeover)
	}
	load.Wait()
	events := load.Events()
	tally := faulttest.Count(events)
	ws := fullWindows(start, end)
	notes := map[int64]string{killed.UnixNano() / int64(W): "leader SIGKILLed"}
	rows := s.checkWindows(ws, tally, notes)
	led := killed.Add(takeover)
	grantsAfter, _ := s.grantsSeen(led, end)
	if grantsAfter == 0 {
		t.Errorf("no grant after the new leader took over")
	}
	for _, region := range []string{"eu", "us"} {
		if okIn(events, "", region, led.Add(W/2), end) == 0 {
			t.Errorf("%s admitted nothing after the new leader took over", region)
		}
	}
	faulttest.WriteReport(t, faulttest.Report{
		Title: "1. Allocator leader SIGKILLed under load",
		Summary: "Three etcd members (etcd's default raft timings: 100 ms heartbeat, 1 s election), two allocator " +
			"replicas (default `--session-ttl`), each behind a proxy adding 40 ms each way (an 80 ms WAN). " +
			"Strict limit G = 300 per 10 s; eu and us driven at 25 Checks/s each (500 per window). The leader is " +
			"SIGKILLed in the middle of the second window.",
		Facts: [][2]string{
			{"leader killed at", since(s.origin, killed)},
			{"a follower leads after (<= 3 s required)", secs(takeover)},
			{"grants committed by the new leader until the end", fmt.Sprint(grantsAfter)},
			{"grant records checked for duplicates", fmt.Sprint(len(s.grants.Records()))},
			{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
			{"answers", answers(tally)},
		},
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
	}, s.origin)
}

func answers(t faulttest.Tally) string {
	var parts []string
	for _, m := range faulttest.Modes {
		if n := t.Answers[m]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", m, n))
		}
	}
	return strings.Join(parts, ", ")
}

// TestScenario3RepliesDropped: the proxy between the agents and the
// allocator forwards requests but discards every reply for 30 s. The
// allocator commits grants the agents never hear of; the agents time out
// and retry with the same request ids. granted - returned <= G in every
// window, and no request id gets two leases.
func TestScenario3RepliesDropped(t *testing.T) {
	skipShort(t)
	s := &scenario{t: t, G: 300}
	addr := ports.Addr(t)
	px := faulttest.NewProxy(t, addr)
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{GRPCAddr: addr,
		Advertise: px.Addr(), Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, []string{s.allocs[0].EtcdEndpoint})
	rs := redisOf(t)
	var agents []*faulttest.Process
	for _, region := range []string{"eu", "us"} {
		agents = append(agents, faulttest.StartAgent(t, faulttest.AgentOptions{Region: region,
			Allocators: []string{px.Addr()}, Redis: rs[region].Addr()}))
	}
	s.putLimit(0)
	s.waitKnown(agents...)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	// Half a second before the agents fetch the next window's lease (the
	// renewal lead, 2 s, before its start): that request is sent before
	// any timed-out call can open an agent's circuit breaker, and the
	// allocator commits it from a full pool. Its reply is lost.
	dropAt := s.origin.Add(2*W - 2500*time.Millisecond)
	healAt := dropAt.Add(30 * time.Second)
	end := healAt.Add(2*W + W/2)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 25, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: agents[0].GRPCAddr}, {Name: "us-1", Region: "us", Addr: agents[1].GRPCAddr}}})
	sleepUntil(dropAt)
	px.DropReplies(true)
	droppedFrom := time.Now()
	sleepUntil(healAt)
	px.DropReplies(false)
	healed := time.Now()
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	ambiguous, ambiguousTokens := s.grantsSeen(droppedFrom, healed)
	if ambiguous == 0 {
		t.Errorf("no grant was committed while replies were dropped: the ambiguous case was not exercised")
	}
	if px.Discarded(faulttest.ToClient) == 0 {
		t.Errorf("the proxy discarded no reply")
	}
	// Grants whose reply was lost: did the agents' retries (same request
	// id) get them back? A replayed lease that is still live is
	// deposited under its lease id.
	replayed := depositedOf(t, s.grants.Records(), droppedFrom, healed, rs)
	for _, region := range []string{"eu", "us"} {
		if okIn(events, "", region, healed.Add(W/2), end) == 0 {
			t.Errorf("%s admitted nothing after the replies came back", region)
		}
	}
	ws := fullWindows(start, end)
	notes := map[int64]string{}
	for w := droppedFrom.UnixNano() / int64(W); w <= healed.UnixNano()/int64(W); w++ {
		notes[w] = "replies dropped"
	}
	rows := s.checkWindows(ws, tally, notes)
	faulttest.WriteReport(t, faulttest.Report{
		Title: "3. Replies dropped after the allocator committed (ambiguous timeouts), 30 s",
		Summary: "One allocator (embedded etcd) behind the proxy; strict G = 300 per 10 s; eu and us at 25 Checks/s " +
			"each. For 30 s the proxy forwards the agents' requests and discards every reply, so the allocator " +
			"commits grants the agents never receive; the agents time out (1 s), retry the same request ids, " +
			"open their circuit breaker, and retry again after it. Then replies flow again (the connections " +
			"that lost replies are reset and the agents reconnect).",
		Facts: [][2]string{
			{"replies dropped", since(s.origin, droppedFrom) + " to " + since(s.origin, healed)},
			{"reply bytes discarded by the proxy", fmt.Sprint(px.Discarded(faulttest.ToClient))},
			{"grants committed while replies were dropped (ambiguous)", fmt.Sprintf("%d (%d tokens)", ambiguous, ambiguousTokens)},
			{"of those, later deposited by an agent under the same lease id (retry got the same lease)", fmt.Sprint(replayed)},
			{"grant records checked for duplicates", fmt.Sprint(len(s.grants.Records()))},
			{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
			{"answers", answers(tally)},
		},
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
		Notes: []string{"Windows with replies dropped strand what was granted and never received: " +
			"the allocator counts those leases as spent (stranded), never re-grants them blind."},
	}, s.origin)
}

// depositedOf counts the grants first seen in [from, to) whose lease id is
// in their region's bucket (deposited, or closed after a deposit).
func depositedOf(t *testing.T, recs []faulttest.GrantRecord, from, to time.Time, rs map[string]*redistest.Server) int {
	clients := map[string]*redis.Client{}
	for region, srv := range rs {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer c.Close()
		clients[region] = c
	}
	n := 0
	for _, r := range recs {
		if r.Limit != limitID || r.Seen.Before(from) || !r.Seen.Before(to) || clients[r.Region] == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		vals, err := clients[r.Region].HMGet(ctx, bucket.Key("", r.Limit, r.Window), "r:"+r.LeaseID, "c:"+r.LeaseID).Result()
		cancel()
		if err != nil {
			t.Logf("reading %s's bucket: %v", r.Region, err)
			continue
		}
		if vals[0] != nil || vals[1] != nil {
			n++
		}
	}
	return n
}

// TestScenario4EtcdQuorum: three etcd members; one is hard-stopped (the
// raft leader), then a second (quorum lost), then both come back. Grants
// continue with two members, stop cleanly without quorum (the allocator
// keeps running, answers nothing it did not commit), agents run on the
// leases they hold, and nothing is granted twice when quorum returns.
func TestScenario4EtcdQuorum(t *testing.T) {
	skipShort(t)
	etcd := etcdtest.Start(t, 3)
	// Demand below G, with 5 s leases: the regions hold tokens when quorum
	// is lost, so running on held leases shows.
	s := &scenario{t: t, G: 1000}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{
		EtcdEndpoints: etcd.Endpoints(), Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, etcd.Endpoints())
	rs := redisOf(t)
	var agents []*faulttest.Process
	for _, region := range []string{"eu", "us"} {
		agents = append(agents, faulttest.StartAgent(t, faulttest.AgentOptions{Region: region,
			Allocators: []string{s.allocs[0].GRPCAddr}, Redis: rs[region].Addr()}))
	}
	s.putLimit(5 * time.Second)
	s.waitKnown(agents...)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	oneDown := s.origin.Add(W + W/2)
	quorumLost := oneDown.Add(W)
	back := quorumLost.Add(15 * time.Second)
	end := back.Add(2*W + W/2)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 25, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: agents[0].GRPCAddr}, {Name: "us-1", Region: "us", Addr: agents[1].GRPCAddr}}})

	sleepUntil(oneDown)
	first := etcd.Leader()
	if first < 0 {
		first = 0
	}
	stopped1 := time.Now() // HardStop returns seconds after the member is gone
	etcd.HardStop(first)
	sleepUntil(quorumLost)
	second := (first + 1) % 3
	stopped2 := time.Now()
	etcd.HardStop(second)
	sleepUntil(back)
	etcd.Restart(first)
	etcd.Restart(second)
	restarted := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err := etcd.WaitLeader(ctx)
	cancel()
	if err != nil {
		t.Fatalf("etcd has no leader after the members came back: %v", err)
	}
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	withTwo, _ := s.grantsSeen(stopped1.Add(time.Second), stopped2)
	// Grants created without quorum: impossible in etcd; what the test can
	// see is that none appears before quorum is back.
	var withoutQuorum int
	var lastBefore, firstAfter time.Time
	for _, r := range s.grants.Records() {
		if r.Limit != limitID {
			continue
		}
		at := time.Unix(0, r.GrantedAt)
		if at.After(stopped2) && at.Before(restarted) {
			withoutQuorum++
		}
		if at.Before(stopped2) && at.After(lastBefore) {
			lastBefore = at
		}
		if at.After(restarted) && (firstAfter.IsZero() || at.Before(firstAfter)) {
			firstAfter = at
		}
	}
	if withTwo == 0 {
		t.Errorf("no grant while two of three etcd members served")
	}
	if withoutQuorum > 0 {
		t.Errorf("%d grants are dated while etcd had no quorum", withoutQuorum)
	}
	if firstAfter.IsZero() {
		t.Errorf("no grant after quorum returned")
	}
	if !s.allocs[0].Running() {
		t.Errorf("the allocator exited while etcd had no quorum")
	}
	heldOK := 0
	for _, region := range []string{"eu", "us"} {
		n := okIn(events, "", region, stopped2, stopped2.Add(2*time.Second))
		heldOK += n
		if n == 0 {
			t.Errorf("%s admitted nothing right after quorum was lost: it did not run on its held leases", region)
		}
		if okIn(events, "", region, restarted.Add(W/2), end) == 0 {
			t.Errorf("%s admitted nothing after quorum returned", region)
		}
	}
	heldUntil := stopped2
	for _, e := range faulttest.Between(events, stopped2, restarted) {
		if e.Mode == faulttest.ModeOK {
			heldUntil = e.At
		}
	}
	ws := fullWindows(start, end)
	notes := map[int64]string{stopped1.UnixNano() / int64(W): "1 of 3 members down"}
	for w := stopped2.UnixNano() / int64(W); w <= restarted.UnixNano()/int64(W); w++ {
		notes[w] = "no quorum"
	}
	rows := s.checkWindows(ws, tally, notes)
	faulttest.WriteReport(t, faulttest.Report{
		Title: "4. One etcd member hard-stopped, then quorum lost, then restored",
		Summary: "Three etcd members (fast test timings), one allocator on them, strict G = 1000 per 10 s with 5 s " +
			"leases, eu and us at 25 Checks/s each (below G, so the regions hold tokens). The raft leader is " +
			"hard-stopped, 10 s later a second member (no quorum), 15 s later both restart.",
		Facts: [][2]string{
			{"member " + fmt.Sprint(first) + " (raft leader) hard-stopped", since(s.origin, stopped1)},
			{"grants while two members served", fmt.Sprint(withTwo)},
			{"member " + fmt.Sprint(second) + " hard-stopped (quorum lost)", since(s.origin, stopped2)},
			{"last grant before quorum was lost", since(s.origin, lastBefore)},
			{"grants dated while there was no quorum", fmt.Sprint(withoutQuorum)},
			{"Checks admitted on held leases, first 2 s without quorum", fmt.Sprint(heldOK)},
			{"last admission on held leases", since(s.origin, heldUntil)},
			{"members restarted", since(s.origin, restarted)},
			{"first grant after quorum returned", since(s.origin, firstAfter)},
			{"allocator process still running", fmt.Sprint(s.allocs[0].Running())},
			{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
			{"answers", answers(tally)},
		},
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
	}, s.origin)
}

// TestScenario6AgentReplicaKilled: eu runs two agent replicas on one
// Redis. One is SIGKILLed under load; the other keeps serving the region's
// balance, and no token is spent twice. The killed replica is restarted
// (same replica id) and serves again.
func TestScenario6AgentReplicaKilled(t *testing.T) {
	skipShort(t)
	s, _, eu1, eu2, us1 := startReplicas(t)
	start, killAt, restartAt, end, load := s.outageLoad(eu1, eu2, us1)
	sleepUntil(killAt)
	eu1.Kill()
	killed := time.Now()
	sleepUntil(restartAt)
	eu1.Restart()
	restarted := time.Now()
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	// The surviving replica serves in every window after the kill.
	for w := killed.UnixNano()/int64(W) + 1; (w+1)*int64(W) <= end.UnixNano(); w++ {
		if okIn(events, "eu-2", "", windowStart(w), windowStart(w+1)) == 0 {
			t.Errorf("window %+.0fs: eu-2 admitted nothing after eu-1 was killed", windowStart(w).Sub(s.origin).Seconds())
		}
	}
	firstOK := time.Time{}
	for _, e := range faulttest.Between(events, restarted, end) {
		if e.Target == "eu-1" && e.Mode == faulttest.ModeOK {
			firstOK = e.At
			break
		}
	}
	if firstOK.IsZero() {
		t.Errorf("the restarted eu-1 admitted nothing")
	}
	ws := fullWindows(start, end)
	notes := map[int64]string{killed.UnixNano() / int64(W): "eu-1 SIGKILLed", restarted.UnixNano() / int64(W): "eu-1 restarted"}
	rows := s.checkWindows(ws, tally, notes)
	faulttest.WriteReport(t, faulttest.Report{
		Title: "6. Agent replica SIGKILLed",
		Summary: "One allocator (embedded etcd); eu runs two agent replicas (eu-1, eu-2) on one Redis, us one; strict " +
			"G = 300 per 10 s; each replica driven at 20 Checks/s (600 per window). eu-1 is SIGKILLed mid-window " +
			"(whatever it held: renewal lock, in-flight spends) and restarted 20 s later with the same replica id.",
		Facts: [][2]string{
			{"eu-1 SIGKILLed", since(s.origin, killed)},
			{"eu-1 restarted", since(s.origin, restarted)},
			{"first admission by the restarted eu-1", since(s.origin, firstOK)},
			{"duplicate leases", fmt.Sprint(len(s.grants.Duplicates()))},
			{"answers", answers(tally)},
		},
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
		Notes: []string{"Nothing spent twice: in every window each region's admitted tokens (test and allocator) are " +
			"at most what its leases held (granted minus unspent at return, from etcd's grant records)."},
	}, s.origin)
}

// TestScenario7RegionLoss: eu and us share G = 400 per 10 s at 20 Checks/s
// each. Then us is lost (its agent SIGKILLed, its demand gone) and its
// demand moves to eu (60 Checks/s). The survivor must get the budget
// within two renewal intervals, and from the next window on spend all of
// G.
func TestScenario7RegionLoss(t *testing.T) {
	skipShort(t)
	const renewInterval = 250 * time.Millisecond // the old agent's renewal interval: the region must be served within two of them
	s := &scenario{t: t, G: 400}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, []string{s.allocs[0].EtcdEndpoint})
	rs := redisOf(t)
	alloc := []string{s.allocs[0].GRPCAddr}
	eu := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", Allocators: alloc, Redis: rs["eu"].Addr()})
	us := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "us", Allocators: alloc, Redis: rs["us"].Addr()})
	s.putLimit(0)
	s.waitKnown(eu, us)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	shiftAt := s.origin.Add(2*W + 2*time.Second)
	end := shiftAt.Add(3*W - 2*time.Second)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 20, Workers: 3, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu.GRPCAddr}, {Name: "us-1", Region: "us", Addr: us.GRPCAddr}}})
	sleepUntil(shiftAt)
	load.SetRate("us-1", 0)
	us.Kill()
	load.SetRate("eu-1", 60)
	shifted := time.Now()
	load.Wait()

	events := load.Events()
	tally := faulttest.Count(events)
	// Time until the survivor is served at its new demand: the first
	// instant after the shift from which eu's answers for 1 s are all
	// admitted, or denied only because the window's pool is spent (a
	// retry_after past the window's reset).
	var served time.Duration = -1
	euEvents := []faulttest.Event{}
	for _, e := range faulttest.Between(events, shifted, end) {
		if e.Target == "eu-1" {
			euEvents = append(euEvents, e)
		}
	}
	for i, e := range euEvents {
		ok := true
		for _, f := range euEvents[i:] {
			if f.At.Sub(e.At) > time.Second {
				break
			}
			if f.Mode != faulttest.ModeOK && !(f.Mode == faulttest.ModeOverLimit && f.RetryAfter > 500*time.Millisecond) {
				ok = false
				break
			}
		}
		if ok {
			served = e.At.Sub(shifted)
			break
		}
	}
	if served < 0 || served > 2*renewInterval {
		t.Errorf("the surviving region was served at its new demand %v after the shift, want <= two renewal intervals (%v)",
			served, 2*renewInterval)
	}
	ws := fullWindows(start, end)
	shiftW := shifted.UnixNano() / int64(W)
	var after []int64
	for _, w := range ws {
		if w > shiftW {
			after = append(after, w)
			if n := tally.Admitted[w]["eu"]; n < s.G*95/100 {
				t.Errorf("window %+.0fs after the region loss: eu admitted %d of G = %d, want >= 95%%", windowStart(w).Sub(s.origin).Seconds(), n, s.G)
			}
		}
	}
	if len(after) == 0 {
		t.Errorf("no full window after the shift")
	}
	// us's agent died with the admits since its last usage report (every
	// 2 s) unreported: nobody is left in us to report them.
	s.lost = map[int64]string{shiftW: "us"}
	rows := s.checkWindows(ws, tally, map[int64]string{shiftW: "us lost, demand moved to eu"})
	faulttest.WriteReport(t, faulttest.Report{
		Title: "7. Region loss: all demand moves to the other region",
		Summary: "One allocator (embedded etcd); strict G = 400 per 10 s; eu and us at 20 Checks/s each (their demand " +
			"together is G). 2 s into the third window us is lost (its agent SIGKILLed, its traffic gone) and eu's " +
			"traffic triples to 60 Checks/s (600 per window). The agents renew on the traffic (a spend below the low-water mark, a denial), not on an interval.",
		Facts: [][2]string{
			{"us lost, eu at 60/s", since(s.origin, shifted)},
			{"eu served at its new demand after (<= 500 ms required)", secs(served)},
			{"eu admitted per full window after the loss", fmt.Sprint(admittedIn(tally, after, "eu"))},
			{"answers", answers(tally)},
		},
		Windows: rows, Modes: faulttest.TimeInModes(events, end),
		Notes: []string{"The loss window strands what us held (granted to us, never spent nor returned); from the " +
			"next window on, eu is the only region asking and gets the whole pool. In the loss window the allocator's " +
			"admitted count for us can be below the test's: us's agent died with the admits since its last usage " +
			"report (every 2 s) unreported, and no us agent is left to report them (the counts are still in us's Redis)."},
	}, s.origin)
}

func admittedIn(t faulttest.Tally, ws []int64, region string) []int64 {
	out := make([]int64, len(ws))
	for i, w := range ws {
		out[i] = t.Admitted[w][region]
	}
	return out
}
