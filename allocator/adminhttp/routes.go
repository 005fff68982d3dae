package adminhttp

import (
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
)

// Suffixes of a limit's parts under /v1/limits/{id...}. Limit ids may
// contain '/', so ".../history" is the history of the limit before it
// (GET only: 405 for other methods); a limit whose own id ends in
// "/history" or "/windows" is addressed with that last '/' escaped as %2F.
const (
	historySuffix = "/history"
	windowsSuffix = "/windows"
)

// getLimitOrPart serves GET /v1/limits/{id}, /v1/limits/{id}/history and
// /v1/limits/{id}/windows.
func (h *Handler) getLimitOrPart(w http.ResponseWriter, r *http.Request) {
	switch op, id := limitPart(r); op {
	case "LimitHistory":
		h.limitHistory(w, r, id)
	case "ListWindows":
		h.listWindows(w, r, id)
	default:
		h.getLimit(w, r, id)
	}
}

// limitPart says which operation a path under /v1/limits/ names (GetLimit
// for the limit itself), and for which limit id. It looks at the escaped path so that %2F stays part of
// the id.
func limitPart(r *http.Request) (op, id string) {
	id = r.PathValue("id")
	esc := strings.TrimPrefix(r.URL.EscapedPath(), "/v1/limits/")
	for _, p := range []struct{ suffix, op string }{{historySuffix, "LimitHistory"}, {windowsSuffix, "ListWindows"}} {
		if len(esc) > len(p.suffix) && strings.HasSuffix(esc, p.suffix) && strings.HasSuffix(id, p.suffix) {
			return p.op, strings.TrimSuffix(id, p.suffix)
		}
	}
	return "GetLimit", id
}

// limitNotAllowed answers 405 to the methods a limit or its part does not
// take.
func (h *Handler) limitNotAllowed(w http.ResponseWriter, r *http.Request) {
	if op, _ := limitPart(r); op != "GetLimit" {
		writeNotAllowed(w, r, "GET, HEAD")
		return
	}
	writeNotAllowed(w, r, "DELETE, GET, HEAD, PUT")
}

