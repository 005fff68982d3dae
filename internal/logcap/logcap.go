// Package logcap bounds what one log record, and one message repeated,
// can cost. Handler wraps an slog.Handler and, before the wrapped handler
// formats anything:
//
//   - cuts the message and every string value to Limits.Value bytes, and
//     all of a record's strings together (its message, keys and values,
//     and those its logger was given by With) to Limits.Record bytes,
//     marking each cut as "…(truncated, N bytes)" with N the original
//     length;
//   - keeps at most Limits.Attrs attributes per record (group members
//     count) and Limits.Depth levels of groups, and says how many it
//     dropped in a last attribute, logcap.dropped_attrs;
//   - formats values of other kinds (errors, Stringers, structs, slices)
//     to strings first, so they are cut like strings;
//   - lets each message (per level) through at Limits.Rate records a
//     second with bursts of Limits.Burst, and carries the number it
//     suppressed in the next record of that message it lets through, as
//     logcap.suppressed.
//
// So a record hands the wrapped handler at most Limits.MaxBytes bytes of
// text (11 KiB with the defaults: the record cap, one key that crosses it
// and a marker of at most 42 bytes per cut), whatever a caller passed in;
// numbers, times and the two counters are fixed-size. The wrapped
// handler's escaping can still grow it: a text or JSON handler writes a
// control byte as up to 6.
//
// Leasehold's commands wrap every process's handler in one (cmd/leasehold),
// so no request, reply or error a process logs can write an unbounded
// line, and a flood of one warning costs Rate lines a second.
package logcap

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Limits are a Handler's caps. A zero field takes its default.
type Limits struct {
	// Value caps the message and each string value, in bytes (default
	// 1 KiB): an id, a reason or an error message is far shorter.
	Value int
	// Record caps all strings of a record together, in bytes (default
	// 8 KiB): a few long values, not a page.
	Record int
	// Attrs caps the attributes of a record, group members included
	// (default 64; the most any statement here passes is about 12).
	Attrs int
	// Depth caps how deeply groups nest (default 4).
	Depth int
	// Rate is how many records of one message (and level) a second go
	// through in the long run, Burst how many at once (defaults 10 and
	// 100: an ApplyLimits of 100 changes logs 100 lines in a burst;
	// a warning repeated per limit or per call is cut to 10 a second).
	Rate  float64
	Burst int
}

// MaxBytes bounds the bytes of text (message, keys, string values, group
// names) of one record a Handler with these limits passes on: the record
// cap, one key that crosses it, a marker per value and the message, and
// the two counters it may add.
func (l Limits) MaxBytes() int {
	l = l.withDefaults()
	return l.Record + KeyCap + markerMax*(l.Attrs+1) + len(DroppedKey) + len(SuppressedKey)
}

// Defaults are the caps a zero Limits takes.
var Defaults = Limits{Value: 1 << 10, Record: 8 << 10, Attrs: 64, Depth: 4, Rate: 10, Burst: 100}

// KeyCap caps an attribute's key, in bytes (keys come from code).
const KeyCap = 64

// maxKeys bounds the messages the rate limiter keeps a bucket for; past
// it, messages it has not seen share one bucket (messages are constants
// in code, so this is never reached but by a bug that puts input in one).
const maxKeys = 1024

// Names of the attributes a Handler adds.
const (
	DroppedKey    = "logcap.dropped_attrs"
	SuppressedKey = "logcap.suppressed"
)

func (l Limits) withDefaults() Limits {
	d := Defaults
	if l.Value > 0 {
		d.Value = l.Value
	}
	if l.Record > 0 {
		d.Record = l.Record
	}
	if l.Attrs > 0 {
		d.Attrs = l.Attrs
	}
	if l.Depth > 0 {
		d.Depth = l.Depth
	}
	if l.Rate > 0 {
		d.Rate = l.Rate
	}
	if l.Burst > 0 {
		d.Burst = l.Burst
	}
	return d
}

// Handler is an slog.Handler that caps records before a wrapped handler
// sees them (see the package doc). Handlers derived with WithAttrs and
// WithGroup share their parent's rate limiter. Safe for concurrent use.
type Handler struct {
	inner  slog.Handler
	lim    Limits
	rl     *rateLimiter
	depth  int // groups opened by WithGroup
	used   int // bytes the WithAttrs attributes took of the record cap
	nAttrs int // attributes WithAttrs added
}

// New wraps inner.
func New(inner slog.Handler, l Limits) *Handler {
	return &Handler{inner: inner, lim: l.withDefaults(), rl: &rateLimiter{buckets: map[rlKey]*bucket{}}}
}

// Enabled reports whether the wrapped handler handles level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle caps r and passes it on, unless its message is over its rate.
// The rate runs on r.Time, the time the record was made.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	b := &budget{lim: h.lim, left: h.lim.Record - h.used, attrs: h.nAttrs}
	msg := b.str(r.Message)
	suppressed, ok := h.rl.allow(rlKey{r.Level, msg}, r.Time, h.lim)
	if !ok {
		return nil
	}
	out := slog.NewRecord(r.Time, r.Level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if c, keep := b.attr(a, h.depth); keep {
			out.AddAttrs(c)
		}
		return true
	})
	if b.dropped > 0 {
		out.AddAttrs(slog.Int(DroppedKey, b.dropped))
	}
	if suppressed > 0 {
		out.AddAttrs(slog.Int64(SuppressedKey, suppressed))
	}
	return h.inner.Handle(ctx, out)
}

