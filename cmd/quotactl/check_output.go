package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"leasehold/internal/zones"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// The denial reasons every summary shows, zero or not, in this order.
var checkDenials = []string{"OVER_LIMIT", "UNAVAILABLE"}

// maxWindowSpan bounds W and reset_after for window attribution (an answer
// outside it is counted, but in no window), so the arithmetic cannot
// overflow.
const maxWindowSpan = 366 * 24 * time.Hour

// tally counts the outcomes of a run's calls.
type tally struct {
	calls    int64 // answered + errors
	answered int64
	counts
	errors     map[string]int64 // by gRPC code name
	unwindowed int64            // answers with no usable window or reset_after
	windows    map[winKey]*counts
	lat        latencies // of answered calls
}

// counts are the answers of a run or of one window.
type counts struct {
	admitted, admittedCost int64 // allowed, fallback admits included
	fallback, fallbackCost int64 // allowed with reason FALLBACK
	denied                 map[string]int64
}

// winKey names a window: its length, phase offset and the index of its
// end (the window is [(end-1)*w + phase, end*w + phase) in Unix
// nanoseconds).
type winKey struct{ w, phase, end int64 }

func (k winKey) start() int64 { return (k.end-1)*k.w + k.phase }

func newTally() *tally {
	return &tally{counts: counts{denied: map[string]int64{}}, errors: map[string]int64{}, windows: map[winKey]*counts{}}
}

func (t *tally) error(c codes.Code) {
	t.calls++
	t.errors[c.String()]++
}

// answer counts one CheckResponse of a call of cost tokens that arrived at
// arrived after lat.
func (t *tally) answer(resp *pb.CheckResponse, cost int64, arrived time.Time, lat time.Duration) {
	t.calls++
	t.answered++
	t.lat.add(lat)
	t.counts.add(resp, cost)
	k, ok := windowOf(resp, arrived)
	if !ok {
		t.unwindowed++
		return
	}
	c := t.windows[k]
	if c == nil {
		c = &counts{denied: map[string]int64{}}
		t.windows[k] = c
	}
	c.add(resp, cost)
}

func (c *counts) add(resp *pb.CheckResponse, cost int64) {
	if !resp.GetAllowed() {
		c.denied[reasonName(resp.GetReason())]++
		return
	}
	c.admitted++
	c.admittedCost += cost
	if resp.GetReason() == pb.Reason_REASON_FALLBACK {
		c.fallback++
		c.fallbackCost += cost
	}
}

func (c *counts) deniedTotal() int64 {
	var n int64
	for _, v := range c.denied {
		n += v
	}
	return n
}

// windowOf attributes an answer to the window ending at the multiple of W
// (plus the limit's phase offset, window_phase) nearest to its arrival
// plus reset_after. Every process on one host (one clock) therefore agrees
// on where windows start.
func windowOf(resp *pb.CheckResponse, arrived time.Time) (winKey, bool) {
	if resp.GetWindow() == nil || resp.GetResetAfter() == nil {
		return winKey{}, false
	}
	w, reset := resp.GetWindow().AsDuration(), resp.GetResetAfter().AsDuration()
	if w <= 0 || w > maxWindowSpan || reset < 0 || reset > maxWindowSpan {
		return winKey{}, false
	}
	end := arrived.UnixNano() + int64(reset)
	if c := resp.GetCalendar(); c != nil {
		// Calendar windows: window is the current one's own length, so
		// the window is the calendar's that holds the middle of [end -
		// window, end). Keyed by its start (as a phase of one window of
		// its length: start() is the start).
		cal, err := zones.Calendar(c.GetUnit(), c.GetZone())
		if err != nil {
			return winKey{}, false
		}
		cw := cal.WindowOf(time.Unix(0, end-int64(w)/2))
		if cw.Empty() {
			return winKey{}, false
		}
		return winKey{w: int64(cw.Length()), phase: cw.Start.UnixNano(), end: 1}, true
	}
	var phase int64
	if p := resp.GetWindowPhase().AsDuration(); p > 0 && p < w {
		phase = int64(p)
		end -= phase // the window's end less the phase is a multiple of W
	}
	if end <= 0 {
		return winKey{}, false
	}
	// round(end / w), halves up
	return winKey{w: int64(w), phase: phase, end: (end + int64(w)/2) / int64(w)}, true
}

