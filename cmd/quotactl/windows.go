package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "leasehold/proto/leasehold/v1"
)

const (
	// windowsDefaultLast is --last when not given.
	windowsDefaultLast = 10
	// windowsMaxLast bounds --last.
	windowsMaxLast = 1000
)

var windowsCmd = &command{
	name:    "windows",
	args:    "ID [--last N]",
	summary: "report a limit's recent windows: admitted against G, the overshoot bound, stranded tokens",
	detail: `windows calls leasehold.v1.Admin/ListWindows on the allocator (served by
the leader; a follower redirects) and prints the limit's last N windows,
oldest first, the running window included. Each row holds what was granted
(the regions' standing shares included: "standing" in --json), returned and
admitted per region, the overshoot bound (+Inf while a region
was in open fallback), the observed overshoot and the stranded tokens
(docs/overshoot.md).

The running window is marked "*" after its end. A row whose
observed_overshoot is above a finite bound is marked "!": that is a bug,
report it.

A bucket limit has no windows: windows prints its last N reporting
intervals (one minute each) instead, what the regions admitted in each
beside the bound B + R x (interval + slack), then the regions' rate shares
in force. An interval whose admitted_total is above its bound is marked
"!". With --json, a bucket limit prints one object (kind, intervals,
shares) instead of an array of windows.

An override in force (limits override), on the limit or on the plan of a
tenant, is named in a line under the tables: its end, its reason, what it
returns to and the settings it changes (old -> new); with --json, in
"override" (of the newest window, or of the bucket or concurrency
limit's object).`,
	flags: func(f *flagSet) action {
		last := int32(windowsDefaultLast)
		f.value("last", "`N`: windows to show, newest included, 1-1000 (default 10)", func(s string) error {
			n, err := strconv.ParseInt(s, 10, 32)
			if err != nil || n < 1 || n > windowsMaxLast {
				return fmt.Errorf("want a whole number from 1 to %d", windowsMaxLast)
			}
			last = int32(n)
			return nil
		})
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			req := &pb.ListWindowsRequest{LimitId: id, Last: last}
			// With allocator groups the reports of a limit that moved are
			// in the groups that owned its windows: gather them all.
			var ws []*pb.WindowReport
			var bk bucketWindows
			found := false
			var notFound error
			list := func(call func(adminRPC) error) (string, error) {
				var resp *pb.ListWindowsResponse
				var code codes.Code // of the last attempt
				err := call(func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
					resp, err = c.ListWindows(ctx, req, opt)
					code = status.Code(err)
					return err
				})
				if code == codes.NotFound && ctx.Err() == nil {
					notFound = err
					return "", nil
				}
				if err != nil {
					return "", err
				}
				found = true
				ws = append(ws, resp.GetWindows()...)
				if bk.overridden == nil {
					bk.overridden = resp.GetOverridden()
				}
				if resp.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY {
					bk.concurrency = true
					bk.plan = cell(bk.plan, resp.GetPlan())
					bk.limitSlots = max(bk.limitSlots, resp.GetLimitSlots())
					bk.shares = append(bk.shares, resp.GetShares()...)
				}
				if resp.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET {
					bk.bucket = true
					bk.plan = cell(bk.plan, resp.GetPlan())
					bk.intervals = append(bk.intervals, resp.GetIntervals()...)
					bk.shares = append(bk.shares, resp.GetShares()...)
				}
				return resp.GetGroup(), nil
			}
			group, err := list(func(rpc adminRPC) error { return e.admin(ctx, rpc) })
			if err != nil {
				return err
			}
			if group != "" || !found {
				// One of several groups, or not here: maybe elsewhere.
				g, err := e.groupMap(ctx)
				if err != nil {
					return err
				}
				if g.active() {
					if err := e.otherGroups(ctx, g.group, list); err != nil {
						return err
					}
				}
			}
			if !found {
				return fmt.Errorf("no limit %q (%v)", id, notFound)
			}
			if bk.concurrency {
				return e.printSlotWindows(id, bk)
			}
			if bk.bucket {
				bk.intervals = orderIntervals(bk.intervals, int(last))
				return e.printBucketWindows(id, bk)
			}
			return e.printWindows(orderWindows(ws, int(last)), bk.overridden)
		}
	},
}

