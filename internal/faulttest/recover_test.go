package faulttest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/faulttest"
	"leasehold/internal/ports"
	pb "leasehold/proto/leasehold/v1"
)

// recoverBudget is how soon after the allocator (or its link) is healthy
// again the agent must admit again (issue 14: within 2 s).
const recoverBudget = 2 * time.Second

// TestRecoverAfterAllocatorOutage: real processes (an allocator with its
// embedded etcd, the eu agent behind a TCP proxy, a redis-server), a
// strict limit with fallback closed, W = 2 s and 1 s leases, so an agent
// cut from its allocator denies within a couple of seconds. Each case
// takes the allocator away for 6 s, long enough for the agent's breaker
// to open and gRPC's reconnect backoff to grow, and brings it back:
//   - killed: SIGKILL, then a restart; healthy when its Allocator service
//     serves again (it leads: it waited out its old etcd session);
//   - cut: the proxy forwards nothing and resets every connection; healthy
//     when it forwards again.
//
// From the agent's answers to a steady load, the test measures how long
// after "healthy" the first Check is admitted again, and fails above 2 s.
// From the agent's log it counts the lines the outage cost: the allocator's
// loss is logged once, and failed calls at most once a second per kind.
func TestRecoverAfterAllocatorOutage(t *testing.T) {
	skipShort(t)
	for _, c := range []string{"killed", "cut"} {
		t.Run(c, func(t *testing.T) { runRecover(t, c == "killed") })
	}
}

func runRecover(t *testing.T, kill bool) {
	const (
		limit  = "tenant/recover"
		win    = 2 * time.Second
		outage = 6 * time.Second
	)
	alloc := faulttest.StartAllocator(t, faulttest.AllocatorOptions{Regions: []string{"eu"}, GRPCAddr: ports.Addr(t),
		SessionTTL: 2 * time.Second})
	px := faulttest.NewProxy(t, alloc.GRPCAddr)
	s := &scenario{t: t, G: 1 << 20, allocs: []*faulttest.Process{alloc}}
	l := &pb.Limit{Id: limit, LimitTokens: s.G, Window: durationpb.New(win), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(time.Second)}}
	faulttest.HistoryLimit(t, l)
	s.admin(func(ctx context.Context, a pb.AdminClient) error {
		_, err := a.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l})
		return err
	})
	rs := redisOf(t)
	agent := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", Allocators: []string{px.Addr()}, Redis: rs["eu"].Addr()})
	waitLimitKnown(t, limit, agent)

	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limit, Window: win, Rate: 50, Duration: 30 * time.Second,
		Timeout: 500 * time.Millisecond, Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: agent.GRPCAddr}}})
	time.Sleep(2 * time.Second) // the load runs admitted before the fault
	down := time.Now()
	logBefore := len(agent.Stderr())
	if kill {
		alloc.Kill()
	} else {
		px.Blackhole(true)
		px.Reset()
	}
	time.Sleep(outage) // the outage
	var healthy time.Time
	if kill {
		alloc.Restart() // waits until Admin serves
		if err := faulttest.WaitHealthy(alloc.GRPCAddr, pb.Allocator_ServiceDesc.ServiceName, 30*time.Second, alloc.Exited()); err != nil {
			t.Fatalf("the restarted allocator does not lead: %v", err)
		}
		healthy = time.Now()
	} else {
		healthy = time.Now()
		px.Blackhole(false)
	}
	time.Sleep(recoverBudget + 2*time.Second) // the load runs on past the budget
	load.Stop()
	events := load.Events()
	logged := agent.Stderr()[logBefore:]

	var okBefore, deniedDuring int
	var firstOK time.Time
	for _, e := range events {
		switch {
		case e.At.Before(down):
			if e.Mode == faulttest.ModeOK {
				okBefore++
			}
		case e.At.Before(healthy):
			if e.Mode != faulttest.ModeOK && e.At.After(down.Add(win+time.Second)) {
				deniedDuring++
			}
		case e.Mode == faulttest.ModeOK && firstOK.IsZero():
			firstOK = e.At
		}
	}
	if okBefore == 0 || deniedDuring == 0 {
		t.Fatalf("admitted before the outage %d, refused during it %d: the scenario did not take the region down", okBefore, deniedDuring)
	}
	if firstOK.IsZero() {
		t.Fatalf("no Check admitted in the %v after the allocator was healthy again", recoverBudget+2*time.Second)
	}
	took := firstOK.Sub(healthy)
	t.Logf("allocator healthy again at down%+.2fs; first Check admitted %.2fs later (budget %v)",
		healthy.Sub(down).Seconds(), took.Seconds(), recoverBudget)
	if took > recoverBudget {
		t.Errorf("first Check admitted %.2fs after the allocator was healthy again, want within %v", took.Seconds(), recoverBudget)
	}

	lines := strings.Split(strings.TrimSpace(logged), "\n")
	unreachable, failed := 0, 0
	for _, l := range lines {
		switch {
		case strings.Contains(l, "allocator unreachable:"):
			unreachable++
		case strings.Contains(l, "allocator call failed"):
			failed++
		}
	}
	t.Logf("the outage logged %d lines: %d 'allocator unreachable', %d 'allocator call failed'", len(lines), unreachable, failed)
	if unreachable != 1 {
		t.Errorf("'allocator unreachable' logged %d times, want once for one outage", unreachable)
	}
	// At most one line a second for each kind of call (sync, requests,
	// returns, reports, snapshot), over the outage and the recovery.
	if limit := 5 * int((outage+recoverBudget+2*time.Second)/time.Second); failed > limit {
		t.Errorf("'allocator call failed' logged %d times, want at most %d", failed, limit)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("agent log of the outage:\n%s", logged)
	}
}
