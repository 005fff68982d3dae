package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// settleLimiter admits with p (or err) and records the settles.
type settleLimiter struct {
	fakeLimiter
	p       client.Pending
	err     error
	settled []string // "limit id actual"
	ctxErr  error    // the settle's context error
}

func (f *settleLimiter) AllowSettleLater(_ context.Context, limit string, estimate int64) (client.Pending, error) {
	f.asked = append(f.asked, fmt.Sprintf("%s %d", limit, estimate))
	return f.p, f.err
}

func (f *settleLimiter) Settle(ctx context.Context, limit, id string, actual int64) (client.Settlement, error) {
	f.settled = append(f.settled, fmt.Sprintf("%s %s %d", limit, id, actual))
	f.ctxErr = ctx.Err()
	return client.Settlement{Estimate: 100, Refunded: 100 - actual}, nil
}

// TestSettleLater: the cost is charged as an estimate, the handler runs,
// and the request is settled once with the bytes it wrote, even when the
// caller has gone; a denied request runs nothing and settles nothing.
func TestSettleLater(t *testing.T) {
	ok := client.Decision{Allowed: true, Reason: pb.Reason_REASON_OK, Limit: 1000, Window: 60e9, Remaining: 900}
	l := &settleLimiter{p: client.Pending{Decision: ok, SettleID: "s1-x"}}
	var seen []client.Settlement
	mw := Middleware(l, Key(keyHeader), Cost(func(*http.Request) int64 { return 100 }),
		SettleLater(func(_ *http.Request, written int64) int64 { return written }),
		ObserveSettle(func(_ *http.Request, s client.Settlement, err error) {
			if err != nil {
				t.Errorf("settle: %v", err)
			}
			seen = append(seen, s)
		}))
	ctx, cancel := context.WithCancel(context.Background())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 37)))
		http.NewResponseController(w).Flush() // the wrapped writer still flushes
		cancel()                              // the caller goes away before the settle
	}))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/file", nil).WithContext(ctx)
	req.Header.Set("X-Tenant", "atlas")
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || !rec.Flushed || rec.Body.Len() != 37 || rec.Header().Get("RateLimit-Policy") == "" {
		t.Fatalf("allowed: %d, flushed %v, %d bytes, headers %v", rec.Code, rec.Flushed, rec.Body.Len(), rec.Header())
	}
	if len(l.asked) != 1 || l.asked[0] != "tenant/atlas 100" || len(l.settled) != 1 || l.settled[0] != "tenant/atlas s1-x 37" {
		t.Fatalf("asked %v, settled %v", l.asked, l.settled)
	}
	if l.ctxErr != nil || len(seen) != 1 || seen[0].Refunded != 63 {
		t.Fatalf("settle context %v, observed %+v", l.ctxErr, seen)
	}

	// Denied: 429, the handler does not run, nothing to settle.
	l.p = client.Pending{Decision: client.Decision{Reason: pb.Reason_REASON_OVER_LIMIT, Limit: 1000, Window: 60e9}}
	ran := false
	h = mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("GET", "/file", nil)
	req.Header.Set("X-Tenant", "atlas")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || ran || len(l.settled) != 1 {
		t.Fatalf("denied: %d, ran %v, settled %v", rec.Code, ran, l.settled)
	}
	// The limiter failed: 503, nothing settled.
	l.err = errors.Join(client.ErrUnavailable, errors.New("agent down"))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || ran || len(l.settled) != 1 {
		t.Fatalf("failed: %d, ran %v, settled %v", rec.Code, ran, l.settled)
	}
}

// TestSettleLaterNeedsASettleLimiter: a Limiter that cannot settle is
// refused when the middleware is built, not on a request.
func TestSettleLaterNeedsASettleLimiter(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "SettleLimiter") {
			t.Fatalf("recovered %v, want a panic naming SettleLimiter", r)
		}
	}()
	Middleware(&fakeLimiter{}, Key(keyHeader), SettleLater(func(*http.Request, int64) int64 { return 0 }))
}
