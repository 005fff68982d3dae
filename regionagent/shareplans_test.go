package regionagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// Plans of bucket and concurrency limits: a tenant no admin call created
// is limited by its plan from its first use, in two regions, and costs
// nothing once idle (docs/plans.md, docs/design.md "Plans").

// shareRetention is how long the allocator keeps an expired share in
// these tests (its sweep runs every few milliseconds of real time, at
// the world's clock).
const shareRetention = 30 * time.Second

// newShareWorld is a world whose allocator sweeps often, with a short
// share retention.
func newShareWorld(t *testing.T, regions ...string) *world {
	return startWorldWith(t, true, nil, []allocator.Option{allocator.WithRetention(shareRetention, 5*time.Millisecond)}, regions...)
}

// admitLog is what a test's callers were admitted, at the world's clock.
type admitLog struct {
	ms       []int64 // one per admitted token (cost 1)
	denied   int
	admitted map[string]int
}

// checkBucketBound holds every interval between two admits against the
// bucket limit's bound B + ceil(R x T / period) (brute force).
func checkBucketBound(t *testing.T, rate int64, period time.Duration, burst int64, ms []int64) {
	t.Helper()
	ms = slices.Sorted(slices.Values(ms))
	for i := range ms {
		for j := i; j < len(ms); j++ {
			got := int64(j - i + 1)
			if b := lease.BucketBound(rate, period, burst, time.Duration(ms[j]-ms[i])*time.Millisecond, 0); got > b {
				t.Fatalf("admitted %d in [%d ms, %d ms] (%v), bound %d", got, ms[i], ms[j], time.Duration(ms[j]-ms[i])*time.Millisecond, b)
			}
		}
	}
}

// drive runs demand (tokens per second, per region) for d in steps of
// 50 ms of the world's clock: each region's callers Check, then its agent
// does its timed work (renewals, installs).
func (w *world) drive(t *testing.T, agents map[string]*Agent, id string, demand map[string]float64, d time.Duration, log *admitLog) {
	t.Helper()
	ctx := context.Background()
	acc := map[string]float64{}
	const step = 50 * time.Millisecond
	for range int(d / step) {
		for _, r := range slices.Sorted(func(yield func(string) bool) {
			for r := range agents {
				if !yield(r) {
					return
				}
			}
		}) {
			acc[r] += demand[r] * step.Seconds()
			for acc[r] >= 1 {
				acc[r]--
				dec, err := agents[r].Check(ctx, id, 1)
				if err != nil {
					t.Fatalf("%s: Check %s: %v", r, id, err)
				}
				if dec.Allowed {
					log.ms = append(log.ms, w.clock.Now().UnixMilli())
					log.admitted[r]++
				} else {
					log.denied++
				}
			}
			agents[r].tick(ctx)
		}
		w.clock.Add(step)
	}
}

// shareRecords counts the allocator's etcd keys naming id.
func (w *world) shareRecords(t *testing.T, id string) int {
	t.Helper()
	resp, err := w.alloc.Store().Client().Get(context.Background(), "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/shares/"+id+"!") {
			n++
		}
	}
	return n
}

// awaitForgotten waits (real time, bounded) for the allocator's sweep to
// forget id: no share state in its core, no share record in etcd.
func (w *world) awaitForgotten(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var kept bool
		_ = w.alloc.View(func(_ time.Time, c *allocator.Core) { kept = c.SharesKept(id) })
		n := w.shareRecords(t, id)
		if !kept && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the allocator still keeps %s: core state %v, %d share records in etcd", id, kept, n)
		}
		time.Sleep(5 * time.Millisecond) // polling the sweep's effect
	}
}

// rateSeq reads the seq of the share in force in a region's Redis for a
// bucket limit (0: none).
func (w *world) rateSeq(t *testing.T, region, id string) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis[region].Addr()})
	defer rdb.Close()
	v, err := rdb.HGet(context.Background(), "lh:{"+id+"}:rate", "seq").Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// freePlan is a bucket plan: every tenant/{id} rate tokens a second,