// reasonName is the Reason without its REASON_ prefix: OVER_LIMIT.
func reasonName(r pb.Reason) string {
	n := r.String() // a number when unknown to this build
	if s, ok := strings.CutPrefix(n, "REASON_"); ok {
		return s
	}
	return "REASON_" + n
}

// latencies is a log-linear histogram: exact below 128ns, within 1% above,
// in a few dozen buckets however many calls are made.
type latencies struct {
	n       int64
	max     time.Duration
	buckets map[int]int64
}

const latSub = 128 // buckets per power of two

func latBucket(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < latSub {
		return int(v)
	}
	shift := bits.Len64(v) - 8 // v>>shift is in [128, 256)
	return latSub + shift*latSub + int(v>>shift) - latSub
}

// latValue is the middle of bucket b.
func latValue(b int) time.Duration {
	if b < latSub {
		return time.Duration(b)
	}
	shift := (b - latSub) / latSub
	m := uint64((b-latSub)%latSub + latSub)
	return time.Duration(m<<shift + (uint64(1)<<shift)/2)
}

func (l *latencies) add(d time.Duration) {
	if l.buckets == nil {
		l.buckets = map[int]int64{}
	}
	l.n++
	l.max = max(l.max, d)
	l.buckets[latBucket(d)]++
}

// quantile is the latency below which a fraction q of the calls fell (the
// nearest-rank method), never more than the maximum.
func (l *latencies) quantile(q float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(l.n)))
	keys := make([]int, 0, len(l.buckets))
	for k := range l.buckets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var seen int64
	for _, k := range keys {
		seen += l.buckets[k]
		if seen >= rank {
			return min(latValue(k), l.max)
		}
	}
	return l.max
}

// The JSON summary. encoding/json writes map keys sorted.
type checkJSON struct {
	Limit               string           `json:"limit"`
	Agent               string           `json:"agent"`
	Cost                int64            `json:"cost"`
	Calls               int64            `json:"calls"`
	AdmittedRequests    int64            `json:"admitted_requests"`
	AdmittedCost        int64            `json:"admitted_cost"`
	Denied              map[string]int64 `json:"denied"`
	FallbackRequests    int64            `json:"fallback_requests"`
	FallbackCost        int64            `json:"fallback_cost"`
	Errors              map[string]int64 `json:"errors"`
	DurationSeconds     float64          `json:"duration_seconds"`
	CallsPerSecond      float64          `json:"calls_per_second"`
	LatencyMS           latencyJSON      `json:"latency_ms"`
	Stopped             string           `json:"stopped"`
	StopError           string           `json:"stop_error"`
	UnwindowedResponses int64            `json:"unwindowed_responses"`
	Windows             []windowJSON     `json:"windows"`
}

type latencyJSON struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type windowJSON struct {
	WindowStart      string           `json:"window_start"`
	WindowSeconds    float64          `json:"window_seconds"`
	AdmittedRequests int64            `json:"admitted_requests"`
	AdmittedCost     int64            `json:"admitted_cost"`
	Denied           map[string]int64 `json:"denied"`
	FallbackRequests int64            `json:"fallback_requests"`
	FallbackCost     int64            `json:"fallback_cost"`
}

// checkTime is a window start: RFC 3339, UTC, milliseconds.
const checkTime = "2006-01-02T15:04:05.000Z07:00"

func (k winKey) startString() string {
	return time.Unix(0, k.start()).UTC().Format(checkTime)
}

