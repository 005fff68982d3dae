package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"leasehold/internal/zones"
	leasepkg "leasehold/lease"
)

// Invariant names what a violation breaks.
type Invariant string

// The invariants Check verifies per (limit, window).
const (
	// Budget: net granted (the tokens of distinct leases minus what their
	// returns credited) <= G.
	Budget Invariant = "budget"
	// Idempotency: one request id never yields two leases or two token
	// counts; a return is credited once; a reservation id is one
	// reservation.
	Idempotency Invariant = "idempotency"
	// Clamp: every lease lies in its window (start >= the window's start,
	// expiry <= its end), on the allocator's clock.
	Clamp Invariant = "clamp"
	// Leased: what a region admitted from leases <= what it was granted
	// for the window minus what it returned unspent; what was spent from a
	// sub-lease <= the sub-lease.
	Leased Invariant = "leased"
	// Deadline: no region admits from leases after the last expiry of its
	// leases for the window, nor before the first started (ClockTolerance
	// allowed).
	Deadline Invariant = "deadline"
	// Promise: admitted over all regions <= G + the fallback admits each
	// region's fallback allows (closed 0, local:A A, open any); a strict
	// limit with closed fallbacks, <= G exactly.
	Promise Invariant = "promise"
)

// Limit is what a run's limit is known to be, beyond its records:
// Check's optional statement of the limits, against which the promise is
// held (rather than against the fallbacks the agents said they applied).
type Limit struct {
	G      int64         // 0: as the records say
	Window time.Duration // the windows it applies to (0: any fixed length)
	// Cal: the calendar windows it applies to (zones.Format; "" for fixed
	// windows).
	Cal string
	// Strict: every fallback is closed; admitted <= G exactly.
	Strict bool
	// Fallback per region: "closed" (the default), "local:A" or "open".
	Fallback map[string]string
}

// allowance is what region may admit under its fallback per window
// (math.MaxInt64: any), as l states it.
func (l Limit) allowance(region string) int64 {
	if l.Strict {
		return 0
	}
	f := l.Fallback[region]
	switch {
	case f == FallbackOpen:
		return math.MaxInt64
	case strings.HasPrefix(f, FallbackLocal+":"):
		a, err := strconv.ParseInt(f[len(FallbackLocal)+1:], 10, 64)
		if err == nil && a >= 0 {
			return a
		}
	}
	return 0
}

// DefaultClockTolerance is how far apart Check takes the processes'
// clocks to be, by default: enough for processes on one host (one clock)
// and rounding; give the real bound across hosts.
const DefaultClockTolerance = 10 * time.Millisecond

// Options configure a check.
type Options struct {
	// Limits states limits by id (nil: each window's G is the largest the
	// allocator's grants named, else the agents' decisions; fallbacks are
	// what the agents said they applied).
	Limits map[string]Limit
	// ClockTolerance is the bound on the offset between the recording
	// processes' clocks (default DefaultClockTolerance; negative: 0).
	ClockTolerance time.Duration
}

// Violation is one broken invariant, with the numbers that break it.
type Violation struct {
	Invariant Invariant
	Limit     string
	Window    int64         // the window's index
	WindowLen time.Duration // its W
	Phase     time.Duration // its phase offset
	Region    string        // "" when it concerns every region
	Detail    string
}

func (v Violation) String() string {
	where := fmt.Sprintf("%s window %d (W %v)", v.Limit, v.Window, v.WindowLen)
	if v.Phase != 0 {
		where = fmt.Sprintf("%s window %d (W %v, phase %v)", v.Limit, v.Window, v.WindowLen, v.Phase)
	}
	if v.Region != "" {
		where += " region " + v.Region
	}
	return string(v.Invariant) + ": " + where + ": " + v.Detail
}

// Report is what Check found.
type Report struct {
	Runs, Ended int // runs read, and of them closed by an end record
	// Records by kind.
	Decisions, Admits, FallbackAdmits, Grants, Returns, Reports, Reservations, Releases int
	// Leases: distinct lease ids granted; Windows: (limit, window) pairs
	// checked; Uncovered: of them, windows that began less than one W
	// after the first allocator's history did (its leases may have been
	// granted before; leased and deadline are not checked there).
	Leases, Windows, Uncovered int
	Violations                 []Violation
	// Incomplete says why the history may miss records (runs cut short,
	// records dropped, sub-lease decisions whose reservation is missing).
	// Violations are still found in an incomplete history, but a clean
	// one proves nothing about what is missing.
	Incomplete []string
}

