package overshoot

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// FallbackMode is the fallback a region applied while it could not get
// leases. The constants are ordered from harmless to unbounded, so the worst
// of two modes is the larger one: max(a, b).
type FallbackMode int

// Fallback modes, in increasing order of what they may admit.
const (
	// FallbackNone: the region never needed a fallback in the window.
	FallbackNone FallbackMode = iota
	// FallbackClosed: the region denied everything beyond its leases.
	FallbackClosed
	// FallbackLocal: local:A, the region admitted at most A tokens of its
	// own in the window (Region.LocalAllowance).
	FallbackLocal
	// FallbackOpen: the region admitted everything. No bound holds.
	FallbackOpen
)

// String returns "none", "closed", "local" or "open" (the names used in
// limit configuration), or "FallbackMode(n)" for an unknown value.
func (m FallbackMode) String() string {
	switch m {
	case FallbackNone:
		return "none"
	case FallbackClosed:
		return "closed"
	case FallbackLocal:
		return "local"
	case FallbackOpen:
		return "open"
	}
	return fmt.Sprintf("FallbackMode(%d)", int(m))
}

// known reports whether m is one of the four defined modes.
func (m FallbackMode) known() bool { return m >= FallbackNone && m <= FallbackOpen }

// Failover is one Redis failover that lost replicated writes in a region
// during the window. Spends recorded on the old primary but not yet
// replicated are forgotten by the new primary, so their tokens can be spent
// (or returned) a second time.
type Failover struct {
	// Lag is the replication lag at the failover: how far behind the
	// replica that was promoted was. Negative reads as 0.
	Lag time.Duration
	// AdmitRate is the region's admit rate for the limit, in tokens per
	// second, around the failover. Negative reads as 0; NaN or +Inf means
	// the rate is unknown, and the term saturates at math.MaxInt64.
	AdmitRate float64
	// Observed is the number of re-spent tokens the agent measured, if it
	// could (for example by comparing its own spend log with Redis after
	// the failover); 0 when it did not measure.
	Observed int64
}

// Region is what one region did for the limit in the window, as its agents
// report it.
type Region struct {
	// Name identifies the region ("eu", "us", ...).
	Name string
	// Admitted is the tokens admitted from leases: spent from the regional
	// bucket in Redis, or from leases an agent held in process while Redis
	// was down. Re-spends after a Redis failover count again.
	Admitted int64
	// FallbackAdmitted is the tokens admitted without a lease, under
	// local:A or open fallback.
	FallbackAdmitted int64
	// Fallback is the worst fallback mode the region entered in the
	// window; FallbackNone if it never fell back.
	Fallback FallbackMode
	// LocalAllowance is A of local:A: the most tokens the region may admit
	// under local fallback per window. Only read when Fallback is
	// FallbackLocal.
	LocalAllowance int64
	// Failovers lists the Redis failovers with lost writes that the region
	// saw in the window.
	Failovers []Failover
	// SettleOverrun is the cost settle-later decisions admitted in the
	// window beyond the region's leases: settled above their estimate
	// when the window's leases could not hold the difference. Admitted
	// counts it.
	SettleOverrun int64
}

// Window is what really happened to one limit in one window, as the
// allocator knows it once the window has closed and the regions have
// reported. The zero value is an empty window of a limit with G = 0.
type Window struct {
	// Limit is G, the limit's tokens per window, in force at the window's
	// end (after any change made during the window).
	Limit int64
	// LimitAtGrant is the largest G that was in force when any grant of
	// the window was made. It differs from Limit only when G was lowered
	// after grants were made: grants made under the old G stay valid and
	// spendable. 0 (or any value <= Limit) means G was not lowered.
	LimitAtGrant int64
	// Granted is the tokens the allocator granted for the window.
	Granted int64
	// Returned is the tokens credited back to the pool (unspent tokens of
	// closed leases) while the window was open. Returns that arrive after
	// the window has closed are not counted.
	Returned int64
	// CarriedOver is the tokens of leases from other windows that were
	// spendable in this one. Leasehold clamps every lease to its window
	// (invariant 3), so it is always 0 there; the field exists to show
	// what clamping saves.
	CarriedOver int64
	// Regions is one entry per region.
	Regions []Region
}

// ErrInvalid is wrapped by every error that [Window.Validate] returns.
var ErrInvalid = errors.New("overshoot: invalid window")

// Validate reports every field of w that the system should never produce:
// negative counts, more returned than granted, an unknown fallback mode, a
// region that admitted fallback tokens without being in local or open mode
// or more than its allowance in local mode, an unusable failover estimate,
// or two regions with the same name. Each problem is one error wrapping
// [ErrInvalid]; they are joined with errors.Join. It returns nil for a
// window that keeps the rules.
//
// Compute, Observed and Stranded accept invalid windows too (negative counts
// read as 0); a region that broke its fallback rules then shows as observed
// overshoot above the bound, which is how the bug is meant to surface.
func (w Window) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...)))
	}
	neg := func(what string, v int64) {
		if v < 0 {
			bad("%s is negative (%d)", what, v)
		}
	}
	neg("limit", w.Limit)
	neg("limit at grant", w.LimitAtGrant)
	neg("granted", w.Granted)
	neg("returned", w.Returned)
	neg("carried over", w.CarriedOver)
	if w.Returned > w.Granted && w.Returned >= 0 && w.Granted >= 0 {
		bad("returned %d > granted %d", w.Returned, w.Granted)
	}
	seen := make(map[string]bool, len(w.Regions))
	for _, r := range w.Regions {
		if seen[r.Name] {
			bad("region %q listed twice", r.Name)
		}
		seen[r.Name] = true
		neg(fmt.Sprintf("region %q admitted", r.Name), r.Admitted)
		neg(fmt.Sprintf("region %q fallback admitted", r.Name), r.FallbackAdmitted)
		neg(fmt.Sprintf("region %q local allowance", r.Name), r.LocalAllowance)
		switch {
		case !r.Fallback.known():
			bad("region %q: unknown fallback mode %v", r.Name, r.Fallback)
		case r.Fallback < FallbackLocal && r.FallbackAdmitted > 0:
			bad("region %q admitted %d fallback tokens in mode %v", r.Name, r.FallbackAdmitted, r.Fallback)
		case r.Fallback == FallbackLocal && r.FallbackAdmitted > r.LocalAllowance:
			bad("region %q admitted %d fallback tokens, above local:%d", r.Name, r.FallbackAdmitted, r.LocalAllowance)
		}
		for i, f := range r.Failovers {
			if f.Lag < 0 {
				bad("region %q failover %d: negative lag %v", r.Name, i, f.Lag)
			}
			if f.AdmitRate < 0 || math.IsNaN(f.AdmitRate) || math.IsInf(f.AdmitRate, 0) {
				bad("region %q failover %d: admit rate %v", r.Name, i, f.AdmitRate)
			}
			if f.Observed < 0 {
				bad("region %q failover %d: negative observed re-spends (%d)", r.Name, i, f.Observed)
			}
		}
	}
	return errors.Join(errs...)
}

// outstanding is the tokens granted and not returned, never negative.
func (w Window) outstanding() int64 {
	return nonNeg(w.Granted) - min(nonNeg(w.Returned), nonNeg(w.Granted))
}

// admitted returns the tokens admitted from leases and under fallback,
// summed over the regions.
func (w Window) admitted() (lease, fallback int64) {
	for _, r := range w.Regions {
		lease = addSat(lease, nonNeg(r.Admitted))
		fallback = addSat(fallback, nonNeg(r.FallbackAdmitted))
	}
	return lease, fallback
}