// bursts of burst, shares of 10 s, strict, in regions.
func freePlan(rate, burst int64, regions ...string) *pb.Limit {
	return &pb.Limit{Id: "plans/free", Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: burst,
		RatePeriod: durationpb.New(time.Second), Regions: regions, Mode: pb.Mode_MODE_STRICT,
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"tenant/{id}"}}
}

// TestBucketPlanFirstUseTwoRegionsStrict: a tenant no admin call ever
// created, on a bucket plan (10 a second, bursts of 20), checked in two
// regions with demand 2.5 times the rate: over every interval of length
// d the regions together admit at most B + R x d, and it is limited
// (denials, and most of the rate admitted). Then it goes quiet: once its
// last share is past the retention the allocator keeps nothing of it
// (core and etcd); used again, its shares restart at seq 1, which each
// region's Redis (still holding the old share's hash, with a greater
// seq) and agent accept, within the bound again. Idle past the agents'
// forget time, the agents keep nothing either, and it works once more.
func TestBucketPlanFirstUseTwoRegionsStrict(t *testing.T) {
	const R, B, id = 10, 20, "tenant/newco"
	w := newShareWorld(t, "eu", "us")
	w.putPlan(freePlan(R, B, "eu", "us"), "tenant/probe")
	agents := map[string]*Agent{"eu": w.agent("eu", "eu1"), "us": w.agent("us", "us1")}
	demand := map[string]float64{"eu": 15, "us": 10}

	first := &admitLog{admitted: map[string]int{}}
	start := w.clock.Now()
	w.drive(t, agents, id, demand, 40*time.Second, first)
	checkBucketBound(t, R, time.Second, B, first.ms)
	t.Logf("40 s of 25/s against 10/s, burst 20: admitted eu %d, us %d, denied %d", first.admitted["eu"], first.admitted["us"], first.denied)
	if n := len(first.ms); n < R*40*6/10 || first.denied == 0 || first.admitted["eu"] == 0 || first.admitted["us"] == 0 {
		t.Fatalf("admitted %d (eu %d, us %d) and denied %d in 40 s at 10/s: want most of the rate, in both regions, and denials",
			n, first.admitted["eu"], first.admitted["us"], first.denied)
	}
	for r, a := range agents {
		if n := a.core.Bound(); n != 1 {
			t.Errorf("%s agent keeps %d ids resolved from plans, want 1", r, n)
		}
	}
	if n := w.shareRecords(t, id); n == 0 {
		t.Fatal("no share records of the tenant in etcd while it is used")
	}
	seqBefore := map[string]int64{"eu": w.rateSeq(t, "eu", id), "us": w.rateSeq(t, "us", id)}
	if seqBefore["eu"] < 3 || seqBefore["us"] < 3 {
		t.Fatalf("the shares in force in Redis after 40 s: seq %v, want renewals", seqBefore)
	}

	// Idle: the last shares expire within a share ttl; the allocator
	// forgets the tenant the retention later.
	for range 50 {
		w.clock.Add(time.Second)
		for _, a := range agents {
			a.tick(context.Background())
		}
	}
	w.awaitForgotten(t, id)
	t.Logf("idle %v after %v of use: the allocator keeps nothing of %s", 50*time.Second, w.clock.Now().Sub(start)-50*time.Second, id)

	// Used again, before the agents forget it and before its Redis keys
	// expire: seq 1 below the old shares' seq, accepted.
	again := &admitLog{admitted: map[string]int{}}
	w.drive(t, agents, id, demand, 20*time.Second, again)
	checkBucketBound(t, R, time.Second, B, again.ms)
	if len(again.ms) < R*20/2 || again.denied == 0 {
		t.Fatalf("used again: admitted %d, denied %d in 20 s", len(again.ms), again.denied)
	}
	for r := range agents {
		if s := w.rateSeq(t, r, id); s >= seqBefore[r] || s < 1 {
			t.Errorf("%s's Redis holds seq %d after the tenant came back, want the restarted seq (below %d)", r, s, seqBefore[r])
		}
	}

	// Idle past the agents' forget time (5 min): nothing kept anywhere.
	for range 14 {
		w.clock.Add(30 * time.Second)
		for _, a := range agents {
			a.tick(context.Background())
		}
	}
	for r, a := range agents {
		if n, act := a.core.Bound(), a.core.Active(); n != 0 || act != 0 {
			t.Fatalf("%s agent after 7 idle minutes: %d resolved, %d limit states; want none", r, n, act)
		}
	}
	w.awaitForgotten(t, id)
	last := &admitLog{admitted: map[string]int{}}
	w.drive(t, agents, id, demand, 10*time.Second, last)
	checkBucketBound(t, R, time.Second, B, last.ms)
	if len(last.ms) == 0 || last.denied == 0 {
		t.Fatalf("used a third time: admitted %d, denied %d", len(last.ms), last.denied)
	}
}

