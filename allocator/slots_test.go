package allocator

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// concLimit is a concurrency limit of n slots, its shares living ttl,
// validated as the Admin API validates it.
func concLimit(t testing.TB, id string, n int64, ttl time.Duration, regions ...string) *Limit {
	t.Helper()
	p, err := limitspec.ValidateLimit(&pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n,
		Regions: regions, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}, regions)
	if err != nil {
		t.Fatal(err)
	}
	p.Version = 1
	return decodeLimit(p)
}

// TestSlotShareStepTable: slot shares follow demand within what the
// other regions' unexpired shares leave; a region keeps the slots it
// holds (admitting no new one beyond its part); an expired share's slots
// go back only at its expiry; replays and wrong kinds.
func TestSlotShareStepTable(t *testing.T) {
	c := NewCore()
	c.SetLimit(concLimit(t, "c/a", 3, 10*time.Second, "eu", "us"))
	c.SetLimit(testLimit("w/a", 100, time.Minute, 15*time.Second, "eu", "us"))
	s := time.Second
	type step struct {
		at          time.Duration
		region, req string
		limit       string
		demand      float64
		held        int64
		code        pb.ItemCode
		n, admit    int64 // granted
		seq         int64
		replayed    bool
		reserved    int64 // ReservedSlots after the step
	}
	steps := []step{
		{at: 0, region: "eu", req: "e1", demand: 8, n: 3, admit: 3, seq: 1, reserved: 3},
		{at: 1 * s, region: "us", req: "u1", demand: 8, reserved: 3}, // nothing free
		{at: 2 * s, region: "eu", req: "e1", demand: 8, n: 3, admit: 3, seq: 1, replayed: true, reserved: 3},
		// eu renews holding 3: kept, but only its part (2 of 3) admits.
		{at: 5 * s, region: "eu", req: "e2", demand: 8, held: 3, n: 3, admit: 2, seq: 2, reserved: 3},
		// eu's jobs end: it renews holding 2, at its part.
		{at: 9 * s, region: "eu", req: "e3", demand: 8, held: 2, n: 2, admit: 2, seq: 3, reserved: 3},
		// The larger shares (e1 until 10 s, e2 until 15 s) still count.
		{at: 10 * s, region: "us", req: "u2", demand: 8, reserved: 3},
		{at: 15*s - 1, region: "us", req: "u3", demand: 8, reserved: 3},
		{at: 15 * s, region: "us", req: "u4", demand: 8, n: 1, admit: 1, seq: 1, reserved: 3},
		// A window limit's request for a share, a bucket-like request of a
		// concurrency limit for a lease (below), an unknown limit.
		{at: 15 * s, region: "eu", req: "x1", limit: "w/a", code: pb.ItemCode_ITEM_CODE_WRONG_KIND, reserved: 3},
		{at: 15 * s, region: "eu", req: "x2", limit: "c/none", code: pb.ItemCode_ITEM_CODE_NOT_FOUND, reserved: 3},
	}
	for i, st := range steps {
		limit := st.limit
		if limit == "" {
			limit = "c/a"
		}
		now := t0.Add(st.at)
		d := c.AcquireShare(now, st.region, ShareAcquire{RequestID: st.req, Limit: limit, Demand: st.demand, HeldSlots: st.held})
		var n, admit, seq int64
		if d.Grant != nil {
			n, admit, seq = d.Grant.Slots, d.Grant.Admit, d.Grant.Seq
		}
		if d.Code != st.code || n != st.n || admit != st.admit || seq != st.seq || d.Replayed != st.replayed {
			t.Fatalf("step %d (%s %s at %v): got code %v n %d admit %d seq %d replayed %v (%s); want %v %d %d %d %v",
				i, st.region, st.req, st.at, d.Code, n, admit, seq, d.Replayed, d.Message, st.code, st.n, st.admit, st.seq, st.replayed)
		}
		if got := c.ReservedSlots("c/a", now); got != st.reserved {
			t.Fatalf("step %d: reserved %d, want %d", i, got, st.reserved)
		}
	}
	dec := c.Acquire(t0.Add(16*s), "eu", AcquireRequest{RequestID: "l1", Limit: "c/a"})
	if dec.Code != pb.ItemCode_ITEM_CODE_WRONG_KIND {
		t.Fatalf("a lease of a concurrency limit: %v %s, want WRONG_KIND", dec.Code, dec.Message)
	}
	g := c.shareReq[requestKey{"eu", "e2"}]
	if p := g.ToProto(t0.Add(5 * s)); p.Slots != 3 || p.AdmitSlots != 2 || p.RateMilliTokens != 0 || p.BurstTokens != 0 ||
		p.ExpiresIn.AsDuration() != 10*s {
		t.Fatalf("the share as the agent gets it: %v", p)
	}
}

// refSlots counts, by brute force, the slots of the shares in force at
// now: each holder at the largest of its unexpired shares.
func refSlots(all []*ShareGrant, now time.Time) (n int64) {
	most := map[string]int64{}
	for _, g := range all {
		if g.inForce(now) {
			most[g.holderKey()] = max(most[g.holderKey()], g.Slots)
		}
	}
	for _, v := range most {
		n += v
	}
	return n
}

// TestSlotSharesNeverExceedN: random requests of three regions (and
// replicas' own holders), random held counts and demands, forgetting and
// rebuilding: at every grant and expiry instant the reference finds the
// slots of the shares in force at most N, and the core agrees with it.
func TestSlotSharesNeverExceedN(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	regions := []string{"eu", "us", "ap"}
	for seed := range seeds {
		rng := rand.New(rand.NewSource(int64(seed)))
		n := 1 + rng.Int63n(20)
		ttl := time.Duration(1+rng.Intn(20)) * time.Second
		l := concLimit(t, "c/x", n, ttl, regions...)
		c := NewCore()
		c.SetLimit(l)
		var all []*ShareGrant
		now := t0
		for i := range 400 {
			now = now.Add(time.Duration(rng.Int63n(int64(ttl / 2))))
			region := regions[rng.Intn(3)]
			holder := []string{"", "", "", "eu-1"}[rng.Intn(4)]
			d := c.AcquireShare(now, region, ShareAcquire{RequestID: fmt.Sprintf("r%d", i), Limit: "c/x",
				Demand: float64(rng.Intn(30)), HeldSlots: rng.Int63n(n + 3), Holder: holder})
			if d.New {
				if d.Grant.Admit > d.Grant.Slots {
					t.Fatalf("seed %d step %d: admit %d above n %d", seed, i, d.Grant.Admit, d.Grant.Slots)
				}
				all = append(all, d.Grant)
			}
			for _, at := range append([]time.Time{now}, expiriesAfter(all, now)...) {
				if got := refSlots(all, at); got > n {
					t.Fatalf("seed %d step %d at %v: shares in force hold %d slots, N %d", seed, i, at.Sub(t0), got, n)
				}
			}
			if got, want := c.ReservedSlots("c/x", now), refSlots(all, now); got != want {
				t.Fatalf("seed %d step %d: core reserves %d, reference %d", seed, i, got, want)
			}
			if rng.Intn(20) == 0 {
				nc := NewCore()
				nc.SetLimit(l)
				for _, gs := range c.shares["c/x"].byRegion {
					for _, g := range gs {
						nc.RestoreShare(g)
					}
				}
				c = nc
			}
		}
	}
}