// OK reports whether no invariant was broken.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Certified reports whether the history is complete and breaks nothing.
func (r Report) Certified() bool { return r.OK() && len(r.Incomplete) == 0 }

// Summary is one line of counts.
func (r Report) Summary() string {
	return fmt.Sprintf("%d runs (%d ended), %d decisions (%d admits, %d under a fallback), %d grant records (%d leases), "+
		"%d returns, %d usage reports, %d reservations, %d releases; %d windows checked (%d before the allocators' history: "+
		"leases not checked), %d violations",
		r.Runs, r.Ended, r.Decisions, r.Admits, r.FallbackAdmits, r.Grants, r.Leases, r.Returns, r.Reports,
		r.Reservations, r.Releases, r.Windows, r.Uncovered, len(r.Violations))
}

// Check verifies the per-window invariants over h with the default
// options and the limits stated (nil: none).
func Check(h *History, limits map[string]Limit) Report {
	return Options{Limits: limits}.Check(h)
}

// windowKey names one window of one limit.
type windowKey struct {
	limit string
	wlen  int64
	phase int64 // the windows' phase offset, ns
	index int64
	cal   string // calendar windows (zones.Format), "" for fixed ones
}

// keyOf names the window a record names.
func keyOf(r Record) windowKey {
	return windowKey{r.Limit, r.WindowLen, r.WindowPhase, r.Window, r.Cal}
}

// start and end are the window's bounds in Unix ns: index x W + φ for
// fixed windows; a calendar window's own bounds (whose length wlen only
// repeats).
func (k windowKey) start() int64 {
	if k.cal != "" {
		return k.calendar().Start.UnixNano()
	}
	return k.index*k.wlen + k.phase
}

func (k windowKey) end() int64 {
	if k.cal != "" {
		return k.calendar().End.UnixNano()
	}
	return (k.index+1)*k.wlen + k.phase
}

// calendar is a calendar key's window (empty for a calendar the zone
// database does not know).
func (k windowKey) calendar() leasepkg.CalendarWindow {
	c, err := zones.Parse(k.cal)
	if err != nil {
		return leasepkg.CalendarWindow{}
	}
	return c.Window(k.index)
}

// lease is one lease id's grants and returns.
type lease struct {
	grant    Record // the first grant record
	returned bool
	ret      Record // a return that counts (credited or window_closed; the original, once seen)
}

// reservation is one sub-lease reservation and what was spent from it.
type reservation struct {
	rec   Record
	spent int64
}

// regionWindow is one region's part of a window.
type regionWindow struct {
	granted, unspent   int64 // distinct leases' tokens, their returns' unspent
	leases             int
	firstStart, expiry int64 // of its leases: the earliest start, the latest expiry
	admits             int64 // from leases (any path)
	fallback           int64 // under a fallback
	fbOpen             bool
	fbCap              int64
	late, early        int   // admits after the last expiry, before the first start
	lateBy, earlyBy    int64 // the worst, ns
	rollback           int64 // redis_rollback_tokens reported (largest)
}

// window is what the history says of one (limit, window).
type window struct {
	gGrant, gDecision int64 // the largest G the grants, and the decisions, named
	granted, credited int64
	regions           map[string]*regionWindow
}

func (w *window) region(r string) *regionWindow {
	rw := w.regions[r]
	if rw == nil {
		rw = &regionWindow{}
		w.regions[r] = rw
	}
	return rw
}

