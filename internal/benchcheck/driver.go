package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	pb "leasehold/proto/leasehold/v1"
)

// envoyDomain is the Envoy rate limit domain the agent's mapping serves;
// the descriptor key envoyKey names the limit benchPrefix+value.
const (
	envoyDomain = "bench"
	envoyKey    = "k"
	benchPrefix = "bench/"
)

// envoyMapping maps every descriptor (envoyKey, V) of envoyDomain to the
// limit bench/V.
const envoyMapping = `domains:
  - domain: ` + envoyDomain + `
    descriptors:
      - key: ` + envoyKey + `
        limit: "` + benchPrefix + `{` + envoyKey + `}"
`

// decider makes one decision for key (its short name, without
// benchPrefix) and says whether the answer was OK.
type decider func(ctx context.Context, key string) (ok bool, err error)

// checker decides through RegionAgent Check.
func checker(cc grpc.ClientConnInterface) decider {
	cl := pb.NewRegionAgentClient(cc)
	return func(ctx context.Context, key string) (bool, error) {
		resp, err := cl.Check(ctx, &pb.CheckRequest{LimitId: benchPrefix + key, Cost: 1})
		if err != nil {
			return false, err
		}
		return resp.Allowed && resp.Reason == pb.Reason_REASON_OK, nil
	}
}

// envoyChecker decides through Envoy's ShouldRateLimit, one descriptor.
func envoyChecker(cc grpc.ClientConnInterface) decider {
	cl := rlsv3.NewRateLimitServiceClient(cc)
	return func(ctx context.Context, key string) (bool, error) {
		resp, err := cl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: envoyDomain, HitsAddend: 1,
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: envoyKey, Value: key}}}}})
		if err != nil {
			return false, err
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
	}
}

// load bounds one case: callers goroutines take decisions in turn until
// max are taken or dur has passed, whichever comes first. Decision i uses
// keys[i % len(keys)]; with once, no key is used twice (max is cut to
// len(keys)).
type load struct {
	keys    []string
	callers int
	max     int
	dur     time.Duration
	once    bool
}

// callTimeout bounds one call: a server that stops answering ends the case
// with errors instead of hanging it.
const callTimeout = 5 * time.Second

// drive runs l against the deciders (caller c uses ds[c % len(ds)]: one
// per connection) and returns what the callers saw; CPU is the caller's to
// measure around it. The first error, if any, is returned beside the
// result.
func drive(ctx context.Context, ds []decider, l load) (result, error) {
	n := l.max
	if l.once {
		n = min(n, len(l.keys))
	}
	ctx, cancel := context.WithTimeout(ctx, l.dur+callTimeout)
	defer cancel()
	var (
		next      atomic.Int64
		stop      atomic.Bool
		notOK     atomic.Int64
		errs      atomic.Int64
		firstErr  error
		errOnce   sync.Once
		wg        sync.WaitGroup
		latencies = make([][]time.Duration, l.callers)
	)
	timer := time.AfterFunc(l.dur, func() { stop.Store(true) })
	defer timer.Stop()
	start := time.Now()
	for c := range l.callers {
		// Room for the count bound's share, up to 64 Ki: a bound of
		// 2^30 (a case bounded by time) once made each caller zero 4 GiB
		// before its first call.
		latencies[c] = make([]time.Duration, 0, min(n/l.callers+1, 1<<16))
		decide := ds[c%len(ds)]
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n) && !stop.Load() && ctx.Err() == nil; i = next.Add(1) - 1 {
				t0 := time.Now()
				ok, err := decide(ctx, l.keys[int(i)%len(l.keys)])
				latencies[c] = append(latencies[c], time.Since(t0))
				switch {
				case err != nil:
					errs.Add(1)
					notOK.Add(1)
					errOnce.Do(func() { firstErr = err })
				case !ok:
					notOK.Add(1)
				}
			}
		})
	}
	wg.Wait()
	all := slices.Concat(latencies...)
	r := result{decisions: len(all), notOK: int(notOK.Load()), errors: int(errs.Load()), elapsed: time.Since(start)}
	r.p50, r.p99 = quantile(all, 0.50), quantile(all, 0.99)
	return r, firstErr
}

// quantile returns the q-quantile of ds (nearest rank; sorts ds).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
