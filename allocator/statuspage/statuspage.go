// Package statuspage serves the allocator's built-in status page for SREs.
//
// GET /status lists the limits (largest G first, at most a configured
// number) with each one's last closed window: admitted, the overshoot
// bound, the observed overshoot and the stranded tokens, and charts the
// recent windows of the largest ones. GET /status?limit=ID shows one limit
// with every window the leader still keeps and the bound term by term.
//
// The page is rendered on the server with html/template: inline CSS and
// inline SVG, no JavaScript and no external resource (the Content Security
// Policy forbids both). Every value coming from a limit is escaped by the
// template.
package statuspage

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"leasehold/allocator"
	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// Source is what the page reads. *allocator.Allocator implements it.
type Source interface {
	// Limits returns every limit (any replica can answer).
	Limits(ctx context.Context) ([]*pb.Limit, error)
	// Reports returns up to last windows of a limit, oldest first; the last
	// one may still be running (Closed false). A follower answers an error
	// matching allocator.ErrNotLeader, a limit without windows one matching
	// allocator.ErrNotFound.
	Reports(limit string, last int) ([]allocator.WindowReport, error)
	// BucketStatus returns up to last reporting intervals of a bucket
	// limit (oldest first, the running one last) and its rate shares in
	// force; errors as Reports.
	BucketStatus(limit string, last int) (allocator.BucketStatus, error)
	// SlotStatus returns a concurrency limit's N, bound, slots leased and
	// held, and its slot shares in force; errors as Reports.
	SlotStatus(limit string) (allocator.SlotStatus, error)
	// IsLeader tells whether this replica leads.
	IsLeader() bool
	// Leader is the leader's advertised gRPC address ("" if unknown).
	Leader() string
}

var _ Source = (*allocator.Allocator)(nil)

// Option changes a setting of the page.
type Option func(*options)

type options struct {
	maxLimits     int
	maxCharts     int
	windows       int
	detailWindows int
	settle        time.Duration
	now           func() time.Time
}

// WithMaxLimits sets how many limits the index page lists at most (default
// 200). The others are reached with the filter or by id; the page says so.
func WithMaxLimits(n int) Option { return func(o *options) { o.maxLimits = max(1, n) } }

// WithMaxCharts sets how many of the listed limits (the largest G first)
// get a chart of their recent windows on the index page (default 50).
func WithMaxCharts(n int) Option { return func(o *options) { o.maxCharts = max(0, n) } }

// WithWindows sets how many recent windows a chart shows on the index page
// (default 20) and on a limit's page (default 60, the windows the
// allocator keeps by default).
func WithWindows(index, detail int) Option {
	return func(o *options) { o.windows, o.detailWindows = max(1, index), max(1, detail) }
}

// WithSettle sets how long after its end a window still waits for usage
// reports (default 5 s: agents report every 2 s). Until then it is drawn
// like the running window, and the table shows the window before it.
func WithSettle(d time.Duration) Option { return func(o *options) { o.settle = max(0, d) } }