// Check verifies the per-window invariants over h, from its records alone.
func (o Options) Check(h *History) Report {
	tol := int64(o.ClockTolerance)
	if o.ClockTolerance == 0 {
		tol = int64(DefaultClockTolerance)
	}
	tol = max(0, tol)
	var rep Report
	windows := map[windowKey]*window{}
	win := func(k windowKey) *window {
		w := windows[k]
		if w == nil {
			w = &window{regions: map[string]*regionWindow{}}
			windows[k] = w
		}
		return w
	}
	violate := func(inv Invariant, k windowKey, region, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{Invariant: inv, Limit: k.limit, Window: k.index,
			WindowLen: time.Duration(k.wlen), Phase: time.Duration(k.phase), Region: region, Detail: fmt.Sprintf(format, args...)})
	}

	// The runs, and what makes the history incomplete.
	var cut, open []string
	var dropped int64
	allocFrom := int64(math.MaxInt64) // when the first allocator began to record
	for _, r := range h.Runs {
		rep.Runs++
		if r.Start.Role == RoleAllocator {
			allocFrom = min(allocFrom, r.Start.T)
		}
		name := fmt.Sprintf("%s (%s:%d)", r.Start.Proc, r.File, r.Line)
		switch {
		case r.Ended:
			rep.Ended++
		case r.Cut:
			cut = append(cut, name)
		default:
			open = append(open, name)
		}
		dropped += r.Dropped
	}
	if n := len(cut) + len(open); n > 0 {
		rep.Incomplete = append(rep.Incomplete, fmt.Sprintf("%d runs without an end record (killed, or still running): %s; their last records may be missing",
			n, strings.Join(append(cut, open...), ", ")))
	}
	if dropped > 0 {
		rep.Incomplete = append(rep.Incomplete, fmt.Sprintf("%d records dropped (a recorder could not keep up)", dropped))
	}
	// A window's leases are all in the history if the allocators recorded
	// from before its previous window began: a lease is granted at the
	// earliest in the window before its own (fetched early).
	covered := func(k windowKey) bool {
		return allocFrom != math.MaxInt64 && k.start()-k.wlen >= allocFrom
	}
	if allocFrom == math.MaxInt64 {
		rep.Incomplete = append(rep.Incomplete, "no allocator history: what regions were leased, and when, is not checked")
	}

	// Grants: one lease per lease id, one per request id.
	leases := map[string]*lease{}
	type reqKey struct{ region, request string }
	byRequest := map[reqKey]Record{}
	recs := h.Records()
	for _, r := range recs {
		if r.Kind != KindGrant {
			continue
		}
		rep.Grants++
		k := keyOf(r)
		rk := reqKey{r.Region, r.Request}
		if first, ok := byRequest[rk]; !ok {
			byRequest[rk] = r
		} else if first.Lease != r.Lease || first.Tokens != r.Tokens || first.Limit != r.Limit {
			violate(Idempotency, k, r.Region, "request %q yielded lease %q of %d tokens (%s) and lease %q of %d tokens (%s)",
				r.Request, first.Lease, first.Tokens, first.Limit, r.Lease, r.Tokens, r.Limit)
			continue
		}
		if l, ok := leases[r.Lease]; ok {
			if g := l.grant; g.Tokens != r.Tokens || g.Limit != r.Limit || g.Window != r.Window || g.Region != r.Region ||
				g.Expiry != r.Expiry {
				violate(Idempotency, k, r.Region, "lease %q answered as %d tokens expiring at %d and as %d tokens expiring at %d",
					r.Lease, g.Tokens, g.Expiry, r.Tokens, r.Expiry)
			}
			continue
		}
		leases[r.Lease] = &lease{grant: r}
		rep.Leases++
		if r.Expiry > k.end() {
			violate(Clamp, k, r.Region, "lease %q expires at %s, %v after its window's end %s", r.Lease,
				instant(r.Expiry), time.Duration(r.Expiry-k.end()), instant(k.end()))
		}
		if r.Start != 0 && r.Start < k.start() {
			violate(Clamp, k, r.Region, "lease %q starts at %s, %v before its window's start %s", r.Lease,
				instant(r.Start), time.Duration(k.start()-r.Start), instant(k.start()))
		}
		if r.End != 0 && r.End != k.end() {
			violate(Clamp, k, r.Region, "lease %q names the window's end %s; window %d of W %v ends at %s", r.Lease,
				instant(r.End), k.index, time.Duration(k.wlen), instant(k.end()))
		}
		w := win(k)
		w.gGrant = max(w.gGrant, r.G)
		w.granted += r.Tokens
		rw := w.region(r.Region)
		rw.granted += r.Tokens
		rw.leases++
		start := max(r.Start, k.start())
		if rw.leases == 1 || start < rw.firstStart {
			rw.firstStart = start
		}
		rw.expiry = max(rw.expiry, r.Expiry)
	}

	// Returns: credited once per lease; unspent tokens were not spent.
	for _, r := range recs {
		if r.Kind != KindReturn {
			continue
		}
		rep.Returns++
		l := leases[r.Lease]
		if l == nil || (r.Code != "ok" && r.Code != "window_closed" && !r.Duplicate) {
			continue // a lease the history did not see granted counts nowhere (its grant is not counted either)
		}
		g := l.grant
		k := keyOf(g)
		if l.returned {
			// Retries answer as the first return did; two returns that were
			// both not duplicates were credited twice. (Files are read in
			// name order, so a retry's record may come first.)
			switch {
			case !r.Duplicate && !l.ret.Duplicate:
				violate(Idempotency, k, g.Region, "lease %q returned twice, credited %d then %d", r.Lease, l.ret.Credited, r.Credited)
			case r.Credited != l.ret.Credited:
				violate(Idempotency, k, g.Region, "lease %q: its return and a retry answered %d and %d credited", r.Lease, l.ret.Credited, r.Credited)
			}
			if !r.Duplicate {
				l.ret = r
			}
			continue
		}
		l.returned, l.ret = true, r
		if r.Unspent > g.Tokens || r.Credited > r.Unspent {
			violate(Budget, k, g.Region, "lease %q of %d tokens returned %d unspent, %d credited", r.Lease, g.Tokens, r.Unspent, r.Credited)
		}
		w := win(k)
		w.credited += r.Credited
		w.region(g.Region).unspent += min(r.Unspent, g.Tokens)
	}

	// Reservations (sub-leases) by id.
	reservations := map[string]*reservation{}
	for _, r := range recs {
		switch r.Kind {
		case KindRelease:
			rep.Releases++
		case KindReport:
			rep.Reports++
			if r.Rollback > 0 && r.WindowLen > 0 {
				rw := win(keyOf(r)).region(r.Region)
				rw.rollback = max(rw.rollback, r.Rollback)
			}
		case KindReserve:
			rep.Reservations++
			if first := reservations[r.Reservation]; first != nil {
				if first.rec.Tokens != r.Tokens || first.rec.Limit != r.Limit || first.rec.Window != r.Window {
					violate(Idempotency, keyOf(r), r.Region,
						"reservation %q answered as %d tokens (%s window %d) and as %d tokens (%s window %d)", r.Reservation,
						first.rec.Tokens, first.rec.Limit, first.rec.Window, r.Tokens, r.Limit, r.Window)
				}
				continue
			}
			reservations[r.Reservation] = &reservation{rec: r}
		}
	}

	// Decisions: what each region admitted, from leases and under its
	// fallback, and when.
	var unresolved, unnamed int
	for _, r := range recs {
		if r.Kind != KindDecision {
			continue
		}
		rep.Decisions++
		if r.Answer != AnswerOK {
			continue
		}
		rep.Admits++
		k := keyOf(r)
		region := r.Region
		if r.Path == PathChunk || r.Path == PathSubLease {
			res := reservations[r.Reservation]
			if res == nil {
				unresolved++
				continue
			}
			res.spent += r.Cost
			k = keyOf(res.rec)
			region = res.rec.Region
		}
		if k.index == 0 || k.wlen <= 0 || region == "" {
			unnamed++
			continue
		}
		w := win(k)
		w.gDecision = max(w.gDecision, r.G)
		rw := w.region(region)
		if r.Fallback != "" {
			rep.FallbackAdmits++
			rw.fallback += r.Cost
			rw.fbOpen = rw.fbOpen || r.Fallback == FallbackOpen
			rw.fbCap = max(rw.fbCap, r.Cap)
			continue
		}
		rw.admits += r.Cost
		if rw.leases == 0 || !covered(k) {
			continue // Leased reports it; or the history may not have the leases
		}
		spent := r.T
		if r.Spend != 0 {
			spent = r.Spend
		}
		if by := spent - rw.expiry; by > tol {
			rw.late++
			rw.lateBy = max(rw.lateBy, by)
		}
		if by := rw.firstStart - r.T; by > tol {
			rw.early++
			rw.earlyBy = max(rw.earlyBy, by)
		}
	}
	if unresolved > 0 {
		rep.Incomplete = append(rep.Incomplete, fmt.Sprintf("%d sub-lease admits name a reservation the history does not have", unresolved))
	}
	if unnamed > 0 {
		rep.Incomplete = append(rep.Incomplete, fmt.Sprintf("%d admits name no window or region", unnamed))
	}
	for id, res := range reservations {
		if res.spent > res.rec.Tokens {
			r := res.rec
			violate(Leased, keyOf(r), r.Region, "%d tokens admitted from reservation %q of %d",
				res.spent, id, r.Tokens)
		}
	}

	// Per window: the budget, what each region was leased, the deadlines,
	// the promise.
	keys := make([]windowKey, 0, len(windows))
	for k := range windows {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b windowKey) int {
		return cmp.Or(strings.Compare(a.limit, b.limit), strings.Compare(a.cal, b.cal), cmp.Compare(a.wlen, b.wlen), cmp.Compare(a.phase, b.phase), cmp.Compare(a.index, b.index))
	})
	for _, k := range keys {
		w := windows[k]
		rep.Windows++
		lim, stated := o.Limits[k.limit]
		if stated && ((lim.Window != 0 && int64(lim.Window) != k.wlen) || lim.Cal != k.cal) {
			stated = false
		}
		G := w.gGrant
		if G == 0 {
			G = w.gDecision
		}
		if stated && lim.G > 0 {
			G = lim.G
		}
		if net := w.granted - w.credited; w.granted > 0 && net > G {
			violate(Budget, k, "", "net granted %d (granted %d - credited %d) > G %d", net, w.granted, w.credited, G)
		}
		regions := make([]string, 0, len(w.regions))
		for r := range w.regions {
			regions = append(regions, r)
		}
		slices.Sort(regions)
		var admits, fallback, allowed, rollback int64
		if !covered(k) {
			rep.Uncovered++
		}
		for _, r := range regions {
			rw := w.regions[r]
			admits += rw.admits
			fallback += rw.fallback
			rollback += rw.rollback
			if leased := rw.granted - rw.unspent; rw.admits > leased && covered(k) {
				violate(Leased, k, r, "admitted %d from leases; granted %d in %d leases, %d returned unspent: %d leased%s",
					rw.admits, rw.granted, rw.leases, rw.unspent, leased, rollbackNote(rw.rollback))
			}
			if rw.late > 0 {
				violate(Deadline, k, r, "%d admits after the region's last lease expired (%s), the latest %v after it (tolerance %v)",
					rw.late, instant(rw.expiry), time.Duration(rw.lateBy), time.Duration(tol))
			}
			if rw.early > 0 {
				violate(Deadline, k, r, "%d admits before the region's first lease started (%s), the earliest %v before it (tolerance %v)",
					rw.early, instant(rw.firstStart), time.Duration(rw.earlyBy), time.Duration(tol))
			}
			a := int64(0)
			switch {
			case stated:
				a = lim.allowance(r)
			case rw.fbOpen:
				a = math.MaxInt64
			default:
				a = rw.fbCap
			}
			if rw.fallback > a {
				violate(Promise, k, r, "admitted %d under its fallback, which allows %s", rw.fallback, allowance(a))
			}
			if allowed < math.MaxInt64 {
				allowed = satAdd(allowed, a)
			}
		}
		if total := admits + fallback; total > satAdd(G, allowed) {
			violate(Promise, k, "", "admitted %d (%d from leases + %d under fallbacks) > G %d + fallbacks allowed %s%s",
				total, admits, fallback, G, allowance(allowed), rollbackNote(rollback))
		}
	}
	slices.SortStableFunc(rep.Violations, func(a, b Violation) int {
		return cmp.Or(strings.Compare(a.Limit, b.Limit), cmp.Compare(a.WindowLen, b.WindowLen), cmp.Compare(a.Phase, b.Phase), cmp.Compare(a.Window, b.Window),
			strings.Compare(a.Region, b.Region), strings.Compare(string(a.Invariant), string(b.Invariant)))
	})
	return rep
}

func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func allowance(a int64) string {
	if a == math.MaxInt64 {
		return "any (open)"
	}
	return strconv.FormatInt(a, 10)
}

func rollbackNote(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (the agents reported %d tokens re-spendable after a Redis failover lost writes: the bound's term, not checked here)", n)
}

// instant formats unix ns for a violation.
func instant(ns int64) string {
	return time.Unix(0, ns).UTC().Format("15:04:05.000000")
}
