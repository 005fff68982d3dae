package allocator

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// bucketProto is a strict bucket limit's record: R per second, burst B,
// its shares living ttl, in regions.
func bucketProto(id string, rate, burst int64, ttl time.Duration, regions ...string) *pb.Limit {
	return &pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, RateTokens: rate, BurstTokens: burst,
		Regions: regions, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}}
}

// bucketLimit is a bucket limit of rate tokens per second and burst, its
// shares living ttl. Validation refuses bucket limits until they are
// enforced end to end, so the test checks the fields (ValidateBucket) and
// decodes the limit itself.
func bucketLimit(id string, rate, burst int64, ttl time.Duration, regions ...string) *Limit {
	p := bucketProto(id, rate, burst, ttl, regions...)
	p.Version = 1
	if err := limitspec.ValidateBucket(p); err != nil {
		panic(err)
	}
	return decodeLimit(p)
}

// TestShareStepTable: rate shares follow demand within what the other
// regions' unexpired shares leave; an expired share's rate goes back only
// at its expiry; replays, conflicts and wrong kinds.
func TestShareStepTable(t *testing.T) {
	c := NewCore()
	c.SetLimit(bucketLimit("b/a", 100, 200, 10*time.Second, "eu", "us"))
	c.SetLimit(testLimit("w/a", 100, time.Minute, 15*time.Second, "eu", "us"))
	s := time.Second
	type step struct {
		at          time.Duration
		region, req string
		limit       string
		demand      float64
		code        pb.ItemCode
		rate, burst int64 // granted
		seq         int64
		replayed    bool
		resRate     int64 // Reserved after the step
		resBurst    int64
	}
	steps := []step{
		{at: 0, region: "eu", req: "e1", demand: 300, rate: 100_000, burst: 200, seq: 1, resRate: 100_000, resBurst: 200},
		{at: 1 * s, region: "us", req: "u1", demand: 100, resRate: 100_000, resBurst: 200}, // nothing free
		{at: 2 * s, region: "eu", req: "e1", demand: 300, rate: 100_000, burst: 200, seq: 1, replayed: true, resRate: 100_000, resBurst: 200},
		// eu renews at its demand's part (3/4); its first share still counts.
		{at: 5 * s, region: "eu", req: "e2", demand: 300, rate: 75_000, burst: 150, seq: 2, resRate: 100_000, resBurst: 200},
		{at: 6 * s, region: "us", req: "u2", demand: 100, resRate: 100_000, resBurst: 200},
		// The first share expires at 10 s: only then is its rate free.
		{at: 10*s - 1, region: "us", req: "u3", demand: 100, resRate: 100_000, resBurst: 200},
		{at: 10 * s, region: "us", req: "u4", demand: 100, rate: 25_000, burst: 50, seq: 1, resRate: 100_000, resBurst: 200},
		// Demand shifts: us renews and takes only what eu's share leaves
		// until eu renews smaller and its larger share expires.
		{at: 12 * s, region: "us", req: "u5", demand: 900, rate: 25_000, burst: 50, seq: 2, resRate: 100_000, resBurst: 200},
		{at: 13 * s, region: "eu", req: "e3", demand: 100, rate: 10_000, burst: 20, seq: 3, resRate: 100_000, resBurst: 200},
		{at: 14 * s, region: "us", req: "u6", demand: 900, rate: 25_000, burst: 50, seq: 3, resRate: 100_000, resBurst: 200},
		// eu's 3/4 share (granted at 5 s) expired at 15 s.
		{at: 16 * s, region: "us", req: "u7", demand: 900, rate: 90_000, burst: 180, seq: 4, resRate: 100_000, resBurst: 200},
		// Errors (eu's last share expired at 23 s: only us's holds).
		{at: 24 * s, region: "eu", req: "e3", limit: "w/a", code: pb.ItemCode_ITEM_CODE_CONFLICT, resRate: 90_000, resBurst: 180},
		{at: 24 * s, region: "eu", req: "e9", limit: "w/a", code: pb.ItemCode_ITEM_CODE_WRONG_KIND, resRate: 90_000, resBurst: 180},
		{at: 24 * s, region: "ap", req: "a1", code: pb.ItemCode_ITEM_CODE_REGION_NOT_ALLOWED, resRate: 90_000, resBurst: 180},
		{at: 24 * s, region: "eu", req: "e8", limit: "nope", code: pb.ItemCode_ITEM_CODE_NOT_FOUND, resRate: 90_000, resBurst: 180},
	}
	for i, st := range steps {
		limit := st.limit
		if limit == "" {
			limit = "b/a"
		}
		now := t0.Add(st.at)
		d := c.AcquireShare(now, st.region, ShareAcquire{RequestID: st.req, Limit: limit, Demand: st.demand})
		if d.Code != st.code {
			t.Fatalf("step %d: code %v (%s), want %v", i, d.Code, d.Message, st.code)
		}
		var rate, burst, seq int64
		if d.Grant != nil {
			rate, burst, seq = d.Grant.Rate, d.Grant.Burst, d.Grant.Seq
		}
		if rate != st.rate || burst != st.burst || seq != st.seq || d.Replayed != st.replayed || (d.Grant != nil && d.New == d.Replayed) {
			t.Fatalf("step %d (%s %s at %v): granted (%d, %d) seq %d replayed %v new %v; want (%d, %d) seq %d replayed %v",
				i, st.region, st.req, st.at, rate, burst, seq, d.Replayed, d.New, st.rate, st.burst, st.seq, st.replayed)
		}
		if r, b := c.Reserved("b/a", now); r != st.resRate || b != st.resBurst {
			t.Fatalf("step %d: reserved (%d, %d), want (%d, %d)", i, r, b, st.resRate, st.resBurst)
		}
	}
	// A replica of eu spending alone (Redis down) is counted apart from
	// eu's shared bucket: nothing is free for it while us holds the rest.
	if d := c.AcquireShare(t0.Add(24*s), "eu", ShareAcquire{RequestID: "e10", Limit: "b/a", Demand: 100, Holder: "eu-1-x"}); d.Grant == nil ||
		d.Grant.Rate != 10_000 || d.Grant.Seq != 1 {
		t.Fatalf("eu's replica alone: %+v", d)
	}
	if r, _ := c.Reserved("b/a", t0.Add(24*s)); r != 100_000 {
		t.Fatalf("reserved with eu's replica: %d", r)
	}
	// A lease asked for a bucket limit is the wrong kind, and a share's
	// request id cannot name a lease.
	if d := c.Acquire(t0.Add(25*s), "eu", AcquireRequest{RequestID: "e7", Limit: "b/a", Want: 1}); d.Code != pb.ItemCode_ITEM_CODE_WRONG_KIND {
		t.Fatalf("lease of a bucket limit: %+v", d)
	}
	if d := c.Acquire(t0.Add(25*s), "eu", AcquireRequest{RequestID: "e3", Limit: "w/a", Want: 1}); d.Code != pb.ItemCode_ITEM_CODE_CONFLICT {
		t.Fatalf("lease with a share's request id: %+v", d)
	}
	// The replay is rendered from now: it never lives longer.
	g := c.shareReq[requestKey{"us", "u7"}]
	if p := g.ToProto(t0.Add(20 * s)); p.ExpiresIn.AsDuration() != 6*s || p.RateMilliTokens != 90_000 || p.RatePeriod.AsDuration() != s || p.BurstTokens != 180 {
		t.Fatalf("ToProto: %v", p)
	}
}

