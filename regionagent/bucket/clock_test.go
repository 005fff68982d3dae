package bucket

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// a0 is a fixed agent instant. Agent times in these tests carry no monotonic
// reading, so Sub uses their wall part, deterministically.
var a0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// world simulates one TIME round trip. Redis's clock reads agent time +
// offset. The request leaves at a0 (a1), Redis reads its clock `at` after
// that (0 <= at <= rtt) and truncates it to the microsecond, the reply
// arrives at a0 + rtt (a2).
type world struct {
	offset time.Duration // Redis clock - agent clock
	rtt    time.Duration
	at     time.Duration
}

func (w world) sync(t *testing.T) ClockSync {
	t.Helper()
	redisAt := a0.Add(w.at + w.offset).Truncate(time.Microsecond)
	c, err := NewClockSync(a0, a0.Add(w.rtt), redisAt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// redisNs is Redis's true clock, in ns, at agent instant a.
func (w world) redisNs(a time.Time) int64 { return a.Add(w.offset).UnixNano() }

// TestToRedisNeverLate is the step table for invariant 4's clock part: for
// any offset, RTT and moment inside the round trip at which Redis read its
// clock, a deadline converted with ToRedis is reached on Redis's clock no
// later than the agent deadline itself (Redis admits at now_ms < D only
// while real time is before the agent deadline); a start converted with
// ToRedisStart is reached no earlier than the agent start; and neither is
// looser than the RTT plus rounding.
func TestToRedisNeverLate(t *testing.T) {
	offsets := []time.Duration{0, 1, 999_999, time.Millisecond, -time.Millisecond, 1500 * time.Microsecond,
		-1500*time.Microsecond - 1, 37*time.Second + 123456789, -3 * time.Hour, 24*time.Hour + 1}
	rtts := []time.Duration{0, 1, 250 * time.Microsecond, 999 * time.Microsecond, time.Millisecond, 3*time.Millisecond + 7, 120 * time.Millisecond}
	dls := []time.Duration{0, 1, time.Millisecond - 1, time.Millisecond, 59*time.Second + 999*time.Millisecond + 999_999, -5 * time.Second}
	n := 0
	for _, off := range offsets {
		for _, rtt := range rtts {
			for _, at := range []time.Duration{0, rtt / 3, rtt / 2, rtt} {
				w := world{offset: off, rtt: rtt, at: at}
				c := w.sync(t)
				for _, dl := range dls {
					n++
					d := a0.Add(dl)
					got := c.ToRedis(d)
					trueNs := w.redisNs(d)
					// Never late: Redis at now_ms = got-1 is before d in real
					// time, i.e. got ms <= Redis's clock at d.
					if got*1e6 > trueNs {
						t.Fatalf("offset %v rtt %v at %v dl %v: ToRedis = %d ms, Redis reads %d ns at the deadline: late",
							off, rtt, at, dl, got, trueNs)
					}
					// Not looser than needed: RTT + 1µs truncation + 1ms floor.
					if slack := trueNs - got*1e6; slack > int64(rtt)+int64(time.Microsecond)+int64(time.Millisecond) {
						t.Fatalf("offset %v rtt %v at %v dl %v: ToRedis slack %dns exceeds rtt + 1ms", off, rtt, at, dl, slack)
					}
					st := c.ToRedisStart(d)
					if st*1e6 < trueNs {
						t.Fatalf("offset %v rtt %v at %v: ToRedisStart = %d ms, Redis reads %d ns at the start: early",
							off, rtt, at, st, trueNs)
					}
					if slack := st*1e6 - trueNs; slack > int64(rtt)+int64(time.Microsecond)+int64(time.Millisecond) {
						t.Fatalf("offset %v rtt %v at %v dl %v: ToRedisStart slack %dns exceeds rtt + 1ms", off, rtt, at, dl, slack)
					}
				}
			}
		}
	}
	t.Logf("%d cases", n)
}

// TestToRedisRandom checks the same property on random worlds.
func TestToRedisRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		rtt := time.Duration(rng.Int64N(int64(200 * time.Millisecond)))
		w := world{
			offset: time.Duration(rng.Int64N(int64(48*time.Hour))) - 24*time.Hour,
			rtt:    rtt,
			at:     time.Duration(rng.Int64N(int64(rtt) + 1)),
		}
		c := w.sync(t)
		d := a0.Add(time.Duration(rng.Int64N(int64(2*time.Hour))) - time.Hour)
		if got := c.ToRedis(d); got*1e6 > w.redisNs(d) {
			t.Fatalf("%+v deadline %v: ToRedis %d ms is late (Redis %d ns)", w, d, got, w.redisNs(d))
		}
		if got := c.ToRedisStart(d); got*1e6 < w.redisNs(d) {
			t.Fatalf("%+v start %v: ToRedisStart %d ms is early (Redis %d ns)", w, d, got, w.redisNs(d))
		}
	}
}

