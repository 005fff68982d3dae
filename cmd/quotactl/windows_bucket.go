package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// bucketWindows is what ListWindows answered for a bucket limit, every
// group gathered.
type bucketWindows struct {
	bucket    bool
	intervals []*pb.BucketIntervalReport
	shares    []*pb.ShareInForce
	// concurrency: a concurrency limit (N limitSlots): its slot shares.
	concurrency bool
	limitSlots  int64
	// plan names the plan the limit was resolved from ("": a limit of
	// its own).
	plan string
	// overridden is the limit's version in force when it is an
	// override (nil: none), of any kind.
	overridden *pb.Limit
}

// planLine is the line that says a tenant's limit is its plan's.
func (bk bucketWindows) planLine() string {
	if bk.plan == "" {
		return ""
	}
	return "limit of plan " + oneLine(bk.plan) + ": the tenant has no limit of its own\n"
}

// orderIntervals returns is oldest first, at most the newest last of them.
func orderIntervals(is []*pb.BucketIntervalReport, last int) []*pb.BucketIntervalReport {
	is = slices.Clone(is)
	slices.SortStableFunc(is, func(a, b *pb.BucketIntervalReport) int {
		return cmpInt64(tsNanos(a.GetStart()), tsNanos(b.GetStart()))
	})
	if len(is) > last {
		is = is[len(is)-last:]
	}
	return is
}

// intervalOverBound reports an interval that admitted more than its bound:
// a bug.
func intervalOverBound(r *pb.BucketIntervalReport) bool { return r.GetAdmittedTotal() > r.GetBound() }

// rateText is R per period as limits set takes it ("100/s"); "-" when the
// interval knew no rate.
func rateText(tokens int64, period time.Duration) string {
	if tokens <= 0 || period <= 0 {
		return "-"
	}
	return limitspec.FormatRate(tokens, period)
}

// shareRateText is a share's rate, in thousandths of a token per period,
// as tokens per period: "33.333/s".
func shareRateText(milli int64, period time.Duration) string {
	n := strconv.FormatInt(milli/1000, 10)
	if f := milli % 1000; f != 0 {
		n += strings.TrimRight(fmt.Sprintf(".%03d", f), "0")
	}
	return n + strings.TrimPrefix(rateText(1, period), "1") // "1/s" -> "/s"
}

type bucketIntervalJSON struct {
	Limit         string           `json:"limit"`
	IntervalStart string           `json:"interval_start"`
	IntervalEnd   string           `json:"interval_end"`
	Closed        bool             `json:"closed"`
	Rate          string           `json:"rate"`
	Burst         int64            `json:"burst"`
	SlackSeconds  float64          `json:"slack_seconds"`
	Admitted      map[string]int64 `json:"admitted"`
	AdmittedTotal int64            `json:"admitted_total"`
	Bound         int64            `json:"bound"`
	// Shadow mode: Checks admitted that enforcement would have denied.
	Shadow          bool             `json:"shadow,omitempty"`
	WouldDeny       map[string]int64 `json:"would_deny,omitempty"`
	WouldDenyTotal  int64            `json:"would_deny_total,omitempty"`
	WouldDenyChecks int64            `json:"would_deny_checks,omitempty"`
}

type shareJSON struct {
	Region          string `json:"region"`
	Holder          string `json:"holder,omitempty"`
	RateMilliTokens int64  `json:"rate_milli_tokens"`
	Rate            string `json:"rate"`
	Burst           int64  `json:"burst"`
	ExpiresAt       string `json:"expires_at"`
	Seq             int64  `json:"seq"`
}

type bucketWindowsJSON struct {
	Limit     string               `json:"limit"`
	Kind      string               `json:"kind"`
	Plan      string               `json:"plan,omitempty"`
	Override  *overrideJSON        `json:"override,omitempty"`
	Intervals []bucketIntervalJSON `json:"intervals"`
	Shares    []shareJSON          `json:"shares"`
}