// jobsPlan is a concurrency plan: every jobs/{id} at most n slots held at
// once, all regions together, slot shares of 10 s, strict, in regions.
func jobsPlan(n int64, regions ...string) *pb.Limit {
	return &pb.Limit{Id: "plans/jobs", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n, Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}, Binds: []string{"jobs/{id}"}}
}

// slotSeq reads the seq of the slot share in force in a region's Redis
// (0: none).
func (w *world) slotSeq(t *testing.T, region, id string) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: w.redis[region].Addr()})
	defer rdb.Close()
	v, err := rdb.HGet(context.Background(), "lh:{"+id+"}:slots", "seq").Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// slotHolder is one of the test's holders: it acquires a slot, keeps it
// (heartbeating) for a while, releases it and starts again.
type slotHolder struct {
	region, name string
	slot         string
	expires      time.Time // the slot's expiry as the agent last answered
	until        time.Time // when it releases
}

// runHolders drives holders for d in steps of 250 ms and returns the most
// slots they held at once (counted from their own answers: a slot is held
// from its acquire until its release or its expiry) and the acquires
// denied.
func (w *world) runHolders(t *testing.T, agents map[string]*Agent, id string, holders []*slotHolder, d time.Duration) (most, denied int) {
	t.Helper()
	ctx := context.Background()
	const ttl = 2 * time.Second
	for step := range int(d / (250 * time.Millisecond)) {
		now := w.clock.Now()
		for i, h := range holders {
			a := agents[h.region]
			switch {
			case h.slot != "" && !now.Before(h.until):
				if _, err := a.ReleaseSlot(ctx, id, h.slot); err != nil {
					t.Fatalf("%s release: %v", h.name, err)
				}
				h.slot = ""
			case h.slot != "" && !now.Before(h.expires):
				h.slot = "" // lost at its expiry
			case h.slot != "":
				left, err := a.HeartbeatSlot(ctx, id, h.slot, ttl)
				if errorsIs(err, ErrSlotNotHeld) {
					h.slot = ""
					break
				}
				if err != nil {
					t.Fatalf("%s heartbeat: %v", h.name, err)
				}
				h.expires = now.Add(left)
			case (step+i)%3 == 0: // each free holder tries every 750 ms
				dec, err := a.AcquireSlot(ctx, id, h.name, ttl)
				if err != nil {
					t.Fatalf("%s acquire: %v", h.name, err)
				}
				if dec.Allowed {
					h.slot, h.expires = dec.SlotID, now.Add(dec.ExpiresIn)
					h.until = now.Add(time.Duration(1+(step+i)%4) * time.Second)
				} else {
					denied++
				}
			}
			a.slotsSettled(t, id)
		}
		held := 0
		for _, h := range holders {
			if h.slot != "" && now.Before(h.expires) {
				held++
			}
		}
		most = max(most, held)
		var reserved int64
		_ = w.alloc.View(func(now time.Time, c *allocator.Core) { reserved = c.ReservedSlots(id, now) })
		if held > 3 || reserved > 3 {
			t.Fatalf("step %d: the holders hold %d slots, the allocator reserves %d; N is 3", step, held, reserved)
		}
		w.clock.Add(250 * time.Millisecond)
	}
	return most, denied
}