// refReserved is the brute-force reference: from every share ever
// granted, what the holders may spend at now (each holder, a region's
// shared bucket or a replica's in-process one, at the largest of its
// shares granted by now and not expired).
func refReserved(all []*ShareGrant, now time.Time) (rate, burst int64) {
	rates, bursts := map[string]int64{}, map[string]int64{}
	for _, g := range all {
		if g.GrantedAt <= now.UnixNano() && now.UnixNano() < g.ExpiresAt {
			k := g.Region + "/" + g.Holder
			rates[k] = max(rates[k], g.Rate)
			bursts[k] = max(bursts[k], g.Burst)
		}
	}
	for r := range rates {
		rate, burst = rate+rates[r], burst+bursts[r]
	}
	return rate, burst
}

// TestSharesNeverExceedLimit: random requests from three regions with
// random demand, at random instants, with records forgotten after their
// grace and the core rebuilt from its records now and then: at every
// instant the reference finds the shares in force within R and B, and
// the core's own count agrees with it.
func TestSharesNeverExceedLimit(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	regions := []string{"eu", "us", "ap"}
	for seed := range seeds {
		rng := rand.New(rand.NewSource(int64(seed)))
		rate, burst := 1+rng.Int63n(1000), 1+rng.Int63n(500)
		ttl := time.Duration(1+rng.Intn(20)) * time.Second
		l := bucketLimit("b/x", rate, burst, ttl, regions...)
		c := NewCore()
		c.SetLimit(l)
		var all []*ShareGrant
		now := t0
		for i := range 400 {
			now = now.Add(time.Duration(rng.Int63n(int64(ttl / 2))))
			region := regions[rng.Intn(3)]
			holder := []string{"", "", "", "eu-1", "eu-2"}[rng.Intn(5)] // mostly the shared bucket, sometimes a replica's own
			d := c.AcquireShare(now, region, ShareAcquire{RequestID: fmt.Sprintf("r%d", i), Limit: "b/x", Demand: rng.Float64() * 1000, Holder: holder})
			if d.New {
				all = append(all, d.Grant)
			}
			// Check between this step and the next too: shares only
			// expire there, so the instants of grants and expiries are
			// enough.
			for _, at := range append([]time.Time{now}, expiriesAfter(all, now)...) {
				rr, rb := refReserved(all, at)
				if rr > rate*1000 || rb > burst {
					t.Fatalf("seed %d step %d at %v: shares in force (%d, %d) exceed (%d, %d)", seed, i, at.Sub(t0), rr, rb, rate*1000, burst)
				}
			}
			r, b := c.Reserved("b/x", now)
			if rr, rb := refReserved(all, now); r != rr || b != rb {
				t.Fatalf("seed %d step %d: core reserves (%d, %d), reference (%d, %d)", seed, i, r, b, rr, rb)
			}
			switch rng.Intn(20) {
			case 0: // forget what expired a grace ago
				for _, g := range c.ExpiredShares(now, 2*ttl) {
					c.ForgetShare(g)
				}
			case 1: // a new leader rebuilds from the records
				nc := NewCore()
				nc.SetLimit(l)
				for _, gs := range c.shares["b/x"].byRegion {
					for _, g := range gs {
						nc.RestoreShare(g)
					}
				}
				c = nc
			}
		}
	}
}