// orderWindows returns ws oldest first (the allocator sends them so; a
// stable sort keeps that promise whatever it sends), at most the newest
// last of them.
func orderWindows(ws []*pb.WindowReport, last int) []*pb.WindowReport {
	ws = slices.Clone(ws)
	slices.SortStableFunc(ws, func(a, b *pb.WindowReport) int {
		return cmpInt64(tsNanos(a.GetWindowStart()), tsNanos(b.GetWindowStart()))
	})
	if len(ws) > last {
		ws = ws[len(ws)-last:]
	}
	return ws
}

// tsNanos orders timestamps; a missing or invalid one sorts first.
func tsNanos(ts *timestamppb.Timestamp) int64 {
	if ts.CheckValid() != nil {
		return -1 << 63
	}
	return ts.AsTime().UnixNano()
}

// formatTS prints a window boundary as the check command does: RFC 3339,
// UTC, milliseconds; "" when missing or invalid.
func formatTS(ts *timestamppb.Timestamp) string {
	if ts.CheckValid() != nil {
		return ""
	}
	return ts.AsTime().UTC().Format(checkTime)
}

// overBound reports a window that admitted more above G than its finite
// bound allows: a bug.
func overBound(w *pb.WindowReport) bool {
	return !w.GetBoundInfinite() && w.GetObservedOvershoot() > w.GetBound()
}

// boundText is the bound as a number, or +Inf.
func boundText(w *pb.WindowReport) string {
	if w.GetBoundInfinite() {
		return "+Inf"
	}
	return strconv.FormatInt(w.GetBound(), 10)
}

// formatAdmitted prints admitted per region as "eu=691,us=309", regions
// sorted.
func formatAdmitted(m map[string]int64) string {
	regions := make([]string, 0, len(m))
	for r := range m {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	parts := make([]string, len(regions))
	for i, r := range regions {
		parts[i] = oneLine(r) + "=" + strconv.FormatInt(m[r], 10)
	}
	return strings.Join(parts, ",")
}

// windowFallbackName is a window's fallback mode in a region, as the JSON
// output writes it; "" for none (the region is left out).
func windowFallbackName(k pb.FallbackKind) string {
	switch k {
	case pb.FallbackKind_FALLBACK_KIND_UNSPECIFIED:
		return ""
	case pb.FallbackKind_FALLBACK_KIND_CLOSED:
		return "closed"
	case pb.FallbackKind_FALLBACK_KIND_LOCAL:
		return "local"
	case pb.FallbackKind_FALLBACK_KIND_OPEN:
		return "open"
	}
	return fmt.Sprintf("kind(%d)", int32(k))
}

// The JSON report: one object per window. encoding/json writes map keys
// sorted.
type windowReportJSON struct {
	Limit             string            `json:"limit"`
	WindowStart       string            `json:"window_start"`
	WindowEnd         string            `json:"window_end"`
	Closed            bool              `json:"closed"`
	LimitTokens       int64             `json:"limit_tokens"`
	Granted           int64             `json:"granted"`
	Standing          int64             `json:"standing,omitempty"` // of granted, the regions' standing shares
	Returned          int64             `json:"returned"`
	Admitted          map[string]int64  `json:"admitted"`
	AdmittedTotal     int64             `json:"admitted_total"`
	FallbackAdmitted  int64             `json:"fallback_admitted"`
	Bound             boundJSON         `json:"bound"`
	ObservedOvershoot int64             `json:"observed_overshoot"`
	Stranded          int64             `json:"stranded"`
	Fallback          map[string]string `json:"fallback"`
	Terms             termsJSON         `json:"terms"`
	// Shadow mode only (absent otherwise).
	Shadow          bool             `json:"shadow,omitempty"`
	WouldDeny       map[string]int64 `json:"would_deny,omitempty"`
	WouldDenyTotal  int64            `json:"would_deny_total,omitempty"`
	WouldDenyChecks int64            `json:"would_deny_checks,omitempty"`
	// Plan names the plan of a limit resolved from one (absent otherwise).
	Plan string `json:"plan,omitempty"`
	// Calendar names a calendar window, "calendar month, Europe/Berlin"
	// (absent for fixed windows).
	Calendar string `json:"calendar,omitempty"`
	// Override is the override in force now: on the newest window only
	// (absent without one).
	Override *overrideJSON `json:"override,omitempty"`
}

// overrideJSON is an override in force as windows --json writes it.
type overrideJSON struct {
	EndsAt    string      `json:"ends_at"`
	Reason    string      `json:"reason"`
	ReturnsTo string      `json:"returns_to"`
	Changes   []fieldDiff `json:"changes"`
}

// overrideJSONOf is the override in force on l (nil: none).
func overrideJSONOf(l *pb.Limit) *overrideJSON {
	o := l.GetOverride()
	if o == nil {
		return nil
	}
	ch := overrideChanges(l)
	if ch == nil {
		ch = []fieldDiff{} // a tenant whose contract keeps all the override changes: [], not null
	}
	return &overrideJSON{EndsAt: formatTS(o.GetEndsAt()), Reason: o.GetReason(),
		ReturnsTo: numbersOf(o.GetAfter()) + shadowSuffix(o.GetAfter()), Changes: ch}
}

// overrideLine is the line under windows' tables that names the override
// in force on l: limits get's summary and the settings it changes; ""
// without one.
func overrideLine(l *pb.Limit) string {
	o := l.GetOverride()
	if o == nil {
		return ""
	}
	ds := overrideChanges(l)
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = oneLine(d.Field) + " " + showValue(d.Old) + " -> " + showValue(d.New)
	}
	return "override " + overrideSummary(o) + "; it changes " + cell(strings.Join(parts, ", "), "nothing") + "\n"
}

