package logcap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// capture is an slog.Handler that keeps what it is handed: each record's
// attributes (the With ones first, group names folded into the keys as
// "g.k") and the bytes of text it got.
type capture struct {
	mu   *sync.Mutex
	recs *[]captured
	pre  []slog.Attr
	pfx  string
	text int // bytes of group names and With attributes
}

type captured struct {
	msg   string
	attrs map[string]slog.Value
	text  int // bytes of text: message, keys, string values, group names
}

func newCapture() *capture { return &capture{mu: &sync.Mutex{}, recs: &[]captured{}} }

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	out := captured{msg: r.Message, attrs: map[string]slog.Value{}, text: c.text + len(r.Message)}
	var add func(pfx string, a slog.Attr)
	add = func(pfx string, a slog.Attr) {
		out.text += len(a.Key)
		if a.Value.Kind() == slog.KindGroup {
			for _, m := range a.Value.Group() {
				add(pfx+a.Key+".", m)
			}
			return
		}
		if a.Value.Kind() == slog.KindString {
			out.text += len(a.Value.String())
		}
		out.attrs[pfx+a.Key] = a.Value
	}
	for _, a := range c.pre {
		add("", a)
	}
	r.Attrs(func(a slog.Attr) bool { add(c.pfx, a); return true })
	c.mu.Lock()
	*c.recs = append(*c.recs, out)
	c.mu.Unlock()
	return nil
}

func (c *capture) WithAttrs(as []slog.Attr) slog.Handler {
	d := *c
	d.pre = append([]slog.Attr(nil), c.pre...)
	for _, a := range as {
		a.Key = c.pfx + a.Key
		d.pre = append(d.pre, a)
	}
	return &d
}

func (c *capture) WithGroup(name string) slog.Handler {
	d := *c
	d.pfx += name + "."
	d.text += len(name)
	return &d
}

func (c *capture) all() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]captured(nil), *c.recs...)
}

func (c *capture) last(t *testing.T) captured {
	t.Helper()
	all := c.all()
	if len(all) == 0 {
		t.Fatal("nothing logged")
	}
	return all[len(all)-1]
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// handle logs msg with args at t through h.
func handle(t *testing.T, h slog.Handler, at time.Time, msg string, args ...any) {
	t.Helper()
	r := slog.NewRecord(at, slog.LevelWarn, msg, 0)
	r.Add(args...)
	if err := h.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

func TestCutsMessageAndValues(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{})
	long := strings.Repeat("x", 5000)
	handle(t, h, t0, strings.Repeat("m", 2000), "region", long, "err", errors.New(strings.Repeat("e", 3000)),
		"short", "ok", "n", 7, "any", []string{long})
	got := c.last(t)
	if want := strings.Repeat("m", 1024) + "…(truncated, 2000 bytes)"; got.msg != want {
		t.Errorf("message: %d bytes %q...", len(got.msg), got.msg[1000:])
	}
	for key, n := range map[string]int{"region": 5000, "err": 3000, "any": 5002} {
		v := got.attrs[key]
		if v.Kind() != slog.KindString || !strings.HasSuffix(v.String(), "…(truncated, "+itoa(n)+" bytes)") ||
			len(v.String()) > 1024+markerMax {
			t.Errorf("%s: %v %d bytes, want 1024 kept and the marker", key, v.Kind(), len(v.String()))
		}
	}
	if got.attrs["short"].String() != "ok" || got.attrs["n"].Int64() != 7 {
		t.Errorf("short values changed: %v", got.attrs)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestRecordCap(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{Value: 1000, Record: 4000})
	var args []any
	for i := range 10 {
		args = append(args, string(rune('a'+i)), strings.Repeat("v", 1000))
	}
	handle(t, h, t0, "msg", args...)
	got := c.last(t)
	// 3 bytes of message; then each attribute costs 1 (key) + 1000: three
	// whole, the fourth cut to 993, the other six dropped.
	if len(got.attrs) != 5 || num(got.attrs[DroppedKey]) != 6 {
		t.Fatalf("kept %d attributes (%v dropped), want 4 and 6 dropped", len(got.attrs)-1, got.attrs[DroppedKey])
	}
	if v := got.attrs["d"].String(); !strings.HasPrefix(v, strings.Repeat("v", 993)+"…") || strings.HasPrefix(v, strings.Repeat("v", 994)) {
		t.Errorf("the value that crosses the cap: %d bytes, want 993 kept", len(v))
	}
	if max := (Limits{Value: 1000, Record: 4000}).MaxBytes(); got.text > max {
		t.Errorf("record text %d bytes > MaxBytes %d", got.text, max)
	}
}

func TestAttrAndDepthCaps(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{Attrs: 5, Depth: 2})
	handle(t, h, t0, "many", "a", 1, "b", 2, "c", 3, slog.Group("g", "d", 4, slog.Group("h", "e", 5, slog.Group("i", "f", 6))),
		"x", 7, "y", 8)
	got := c.last(t)
	// a b c g.d g.h.e kept (5: depth 2 reached at g.h); g.h.i.f past the
	// depth, x and y past the count.
	for _, k := range []string{"a", "b", "c", "g.d", "g.h.e"} {
		if _, ok := got.attrs[k]; !ok {
			t.Errorf("%s dropped", k)
		}
	}
	if n := num(got.attrs[DroppedKey]); n != 3 || len(got.attrs) != 6 {
		t.Errorf("got %v, want 5 attributes and 3 dropped", got.attrs)
	}
}

// TestWithAttrsCharged: what a logger was given by With is cut like a
// record's attributes and counts against every record's caps.
func TestWithAttrsCharged(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{Value: 100, Record: 300, Attrs: 3}).WithAttrs([]slog.Attr{
		slog.String("component", strings.Repeat("c", 250)), slog.String("region", "eu")})
	h = h.WithGroup(strings.Repeat("g", 100))
	handle(t, h, t0, "msg", "k", strings.Repeat("v", 200), "k2", "x")
	got := c.last(t)
	if v := got.attrs["component"].String(); !strings.HasPrefix(v, strings.Repeat("c", 100)+"…(truncated, 250 bytes)") {
		t.Errorf("With value not cut: %d bytes", len(v))
	}
	// Used by With and the group: 9+100 + 6+2 + 64 = 181 of 300; the
	// message 3; the record's k gets 1 key byte and 100 value bytes; k2 is
	// the 4th attribute (3 allowed) and is dropped.
	gk := strings.Repeat("g", 64) + ".k"
	if v := got.attrs[gk].String(); !strings.HasPrefix(v, strings.Repeat("v", 100)+"…") {
		t.Errorf("record value %q: want 100 kept", v)
	}
	if num(got.attrs[strings.Repeat("g", 64)+"."+DroppedKey]) != 1 {
		t.Errorf("want k2 dropped: %v", got.attrs)
	}
	if got.text > (Limits{Value: 100, Record: 300, Attrs: 3}).MaxBytes() {
		t.Errorf("record text %d bytes over MaxBytes", got.text)
	}
}

