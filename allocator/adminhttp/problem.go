package adminhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
)

// LeaderHeader names the leader's gRPC address on a follower's 503: the
// HTTP form of the "leasehold-leader" gRPC trailer.
const LeaderHeader = "Leasehold-Leader"

// GroupHeader and GroupAllocatorHeader name, on a 421, the allocator
// group a limit lives in and one of its allocators (gRPC address), when
// the limits are sharded over several allocator groups: the HTTP form of
// the "leasehold-group" and "leasehold-group-allocator" trailers.
const (
	GroupHeader          = "Leasehold-Group"
	GroupAllocatorHeader = "Leasehold-Group-Allocator"
)

// problem is an RFC 9457 problem detail, and the error that becomes one.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// InvalidParams names the bad field or parameter of a 400.
	InvalidParams []invalidParam `json:"invalid-params,omitempty"`
	// CurrentVersion is the limit's version on a 412 (0: it does not
	// exist).
	CurrentVersion *int64 `json:"current-version,omitempty"`
	// Leader is the leader's gRPC address on a follower's 503.
	Leader string `json:"leader,omitempty"`
	// Group and Allocator name, on a 421, the allocator group the limit
	// lives in and one of its allocators (gRPC address).
	Group     string `json:"group,omitempty"`
	Allocator string `json:"allocator,omitempty"`
}

// invalidParam is one bad field: name as the service names fields
// ("limit.limit_tokens"), query parameters and headers by their names.
type invalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

func (p *problem) Error() string { return p.Detail }

// invalid is a 400 naming field.
func invalid(field, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	return &problem{Status: http.StatusBadRequest, Detail: field + ": " + reason,
		InvalidParams: []invalidParam{{Name: field, Reason: reason}}}
}

// statusOf maps the Admin service's gRPC codes to HTTP statuses: the one
// table of the HTTP API. Aborted is 409 here; fail makes it 412 for a
// request with If-Match.
var statusOf = map[codes.Code]int{
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.FailedPrecondition: http.StatusBadRequest,
	codes.OutOfRange:         http.StatusBadRequest,
	codes.Unauthenticated:    http.StatusUnauthorized,
	codes.PermissionDenied:   http.StatusForbidden,
	codes.NotFound:           http.StatusNotFound,
	codes.Aborted:            http.StatusConflict,
	codes.AlreadyExists:      http.StatusConflict,
	codes.ResourceExhausted:  http.StatusTooManyRequests,
	codes.Canceled:           http.StatusServiceUnavailable,
	codes.Unavailable:        http.StatusServiceUnavailable,
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,
	codes.Unimplemented:      http.StatusNotImplemented,
}

// fieldMessage splits the service's "field: reason" messages; a field is
// proto names joined by '.', with list indexes and map keys in brackets.
var fieldMessage = regexp.MustCompile(`^((?:[A-Za-z_][A-Za-z0-9_]*|\[[^\]]*\])(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\]]*\])*): (.+)$`)

// fail answers err: a problem as it is, a service error mapped by
// statusOf. conditional says the request carried If-Match (a version
// mismatch is then 412); id is the limit to name the current version of.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, c *call, err error, conditional bool, id string) {
	if p, ok := err.(*problem); ok {
		writeProblem(w, r, p)
		return
	}
	s := status.Convert(err)
	code, ok := statusOf[s.Code()]
	if !ok {
		code = http.StatusInternalServerError
	}
	p := &problem{Status: code, Detail: s.Message()}
	switch s.Code() {
	case codes.InvalidArgument:
		msg := strings.TrimPrefix(s.Message(), "allocator: invalid argument: ")
		if m := fieldMessage.FindStringSubmatch(msg); m != nil {
			p.InvalidParams = []invalidParam{{Name: m[1], Reason: m[2]}}
		}
	case codes.Aborted:
		if conditional && id != "" {
			p.Status = http.StatusPreconditionFailed
			cur := int64(0)
			if resp, err := h.cfg.Admin.GetLimit(c.ctx, &pb.GetLimitRequest{Id: id}); err == nil {
				cur = resp.GetLimit().GetVersion()
			} else if !isNotFound(err) {
				cur = -1
			}
			if cur >= 0 {
				p.CurrentVersion = &cur
				if cur > 0 {
					w.Header().Set("ETag", entityTag(cur))
					p.Detail = fmt.Sprintf("%s; the limit is at version %d (ETag %s)", s.Message(), cur, entityTag(cur))
				} else {
					p.Detail = s.Message() + "; the limit does not exist"
				}
			}
		}
	case codes.Unavailable:
		p.Leader = c.stream.leader()
	case codes.FailedPrecondition:
		if g, a := c.stream.group(); g != "" {
			// Another allocator group's limit: ask there (RFC 9110 421).
			p.Status, p.Group, p.Allocator = http.StatusMisdirectedRequest, g, a
			w.Header().Set(GroupHeader, g)
			w.Header().Set(GroupAllocatorHeader, a)
		}
	}
	if code == http.StatusInternalServerError {
		h.log.Error("admin http: internal error", "method", r.Method, "path", r.URL.Path, "code", s.Code(), "err", s.Message())
	}
	writeProblem(w, r, p)
}

// writeProblem writes p as application/problem+json, with the headers
// its status calls for.
func writeProblem(w http.ResponseWriter, r *http.Request, p *problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	hd := w.Header()
	hd.Del("Content-Length")
	hd.Set("Content-Type", "application/problem+json")
	hd.Set("Cache-Control", "no-store")
	switch p.Status {
	case http.StatusUnauthorized:
		if r.Header.Get("Authorization") != "" {
			hd.Set("WWW-Authenticate", `Bearer realm="leasehold", error="invalid_token"`)
		} else {
			hd.Set("WWW-Authenticate", `Bearer realm="leasehold"`)
		}
	case http.StatusServiceUnavailable:
		hd.Set("Retry-After", "1")
		if p.Leader != "" {
			hd.Set(LeaderHeader, p.Leader)
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "must be >= 1", not "\u003e="
	if err := enc.Encode(p); err != nil {
		// Cannot happen: strings and numbers only.
		b.Reset()
		b.WriteString(`{"type":"about:blank","status":500}` + "\n")
	}
	w.WriteHeader(p.Status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.Bytes())
	}
}

// marshal writes messages with proto field names, and fields at their
// zero value too, so every documented field is present.
var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}

// write answers m as JSON with code.
func (h *Handler) write(w http.ResponseWriter, r *http.Request, code int, m proto.Message) {
	b, err := marshal.Marshal(m)
	if err != nil {
		h.log.Error("admin http: encode response", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, r, &problem{Status: http.StatusInternalServerError, Detail: "encoding the response failed"})
		return
	}
	// protojson varies its whitespace from build to build on purpose;
	// compact it so that the same answer is the same bytes.
	var out bytes.Buffer
	out.Grow(len(b) + 1)
	if err := json.Compact(&out, b); err != nil {
		out.Reset()
		out.Write(b)
	}
	out.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(out.Bytes())
}