func TestToRedisFixed(t *testing.T) {
	// Redis reads 1_700_000_000.123456 s; the round trip took 2 ms.
	redisAt := time.Unix(1_700_000_000, 123_456_000)
	c, err := NewClockSync(a0, a0.Add(2*time.Millisecond), redisAt)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		agent     time.Duration // after a0
		deadline  int64
		startNotB int64
	}{
		// Lower bound: redis + (t - a2); upper: redis + 1µs + (t - a1).
		{2 * time.Millisecond, 1_700_000_000_123, 1_700_000_000_126},
		{2*time.Millisecond + 544*time.Microsecond, 1_700_000_000_124, 1_700_000_000_127},
		{2*time.Millisecond + 543*time.Microsecond, 1_700_000_000_123, 1_700_000_000_126},
		{0, 1_700_000_000_121, 1_700_000_000_124},
		{time.Minute, 1_700_000_060_121, 1_700_000_060_124},
		{-time.Second, 1_699_999_999_121, 1_699_999_999_124},
	}
	for _, tt := range tests {
		if got := c.ToRedis(a0.Add(tt.agent)); got != tt.deadline {
			t.Errorf("ToRedis(a0+%v) = %d, want %d", tt.agent, got, tt.deadline)
		}
		if got := c.ToRedisStart(a0.Add(tt.agent)); got != tt.startNotB {
			t.Errorf("ToRedisStart(a0+%v) = %d, want %d", tt.agent, got, tt.startNotB)
		}
	}
	if c.RTT() != 2*time.Millisecond {
		t.Errorf("RTT = %v", c.RTT())
	}
	if _, err := NewClockSync(a0, a0.Add(-1), redisAt); !errors.Is(err, ErrClockSample) {
		t.Errorf("NewClockSync(received before sent) = %v, want ErrClockSample", err)
	}
	// Far-away instants saturate instead of wrapping.
	if got := c.ToRedis(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)); got <= 0 {
		t.Errorf("ToRedis(year 9999) = %d, want a large positive value", got)
	}
	if got := c.ToRedis(time.Time{}); got >= 0 {
		t.Errorf("ToRedis(zero time) = %d, want negative", got)
	}
}

// fakeTime answers TIME from a script of (rtt, redis time, error) and
// advances a fake agent clock by each rtt.
type fakeTime struct {
	now     time.Time
	replies []fakeReply
}

type fakeReply struct {
	rtt   time.Duration
	redis time.Time
	err   error
}

func (f *fakeTime) clock() time.Time { return f.now }

func (f *fakeTime) Time(context.Context) *redis.TimeCmd {
	r := f.replies[0]
	f.replies = f.replies[1:]
	f.now = f.now.Add(r.rtt)
	return redis.NewTimeCmdResult(r.redis, r.err)
}

func TestSyncClockKeepsSmallestRTT(t *testing.T) {
	r0 := time.Unix(1_700_000_000, 0)
	f := &fakeTime{now: a0, replies: []fakeReply{
		{rtt: 5 * time.Millisecond, redis: r0},
		{err: errors.New("boom")},
		{rtt: time.Millisecond, redis: r0.Add(10 * time.Millisecond)},
		{rtt: 3 * time.Millisecond, redis: r0.Add(20 * time.Millisecond)},
	}}
	c, err := SyncClock(context.Background(), f, 4, f.clock)
	if err != nil {
		t.Fatal(err)
	}
	if c.RTT() != time.Millisecond {
		t.Fatalf("kept RTT %v, want 1ms", c.RTT())
	}
	// Third sample: sent at a0+5ms, received at a0+6ms, Redis r0+10ms.
	if got, want := c.ToRedis(a0.Add(6*time.Millisecond)), r0.Add(10*time.Millisecond).UnixMilli(); got != want {
		t.Fatalf("ToRedis = %d, want %d", got, want)
	}

	bad := &fakeTime{now: a0, replies: []fakeReply{{err: errors.New("down")}, {err: errors.New("down")}}}
	if _, err := SyncClock(context.Background(), bad, 2, bad.clock); err == nil {
		t.Fatal("SyncClock with only failures succeeded")
	}
}

func TestSyncClockRealRedis(t *testing.T) {
	_, rdb := realRedis(t)
	ctx := testCtx(t)
	c, err := SyncClock(ctx, rdb, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.RTT() <= 0 || c.RTT() > time.Second {
		t.Fatalf("RTT %v", c.RTT())
	}
	// Same host, same clock: the Redis deadline of "now" is within a few ms
	// of the wall clock, and never after the TIME read afterwards.
	now := time.Now()
	d := c.ToRedis(now)
	after, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d > after.UnixMilli() || now.UnixMilli()-d > 50 {
		t.Fatalf("ToRedis(now) = %d; wall now %d, Redis after %d", d, now.UnixMilli(), after.UnixMilli())
	}
}