func TestCutKeepsUTF8(t *testing.T) {
	s := strings.Repeat("é", 600) // 1200 bytes
	got := cut(s, 1023)
	if !utf8.ValidString(got) || !strings.HasPrefix(got, strings.Repeat("é", 511)+"…") {
		t.Errorf("cut at 1023 of 2-byte runes: %q", got[len(got)-40:])
	}
	if cut("short", 10) != "short" {
		t.Error("short string cut")
	}
}

// TestRate is a step table at fixed instants: a message gets Burst
// records at once and Rate a second after that; the next record let
// through says how many were suppressed; other messages and levels have
// buckets of their own.
func TestRate(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{Rate: 10, Burst: 100})
	count := func(msg string) (n int, suppressed int64) {
		for _, r := range c.all() {
			if r.msg == msg {
				n++
				suppressed += num(r.attrs[SuppressedKey])
			}
		}
		return n, suppressed
	}
	for _, step := range []struct {
		at         time.Duration
		records    int // "lease return failed" records logged at the instant
		total      int // written so far
		suppressed int64
	}{
		{0, 1050, 100, 0},                             // a window boundary in a partition: the burst
		{time.Second, 1050, 110, 950},                 // refilled 10; the first says 950 were dropped
		{1500 * time.Millisecond, 3, 113, 950 + 1040}, // 5 refilled, 2 left
		{12 * time.Second, 200, 213, 1990},            // full again (100), 100 dropped
		{13 * time.Second, 0, 213, 1990},
	} {
		for range step.records {
			handle(t, h, t0.Add(step.at), "lease return failed", "limit", "tenant/a")
		}
		n, sup := count("lease return failed")
		if n != step.total || sup != step.suppressed {
			t.Fatalf("at t0+%v: %d written, %d said suppressed; want %d and %d", step.at, n, sup, step.total, step.suppressed)
		}
	}
	handle(t, h, t0.Add(13*time.Second), "another message")
	r := slog.NewRecord(t0.Add(13*time.Second), slog.LevelError, "lease return failed", 0)
	_ = h.Handle(context.Background(), r)
	if n, _ := count("another message"); n != 1 {
		t.Error("another message shares the bucket")
	}
	if n, _ := count("lease return failed"); n != 214 {
		t.Error("the same message at another level shares the bucket")
	}
}