// sortedWindows returns t's windows by start (then length).
func (t *tally) sortedWindows() []winKey {
	keys := make([]winKey, 0, len(t.windows))
	for k := range t.windows {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b winKey) int {
		if c := cmpInt64(a.start(), b.start()); c != 0 {
			return c
		}
		return cmpInt64(a.w, b.w)
	})
	return keys
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// denialColumns are the denial reasons to show: the fixed ones, then any
// other reason seen, sorted.
func (t *tally) denialColumns() []string {
	cols := slices.Clone(checkDenials)
	var extra []string
	for k := range t.denied {
		if !slices.Contains(cols, k) {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	return append(cols, extra...)
}

// withFixedDenials copies m with every fixed reason present.
func withFixedDenials(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m)+len(checkDenials))
	for _, r := range checkDenials {
		out[r] = 0
	}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ms(d time.Duration) float64 {
	return math.Round(float64(d)/1e3) / 1e3
}

// printCheck prints the summary of a run: JSON, or "key: value" lines and
// the per-window table.
func (e *env) printCheck(r *checkRun, t *tally, elapsed time.Duration) error {
	secs := elapsed.Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(t.calls) / secs
	}
	stopErr := ""
	if r.stopErr != nil {
		stopErr = oneLine(r.describe(r.stopErr).Error())
	}
	if e.json {
		out := checkJSON{
			Limit: r.limit, Agent: r.agent, Cost: r.cost, Calls: t.calls,
			AdmittedRequests: t.admitted, AdmittedCost: t.admittedCost,
			Denied:           withFixedDenials(t.denied),
			FallbackRequests: t.fallback, FallbackCost: t.fallbackCost,
			Errors:          t.errors,
			DurationSeconds: math.Round(secs*1e3) / 1e3,
			CallsPerSecond:  math.Round(rate*10) / 10,
			LatencyMS: latencyJSON{
				P50: ms(t.lat.quantile(0.50)), P90: ms(t.lat.quantile(0.90)),
				P99: ms(t.lat.quantile(0.99)), Max: ms(t.lat.max),
			},
			Stopped: r.reason, StopError: stopErr,
			UnwindowedResponses: t.unwindowed,
			Windows:             []windowJSON{},
		}
		for _, k := range t.sortedWindows() {
			c := t.windows[k]
			out.Windows = append(out.Windows, windowJSON{
				WindowStart: k.startString(), WindowSeconds: float64(k.w) / 1e9,
				AdmittedRequests: c.admitted, AdmittedCost: c.admittedCost,
				Denied:           withFixedDenials(c.denied),
				FallbackRequests: c.fallback, FallbackCost: c.fallbackCost,
			})
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %v", err)
		}
		_, err = e.stdout.Write(append(b, '\n'))
		return err
	}

	cols := t.denialColumns()
	reasons := func(m map[string]int64) string {
		parts := make([]string, len(cols))
		for i, c := range cols {
			parts[i] = c + " " + strconv.FormatInt(m[c], 10)
		}
		return strings.Join(parts, ", ")
	}
	errs := strconv.FormatInt(t.calls-t.answered, 10)
	if len(t.errors) > 0 {
		names := make([]string, 0, len(t.errors))
		for k := range t.errors {
			names = append(names, k)
		}
		slices.Sort(names)
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = n + " " + strconv.FormatInt(t.errors[n], 10)
		}
		errs += " (" + strings.Join(parts, ", ") + ")"
	}
	stopped := r.reason
	if stopErr != "" {
		stopped += ": " + stopErr
	}
	rows := [][2]string{
		{"limit", cell(r.limit, "")},
		{"agent", r.agent},
		{"cost", strconv.FormatInt(r.cost, 10)},
		{"calls", strconv.FormatInt(t.calls, 10)},
		{"admitted", fmt.Sprintf("%d requests, cost %d", t.admitted, t.admittedCost)},
		{"denied", fmt.Sprintf("%d (%s)", t.deniedTotal(), reasons(t.denied))},
		{"fallback", fmt.Sprintf("%d requests, cost %d", t.fallback, t.fallbackCost)},
		{"errors", errs},
		{"duration", elapsed.Round(time.Millisecond).String()},
		{"rate", fmt.Sprintf("%.1f calls/s", rate)},
		{"latency", fmt.Sprintf("p50 %.3fms, p90 %.3fms, p99 %.3fms, max %.3fms",
			ms(t.lat.quantile(0.50)), ms(t.lat.quantile(0.90)), ms(t.lat.quantile(0.99)), ms(t.lat.max))},
		{"stopped", stopped},
	}
	if t.unwindowed > 0 {
		rows = append(rows, [2]string{"unwindowed", strconv.FormatInt(t.unwindowed, 10) + " (answers without a usable window or reset_after)"})
	}
	var b bytes.Buffer
	for _, row := range rows {
		fmt.Fprintf(&b, "%-10s %s\n", row[0]+":", row[1])
	}
	b.WriteByte('\n')
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "WINDOW_START\tW\tADMITTED\tADMITTED_COST\t%s\tFALLBACK\tFALLBACK_COST\n", strings.Join(cols, "\t"))
	for _, k := range t.sortedWindows() {
		c := t.windows[k]
		den := make([]string, len(cols))
		for i, col := range cols {
			den[i] = strconv.FormatInt(c.denied[col], 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%d\n", k.startString(),
			formatDuration(durationpb.New(time.Duration(k.w))), c.admitted, c.admittedCost,
			strings.Join(den, "\t"), c.fallback, c.fallbackCost)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.Copy(e.stdout, &b)
	return err
}
