package faulttest_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"leasehold/internal/faulttest"
	"leasehold/regionagent/bucket"
)

// TestAgentKilledHoldingChunks: eu runs two agent replicas on one Redis,
// us one; strict G = 10,000 per 10 s; each replica driven at 100 Checks/s
// (3,000 a window: no pool runs dry), so the limit is hot on every replica
// and decided from chunks. eu-1 is SIGKILLed mid-window while it holds
// chunks (the bucket's reservations of eu-1 not released, fully spent
// ones included). The region never admits more than its leases held, no
// window more than G, and what eu-1 held unspent is stranded: the
// allocator counts it admitted (reserved tokens count as admitted until
// released), no caller was admitted it, and it is no more than eu-1's
// unreleased reservations and its Checks in flight.
func TestAgentKilledHoldingChunks(t *testing.T) {
	skipShort(t)
	s := &scenario{t: t, G: 10000}
	s.allocs = []*faulttest.Process{faulttest.StartAllocator(t, faulttest.AllocatorOptions{Retention: 10 * time.Minute})}
	s.grants = faulttest.WatchGrants(t, []string{s.allocs[0].EtcdEndpoint})
	rs := redisOf(t)
	alloc := []string{s.allocs[0].GRPCAddr}
	eu1 := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", ReplicaID: "eu-1", Allocators: alloc, Redis: rs["eu"].Addr(), Args: chunksOn})
	eu2 := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", ReplicaID: "eu-2", Allocators: alloc, Redis: rs["eu"].Addr(), Args: chunksOn})
	us1 := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "us", ReplicaID: "us-1", Allocators: alloc, Redis: rs["us"].Addr(), Args: chunksOn})
	s.putLimit(0)
	s.waitKnown(eu1, eu2, us1)

	start := time.Now()
	s.origin = nextWindowStart(start, 0)
	killAt := s.origin.Add(W + W/2)
	end := killAt.Add(W + W/2)
	load := faulttest.StartLoad(t, faulttest.LoadConfig{Limit: limitID, Window: W, Rate: 100, Workers: 4, Duration: end.Sub(start),
		Targets: []faulttest.Target{{Name: "eu-1", Region: "eu", Addr: eu1.GRPCAddr}, {Name: "eu-2", Region: "eu", Addr: eu2.GRPCAddr},
			{Name: "us-1", Region: "us", Addr: us1.GRPCAddr}}})
	sleepUntil(killAt)
	chunked, _, _ := faulttest.ScrapeMetric(context.Background(), eu1.HTTPAddr, "leasehold_agent_chunk_checks_total")
	checks, _, _ := faulttest.ScrapeMetric(context.Background(), eu1.HTTPAddr, "leasehold_agent_checks_total", `result="ok"`)
	t.Logf("eu-1 before the kill: %.0f of %.0f admitted Checks decided from chunks", chunked, checks)
	eu1.Kill()
	killed := time.Now()
	kw := killed.UnixNano() / int64(W)
	held := heldByReplica(t, rs["eu"].Addr(), bucket.Key("", limitID, kw), "ag-eu-1-")
	load.Wait()

	tally := faulttest.Count(load.Events())

	ws := fullWindows(start, end)
	rows := s.checkWindows(ws, tally, map[int64]string{kw: "eu-1 SIGKILLed holding " + strconv.FormatInt(held, 10) + " tokens in chunks"})
	t.Logf("eu-1 held %d tokens in chunks when it was killed", held)
	if held == 0 {
		t.Fatal("eu-1 held no chunk when it was killed: the test did not exercise chunks")
	}
	// Of what eu-1 held, the part it had not spent is stranded: counted
	// admitted by the allocator, never admitted to a caller. Checks that
	// were in flight at the kill may have been charged too.
	var lost int64
	for _, e := range faulttest.Between(load.Events(), killed.Add(-time.Second), killed.Add(time.Second)) {
		if e.Target == "eu-1" && e.Mode == faulttest.ModeError {
			lost += e.Cost
		}
	}
	reps := s.reports([]int64{kw}, tally)
	if r := reps[kw]; r != nil {
		unseen := r.Admitted["eu"] - tally.Admitted[kw]["eu"]
		t.Logf("kill window: allocator counts eu admitted %d, the callers %d: %d stranded (eu-1 held %d in chunks, %d Checks in flight)",
			r.Admitted["eu"], tally.Admitted[kw]["eu"], unseen, held, lost)
		if unseen < 0 || unseen > held+lost {
			t.Errorf("kill window: %d admitted but never seen by a caller; want 0..%d (what eu-1 held in chunks and in flight)", unseen, held+lost)
		}
	}
	for _, row := range rows {
		t.Logf("%+v", row)
	}
}

// chunksOn turns the agents' chunks on (off by default).
var chunksOn = []string{"--chunk-hot-rate", "50"}

// heldByReplica sums the tokens of the reservations named prefix* of the
// bucket at key that were not released (v:<id> without x:<id> in its
// records, bucket.RecordsKey).
func heldByReplica(t *testing.T, addr, key, prefix string) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	h, err := rdb.HGetAll(ctx, bucket.RecordsKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for f, v := range h {
		id, ok := strings.CutPrefix(f, "v:")
		if !ok || !strings.HasPrefix(id, prefix) {
			continue
		}
		if _, released := h["x:"+id]; released {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		held += n
	}
	return held
}
