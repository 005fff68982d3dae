package bucket

import (
	"context"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClockSync relates the agent's monotonic clock to Redis's clock, from one
// TIME round trip: the request left at agent time a1 (Sent), the reply came
// back at a2 (Received), and Redis said r. Redis read its clock at some
// instant x in [a1, a2], and TIME truncates to the microsecond, so at any
// agent instant t Redis's clock reads
//
//	r + (t - a2)  <=  redis(t)  <  r + 1µs + (t - a1)
//
// (the offset redis - agent lies in [r - a2, r - a1 + 1µs)).
// [ClockSync.ToRedis] uses the lower bound for deadlines, so a deadline on
// Redis's clock is never later in real time than the agent's deadline;
// [ClockSync.ToRedisStart] uses the upper bound for starts, so a lease never
// starts early. The uncertainty is the round-trip time: keep it small (see
// [SyncClock]).
//
// Agent times must come from the same process's time.Now (their monotonic
// readings are compared; a wall-clock step on the agent changes nothing).
// Clock rate drift between the hosts is not modelled: the agent's safety
// margin covers it. The zero value is not meaningful; build one with
// [NewClockSync] or [SyncClock]. A ClockSync is an immutable value.
type ClockSync struct {
	sent, recv time.Time // agent clock, monotonic readings
	redisNs    int64     // Redis TIME reply, ns since the Unix epoch
}

// NewClockSync builds a ClockSync from one round trip: sent and received on
// the agent's clock, redisTime the TIME reply. received must not be before
// sent.
func NewClockSync(sent, received, redisTime time.Time) (ClockSync, error) {
	if received.Before(sent) {
		return ClockSync{}, ErrClockSample
	}
	return ClockSync{sent: sent, recv: received, redisNs: redisTime.UnixNano()}, nil
}

// RTT is the round-trip time of the sample: the width of the uncertainty.
func (c ClockSync) RTT() time.Duration { return c.recv.Sub(c.sent) }

// ToRedis converts an agent deadline to milliseconds on Redis's clock using
// the lower bound of the offset, floored to the millisecond. For the Redis
// time R(d) at the agent instant d, ToRedis(d) <= R(d): a spend that Redis
// admits at now_ms < ToRedis(d) happens before d in real time.
func (c ClockSync) ToRedis(agentDeadline time.Time) int64 {
	ns := addSat(c.redisNs, int64(agentDeadline.Sub(c.recv)))
	return floorDiv(ns, int64(time.Millisecond))
}

// ToRedisStart converts an agent start time to milliseconds on Redis's clock
// using the upper bound of the offset, rounded up: Redis reaches
// ToRedisStart(s) no earlier in real time than the agent reaches s.
func (c ClockSync) ToRedisStart(agentStart time.Time) int64 {
	ns := addSat(addSat(c.redisNs, int64(time.Microsecond)), int64(agentStart.Sub(c.sent)))
	return ceilDiv(ns, int64(time.Millisecond))
}

// TimeSource is what SyncClock needs from Redis: the TIME command.
// redis.UniversalClient implements it.
type TimeSource interface {
	Time(ctx context.Context) *redis.TimeCmd
}

// SyncClock samples TIME tries times (at least once) and keeps the sample
// with the smallest round trip. now reads the agent's clock (nil: time.Now).
// It fails only if no sample succeeded.
func SyncClock(ctx context.Context, src TimeSource, tries int, now func() time.Time) (ClockSync, error) {
	if now == nil {
		now = time.Now
	}
	tries = max(tries, 1)
	var best ClockSync
	found := false
	var lastErr error
	for range tries {
		if err := ctx.Err(); err != nil {
			lastErr = err
			break
		}
		a1 := now()
		r, err := src.Time(ctx).Result()
		a2 := now()
		if err != nil {
			lastErr = err
			continue
		}
		c, err := NewClockSync(a1, a2, r)
		if err != nil {
			lastErr = err
			continue
		}
		if !found || c.RTT() < best.RTT() {
			best, found = c, true
		}
	}
	if !found {
		return ClockSync{}, wrapRedis("time", lastErr)
	}
	return best, nil
}

// floorDiv is a / b rounded toward negative infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// ceilDiv is a / b rounded toward positive infinity (b > 0).
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// addSat adds without wrapping around.
func addSat(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}
