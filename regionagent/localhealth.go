package regionagent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"leasehold/internal/vocab"
	"leasehold/regionagent/bucket"
	"leasehold/regionagent/core"
)

// redisHealth is the agent's circuit breaker on its region's Redis. After
// redisTrip consecutive failed calls it marks Redis down: Checks are then
// decided from the leases the replica holds in process (memStore) and
// make no Redis call at all, so a dead Redis costs nothing per Check. One
// prober (redisProbeLoop) alone calls Redis while it is down, with
// jittered exponential backoff, and marks it up when it answers again.
// Safe for concurrent use.
type redisHealth struct {
	down    atomic.Bool
	episode atomic.Uint64 // counts the times Redis was marked down

	mu        sync.Mutex // protects failures, downSince
	failures  int
	downSince time.Time

	wake chan struct{} // (1) tells the prober Redis went down
}

const (
	// redisTrip consecutive failures mark Redis down: one failed call may
	// be a blip, and going to in-process leases strands what the region
	// holds in Redis for the window.
	redisTrip = 3
	// Probe backoff: first probe after ~100 ms, then doubling up to 5 s,
	// each interval jittered by +-50%.
	redisProbeMin = 100 * time.Millisecond
	redisProbeMax = 5 * time.Second
)

func newRedisHealth() *redisHealth { return &redisHealth{wake: make(chan struct{}, 1)} }

// isDown reports whether Checks are served from in-process leases.
func (h *redisHealth) isDown() bool { return h.down.Load() }

// ok records a call Redis answered.
func (h *redisHealth) ok() {
	h.mu.Lock()
	h.failures = 0
	h.mu.Unlock()
}

// fail records a failed call and reports whether it marked Redis down.
func (h *redisHealth) fail(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	if h.failures < redisTrip || h.down.Load() {
		return false
	}
	h.downSince = now
	h.episode.Add(1)
	h.down.Store(true)
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return true
}

// up marks Redis up; it reports whether Redis was down, and for how long.
func (h *redisHealth) up(now time.Time) (wasDown bool, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = 0
	if !h.down.Load() {
		return false, 0
	}
	h.down.Store(false)
	return true, now.Sub(h.downSince)
}

// redisUnavailable tells a failure of Redis itself (no answer: connection
// refused or reset, timeout, pool exhausted; or an answer saying it cannot
// serve) from an error that Redis answered (a script error, a bad
// argument), which says nothing about its health.
func redisUnavailable(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled),
		errors.Is(err, bucket.ErrInvalid), errors.Is(err, bucket.ErrBadReply), errors.Is(err, bucket.ErrNotHeld):
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"} {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		return false
	}
	return true
}

// observeRedis feeds one Redis call's outcome to the breaker.
func (a *Agent) observeRedis(err error) {
	if err == nil {
		a.rh.ok()
		return
	}
	if !redisUnavailable(err) {
		return
	}
	if now := a.opt.now(); a.rh.fail(now) {
		a.lm.redisUp.Set(0)
		a.log.Warn("Redis unreachable: serving strict limits from in-process leases until it answers again",
			"err", vocab.Cap(err.Error(), maxLogValue))
		a.withCore(func(c *core.Core) { c.SetRedisHealth(now, false) })
	}
}

// redisProbeLoop waits for Redis to be marked down, then probes it with
// jittered exponential backoff until it answers.
func (a *Agent) redisProbeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.rh.wake:
		}
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval, b.RandomizationFactor = redisProbeMin, redisProbeMax, 0.5
		b.MaxElapsedTime = 0 // until Redis answers
		b.Reset()
		for a.rh.isDown() {
			t := time.NewTimer(b.NextBackOff())
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if err := a.probeRedis(ctx); err != nil {
				a.log.Debug("Redis probe failed", "err", err)
			}
		}
	}
}

// probeRedis asks Redis whether it answers (PING, then a fresh clock
// sync: after a restart or a failover its clock may be another host's)
// and, if it does, goes back to the shared bucket.
func (a *Agent) probeRedis(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, a.opt.redisTimeout)
	err := a.cfg.Redis.Ping(rctx).Err()
	cancel()
	if err != nil {
		return err
	}
	if err := a.syncClock(ctx); err != nil {
		return err
	}
	a.redisRecovered()
	return nil
}

// redisRecovered goes back to the shared bucket: the core closes and
// returns every in-process lease, and forgets the next windows' leases
// (Redis may have restarted empty and lost them).
func (a *Agent) redisRecovered() {
	now := a.opt.now()
	wasDown, d := a.rh.up(now)
	if !wasDown {
		return
	}
	a.lm.redisUp.Set(1)
	a.log.Info("Redis answers again: returning in-process leases, back to the shared bucket", "down_for", d)
	a.withCore(func(c *core.Core) { c.SetRedisHealth(now, true) })
}

// localMetrics are the metrics of in-process leases.
type localMetrics struct {
	redisUp     prometheus.Gauge
	leaseTokens prometheus.Counter
	admitted    prometheus.Counter
}

func newLocalMetrics(reg prometheus.Registerer) *localMetrics {
	m := &localMetrics{
		redisUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_agent_redis_up",
			Help: "1 while the agent decides Checks from the region's shared Redis bucket, 0 while Redis is down and it serves from in-process leases.",
		}),
		leaseTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_local_leased_tokens_total",
			Help: "Tokens of leases this replica acquired for itself and held in process while Redis was down.",
		}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_agent_local_admitted_tokens_total",
			Help: "Tokens admitted from in-process leases while Redis was down.",
		}),
	}
	m.redisUp.Set(1)
	if reg != nil {
		reg.MustRegister(m.redisUp, m.leaseTokens, m.admitted)
	}
	return m
}