// calendarDesc names a window's calendar for people: "calendar month,
// Europe/Berlin"; "" for a fixed window.
func calendarDesc(w *pb.WindowReport) string {
	if c := w.GetCalendar(); c != nil {
		return "calendar " + c.GetUnit() + ", " + c.GetZone()
	}
	return ""
}

// boundJSON is a number, or the string "+Inf" (JSON has no infinity).
type boundJSON struct {
	n        int64
	infinite bool
}

func (b boundJSON) MarshalJSON() ([]byte, error) {
	if b.infinite {
		return []byte(`"+Inf"`), nil
	}
	return strconv.AppendInt(nil, b.n, 10), nil
}

type termsJSON struct {
	CarryOver     int64 `json:"carry_over"`
	Fallback      int64 `json:"fallback"`
	LostGrants    int64 `json:"lost_grants"`
	RedisRollback int64 `json:"redis_rollback"`
	LimitLowered  int64 `json:"limit_lowered"`
	Settlement    int64 `json:"settlement"`
}

func windowJSONOf(w *pb.WindowReport) windowReportJSON {
	out := windowReportJSON{
		Calendar:          calendarDesc(w),
		Limit:             w.GetLimitId(),
		WindowStart:       formatTS(w.GetWindowStart()),
		WindowEnd:         formatTS(w.GetWindowEnd()),
		Closed:            w.GetClosed(),
		LimitTokens:       w.GetLimitTokens(),
		Granted:           w.GetGranted(),
		Standing:          w.GetStanding(),
		Returned:          w.GetReturned(),
		Admitted:          make(map[string]int64, len(w.GetAdmitted())),
		AdmittedTotal:     w.GetAdmittedTotal(),
		FallbackAdmitted:  w.GetFallbackAdmitted(),
		Bound:             boundJSON{n: w.GetBound(), infinite: w.GetBoundInfinite()},
		ObservedOvershoot: w.GetObservedOvershoot(),
		Stranded:          w.GetStranded(),
		Fallback:          map[string]string{},
		Terms: termsJSON{
			CarryOver:     w.GetTerms().GetCarryOver(),
			Fallback:      w.GetTerms().GetFallback(),
			LostGrants:    w.GetTerms().GetLostGrants(),
			RedisRollback: w.GetTerms().GetRedisRollback(),
			LimitLowered:  w.GetTerms().GetLimitLowered(),
			Settlement:    w.GetTerms().GetSettlement(),
		},
	}
	for r, n := range w.GetAdmitted() {
		out.Admitted[r] = n
	}
	out.Shadow, out.WouldDenyTotal, out.WouldDenyChecks = w.GetShadow(), w.GetWouldDenyTotal(), w.GetWouldDenyChecks()
	out.Plan = w.GetPlan()
	if len(w.GetWouldDeny()) > 0 {
		out.WouldDeny = maps.Clone(w.GetWouldDeny())
	}
	for r, k := range w.GetFallback() {
		if name := windowFallbackName(k); name != "" {
			out.Fallback[r] = name
		}
	}
	return out
}

