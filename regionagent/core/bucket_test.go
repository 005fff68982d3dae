package core

import (
	"errors"
	"testing"
	"time"
)

// bucketTestLimit: 10 tokens per second, burst 5, two regions.
var bucketTestLimit = Limit{ID: "b/a", Rate: 10, RatePeriod: time.Second, Burst: 5, Mode: ModeStrict, Regions: 2, TTL: 10 * time.Second}

// TestBucketCheckSteps: a bucket limit's Checks through the Core, at fixed
// instants: the first Check asks for a share and waits for it; a share
// starts empty and refills at its rate up to its burst; denials say when
// the bucket will hold the cost; the share is renewed at half its life
// while the limit has Checks; with the allocator unreachable and the share
// expired, UNAVAILABLE; bad input names the field.
func TestBucketCheckSteps(t *testing.T) {
	w := newWorld(t, 10, bucketTestLimit, Limit{ID: "w/a", Tokens: 100, Window: time.Minute, TTL: 15 * time.Second, Mode: ModeStrict, Regions: 1})

	// First Check: no share yet. It asks for one and waits; the share is
	// installed (empty) and the Check is rate limited until a token refills.
	a := w.check("b/a", 1)
	if a.Allowed || a.Reason != ReasonOverLimit || a.RetryAfter < 100*time.Millisecond || a.RetryAfter > 110*time.Millisecond ||
		a.Limit != 10 || a.Window != time.Second {
		t.Fatalf("first check: %+v", a)
	}
	if len(w.shareReqs) != 1 || w.shareReqs[0].Holder != "" || len(w.installs) != 1 || w.installs[0].Share.Unit != 1_000_000 ||
		w.installs[0].Deadline != t0.Add(10*time.Second-w.c.margin(10*time.Second)) {
		t.Fatalf("share requests %+v, installs %+v", w.shareReqs, w.installs)
	}
	// A second later the bucket is full at its burst of 5.
	w.advance(time.Second)
	for i := range 5 {
		if a := w.check("b/a", 1); !a.Allowed || a.Remaining != int64(4-i) {
			t.Fatalf("check %d after a second: %+v", i, a)
		}
	}
	if a := w.check("b/a", 1); a.Allowed || a.Reason != ReasonOverLimit || a.RetryAfter < 100*time.Millisecond {
		t.Fatalf("sixth check: %+v", a)
	}
	w.advance(300 * time.Millisecond)
	if a := w.check("b/a", 3); !a.Allowed || a.Remaining != 0 {
		t.Fatalf("after 300 ms, cost 3: %+v", a)
	}
	// Renewal at half the share's life (5 s after it was asked for),
	// while the limit has Checks.
	w.advance(3700 * time.Millisecond) // t0 + 5 s
	if len(w.shareReqs) != 2 || len(w.installs) != 2 || w.installs[1].Share.Seq != 2 {
		t.Fatalf("renewal at half life: %d requests, %d installs", len(w.shareReqs), len(w.installs))
	}
	if w.shareReqs[0].Admitted != 0 || w.shareReqs[1].Admitted != 8 {
		t.Fatalf("the requests carry the bucket's admitted counter: %d, %d; want 0, 8", w.shareReqs[0].Admitted, w.shareReqs[1].Admitted)
	}
	// Bad input: a cost above the burst, a bucket limit with another.
	_, chk := w.checkMulti(Item{Limit: "b/a", Cost: 6})
	var ie *ItemError
	if !errors.As(chk.Err, &ie) || ie.Field != "cost" || ie.Reason != "must be 1..5 (the limit's burst), got 6" {
		t.Fatalf("cost above the burst: %v", chk.Err)
	}
	_, chk = w.checkMulti(Item{Limit: "w/a", Cost: 1}, Item{Limit: "b/a", Cost: 1})
	if !errors.As(chk.Err, &ie) || ie.Field != "limit_id" || ie.Index != 1 {
		t.Fatalf("bucket limit with another: %v", chk.Err)
	}
	// The allocator goes away: the share in force is spent to its
	// deadline, then the limit is UNAVAILABLE (closed).
	w.dropAcquire = true
	w.c.SetAllocatorHealth(w.now, false)
	w.advance(4 * time.Second) // t0 + 9 s: the first renewal's share lasts until t0 + 15 s
	if a := w.check("b/a", 1); !a.Allowed {
		t.Fatalf("before the share's deadline: %+v", a)
	}
	w.advance(7 * time.Second) // t0 + 16 s
	if a := w.check("b/a", 1); a.Allowed || a.Reason != ReasonUnavailable {
		t.Fatalf("share expired, allocator down: %+v", a)
	}
	// Back: a new share, empty at first, then admitting.
	w.dropAcquire = false
	w.c.SetAllocatorHealth(w.now, true)
	w.drain()
	w.advance(time.Second)
	if a := w.check("b/a", 2); !a.Allowed {
		t.Fatalf("after the allocator came back: %+v", a)
	}
}

// TestBucketRedisDown: while Redis is down the replica asks for shares of
// its own (holder: itself) and spends them from its in-process bucket;
// when Redis answers again the shared bucket's share is used (renewed if
// it expired meanwhile).
func TestBucketRedisDown(t *testing.T) {
	w := newWorld(t, 10, bucketTestLimit)
	w.check("b/a", 1)
	w.advance(time.Second)
	if a := w.check("b/a", 1); !a.Allowed {
		t.Fatalf("shared: %+v", a)
	}
	w.redisDown = true
	w.c.SetRedisHealth(w.now, false)
	a := w.check("b/a", 1) // asks for a share of its own: empty at first
	last := w.shareReqs[len(w.shareReqs)-1]
	if a.Allowed || last.Holder != "eu-1-n" || last.Store != Local {
		t.Fatalf("in process: %+v, request %+v", a, last)
	}
	w.advance(time.Second)
	if a := w.check("b/a", 5); !a.Allowed {
		t.Fatalf("in process after a second: %+v", a)
	}
	w.redisDown = false
	w.c.SetRedisHealth(w.now, true)
	w.drain()
	w.advance(20 * time.Second) // the shared share expired meanwhile: renewed
	if a := w.check("b/a", 1); a.Reason == ReasonUnavailable {
		t.Fatalf("shared again: %+v", a)
	}
	if last := w.shareReqs[len(w.shareReqs)-1]; last.Holder != "" || last.Store != Shared {
		t.Fatalf("the last request is for %q in %v", last.Holder, last.Store)
	}
}

// TestBucketRenewalsPerSecond counts the allocator calls of one active
// bucket limit at steady demand: a Check every 100 ms for ten minutes of
// virtual time, shares of 10 s renewed at half their life, so about one
// call per 5 s (0.2 a second).
func TestBucketRenewalsPerSecond(t *testing.T) {
	w := newWorld(t, 10, bucketTestLimit)
	w.check("b/a", 1)
	start, calls := w.now, w.alloc.calls
	for range 6000 {
		w.advance(100 * time.Millisecond)
		w.check("b/a", 1)
	}
	perSec := float64(w.alloc.calls-calls) / w.now.Sub(start).Seconds()
	t.Logf("%d allocator calls in %v: %.3f a second", w.alloc.calls-calls, w.now.Sub(start), perSec)
	if perSec < 0.19 || perSec > 0.21 {
		t.Fatalf("%.3f allocator calls a second, want about 0.2 (a 10 s share renewed at half its life)", perSec)
	}
}
