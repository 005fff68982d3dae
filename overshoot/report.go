package overshoot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Report is one row per (limit, window) for metrics, the admin API and
// `quotactl windows`: what was granted and admitted, the bound, the observed
// overshoot and the stranded tokens. It marshals to JSON with exactly the
// snake_case field names of its tags. A Report is a plain value: safe for
// concurrent reads, not for a concurrent write.
type Report struct {
	// Limit is the limit's id, e.g. "tenant/atlas".
	Limit string `json:"limit"`
	// WindowStart and WindowEnd delimit the window [start, end) on the
	// allocator's clock, in UTC.
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// LimitTokens is G in force at the window's end.
	LimitTokens int64 `json:"limit_tokens"`
	// Granted and Returned are the tokens granted for the window and
	// credited back while it was open.
	Granted  int64 `json:"granted"`
	Returned int64 `json:"returned"`
	// Admitted is, per region name, every token the region admitted: from
	// leases and under fallback. Never nil.
	Admitted map[string]int64 `json:"admitted"`
	// AdmittedTotal is the sum of Admitted.
	AdmittedTotal int64 `json:"admitted_total"`
	// FallbackAdmitted is the part of AdmittedTotal admitted under local
	// or open fallback, without a lease.
	FallbackAdmitted int64 `json:"fallback_admitted"`
	// Bound is the bound on ObservedOvershoot (tokens above LimitTokens,
	// not on AdmittedTotal): Terms.Total, or +Inf. In JSON a number, or
	// the string "+Inf".
	Bound Ceiling `json:"bound"`
	// ObservedOvershoot is max(0, AdmittedTotal - LimitTokens). Above
	// Bound is a bug.
	ObservedOvershoot int64 `json:"observed_overshoot"`
	// Stranded is the tokens granted that were neither returned nor
	// admitted from a lease (see [Stranded]).
	Stranded int64 `json:"stranded"`

	// Terms is the bound term by term, for per-term metrics. It is not
	// part of the JSON row.
	Terms Bound `json:"-"`
}

// NewReport builds the report of window w of limit, which ran over
// [start, end). Times are stored in UTC, without a monotonic reading.
// Regions listed twice are summed. It does not modify w.
func NewReport(limit string, start, end time.Time, w Window) Report {
	b := Compute(w)
	lease, fallback := w.admitted()
	r := Report{
		Limit:             limit,
		WindowStart:       start.UTC(),
		WindowEnd:         end.UTC(),
		LimitTokens:       w.Limit,
		Granted:           w.Granted,
		Returned:          w.Returned,
		Admitted:          make(map[string]int64, len(w.Regions)),
		AdmittedTotal:     addSat(lease, fallback),
		FallbackAdmitted:  fallback,
		Bound:             Ceiling{Infinite: b.Infinite, Tokens: b.Total},
		ObservedOvershoot: Observed(w),
		Stranded:          Stranded(w),
		Terms:             b,
	}
	for _, reg := range w.Regions {
		r.Admitted[reg.Name] = addSat(r.Admitted[reg.Name], nonNeg(reg.Admitted), nonNeg(reg.FallbackAdmitted))
	}
	return r
}

// Ceiling is a token count that may be infinite. In JSON it is a number, or
// the string "+Inf" when Infinite (JSON has no infinity, and Prometheus
// writes +Inf this way).
type Ceiling struct {
	Infinite bool
	// Tokens is the count when not Infinite.
	Tokens int64
}

// Float64 returns Tokens, or +Inf when c is Infinite.
func (c Ceiling) Float64() float64 {
	if c.Infinite {
		return math.Inf(1)
	}
	return float64(c.Tokens)
}

// String returns the count in decimal, or "+Inf".
func (c Ceiling) String() string {
	if c.Infinite {
		return "+Inf"
	}
	return strconv.FormatInt(c.Tokens, 10)
}

// MarshalJSON writes Tokens as a JSON number, or "+Inf".
func (c Ceiling) MarshalJSON() ([]byte, error) {
	if c.Infinite {
		return []byte(`"+Inf"`), nil
	}
	return strconv.AppendInt(nil, c.Tokens, 10), nil
}

// UnmarshalJSON reads what MarshalJSON writes: an integer, or "+Inf"
// (Tokens is then math.MaxInt64, as in a Report).
func (c *Ceiling) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("null")) { // by convention, a no-op
		return nil
	}
	if bytes.Equal(data, []byte(`"+Inf"`)) {
		*c = Ceiling{Infinite: true, Tokens: math.MaxInt64}
		return nil
	}
	var n int64
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("overshoot: bound must be an integer or \"+Inf\": %w", err)
	}
	*c = Ceiling{Tokens: n}
	return nil
}