// WithClock sets the clock that stamps the page (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Handler serves GET /status and GET /status?limit=ID from src. Mount it
// at /status; any other method is answered 405.
func Handler(src Source, opts ...Option) http.Handler {
	o := options{maxLimits: 200, maxCharts: 50, windows: 20, detailWindows: 60, settle: 5 * time.Second, now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	return &handler{src: src, opt: o}
}

type handler struct {
	src Source
	opt options
}

// maxParam bounds the query parameters we echo back.
const maxParam = 256

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	start := time.Now()
	q := r.URL.Query()
	id, filter := q.Get("limit"), strings.TrimSpace(q.Get("q"))
	now := h.opt.now()
	p := &page{Generated: now.UTC(), Leader: h.src.IsLeader(), LeaderAddr: h.src.Leader(), Filter: filter}
	v := view{now: now, settle: h.opt.settle}
	code := http.StatusOK
	switch {
	case len(id) > maxParam || len(filter) > maxParam:
		code, p.Error = http.StatusBadRequest, "query parameter too long"
	case id != "":
		code = h.detail(r.Context(), v, p, id)
	default:
		code = h.index(r.Context(), v, p)
	}
	p.Title = "Leasehold status"
	if p.Detail != nil {
		p.Title = p.Detail.Row.ID + " · Leasehold status"
	}
	if took := time.Since(start); took < time.Millisecond {
		p.Took = took.Round(time.Microsecond).String()
	} else {
		p.Took = took.Round(time.Millisecond).String()
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, p); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "+
		"form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// view is when the page is drawn: which windows are final.
type view struct {
	now    time.Time
	settle time.Duration
}

// final tells whether a window is over and its usage reports are in.
func (v view) final(r allocator.WindowReport) bool {
	return r.Closed && !v.now.Before(r.WindowEnd.Add(v.settle))
}

// page is everything the template shows.
type page struct {
	Title      string
	Generated  time.Time
	Took       string
	Leader     bool
	LeaderAddr string
	// Follower is set when Reports said this replica does not lead.
	Follower bool
	// ReportsErr is the first error Reports gave (other than not leader
	// or not found); reports stopped being asked after it.
	ReportsErr string
	// Error replaces the content (the limits could not be read).
	Error  string
	Filter string
	Index  *indexView
	Detail *detailView
}

type indexView struct {
	Total     int // limits defined
	Matched   int // limits the filter kept
	Rows      []*row
	Charts    []*chart
	Truncated bool // Matched > len(Rows)
	Attention int  // rows highlighted
	// AttentionLevel is the worst Level of the rows: "crit" or "warn".
	AttentionLevel string
	MaxCharts      int
	Windows        int
}

type detailView struct {
	Row *row
	// Defined is false when the limit is gone but windows remain.
	Defined bool
	Lease   string
	Tags    []string
	Chart   *chart
	Windows []windowRow // newest first
	Regions []string
	// Bucket is set for a bucket limit (no windows, no chart).
	Bucket *bucketView
	// Slots is set for a concurrency limit (no windows, no chart).
	Slots *slotsView
}

// row is one limit in the table.
type row struct {
	ID          string
	Owner       string
	Description string
	G           int64
	Window      string
	Regions     []string
	Mode        string
	Fallback    []regionFallback
	// FallbackAll is the fallback of every region when they share it and
	// none is in force ("" otherwise): one line instead of one per region.
	FallbackAll string
	Version     int64
	// Last is the last final window: closed, its usage reports in (nil:
	// none yet, or not known here).
	Last *windowRow
	// Bucket: a bucket limit; Window then holds its rate and burst and
	// LastInterval (not Last) its last closed reporting interval.
	Bucket       bool
	LastInterval *intervalRow
	// Slots: a concurrency limit; G is then N, and SlotsNow its slots now
	// (nil: not known here).
	Slots    bool
	SlotsNow *slotSummary
	// Alerts say why the row is highlighted; Level is the worst of them:
	// "crit", "warn" or "" (not highlighted).
	Alerts []alertTag
	Level  string
}

type alertTag struct {
	Text  string
	Level string // "crit" or "warn"
}

// regionFallback is a region's configured fail mode and the one in force.
type regionFallback struct {
	Region  string
	Config  string
	InForce string // "" when none
	Open    bool
}

// windowRow is one window as the tables show it.
type windowRow struct {
	Start, End time.Time
	// Running: the window is not over. Settling: it is, but usage reports
	// may still come in.
	Running, Settling bool
	G                 int64
	Granted, Returned int64
	Admitted          []int64 // per region, in the table's region order
	AdmittedTotal     int64
	FallbackAdmitted  int64
	Bound             string // tokens above G, or "∞"
	Ceiling           string // G + bound, or "∞"
	Infinite          bool
	Observed          int64
	Stranded          int64
	OverBound         bool
	StrandedHigh      bool
	Fallback          string // regions in fallback, e.g. "us local"
	Terms             terms
}

type terms struct {
	CarryOver, Fallback, RedisRollback, LimitLowered, LostGrants, Settlement int64
}

// fetcher asks Reports and remembers why it stopped.
type fetcher struct {
	src      Source
	follower bool
	leader   string // from the not-leader error
	err      error
}

// reports returns a limit's windows; nil when there are none or when
// reports cannot be had from this replica.
func (f *fetcher) reports(id string, last int) []allocator.WindowReport {
	if f.follower || f.err != nil {
		return nil
	}
	reps, err := f.src.Reports(id, last)
	if err == nil {
		return reps
	}
	f.note(err)
	return nil
}

func (f *fetcher) finish(p *page) {
	p.Follower = f.follower
	if p.Follower {
		p.Leader = false
		if p.LeaderAddr == "" {
			p.LeaderAddr = f.leader
		}
	}
	if f.err != nil {
		p.ReportsErr = f.err.Error()
	}
}

func (h *handler) index(ctx context.Context, v view, p *page) int {
	limits, err := h.src.Limits(ctx)
	if err != nil {
		p.Error = "cannot read the limits: " + err.Error()
		return http.StatusServiceUnavailable
	}
	iv := &indexView{Total: len(limits), MaxCharts: h.opt.maxCharts, Windows: h.opt.windows}
	p.Index = iv
	if p.Filter != "" {
		f := strings.ToLower(p.Filter)
		kept := limits[:0:0]
		for _, l := range limits {
			if strings.Contains(strings.ToLower(l.GetId()), f) || strings.Contains(strings.ToLower(l.GetOwner()), f) {
				kept = append(kept, l)
			}
		}
		limits = kept
	}
	iv.Matched = len(limits)
	limits = topLimits(limits, h.opt.maxLimits)
	iv.Truncated = iv.Matched > len(limits)
	type charted struct {
		id      string
		reps    []allocator.WindowReport
		regions []string
	}
	var cs []charted
	var all []string
	f := &fetcher{src: h.src}
	for i, l := range limits {
		last := 2 // the last closed window and the running one
		if i < h.opt.maxCharts {
			last = h.opt.windows
		}
		var reps []allocator.WindowReport
		var rw *row
		if isBucket(l) {
			rw = newRow(v, l, nil)
			st, _ := f.bucketStatus(l.GetId(), 2) // the last closed interval and the running one
			bucketRow(rw, l, st)
		} else if isConcurrency(l) {
			rw = newRow(v, l, nil)
			st, ok := f.slotStatus(l.GetId())
			slotsRow(rw, st, ok)
		} else {
			reps = f.reports(l.GetId(), last)
			rw = newRow(v, l, reps)
		}
		iv.Rows = append(iv.Rows, rw)
		if rw.Level != "" {
			iv.Attention++
			if iv.AttentionLevel != "crit" {
				iv.AttentionLevel = rw.Level
			}
		}
		if i < h.opt.maxCharts && len(reps) > 0 {
			cs = append(cs, charted{l.GetId(), reps, regionsOf(l, reps)})
			all = append(all, cs[len(cs)-1].regions...)
		}
	}
	colors := newColors(all)
	for i, c := range cs {
		ch := newChart(v, i, c.id, c.reps, c.regions, colors, smallChart, h.opt.windows)
		ch.Table = true
		iv.Charts = append(iv.Charts, ch)
	}
	f.finish(p)
	return http.StatusOK
}

func (h *handler) detail(ctx context.Context, v view, p *page, id string) int {
	limits, err := h.src.Limits(ctx)
	if err != nil {
		p.Error = "cannot read the limits: " + err.Error()
		return http.StatusServiceUnavailable
	}
	var l *pb.Limit
	for _, x := range limits {
		if x.GetId() == id {
			l = x
			break
		}
	}
	f := &fetcher{src: h.src}
	if l != nil && isBucket(l) {
		st, _ := f.bucketStatus(id, h.opt.detailWindows)
		f.finish(p)
		rw := newRow(v, l, nil)
		bucketRow(rw, l, st)
		regions := bucketRegions(l, st)
		dv := &detailView{Row: rw, Defined: true, Lease: shareDesc(l.GetLease()), Regions: regions, Bucket: newBucketView(l, st, regions)}
		for _, k := range sortedKeys(l.GetTags()) {
			dv.Tags = append(dv.Tags, k+"="+l.GetTags()[k])
		}
		p.Detail = dv
		return http.StatusOK
	}
	if l != nil && isConcurrency(l) {
		st, ok := f.slotStatus(id)
		f.finish(p)
		rw := newRow(v, l, nil)
		slotsRow(rw, st, ok)
		dv := &detailView{Row: rw, Defined: true, Lease: slotShareDesc(l.GetLease()), Regions: l.GetRegions(), Slots: newSlotsView(st)}
		for _, k := range sortedKeys(l.GetTags()) {
			dv.Tags = append(dv.Tags, k+"="+l.GetTags()[k])
		}
		p.Detail = dv
		return http.StatusOK
	}
	reps := f.reports(id, h.opt.detailWindows)
	f.finish(p)
	if l == nil && len(reps) == 0 {
		p.Error = fmt.Sprintf("No limit %q.", id)
		if p.Follower || p.ReportsErr != "" {
			p.Error = fmt.Sprintf("No limit %q is defined.", id)
		}
		return http.StatusNotFound
	}
	var rw *row
	if l != nil {
		rw = newRow(v, l, reps)
	} else {
		rw = newRow(v, &pb.Limit{Id: id}, reps)
	}
	regions := regionsOf(l, reps)
	dv := &detailView{Row: rw, Defined: l != nil, Lease: leaseDesc(l.GetLease()), Regions: regions}
	for _, k := range sortedKeys(l.GetTags()) {
		dv.Tags = append(dv.Tags, k+"="+l.GetTags()[k])
	}
	for i := len(reps) - 1; i >= 0; i-- {
		dv.Windows = append(dv.Windows, newWindowRow(v, reps[i], regions))
	}
	if len(reps) > 0 {
		dv.Chart = newChart(v, 0, id, reps, regions, newColors(regions), bigChart, h.opt.windows)
	}
	p.Detail = dv
	return http.StatusOK
}

// byG orders limits largest G first, then by id.
func byG(a, b *pb.Limit) int {
	return cmp.Or(cmp.Compare(b.GetLimitTokens(), a.GetLimitTokens()), strings.Compare(a.GetId(), b.GetId()))
}

// topLimits returns the first n limits in byG order, without sorting
// them all: a heap of the n best so far, whose root is the worst kept.
// It does not modify ls.
func topLimits(ls []*pb.Limit, n int) []*pb.Limit {
	if len(ls) <= n {
		out := slices.Clone(ls)
		slices.SortFunc(out, byG)
		return out
	}
	h := &worstFirst{}
	for _, l := range ls {
		switch {
		case len(*h) < n:
			heap.Push(h, l)
		case byG(l, (*h)[0]) < 0:
			(*h)[0] = l
			heap.Fix(h, 0)
		}
	}
	out := []*pb.Limit(*h)
	slices.SortFunc(out, byG)
	return out
}

// worstFirst is a heap of limits whose root sorts last in byG order.
type worstFirst []*pb.Limit

func (h worstFirst) Len() int           { return len(h) }
func (h worstFirst) Less(i, j int) bool { return byG(h[i], h[j]) > 0 }
func (h worstFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *worstFirst) Push(x any)        { *h = append(*h, x.(*pb.Limit)) }
func (h *worstFirst) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// newRow builds a limit's table row from its definition and its windows.
func newRow(v view, l *pb.Limit, reps []allocator.WindowReport) *row {
	rw := &row{
		ID: l.GetId(), Owner: l.GetOwner(), Description: l.GetDescription(), G: l.GetLimitTokens(),
		Window: windowDesc(l), Regions: l.GetRegions(), Mode: limitspec.ModeName(l.GetMode()),
		Version: l.GetVersion(),
	}
	if l.GetShadow() {
		rw.Mode += " · shadow"
	}
	if p := l.GetPlan(); p != "" {
		rw.Mode += " · " + p // a tenant's limit from its plan
	}
	// The last final window, and the fail modes in force in it and in the
	// windows after it (settling or running).
	var last *allocator.WindowReport
	inForce := map[string]pb.FallbackKind{}
	for i := len(reps) - 1; i >= 0; i-- {
		for r, k := range reps[i].Fallback {
			inForce[r] = max(inForce[r], k)
		}
		if v.final(reps[i]) {
			last = &reps[i]
			break
		}
	}
	regions := regionsOf(l, reps)
	if last != nil {
		wr := newWindowRow(v, *last, regions)
		rw.Last = &wr
	}
	for _, r := range regions {
		rf := regionFallback{Region: r, Config: fallbackName(l.GetFallback()[r])}
		if k := inForce[r]; k != pb.FallbackKind_FALLBACK_KIND_UNSPECIFIED {
			rf.InForce = kindName(k)
			rf.Open = k == pb.FallbackKind_FALLBACK_KIND_OPEN
		}
		rw.Fallback = append(rw.Fallback, rf)
	}
	if len(rw.Fallback) > 1 {
		rw.FallbackAll = rw.Fallback[0].Config
		for _, rf := range rw.Fallback {
			if rf.Config != rw.FallbackAll || rf.InForce != "" {
				rw.FallbackAll = ""
				break
			}
		}
	}
	crit := func(s string) { rw.Alerts, rw.Level = append(rw.Alerts, alertTag{s, "crit"}), "crit" }
	if last != nil {
		if last.Terms.LostGrants > 0 {
			crit("lost grants: allocator bug")
		}
		if rw.Last.OverBound {
			crit("observed > bound")
		}
	}
	for _, rf := range rw.Fallback {
		if rf.Open {
			crit(rf.Region + " OPEN")
		}
	}
	if o := l.GetOverride(); o != nil {
		// An emergency change in force: it ends by itself.
		rw.Alerts = append(rw.Alerts, alertTag{"override until " + o.GetEndsAt().AsTime().UTC().Format("2006-01-02 15:04:05") +
			" UTC, then " + afterDesc(o.GetAfter()), "warn"})
		if rw.Level == "" {
			rw.Level = "warn"
		}
	}
	if last != nil && (l.GetShadow() || last.WouldDenyChecks > 0) {
		rw.Alerts = append(rw.Alerts, alertTag{"shadow: would deny " + fmtInt(last.WouldDenyChecks) + " checks", "info"})
	}
	if last != nil && rw.Last.StrandedHigh {
		rw.Alerts = append(rw.Alerts, alertTag{"stranded > 10% of G", "warn"})
		if rw.Level == "" {
			rw.Level = "warn"
		}
	}
	return rw
}

// afterDesc is what the version an override returns to allows, by kind:
// "G 100", "rate 100/s, burst 200" or "N 2".
func afterDesc(l *pb.Limit) string {
	switch {
	case isBucket(l):
		return "rate " + rateDesc(l)
	case isConcurrency(l):
		return "N " + fmtInt(l.GetLimitTokens())
	}
	return "G " + fmtInt(l.GetLimitTokens())
}

func newWindowRow(v view, rep allocator.WindowReport, regions []string) windowRow {
	wr := windowRow{
		Start: rep.WindowStart, End: rep.WindowEnd, Running: !rep.Closed, Settling: rep.Closed && !v.final(rep), G: rep.LimitTokens,
		Granted: rep.Granted, Returned: rep.Returned, AdmittedTotal: rep.AdmittedTotal,
		FallbackAdmitted: rep.FallbackAdmitted, Observed: rep.ObservedOvershoot, Stranded: rep.Stranded,
		Infinite: rep.Bound.Infinite,
		Terms: terms{CarryOver: rep.Terms.CarryOver, Fallback: rep.Terms.Fallback, RedisRollback: rep.Terms.RedisRollback,
			LimitLowered: rep.Terms.LimitLowered, LostGrants: rep.Terms.LostGrants, Settlement: rep.Terms.Settlement},
	}
	for _, r := range regions {
		wr.Admitted = append(wr.Admitted, rep.Admitted[r])
	}
	if rep.Bound.Infinite {
		wr.Bound, wr.Ceiling = "∞", "∞"
	} else {
		wr.Bound, wr.Ceiling = fmtInt(rep.Bound.Tokens), fmtInt(addSat(rep.LimitTokens, rep.Bound.Tokens))
		wr.OverBound = rep.ObservedOvershoot > rep.Bound.Tokens
	}
	// stranded > 10% of G, without overflow: s*10 > G <=> s > floor(G/10).
	wr.StrandedHigh = rep.Stranded > rep.LimitTokens/10
	var fb []string
	for _, r := range sortedKeys(rep.Fallback) {
		fb = append(fb, r+" "+kindName(rep.Fallback[r]))
	}
	if rep.WouldDenyChecks > 0 {
		// Shadow mode: what enforcement would have denied, per region.
		var per []string
		for _, r := range sortedKeys(rep.WouldDeny) {
			per = append(per, r+" "+fmtInt(rep.WouldDeny[r]))
		}
		fb = append(fb, "would deny "+fmtInt(rep.WouldDenyChecks)+" checks ("+strings.Join(per, ", ")+" tokens)")
	}
	wr.Fallback = strings.Join(fb, ", ")
	return wr
}

// regionsOf is the limit's regions followed by any other region its
// windows name, so a region removed from the limit still shows.
func regionsOf(l *pb.Limit, reps []allocator.WindowReport) []string {
	out := slices.Clone(l.GetRegions())
	seen := map[string]bool{}
	for _, r := range out {
		seen[r] = true
	}
	var extra []string
	for _, rep := range reps {
		for r := range rep.Admitted {
			if !seen[r] {
				seen[r] = true
				extra = append(extra, r)
			}
		}
		for r := range rep.Fallback {
			if !seen[r] {
				seen[r] = true
				extra = append(extra, r)
			}
		}
	}
	slices.Sort(extra)
	return append(out, extra...)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func kindName(k pb.FallbackKind) string {
	switch k {
	case pb.FallbackKind_FALLBACK_KIND_CLOSED:
		return "closed"
	case pb.FallbackKind_FALLBACK_KIND_LOCAL:
		return "local"
	case pb.FallbackKind_FALLBACK_KIND_OPEN:
		return "OPEN"
	case pb.FallbackKind_FALLBACK_KIND_UNSPECIFIED:
		return "none"
	}
	return k.String()
}

// leaseDesc describes a limit's lease settings.
func leaseDesc(ls *pb.LeaseSettings) string {
	ttl := "a quarter of the window"
	if d := ls.GetTtl().AsDuration(); d > 0 {
		ttl = fmtDuration(d)
	}
	minc, maxc := "1", "none"
	if ls.GetMinChunk() > 0 {
		minc = fmtInt(ls.GetMinChunk())
	}
	if ls.GetMaxChunk() > 0 {
		maxc = fmtInt(ls.GetMaxChunk())
	}
	return "ttl " + ttl + ", min chunk " + minc + ", max chunk " + maxc
}

// fallbackName is a configured fallback as quotactl writes it.
func fallbackName(f *pb.Fallback) string {
	switch f.GetKind() {
	case pb.FallbackKind_FALLBACK_KIND_LOCAL:
		return "local:" + fmtInt(f.GetLocalTokens())
	case pb.FallbackKind_FALLBACK_KIND_OPEN:
		return "open"
	}
	return "closed"
}

// note records why a read from this replica failed: it is a follower
// (and which replica leads, when the error says), or it failed otherwise;
// a limit not found is neither.
func (f *fetcher) note(err error) {
	switch {
	case errors.Is(err, allocator.ErrNotLeader):
		f.follower = true
		var nl *allocator.NotLeaderError
		if errors.As(err, &nl) {
			f.leader = nl.Leader
		}
	case errors.Is(err, allocator.ErrNotFound):
	default:
		f.err = err
	}
}
