// Package httplimit is net/http middleware that asks Leasehold before a
// request reaches its handler.
//
// For every request the caller's Key function names the limit (no key:
// the request passes, counted as such) and the Cost function its cost
// (default 1). Then:
//
//   - allowed (OK, or FALLBACK under the region's fallback): the next
//     handler runs, with the RateLimit-Policy and RateLimit headers set;
//   - OVER_LIMIT: 429 Too Many Requests with Retry-After and the rate
//     limit headers;
//   - the limiter cannot decide (UNAVAILABLE, or the client failed): 503
//     Service Unavailable with Retry-After.
//
// NewMetrics counts these outcomes on a Prometheus registry.
//
// With SettleLater, the cost is an estimate charged at admission and the
// request is settled with its actual cost once the handler has returned
// (e.g. the bytes it wrote): a limit of bytes served per window.
//
// Denials carry an RFC 9457 application/problem+json body naming the
// limit, the reason and the decision id.
//
// Retry-After is delta-seconds (RFC 9110, section 10.2.3): the limiter's
// retry-after plus a uniform jitter in [0, Jitter], rounded up to whole
// seconds, at least 1. The rate limit headers follow
// draft-ietf-httpapi-ratelimit-headers-10 (structured fields):
//
//	RateLimit-Policy: "tenant/atlas";q=1000;w=60
//	RateLimit: "tenant/atlas";r=412;t=17
//
// A request admitted by a limit in shadow mode that enforcement would have
// denied passes with one more header naming the limit and the reason:
//
//	Leasehold-Would-Deny: "tenant/atlas";reason=over_limit
//
// q is the limit's G, w its window in seconds (for a limit with calendar
// windows, the length of the current one: a calendar month in
// Europe/Berlin is w=2678400 in most months, w=2682000 in October), r what is left in the
// region (an estimate: see client.Decision.Remaining), t the seconds until
// the window resets (rounded up). With ShowRemaining, RateLimit is sent
// only to the callers the function accepts; the policy is always sent.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// HeaderWouldDeny names, on a request admitted by a limit in shadow mode,
// the limit and why enforcement would have denied it.
const HeaderWouldDeny = "Leasehold-Would-Deny"

// Limiter decides requests; *client.Client is one.
type Limiter interface {
	Allow(ctx context.Context, limit string, cost int64) (client.Decision, error)
}

// Outcome is what the middleware did with a request.
type Outcome int