// printWindows prints ws (oldest first) as a table with footnotes for the
// marked rows, or as a JSON array; overridden is the override in force
// (nil: none).
func (e *env) printWindows(ws []*pb.WindowReport, overridden *pb.Limit) error {
	if e.json {
		out := make([]windowReportJSON, len(ws))
		for i, w := range ws {
			out[i] = windowJSONOf(w)
		}
		if n := len(out); n > 0 {
			out[n-1].Override = overrideJSONOf(overridden)
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %v", err)
		}
		_, err = e.stdout.Write(append(b, '\n'))
		return err
	}
	var b bytes.Buffer
	if len(ws) > 0 && calendarDesc(ws[len(ws)-1]) != "" {
		// Calendar windows: their bounds are local midnights.
		fmt.Fprintf(&b, "windows: %s\n", calendarDesc(ws[len(ws)-1]))
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	shadow := false // the WOULD_DENY columns, only when some window has them
	for _, w := range ws {
		shadow = shadow || w.GetShadow() || w.GetWouldDenyChecks() > 0
	}
	head := "LIMIT\tWINDOW_START\tWINDOW_END\tLIMIT_TOKENS\tGRANTED\tRETURNED\tADMITTED\t" +
		"ADMITTED_TOTAL\tFALLBACK_ADMITTED\tBOUND\tOBSERVED_OVERSHOOT\tSTRANDED"
	if shadow {
		head += "\tWOULD_DENY\tWOULD_DENY_CHECKS"
	}
	fmt.Fprintln(tw, head)
	running, over := false, false
	for _, w := range ws {
		end := cell(formatTS(w.GetWindowEnd()), "-")
		if !w.GetClosed() {
			end += "*"
			running = true
		}
		overshoot := strconv.FormatInt(w.GetObservedOvershoot(), 10)
		if overBound(w) {
			overshoot += "!"
			over = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t%d",
			cell(w.GetLimitId(), "-"), cell(formatTS(w.GetWindowStart()), "-"), end,
			w.GetLimitTokens(), w.GetGranted(), w.GetReturned(), cell(formatAdmitted(w.GetAdmitted()), "-"),
			w.GetAdmittedTotal(), w.GetFallbackAdmitted(), boundText(w), overshoot, w.GetStranded())
		if shadow {
			fmt.Fprintf(tw, "\t%s\t%d", cell(formatAdmitted(w.GetWouldDeny()), "-"), w.GetWouldDenyChecks())
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if running || over {
		b.WriteByte('\n')
	}
	if running {
		b.WriteString("* running window: its counts still grow\n")
	}
	if over {
		b.WriteString("! observed_overshoot above bound: a bug, please report it (docs/overshoot.md)\n")
	}
	if l := overrideLine(overridden); l != "" {
		if !running && !over {
			b.WriteByte('\n')
		}
		b.WriteString(l)
	}
	if n := len(ws); n > 0 && ws[n-1].GetPlan() != "" {
		fmt.Fprintf(&b, "limit of plan %s: the tenant has no limit of its own\n", cell(ws[n-1].GetPlan(), "-"))
	}
	_, err := io.Copy(e.stdout, &b)
	return err
}