// printBucketWindows prints a bucket limit's intervals (oldest first) and
// its shares in force, as tables with footnotes or as one JSON object.
func (e *env) printBucketWindows(id string, bk bucketWindows) error {
	// Shares are counted per the limit's rate period: the newest
	// interval's.
	period := time.Second
	if n := len(bk.intervals); n > 0 && bk.intervals[n-1].GetRatePeriod().AsDuration() > 0 {
		period = bk.intervals[n-1].GetRatePeriod().AsDuration()
	}
	if e.json {
		out := bucketWindowsJSON{Limit: id, Kind: "bucket", Plan: bk.plan, Override: overrideJSONOf(bk.overridden),
			Intervals: []bucketIntervalJSON{}, Shares: []shareJSON{}}
		for _, r := range bk.intervals {
			adm := maps.Clone(r.GetAdmitted())
			if adm == nil {
				adm = map[string]int64{}
			}
			out.Intervals = append(out.Intervals, bucketIntervalJSON{Limit: r.GetLimitId(), IntervalStart: formatTS(r.GetStart()),
				IntervalEnd: formatTS(r.GetEnd()), Closed: r.GetClosed(), Rate: rateText(r.GetRateTokens(), r.GetRatePeriod().AsDuration()),
				Burst: r.GetBurstTokens(), SlackSeconds: r.GetSlack().AsDuration().Seconds(), Admitted: adm,
				AdmittedTotal: r.GetAdmittedTotal(), Bound: r.GetBound(), Shadow: r.GetShadow(), WouldDeny: maps.Clone(r.GetWouldDeny()),
				WouldDenyTotal: r.GetWouldDenyTotal(), WouldDenyChecks: r.GetWouldDenyChecks()})
		}
		for _, s := range bk.shares {
			out.Shares = append(out.Shares, shareJSON{Region: s.GetRegion(), Holder: s.GetHolder(), RateMilliTokens: s.GetRateMilliTokens(),
				Rate: shareRateText(s.GetRateMilliTokens(), period), Burst: s.GetBurstTokens(), ExpiresAt: formatTS(s.GetExpiresAt()), Seq: s.GetSeq()})
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %v", err)
		}
		_, err = e.stdout.Write(append(b, '\n'))
		return err
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	shadow := false // the WOULD_DENY columns, only when some interval has them
	for _, r := range bk.intervals {
		shadow = shadow || r.GetShadow() || r.GetWouldDenyChecks() > 0
	}
	head := "LIMIT\tINTERVAL_START\tINTERVAL_END\tRATE\tBURST\tADMITTED\tADMITTED_TOTAL\tBOUND"
	if shadow {
		head += "\tWOULD_DENY\tWOULD_DENY_CHECKS"
	}
	fmt.Fprintln(tw, head)
	running, over := false, false
	for _, r := range bk.intervals {
		end := cell(formatTS(r.GetEnd()), "-")
		if !r.GetClosed() {
			end += "*"
			running = true
		}
		total := strconv.FormatInt(r.GetAdmittedTotal(), 10)
		if intervalOverBound(r) {
			total += "!"
			over = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d", cell(r.GetLimitId(), "-"), cell(formatTS(r.GetStart()), "-"), end,
			rateText(r.GetRateTokens(), r.GetRatePeriod().AsDuration()), r.GetBurstTokens(), cell(formatAdmitted(r.GetAdmitted()), "-"),
			total, r.GetBound())
		if shadow {
			fmt.Fprintf(tw, "\t%s\t%d", cell(formatAdmitted(r.GetWouldDeny()), "-"), r.GetWouldDenyChecks())
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\nshares in force:\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tHOLDER\tRATE\tBURST\tEXPIRES_AT\tSEQ")
	for _, s := range bk.shares {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\n", cell(oneLine(s.GetRegion()), "-"), cell(oneLine(s.GetHolder()), "-"),
			shareRateText(s.GetRateMilliTokens(), period), s.GetBurstTokens(), cell(formatTS(s.GetExpiresAt()), "-"), s.GetSeq())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ovr := overrideLine(bk.overridden)
	if running || over || shadow || ovr != "" {
		b.WriteByte('\n')
	}
	if running {
		b.WriteString("* running interval: its count still grows\n")
	}
	if shadow {
		b.WriteString("shadow mode: nothing denied; WOULD_DENY is what enforcement would have denied (not in ADMITTED)\n")
	}
	if over {
		b.WriteString("! admitted_total above bound: a bug, please report it (docs/overshoot.md)\n")
	}
	b.WriteString(ovr)
	if l := bk.planLine(); l != "" {
		b.WriteString("\n" + l)
	}
	_, err := io.Copy(e.stdout, &b)
	return err
}