// TestConcurrencyPlanFirstUseTwoRegionsStrict: a tenant no admin call
// ever created, on a concurrency plan of 3 slots, acquired by eight
// holders in two regions: never more than 3 held at once (the holders'
// own count and the allocator's), and the cap is reached (denials). Then
// the holders stop: the allocator forgets the tenant once its last slot
// share is past the retention (core and etcd); used again, its shares
// start from seq 1, which Redis (still holding the old share's hash) and
// the agent (still holding its plan) take. Idle past the agents' idle
// time, they forget their slot plans, and it works once more.
func TestConcurrencyPlanFirstUseTwoRegionsStrict(t *testing.T) {
	const id = "jobs/newco"
	w := newShareWorld(t, "eu", "us")
	w.putPlan(jobsPlan(3, "eu", "us"), "jobs/probe")
	agents := map[string]*Agent{"eu": w.agent("eu", "eu1"), "us": w.agent("us", "us1")}
	var holders []*slotHolder
	for i := range 8 {
		r := []string{"eu", "us"}[i%2]
		holders = append(holders, &slotHolder{region: r, name: fmt.Sprintf("%s-job-%d", r, i)})
	}
	most, denied := w.runHolders(t, agents, id, holders, 30*time.Second)
	t.Logf("8 holders of a plan of 3 slots for 30 s: at most %d held at once, %d acquires denied", most, denied)
	if most != 3 || denied == 0 {
		t.Fatalf("at most %d held, %d denied: want the cap of 3 reached, and denials", most, denied)
	}
	seqBefore := map[string]int64{"eu": w.slotSeq(t, "eu", id), "us": w.slotSeq(t, "us", id)}
	if seqBefore["eu"] < 2 && seqBefore["us"] < 2 {
		t.Fatalf("slot shares in Redis after 30 s: seq %v, want renewals", seqBefore)
	}

	// The holders stop; the shares expire, the allocator forgets the
	// tenant the retention later, and the agents their plans once idle.
	ctx := context.Background()
	for _, h := range holders {
		if h.slot != "" {
			if _, err := agents[h.region].ReleaseSlot(ctx, id, h.slot); err != nil {
				t.Fatal(err)
			}
			h.slot = ""
		}
	}
	w.clock.Add(10*time.Second + shareRetention + time.Second)
	w.awaitForgotten(t, id)
	for r, a := range agents {
		if n := a.slots.forgetIdle(w.clock.Now(), a.opt.idleAfter); n != 1 {
			t.Fatalf("%s agent keeps %d slot plans %v before its idle time, want 1", r, n, a.opt.idleAfter)
		}
	}
	// Used again before the agents forget it and within the Redis keys'
	// grace: seq 1, below the old share's seq in Redis and in the agent's
	// plan, taken by both.
	seqs := map[string]int64{"eu": w.slotSeq(t, "eu", id), "us": w.slotSeq(t, "us", id)}
	if seqs["eu"] < 2 {
		t.Fatalf("eu's Redis holds slot share seq %d before the tenant comes back, want the old share's (> 1)", seqs["eu"])
	}
	h := acquireOK(t, agents["eu"], id, "again", 2*time.Second)
	if h.Slots < 1 || h.Limit != 3 {
		t.Fatalf("the tenant used again: %+v", h)
	}
	if s := w.slotSeq(t, "eu", id); s != 1 {
		t.Fatalf("eu's Redis holds slot share seq %d after the tenant came back (it held %d before), want 1", s, seqs["eu"])
	}
	if _, err := agents["eu"].ReleaseSlot(ctx, id, h.SlotID); err != nil {
		t.Fatal(err)
	}

	// Idle again, past the agents' idle time after the share's end:
	// nothing kept anywhere.
	w.clock.Add(10*time.Second + 5*time.Minute)
	w.awaitForgotten(t, id)
	for r, a := range agents {
		if n := a.slots.forgetIdle(w.clock.Now(), a.opt.idleAfter); n != 0 {
			t.Fatalf("%s agent keeps %d slot plans 5 minutes after its share ended, want none", r, n)
		}
	}
	most, denied = w.runHolders(t, agents, id, holders, 10*time.Second)
	if most == 0 {
		t.Fatalf("used again: at most %d held, %d denied", most, denied)
	}
}