func (h *Handler) getLimit(w http.ResponseWriter, r *http.Request, id string) {
	c, ok := h.begin(w, r, "GetLimit")
	if !ok {
		return
	}
	if _, err := parseQuery(r.URL.RawQuery); err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.GetLimit(c.ctx, &pb.GetLimitRequest{Id: id})
	if err != nil {
		h.fail(w, r, c, err, false, id)
		return
	}
	etag := entityTag(resp.GetLimit().GetVersion())
	w.Header().Set("ETag", etag)
	if noneMatch(r.Header.Values("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.write(w, r, http.StatusOK, resp)
}

func (h *Handler) listLimits(w http.ResponseWriter, r *http.Request) {
	c, ok := h.begin(w, r, "ListLimits")
	if !ok {
		return
	}
	req := &pb.ListLimitsRequest{}
	q, err := parseQuery(r.URL.RawQuery, "prefix", "page_size", "page_token")
	if err == nil {
		req.Prefix, req.PageToken = q["prefix"], q["page_token"]
		req.PageSize, err = queryInt32(q, "page_size")
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.ListLimits(c.ctx, req)
	h.reply(w, r, c, resp, err)
}

func (h *Handler) putLimit(w http.ResponseWriter, r *http.Request) {
	if op, _ := limitPart(r); op != "GetLimit" {
		writeNotAllowed(w, r, "GET, HEAD")
		return
	}
	c, ok := h.begin(w, r, "PutLimit")
	if !ok {
		return
	}
	id := r.PathValue("id")
	req := &pb.PutLimitRequest{}
	expected, conditional, err := preconditions(r, true)
	if err == nil {
		_, err = parseQuery(r.URL.RawQuery)
	}
	if err == nil {
		err = h.decodeBody(w, r, req)
	}
	if err == nil {
		err = putRequest(req, id, expected)
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.PutLimit(c.ctx, req)
	if err != nil {
		h.fail(w, r, c, err, conditional, id)
		return
	}
	if !req.DryRun {
		w.Header().Set("ETag", entityTag(resp.GetLimit().GetVersion()))
	}
	h.write(w, r, http.StatusOK, resp)
}

// putRequest completes the body of a PUT with the path's id and the
// If-Match version.
func putRequest(req *pb.PutLimitRequest, id string, expected *int64) error {
	if req.ExpectedVersion != nil {
		return invalid("expected_version", "not taken in the body: send If-Match: \"<version>\" (or If-None-Match: * to create)")
	}
	req.ExpectedVersion = expected
	if req.Limit == nil {
		return nil // the service names the missing field
	}
	switch req.Limit.Id {
	case "":
		req.Limit.Id = id
	case id:
	default:
		return invalid("limit.id", "%q differs from the id in the path, %q", req.Limit.Id, id)
	}
	return nil
}

func (h *Handler) deleteLimit(w http.ResponseWriter, r *http.Request) {
	if op, _ := limitPart(r); op != "GetLimit" {
		writeNotAllowed(w, r, "GET, HEAD")
		return
	}
	c, ok := h.begin(w, r, "DeleteLimit")
	if !ok {
		return
	}
	id := r.PathValue("id")
	req := &pb.DeleteLimitRequest{Id: id}
	expected, conditional, err := preconditions(r, false)
	var q map[string]string
	if err == nil {
		q, err = parseQuery(r.URL.RawQuery, "reason", "dry_run")
	}
	if err == nil {
		req.ExpectedVersion, req.Reason = expected, q["reason"]
		req.DryRun, err = queryBool(q, "dry_run")
	}
	if err == nil {
		err = h.emptyBody(w, r)
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.DeleteLimit(c.ctx, req)
	if err != nil {
		h.fail(w, r, c, err, conditional, id)
		return
	}
	h.write(w, r, http.StatusOK, resp)
}

func (h *Handler) applyLimits(w http.ResponseWriter, r *http.Request) {
	c, ok := h.begin(w, r, "ApplyLimits")
	if !ok {
		return
	}
	req := &pb.ApplyLimitsRequest{}
	_, err := parseQuery(r.URL.RawQuery)
	if err == nil {
		err = h.decodeBody(w, r, req)
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.ApplyLimits(c.ctx, req)
	h.reply(w, r, c, resp, err)
}

func (h *Handler) limitHistory(w http.ResponseWriter, r *http.Request, id string) {
	c, ok := h.begin(w, r, "LimitHistory")
	if !ok {
		return
	}
	req := &pb.LimitHistoryRequest{Id: id}
	q, err := parseQuery(r.URL.RawQuery, "page_size", "page_token")
	if err == nil {
		req.PageToken = q["page_token"]
		req.PageSize, err = queryInt32(q, "page_size")
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.LimitHistory(c.ctx, req)
	h.reply(w, r, c, resp, err)
}

func (h *Handler) listWindows(w http.ResponseWriter, r *http.Request, id string) {
	c, ok := h.begin(w, r, "ListWindows")
	if !ok {
		return
	}
	req := &pb.ListWindowsRequest{LimitId: id}
	q, err := parseQuery(r.URL.RawQuery, "last")
	if err == nil {
		req.Last, err = queryInt32(q, "last")
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.ListWindows(c.ctx, req)
	h.reply(w, r, c, resp, err)
}

func (h *Handler) listAudit(w http.ResponseWriter, r *http.Request) {
	c, ok := h.begin(w, r, "ListAudit")
	if !ok {
		return
	}
	req := &pb.ListAuditRequest{}
	q, err := parseQuery(r.URL.RawQuery, "since", "limit_prefix", "page_size", "page_token")
	if err == nil {
		req.LimitPrefix, req.PageToken = q["limit_prefix"], q["page_token"]
		req.PageSize, err = queryInt32(q, "page_size")
	}
	if err == nil {
		req.Since, err = queryTime(q, "since")
	}
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.ListAudit(c.ctx, req)
	h.reply(w, r, c, resp, err)
}

func (h *Handler) whoAmI(w http.ResponseWriter, r *http.Request) {
	c, ok := h.begin(w, r, "WhoAmI")
	if !ok {
		return
	}
	if _, err := parseQuery(r.URL.RawQuery); err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	resp, err := h.cfg.Admin.WhoAmI(c.ctx, &pb.WhoAmIRequest{})
	h.reply(w, r, c, resp, err)
}

// openAPI serves the OpenAPI document. It needs no credentials: it
// describes the API, it holds no data.
func (h *Handler) openAPI(w http.ResponseWriter, r *http.Request) {
	setOp(r, "GetOpenAPI")
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(OpenAPI)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(OpenAPI)
	}
}

// reply writes resp, or the problem err maps to.
func (h *Handler) reply(w http.ResponseWriter, r *http.Request, c *call, resp proto.Message, err error) {
	if err != nil {
		h.fail(w, r, c, err, false, "")
		return
	}
	h.write(w, r, http.StatusOK, resp)
}

// entityTag is a limit version's ETag.
func entityTag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// preconditions reads If-Match and If-None-Match of a PUT (create allows
// If-None-Match: *) or DELETE: the expected version, and whether the
// request was conditional (a stale version is then 412, not 409).
func preconditions(r *http.Request, create bool) (expected *int64, conditional bool, err error) {
	im, inm := r.Header.Values("If-Match"), r.Header.Values("If-None-Match")
	switch {
	case len(im) > 0 && len(inm) > 0:
		return nil, false, invalid("If-None-Match", "send If-Match or If-None-Match, not both")
	case len(im) > 1:
		return nil, false, invalid("If-Match", "give one version")
	case len(im) == 1:
		v, err := parseEntityTag(im[0])
		if err != nil {
			return nil, false, err
		}
		return &v, true, nil
	case len(inm) == 0:
		return nil, false, nil
	case !create:
		return nil, false, invalid("If-None-Match", "not taken on DELETE; use If-Match: \"<version>\"")
	case len(inm) > 1 || strings.TrimSpace(inm[0]) != "*":
		return nil, false, invalid("If-None-Match", "only * (the limit must not exist yet) is taken on PUT")
	}
	zero := int64(0)
	return &zero, true, nil
}

// parseEntityTag parses If-Match's one strong entity tag, "<version>".
func parseEntityTag(s string) (int64, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "*":
		return 0, invalid("If-Match", "* is not taken: name the version you read, \"<version>\"")
	case strings.HasPrefix(s, "W/"):
		return 0, invalid("If-Match", "weak tag %s: versions are strong tags, \"<version>\"", s)
	case strings.Contains(s, ","):
		return 0, invalid("If-Match", "give one version, not a list")
	case len(s) < 3 || s[0] != '"' || s[len(s)-1] != '"':
		return 0, invalid("If-Match", "want a quoted version, e.g. \"3\"")
	}
	v, err := strconv.ParseInt(s[1:len(s)-1], 10, 64)
	if err != nil || v < 1 || s[1] == '+' {
		return 0, invalid("If-Match", "%s: the version is an integer >= 1", s)
	}
	return v, nil
}

// noneMatch reports whether If-None-Match on a GET matches etag.
func noneMatch(vals []string, etag string) bool {
	for _, v := range vals {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
			if t == "*" || t == etag {
				return true
			}
		}
	}
	return false
}

// isNotFound reports whether err is the service's NotFound.
func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }
