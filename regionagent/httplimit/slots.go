package httplimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// SlotLimiter holds slots of concurrency limits; *client.Client is one.
type SlotLimiter interface {
	AcquireSlot(ctx context.Context, limit, holder string, ttl time.Duration) (*client.Slot, client.SlotDecision, error)
}

var _ SlotLimiter = (*client.Client)(nil)

// TypeSlotsHeld is the problem type of a request denied because every
// slot of its concurrency limit is held.
const TypeSlotsHeld = "urn:leasehold:problem:slots-held"

// Slots is middleware that holds one slot of a concurrency limit
// (docs/concurrency.md) for each request's life: the Key option names
// the limit (no key: the request passes, counted NoKey), the slot is
// acquired for ttl between heartbeats (the client heartbeats it while
// the handler runs) and released when the handler returns. Every slot
// held: 429 with Retry-After; the limiter cannot decide (UNAVAILABLE, or
// the client failed): 503 with Retry-After; both with a problem+json
// body. If the slot is lost while the handler runs (its heartbeats did
// not reach the agent in time, or the region's share ended), the
// request's context is canceled: the handler must stop. Cost, settle and
// the rate limit headers do not apply.
func Slots(l SlotLimiter, ttl time.Duration, opts ...Option) func(http.Handler) http.Handler {
	o := buildOptions(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			limit, ok := o.key(r)
			if !ok {
				o.observe(r, NoKey, client.Decision{})
				next.ServeHTTP(w, r)
				return
			}
			s, sd, err := l.AcquireSlot(r.Context(), limit, newHolder(), ttl)
			d := client.Decision{Allowed: sd.Allowed, Reason: sd.Reason, RetryAfter: sd.RetryAfter}
			switch {
			case err != nil && o.passUnknown && errors.Is(err, client.ErrUnknownLimit):
				o.observe(r, UnknownLimit, d)
				next.ServeHTTP(w, r)
			case err != nil:
				o.observe(r, Failed, d)
				o.deny(w, r, limit, client.Decision{}, http.StatusServiceUnavailable)
			case s != nil:
				o.observe(r, Allowed, d)
				ctx, cancel := context.WithCancel(r.Context())
				stopped := make(chan struct{})
				go func() {
					defer close(stopped)
					select {
					case <-s.Lost():
						cancel() // the slot is gone: so is the request's right to run
					case <-ctx.Done():
					}
				}()
				next.ServeHTTP(w, r.WithContext(ctx))
				cancel()
				<-stopped
				_ = s.Release(context.WithoutCancel(r.Context()))
			case sd.Reason == pb.Reason_REASON_OVER_LIMIT:
				o.observe(r, Limited, d)
				o.slotsHeld(w, limit, sd)
			default:
				o.observe(r, Unavailable, d)
				o.deny(w, r, limit, client.Decision{Reason: sd.Reason, RetryAfter: sd.RetryAfter}, http.StatusServiceUnavailable)
			}
		})
	}
}

// slotsHeld answers 429: every slot of the limit is held.
func (o *options) slotsHeld(w http.ResponseWriter, limit string, d client.SlotDecision) {
	secs := RetryAfter(d.RetryAfter, o.jitter, o.rnd)
	p := Problem{Type: TypeSlotsHeld, Title: "Too Many Requests", Status: http.StatusTooManyRequests, Limit: limit,
		Reason: reasonName(pb.Reason_REASON_OVER_LIMIT),
		Detail: "All " + strconv.FormatInt(d.Limit, 10) + " slots of the limit are held. Retry after " + strconv.FormatInt(secs, 10) + " s."}
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(p)
}

// newHolder names one request's slot holder.
func newHolder() string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return "http-" + hex.EncodeToString(b[:])
}