// WithAttrs caps attrs as a record's would be, and charges them to every
// record of the returned handler.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	b := &budget{lim: h.lim, left: h.lim.Record - h.used, attrs: h.nAttrs}
	kept := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if c, keep := b.attr(a, h.depth); keep {
			kept = append(kept, c)
		}
	}
	if b.dropped > 0 {
		kept = append(kept, slog.Int(DroppedKey, b.dropped))
	}
	c := *h
	c.inner = h.inner.WithAttrs(kept)
	c.used = h.lim.Record - b.left
	c.nAttrs = b.attrs
	return &c
}

// WithGroup opens a group (a group past Limits.Depth is not opened: its
// attributes stay at the depth reached).
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" || h.depth >= h.lim.Depth {
		return h
	}
	c := *h
	name = prefix(name, KeyCap)
	c.inner = h.inner.WithGroup(name)
	c.depth++
	c.used += len(name)
	return &c
}

// budget is what is left of one record's caps while it is built.
type budget struct {
	lim     Limits
	left    int // bytes of the record cap
	attrs   int // attributes kept so far
	dropped int // attributes dropped
}

// str cuts s to the value cap and to what is left of the record's.
func (b *budget) str(s string) string {
	n := min(b.lim.Value, max(0, b.left))
	out := cut(s, n)
	b.left -= min(len(s), n)
	return out
}

// key cuts k to KeyCap (without a marker: keys come from code).
func (b *budget) key(k string) string {
	k = prefix(k, KeyCap)
	b.left -= len(k)
	return k
}

// attr caps one attribute at group depth d; keep is false when it is
// dropped: over the attribute cap, in a group past the depth cap, after
// the record cap ran out, or empty.
func (b *budget) attr(a slog.Attr, d int) (slog.Attr, bool) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return a, false
	}
	if a.Value.Kind() == slog.KindGroup {
		members := a.Value.Group()
		if d >= b.lim.Depth || b.left <= 0 {
			b.dropped += countAttrs(members)
			return a, false
		}
		key := b.key(a.Key)
		kept := make([]slog.Attr, 0, len(members))
		for _, m := range members {
			if c, keep := b.attr(m, d+1); keep {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 {
			return a, false
		}
		return slog.Attr{Key: key, Value: slog.GroupValue(kept...)}, true
	}
	if b.attrs >= b.lim.Attrs || b.left <= 0 {
		b.dropped++
		return a, false
	}
	b.attrs++
	a.Key = b.key(a.Key)
	switch a.Value.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(b.str(a.Value.String()))
	case slog.KindAny:
		a.Value = slog.StringValue(b.str(format(a.Value.Any())))
	}
	return a, true
}

// countAttrs counts the leaves of a group.
func countAttrs(as []slog.Attr) int {
	n := 0
	for _, a := range as {
		if v := a.Value.Resolve(); v.Kind() == slog.KindGroup {
			n += countAttrs(v.Group())
		} else {
			n++
		}
	}
	return n
}

// format renders a value of kind Any as the text and JSON handlers would
// for the common cases (errors, Stringers), else with %+v.
func format(v any) string {
	switch x := v.(type) {
	case nil:
		return "<nil>"
	case error:
		return x.Error()
	case fmt.Stringer:
		return x.String()
	case []byte:
		return string(x)
	}
	return fmt.Sprintf("%+v", v)
}

// cut returns s if it is at most n bytes, else its first n bytes (or
// fewer, to end on a whole UTF-8 character) and the marker.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return prefix(s, n) + "…(truncated, " + strconv.Itoa(len(s)) + " bytes)"
}

// markerMax is the longest marker cut adds: "…(truncated, " (16 bytes),
// up to 19 digits, " bytes)" (7).
const markerMax = 42

// prefix is s's first n bytes or fewer, ending on a whole UTF-8
// character.
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	k := max(0, n)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k]
}

// rlKey names what a rate applies to: a message at a level.
type rlKey struct {
	level slog.Level
	msg   string
}

// bucket is one message's token bucket and what it suppressed.
type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int64
}

// rateLimiter holds the buckets of every message seen.
type rateLimiter struct {
	mu       sync.Mutex // protects buckets, overflow
	buckets  map[rlKey]*bucket
	overflow *bucket // shared by messages past maxKeys
}

// allow takes a token of k's bucket at now: ok, and how many records of k
// were suppressed since the last one let through (reset by an ok).
func (r *rateLimiter) allow(k rlKey, now time.Time, l Limits) (suppressed int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.buckets[k]
	if b == nil {
		if len(r.buckets) >= maxKeys {
			if r.overflow == nil {
				r.overflow = &bucket{tokens: float64(l.Burst), last: now}
			}
			b = r.overflow
		} else {
			b = &bucket{tokens: float64(l.Burst), last: now}
			r.buckets[k] = b
		}
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = min(float64(l.Burst), b.tokens+dt.Seconds()*l.Rate)
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		return 0, false
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return suppressed, true
}