const (
	// Allowed: passed to the next handler.
	Allowed Outcome = iota
	// Limited: answered 429.
	Limited
	// Unavailable: answered 503: the limiter answered that it cannot
	// decide (UNAVAILABLE: a closed fallback, an agent not synced).
	Unavailable
	// NoKey: the Key function named no limit; passed.
	NoKey
	// UnknownLimit: the limit does not exist and PassUnknownLimits is set;
	// passed.
	UnknownLimit
	// Failed: answered 503: the limiter gave no answer (an error: the
	// agent unreachable, late, or refusing the call).
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	case Unavailable:
		return "unavailable"
	case NoKey:
		return "no_key"
	case UnknownLimit:
		return "unknown_limit"
	case Failed:
		return "failed"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

type options struct {
	key          func(*http.Request) (string, bool)
	cost         func(*http.Request) int64
	show         func(*http.Request) bool
	jitter       time.Duration
	passUnknown  bool
	observe      func(*http.Request, Outcome, client.Decision)
	unavailRetry time.Duration
	rnd          func(n int64) int64
	// actual, with SettleLater: the request's actual cost.
	actual        func(r *http.Request, written int64) int64
	observeSettle func(*http.Request, client.Settlement, error)
}

// SettleLimiter decides settle-later requests; *client.Client is one.
type SettleLimiter interface {
	Limiter
	AllowSettleLater(ctx context.Context, limit string, estimate int64) (client.Pending, error)
	Settle(ctx context.Context, limit, settleID string, actual int64) (client.Settlement, error)
}

var _ SettleLimiter = (*client.Client)(nil)

// SettleLater makes Cost an estimate (docs/settle.md): an admitted
// request is charged it, and once the next handler has returned it is
// settled with actual(r, written), written being the bytes of the
// response body the handler wrote (the usual actual cost of a download).
// The Limiter must be a SettleLimiter. The settle outlives the request's
// context (a caller gone at the end still costs what it cost).
func SettleLater(actual func(r *http.Request, written int64) int64) Option {
	return func(o *options) { o.actual = actual }
}

// ObserveSettle calls f once per settle (SettleLater) with its outcome.
func ObserveSettle(f func(r *http.Request, s client.Settlement, err error)) Option {
	return func(o *options) { o.observeSettle = f }
}

// Option changes an optional setting; Key is required.
type Option func(*options)

// Key names the limit of a request; ok false lets the request pass
// unlimited (counted as NoKey). Required.
func Key(f func(r *http.Request) (limit string, ok bool)) Option {
	return func(o *options) { o.key = f }
}

// Cost returns a request's cost in tokens (default 1; below 1 counts as
// 1).
func Cost(f func(r *http.Request) int64) Option { return func(o *options) { o.cost = f } }

// ShowRemaining restricts the RateLimit header (what remains of the
// quota) to the requests f accepts, e.g. authenticated callers. Default:
// shown to everyone.
func ShowRemaining(f func(r *http.Request) bool) Option { return func(o *options) { o.show = f } }

// Jitter sets the most random delay added to Retry-After before it is
// rounded up, so denied clients do not come back at once. Default 1s.
func Jitter(max time.Duration) Option {
	return func(o *options) { o.jitter = time.Duration(math.Max(0, float64(max))) }
}

// PassUnknownLimits lets requests whose limit does not exist pass
// (counted as UnknownLimit) instead of answering 503.
func PassUnknownLimits() Option { return func(o *options) { o.passUnknown = true } }

// Observe calls f once per request with what the middleware did (metrics,
// logs). The decision is zero for NoKey.
func Observe(f func(r *http.Request, o Outcome, d client.Decision)) Option {
	return func(o *options) { o.observe = f }
}

// Middleware returns middleware that asks l before every request.
func Middleware(l Limiter, opts ...Option) func(http.Handler) http.Handler {
	o := buildOptions(opts)
	if o.actual != nil {
		sl, ok := l.(SettleLimiter)
		if !ok {
			panic("httplimit: SettleLater needs a SettleLimiter")
		}
		return o.settleLater(sl)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			limit, ok := o.key(r)
			if !ok {
				o.observe(r, NoKey, client.Decision{})
				next.ServeHTTP(w, r)
				return
			}
			d, err := l.Allow(r.Context(), limit, max(1, o.cost(r)))
			switch {
			case err != nil && o.passUnknown && errors.Is(err, client.ErrUnknownLimit):
				o.observe(r, UnknownLimit, d)
				next.ServeHTTP(w, r)
			case err != nil:
				o.observe(r, Failed, d)
				o.deny(w, r, limit, d, http.StatusServiceUnavailable)
			case d.Allowed:
				o.observe(r, Allowed, d)
				o.headers(w.Header(), r, limit, d)
				next.ServeHTTP(w, r)
			case d.Reason == pb.Reason_REASON_OVER_LIMIT:
				o.observe(r, Limited, d)
				o.deny(w, r, limit, d, http.StatusTooManyRequests)
			default:
				o.observe(r, Unavailable, d)
				o.deny(w, r, limit, d, http.StatusServiceUnavailable)
			}
		})
	}
}

// buildOptions applies opts over the defaults; the Key option is
// required.
func buildOptions(opts []Option) options {
	o := options{
		cost:         func(*http.Request) int64 { return 1 },
		show:         func(*http.Request) bool { return true },
		jitter:       time.Second,
		observe:      func(*http.Request, Outcome, client.Decision) {},
		unavailRetry: time.Second,
		rnd:          rand.Int64N,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.key == nil {
		panic("httplimit: the Key option is required")
	}
	if o.observeSettle == nil {
		o.observeSettle = func(*http.Request, client.Settlement, error) {}
	}
	return o
}

// headers sets the rate limit headers.
func (o *options) headers(h http.Header, r *http.Request, limit string, d client.Decision) {
	if d.Limit <= 0 {
		return // the limiter did not say (an error)
	}
	name := sfString(limit)
	h.Set("RateLimit-Policy", name+";q="+strconv.FormatInt(d.Limit, 10)+";w="+strconv.FormatInt(ceilSeconds(d.Window), 10))
	if o.show(r) {
		h.Set("RateLimit", name+";r="+strconv.FormatInt(max(0, d.Remaining), 10)+";t="+strconv.FormatInt(ceilSeconds(d.ResetAfter), 10))
	}
	if d.WouldDeny != pb.Reason_REASON_UNSPECIFIED {
		reason := "unavailable"
		if d.WouldDeny == pb.Reason_REASON_OVER_LIMIT {
			reason = "over_limit"
		}
		h.Set(HeaderWouldDeny, name+";reason="+reason)
	}
}

// RetryAfter returns the Retry-After value for a limiter's retry-after:
// d plus a jitter in [0, jitter], rounded up to whole seconds, at least 1.
// rnd(n) returns a uniform value in [0, n).
func RetryAfter(d, jitter time.Duration, rnd func(n int64) int64) int64 {
	d = max(0, d)
	if jitter > 0 {
		d += time.Duration(rnd(int64(jitter) + 1))
	}
	return max(1, ceilSeconds(d))
}

// Problem is the application/problem+json body of a denial (RFC 9457).
type Problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Limit      string `json:"limit"`
	Reason     string `json:"reason"`
	DecisionID string `json:"decision_id,omitempty"`
}