// TestRateSharedByDerived: a logger made by With shares its parent's
// buckets (one component flooding through several loggers is one flood).
func TestRateSharedByDerived(t *testing.T) {
	c := newCapture()
	h := New(c, Limits{Rate: 1, Burst: 5})
	a, b := h.WithAttrs([]slog.Attr{slog.String("x", "a")}), h.WithGroup("g")
	for i := range 10 {
		handle(t, []slog.Handler{a, b}[i%2], t0, "same")
	}
	if n := len(c.all()); n != 5 {
		t.Fatalf("%d written through two derived handlers, want 5 (one bucket)", n)
	}
}

// TestRateKeysBounded: messages past maxKeys share one bucket, so input
// in a message cannot grow the limiter without bound.
func TestRateKeysBounded(t *testing.T) {
	h := New(slog.DiscardHandler, Limits{Burst: 1, Rate: 1})
	for i := range maxKeys + 500 {
		handle(t, h, t0, "msg "+itoa(i))
	}
	if n := len(h.rl.buckets); n != maxKeys {
		t.Fatalf("%d buckets, want %d", n, maxKeys)
	}
}

// TestHugeRegionLine: the line that once took 8.4 MB (a 4 MB region named
// twice, in an attribute and in an error) is at most MaxBytes of text,
// and its JSON stays well-formed.
func TestHugeRegionLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewJSONHandler(&buf, nil), Limits{}))
	region := strings.Repeat("r", 4<<20)
	log.Warn("allocator: Allocator service call refused", "rpc", "SyncLimits", "principal", "agent/eu", "region", region,
		"err", errors.New(`permission denied: agent certificate is for region "eu", not "`+region+`"`))
	if buf.Len() > Defaults.MaxBytes()+200 {
		t.Errorf("line of %d bytes, want at most about %d", buf.Len(), Defaults.MaxBytes())
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if s, _ := m["region"].(string); !strings.HasSuffix(s, "…(truncated, 4194304 bytes)") {
		t.Errorf("region: %.60q", s)
	}
}

// FuzzHandler: whatever the message, values and nesting, the text a
// record hands on is at most MaxBytes, every string it keeps is the
// original or a prefix of it with the marker, and the JSON line parses.
func FuzzHandler(f *testing.F) {
	f.Add("msg", "value", "key", 3, 2, 100, 500)
	f.Add(strings.Repeat("é", 700), strings.Repeat("\x00", 3000), strings.Repeat("k", 100), 70, 6, 1, 1)
	f.Add("", "", "", 0, 0, 0, 0)
	f.Fuzz(func(t *testing.T, msg, val, key string, n, depth, vcap, rcap int) {
		n, depth = min(max(n, 0), 200), min(max(depth, 0), 8)
		l := Limits{Value: vcap % 5000, Record: rcap % 20000, Attrs: 50, Depth: 3}
		c := newCapture()
		var buf bytes.Buffer
		for _, h := range []slog.Handler{New(c, l), New(slog.NewJSONHandler(&buf, nil), l)} {
			log := slog.New(h).With(key, val)
			args := make([]any, 0, n)
			for i := range n {
				a := slog.String(key+itoa(i), val)
				for range depth {
					a = slog.Group(key, a)
				}
				args = append(args, a)
			}
			log.Info(msg, args...)
		}
		got := c.last(t)
		if got.text > l.MaxBytes() {
			t.Fatalf("record text %d bytes > MaxBytes %d", got.text, l.MaxBytes())
		}
		for _, s := range append([]string{got.msg}, stringsOf(got.attrs)...) {
			if i := strings.LastIndex(s, "…(truncated, "); i >= 0 && s != msg && s != val {
				if !strings.HasPrefix(msg, s[:i]) && !strings.HasPrefix(val, s[:i]) {
					t.Fatalf("kept %q is no prefix of the input", s[:i])
				}
			}
		}
		var m map[string]any
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatalf("JSON line does not parse: %v\n%.200s", err, buf.String())
		}
	})
}

// num is an int attribute's value, 0 if absent.
func num(v slog.Value) int64 {
	if v.Kind() != slog.KindInt64 {
		return 0
	}
	return v.Int64()
}

func stringsOf(m map[string]slog.Value) []string {
	var out []string
	for _, v := range m {
		if v.Kind() == slog.KindString {
			out = append(out, v.String())
		}
	}
	return out
}
