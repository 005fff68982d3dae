package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"leasehold/internal/vocab"
)

// Version is the format of the records this package writes (a start
// record's V). Readers refuse other versions.
const Version = 1

// MaxString is the most bytes of any string in a record: longer strings
// are cut when recorded (vocab.Cap) and refused when read.
const MaxString = 512

// MaxLine is the longest line a reader accepts (a record with every string
// at its cap is about 12 KiB).
const MaxLine = 64 << 10

// Kind is what a record is about.
type Kind string

// The kinds of record.
const (
	// KindStart opens a run: Proc, Role, Region, V.
	KindStart Kind = "start"
	// KindEnd closes a run written to its end: Count records written,
	// Dropped records dropped in all.
	KindEnd Kind = "end"
	// KindDropped says Count records were dropped (the queue was full)
	// before T: the history is incomplete.
	KindDropped Kind = "dropped"
	// KindDecision is one answer about one limit (a CheckMulti of n limits
	// writes n, each with Items = n).
	KindDecision Kind = "decision"
	// KindGrant is a lease the allocator answered (Replayed: made earlier
	// for the same request id).
	KindGrant Kind = "grant"
	// KindReturn is a lease return the allocator answered.
	KindReturn Kind = "return"
	// KindReport is one usage item the allocator received and stored.
	KindReport Kind = "report"
	// KindReserve is a sub-lease reservation an agent granted.
	KindReserve Kind = "reserve"
	// KindRelease is a reservation's release an agent took.
	KindRelease Kind = "release"
)

// Roles of a process (a start record's Role).
const (
	RoleAllocator = "allocator"
	RoleAgent     = "agent"
	RoleGateway   = "gateway"
)

// Answer is a decision's answer.
type Answer string

// The answers.
const (
	AnswerOK          Answer = "ok" // admitted (from tokens leased, or under a fallback: Fallback says)
	AnswerOverLimit   Answer = "over_limit"
	AnswerUnavailable Answer = "unavailable"
)

// Path says what decided.
type Path string

// The paths of a decision.
const (
	PathRedis       Path = "redis"        // the region's shared bucket
	PathInProcess   Path = "in-process"   // the agent replica's own leases (Redis down)
	PathChunk       Path = "chunk"        // the agent's chunk of a hot limit, in memory (Reservation)
	PathSubLease    Path = "sub-lease"    // a client's sub-lease, in memory (Reservation)
	PathDenialCache Path = "denial-cache" // a client repeating a denial
	PathNone        Path = "none"         // no store was asked (the agent does not know the limits)
)

// Fallback kinds of an admit (Record.Fallback).
const (
	FallbackLocal = "local"
	FallbackOpen  = "open"
)

// Record is one line of a history. Which fields are set depends on Kind;
// times are unix nanoseconds on the recording process's clock (the
// allocator's for grants, returns and reports), durations nanoseconds.
type Record struct {
	Kind Kind  `json:"kind"`
	T    int64 `json:"t"` // when it was recorded (a decision: when its answer was final)
	// Proc is the process (start) or the replica that decided or answered.
	Proc string `json:"proc,omitempty"`
	Role string `json:"role,omitempty"` // start
	V    int    `json:"v,omitempty"`    // start: the format version

	Region    string `json:"region,omitempty"`
	Limit     string `json:"limit,omitempty"`
	Window    int64  `json:"window,omitempty"` // window index (0: not known)
	WindowLen int64  `json:"wlen,omitempty"`   // W
	// WindowPhase is the windows' phase offset φ (ns; 0 for the
	// epoch-aligned windows): window Window is [Window*W + φ, ...).
	WindowPhase int64 `json:"wph,omitempty"`
	// Cal names calendar windows (zones.Format, e.g. "month
	// Europe/Berlin"): Window then counts calendar windows and WindowLen
	// is this window's own length. "" for fixed windows.
	Cal string `json:"cal,omitempty"`
	G   int64  `json:"g,omitempty"` // the limit's G as the recorder knew it

	// decision
	Cost     int64  `json:"cost,omitempty"`
	Answer   Answer `json:"answer,omitempty"`
	Path     Path   `json:"path,omitempty"`
	Fallback string `json:"fallback,omitempty"` // an admit under a fallback: local or open
	Cap      int64  `json:"cap,omitempty"`      // Fallback local: A
	// Spend is when the agent sent the decision's last spend: the spend
	// happened at or after it.
	Spend int64 `json:"spend,omitempty"`
	Items int   `json:"items,omitempty"` // limits of a CheckMulti (> 1)
	// Reservation names the sub-lease a decision spent from (PathChunk,
	// PathSubLease), or the reservation reserved or released.
	Reservation string `json:"reservation,omitempty"`

	// grant
	Request  string `json:"request,omitempty"`
	Lease    string `json:"lease,omitempty"` // also return
	Tokens   int64  `json:"tokens,omitempty"`
	Start    int64  `json:"start,omitempty"`  // spendable from (allocator clock)
	Expiry   int64  `json:"expiry,omitempty"` // the lease's expiry (allocator clock); a reservation's deadline (agent clock)
	End      int64  `json:"end,omitempty"`    // the window's end (allocator clock)
	Replayed bool   `json:"replayed,omitempty"`

	// return, release
	Unspent   int64  `json:"unspent,omitempty"`
	Credited  int64  `json:"credited,omitempty"` // return: went back to the pool
	Returned  int64  `json:"returned,omitempty"` // release: went back to the region
	Duplicate bool   `json:"duplicate,omitempty"`
	Code      string `json:"code,omitempty"` // return: ok, window_closed, unknown_lease...

	// report
	Reporter         string `json:"reporter,omitempty"`
	Admitted         int64  `json:"admitted,omitempty"`
	Denied           int64  `json:"denied,omitempty"`
	FallbackAdmitted int64  `json:"fallback_admitted,omitempty"`
	Released         int64  `json:"released,omitempty"`
	Rollback         int64  `json:"rollback,omitempty"`

	// end, dropped
	Count   int64 `json:"count,omitempty"`
	Dropped int64 `json:"dropped,omitempty"`
}