// expiriesAfter lists the expiry instants of the shares after now.
func expiriesAfter(all []*ShareGrant, now time.Time) []time.Time {
	var out []time.Time
	for _, g := range all {
		if g.ExpiresAt > now.UnixNano() {
			out = append(out, time.Unix(0, g.ExpiresAt))
		}
	}
	return out
}

// TestShareDemandShift: two regions renewing every half TTL follow a
// shift of demand within two renewals after the larger old share expired,
// and under demand their shares add up to R within 2 %.
func TestShareDemandShift(t *testing.T) {
	const ttl = 10 * time.Second
	c := NewCore()
	c.SetLimit(bucketLimit("b/s", 1000, 2000, ttl, "eu", "us"))
	demand := map[string]float64{"eu": 3000, "us": 1000}
	latest := map[string]*ShareGrant{}
	now := t0
	n := 0
	renew := func() {
		for _, r := range []string{"eu", "us"} {
			n++
			if d := c.AcquireShare(now, r, ShareAcquire{RequestID: fmt.Sprintf("q%d", n), Limit: "b/s", Demand: demand[r]}); d.Grant != nil {
				latest[r] = d.Grant
			}
			now = now.Add(time.Millisecond)
		}
	}
	check := func(when string, eu, us float64) {
		t.Helper()
		total := int64(1000 * 1000)
		ge, gu := latest["eu"].Rate, latest["us"].Rate
		if ge+gu < total*98/100 {
			t.Fatalf("%s: shares %d + %d below 98%% of %d", when, ge, gu, total)
		}
		if f := float64(ge) / float64(total); f < eu-0.02 || f > eu+0.02 {
			t.Fatalf("%s: eu holds %.3f of the rate, want %.2f", when, f, eu)
		}
		if f := float64(gu) / float64(total); f < us-0.02 || f > us+0.02 {
			t.Fatalf("%s: us holds %.3f of the rate, want %.2f", when, f, us)
		}
	}
	for range 6 { // a minute of renewals every half TTL
		renew()
		now = now.Add(ttl / 2)
	}
	check("steady", 0.75, 0.25)
	demand["eu"], demand["us"] = 1000, 3000
	// The shares may lag by one TTL (the larger old share must expire),
	// then follow within two renewals.
	for range 2 + 2 {
		renew()
		now = now.Add(ttl / 2)
	}
	renew()
	check("after the shift", 0.25, 0.75)
}