// Problem types.
const (
	TypeOverLimit   = "urn:leasehold:problem:over-limit"
	TypeUnavailable = "urn:leasehold:problem:unavailable"
)

func (o *options) deny(w http.ResponseWriter, r *http.Request, limit string, d client.Decision, code int) {
	h := w.Header()
	retry := d.RetryAfter
	p := Problem{Status: code, Limit: limit, Reason: reasonName(d.Reason)}
	if !d.ID.IsZero() {
		p.DecisionID = d.ID.String()
	}
	if code == http.StatusTooManyRequests {
		p.Type, p.Title = TypeOverLimit, "Too Many Requests"
		p.Detail = "The limit's budget for this window is spent."
		o.headers(h, r, limit, d)
	} else {
		p.Type, p.Title = TypeUnavailable, "Service Unavailable"
		p.Detail = "The rate limiter cannot decide now."
		if p.Reason == "" || d.Reason == pb.Reason_REASON_UNSPECIFIED {
			p.Reason = reasonName(pb.Reason_REASON_UNAVAILABLE)
		}
		if retry <= 0 {
			retry = o.unavailRetry
		}
	}
	secs := RetryAfter(retry, o.jitter, o.rnd)
	p.Detail += " Retry after " + strconv.FormatInt(secs, 10) + " s."
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(p)
}

// reasonName is the reason without its REASON_ prefix, e.g. OVER_LIMIT.
func reasonName(r pb.Reason) string { return strings.TrimPrefix(r.String(), "REASON_") }

// ceilSeconds rounds d up to whole seconds (0 for d <= 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// sfString is s as a structured-field string (RFC 9651): quoted, with
// '"' and '\' escaped; other characters outside printable ASCII become
// '?' (limit ids are ASCII).
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// settleLater is the middleware of SettleLater.
func (o *options) settleLater(l SettleLimiter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			limit, ok := o.key(r)
			if !ok {
				o.observe(r, NoKey, client.Decision{})
				next.ServeHTTP(w, r)
				return
			}
			p, err := l.AllowSettleLater(r.Context(), limit, max(1, o.cost(r)))
			d := p.Decision
			switch {
			case err != nil && o.passUnknown && errors.Is(err, client.ErrUnknownLimit):
				o.observe(r, UnknownLimit, d)
				next.ServeHTTP(w, r)
			case err != nil:
				o.observe(r, Failed, d)
				o.deny(w, r, limit, d, http.StatusServiceUnavailable)
			case d.Allowed:
				o.observe(r, Allowed, d)
				o.headers(w.Header(), r, limit, d)
				cw := &countingWriter{ResponseWriter: w}
				defer func() {
					s, err := l.Settle(context.WithoutCancel(r.Context()), limit, p.SettleID, o.actual(r, cw.n))
					o.observeSettle(r, s, err)
				}()
				next.ServeHTTP(cw, r)
			case d.Reason == pb.Reason_REASON_OVER_LIMIT:
				o.observe(r, Limited, d)
				o.deny(w, r, limit, d, http.StatusTooManyRequests)
			default:
				o.observe(r, Unavailable, d)
				o.deny(w, r, limit, d, http.StatusServiceUnavailable)
			}
		})
	}
}

// countingWriter counts the bytes of the response body. Unwrap lets
// http.ResponseController reach the writer's Flush and deadlines.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