// strings lists the record's string fields, for capping and checking.
func (r *Record) strings() []*string {
	return []*string{&r.Proc, &r.Role, &r.Region, &r.Limit, &r.Fallback, &r.Reservation, &r.Request, &r.Lease,
		&r.Code, &r.Reporter, &r.Cal, (*string)(&r.Kind), (*string)(&r.Answer), (*string)(&r.Path)}
}

// capStrings cuts every string to MaxString.
func (r *Record) capStrings() {
	for _, s := range r.strings() {
		if len(*s) > MaxString {
			*s = vocab.Cap(*s, MaxString)
		}
	}
}

// amountNames names Validate's amounts, in its order.
var amountNames = [...]string{"t", "wlen", "g", "cost", "cap", "spend", "tokens", "unspent", "credited", "returned",
	"admitted", "denied", "fallback_admitted", "released", "rollback", "count", "dropped", "items", "wph"}

// ErrInvalid is a record that breaks the format.
var ErrInvalid = errors.New("history: invalid record")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate checks r against the format: a known kind, the fields its kind
// needs, no string over MaxString, no negative amount.
func (r *Record) Validate() error {
	for _, s := range r.strings() {
		if len(*s) > MaxString {
			return invalid("a string of %d bytes (at most %d)", len(*s), MaxString)
		}
	}
	for i, n := range [...]int64{r.T, r.WindowLen, r.G, r.Cost, r.Cap, r.Spend, r.Tokens, r.Unspent, r.Credited,
		r.Returned, r.Admitted, r.Denied, r.FallbackAdmitted, r.Released, r.Rollback, r.Count, r.Dropped, int64(r.Items), r.WindowPhase} {
		if n < 0 {
			return invalid("%s %d is negative", amountNames[i], n)
		}
	}
	need := func(fields ...string) error {
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] == "" {
				return invalid("%s record without %s", r.Kind, fields[i])
			}
		}
		return nil
	}
	switch r.Kind {
	case KindStart:
		if r.V != Version {
			return invalid("format version %d (this reader knows %d)", r.V, Version)
		}
		return need("proc", r.Proc)
	case KindEnd:
		return nil
	case KindDropped:
		if r.Count < 1 {
			return invalid("dropped record without a count")
		}
		return nil
	case KindDecision:
		switch r.Answer {
		case AnswerOK, AnswerOverLimit, AnswerUnavailable:
		default:
			return invalid("decision answer %q", r.Answer)
		}
		switch r.Path {
		case PathRedis, PathInProcess, PathNone, PathDenialCache:
		case PathChunk, PathSubLease:
			if r.Reservation == "" {
				return invalid("%s decision without its reservation", r.Path)
			}
		default:
			return invalid("decision path %q", r.Path)
		}
		switch r.Fallback {
		case "":
		case FallbackLocal, FallbackOpen:
			if r.Answer != AnswerOK {
				return invalid("a %s fallback on a %s answer", r.Fallback, r.Answer)
			}
		default:
			return invalid("decision fallback %q", r.Fallback)
		}
		if r.Cost < 1 {
			return invalid("decision of cost %d", r.Cost)
		}
		return need("limit", r.Limit)
	case KindGrant:
		if r.WindowLen <= 0 || r.Tokens < 1 {
			return invalid("grant without a window length or tokens")
		}
		return need("limit", r.Limit, "region", r.Region, "request", r.Request, "lease", r.Lease)
	case KindReturn:
		return need("limit", r.Limit, "lease", r.Lease)
	case KindReport:
		return need("limit", r.Limit, "region", r.Region, "reporter", r.Reporter)
	case KindReserve:
		if r.WindowLen <= 0 || r.Tokens < 1 {
			return invalid("reserve without a window length or tokens")
		}
		return need("limit", r.Limit, "reservation", r.Reservation)
	case KindRelease:
		return need("limit", r.Limit, "reservation", r.Reservation)
	}
	return invalid("unknown kind %q", r.Kind)
}

// Decode parses one line (without its newline) as a record and validates
// it. Any input gives a record or an error, never a panic.
func Decode(line []byte) (Record, error) {
	var r Record
	if len(line) > MaxLine {
		return r, invalid("a line of %d bytes (at most %d)", len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Record{}, invalid("more than one value on a line")
	}
	if err := r.Validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// Encode appends r as one line (with its newline) to b, its strings cut to
// MaxString.
func Encode(b []byte, r Record) []byte {
	r.capStrings()
	out, err := json.Marshal(&r)
	if err != nil { // a Record has only strings, numbers and bools
		panic("history: encoding a record: " + err.Error())
	}
	return append(append(b, out...), '\n')
}