// TestBucketFieldsInDiffs: a change's field list (history, dry runs) names
// a bucket limit's kind, rate and burst.
func TestBucketFieldsInDiffs(t *testing.T) {
	a := bucketLimit("b/d", 100, 200, 10*time.Second, "eu").Proto
	b := proto.Clone(a).(*pb.Limit)
	b.RateTokens, b.BurstTokens = 50, 300
	got := map[string][2]string{}
	for _, fc := range diffLimits(a, b) {
		got[fc.Field] = [2]string{fc.Old, fc.New}
	}
	if len(got) != 2 || got["rate"] != [2]string{"100/s", "50/s"} || got["burst_tokens"] != [2]string{"200", "300"} {
		t.Fatalf("diff: %v", got)
	}
	w := testLimit("b/d", 100, time.Minute, 15*time.Second, "eu").Proto
	if fs := diffLimits(w, a); len(fs) == 0 || fs[0].Field != "limit_tokens" {
		t.Fatalf("window to bucket: %v", fs)
	}
}

// TestShareOwnership: with allocator groups, rate shares (not windowed)
// are granted by a group only once it has owned the limit for a share's
// life: the previous owner stopped at the move, so its shares have all
// expired before the new owner's first. Before the move the new group
// names the old one; the old one names the new one after.
func TestShareOwnership(t *testing.T) {
	const ttl = 10 * time.Second
	move := t0.Add(time.Minute)
	owner := func(start time.Time) string {
		if start.Before(move) {
			return "a"
		}
		return "b"
	}
	newCore := func(self string) *Core {
		c := NewCore()
		c.SetLimit(bucketLimit("b/x", 100, 200, ttl, "eu", "us"))
		c.SetOwnership(func(_ string, start time.Time) (string, bool) { g := owner(start); return g, g == self })
		return c
	}
	a, b := newCore("a"), newCore("b")
	ask := func(c *Core, at time.Time, req string) ShareDecision {
		return c.AcquireShare(at, "eu", ShareAcquire{RequestID: req, Limit: "b/x", Demand: 50})
	}
	if d := ask(a, move.Add(-time.Second), "r1"); d.Grant == nil {
		t.Fatalf("the owner before the move: %+v, want a share", d)
	}
	if d := ask(b, move.Add(-time.Second), "r2"); d.Code != pb.ItemCode_ITEM_CODE_WRONG_GROUP || d.OwnerGroup != "a" {
		t.Fatalf("the next owner before the move: %+v, want WRONG_GROUP naming a", d)
	}
	if d := ask(a, move.Add(time.Second), "r3"); d.Code != pb.ItemCode_ITEM_CODE_WRONG_GROUP || d.OwnerGroup != "b" {
		t.Fatalf("the old owner after the move: %+v, want WRONG_GROUP naming b", d)
	}
	if d := ask(b, move.Add(ttl-time.Millisecond), "r4"); d.Code != pb.ItemCode_ITEM_CODE_WRONG_GROUP || d.Grant != nil {
		t.Fatalf("the new owner within a share's life of the move: %+v, want no share", d)
	}
	if d := ask(b, move.Add(ttl), "r5"); d.Grant == nil {
		t.Fatalf("the new owner a share's life after the move: %+v, want a share", d)
	}
}
