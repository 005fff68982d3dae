package adminhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// parseQuery parses a query string that may hold each of the allowed
// parameters at most once; anything else is a 400 naming the parameter
// (a misspelt "dryrun=true" must not pass for a real change).
func parseQuery(raw string, allowed ...string) (map[string]string, error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, invalid("query", "malformed query string: %v", err)
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]string, len(vals))
	for _, k := range keys {
		if !utf8.ValidString(k) || slices.ContainsFunc(vals[k], func(v string) bool { return !utf8.ValidString(v) }) {
			return nil, invalid("query", "not valid UTF-8 once unescaped")
		}
		if k == "" {
			return nil, invalid("query", "a parameter without a name")
		}
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return nil, invalid(k, "unknown query parameter: this route takes none")
			}
			return nil, invalid(k, "unknown query parameter: this route takes %s", strings.Join(allowed, ", "))
		}
		if len(vals[k]) > 1 {
			return nil, invalid(k, "given %d times; give it once", len(vals[k]))
		}
		out[k] = vals[k][0]
	}
	return out, nil
}

func queryInt32(q map[string]string, name string) (int32, error) {
	s, ok := q[name]
	if !ok {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, invalid(name, "%q is not an integer", s)
	}
	return int32(v), nil
}

func queryBool(q map[string]string, name string) (bool, error) {
	s, ok := q[name]
	if !ok {
		return false, nil
	}
	switch s {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, invalid(name, "%q: want true or false", s)
}

func queryTime(q map[string]string, name string) (*timestamppb.Timestamp, error) {
	s, ok := q[name]
	if !ok {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, invalid(name, "%q is not an RFC 3339 time, e.g. 2026-01-02T15:04:05Z", s)
	}
	return timestamppb.New(t), nil
}

// readBody reads a request body of at most the handler's cap: 413 above
// it.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opt.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &problem{Status: http.StatusRequestEntityTooLarge,
				Detail: "request body larger than " + strconv.FormatInt(h.opt.maxBody, 10) + " bytes"}
		}
		return nil, invalid("body", "reading it: %v", err)
	}
	return data, nil
}

// decodeBody decodes a JSON request body into m (protojson: proto or
// JSON field names, unknown fields refused). A decoding error is a 400
// naming the field it was found at, e.g. "limit.fallback[eu].kind".
func (h *Handler) decodeBody(w http.ResponseWriter, r *http.Request, m proto.Message) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return &problem{Status: http.StatusUnsupportedMediaType,
				Detail: "Content-Type " + strconv.Quote(ct) + ": send application/json"}
		}
	}
	data, err := h.readBody(w, r)
	if err != nil {
		return err
	}
	return decodeJSON(data, m)
}

// decodeJSON is decodeBody's decoding: the part the fuzz test drives.
func decodeJSON(data []byte, m proto.Message) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return invalid("body", "required: a JSON object")
	}
	if err := protojson.Unmarshal(data, m); err != nil {
		msg := protoErrPrefix.ReplaceAllString(err.Error(), "")
		field := "body"
		if off, ok := errorOffset(data, msg); ok {
			if p := jsonPath(data, off, m.ProtoReflect().Descriptor()); p != "" {
				field = p
			}
		}
		return invalid(field, "%s", msg)
	}
	return nil
}

// emptyBody refuses a body where the route takes none.
func (h *Handler) emptyBody(w http.ResponseWriter, r *http.Request) error {
	data, err := h.readBody(w, r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) != 0 {
		return invalid("body", "this route takes no body; its parameters are in the query string")
	}
	return nil
}

// protoErrPrefix is the "proto: " protojson puts before its errors (with
// a space that may be U+00A0).
var protoErrPrefix = regexp.MustCompile(`^proto:\s*`)

// linecol finds protojson's "(line L:C)" position in an error message.
var linecol = regexp.MustCompile(`\(line (\d+):(\d+)\)`)

// errorOffset turns the "(line L:C)" of a protojson error (C counts runes
// from 1) into a byte offset in data.
func errorOffset(data []byte, msg string) (int, bool) {
	m := linecol.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	line, err1 := strconv.Atoi(m[1])
	col, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil || line < 1 || col < 1 {
		return 0, false
	}
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	for c := 1; c < col; c++ {
		if off >= len(data) || data[off] == '\n' {
			return 0, false
		}
		_, n := utf8.DecodeRune(data[off:])
		off += n
	}
	return off, true
}

// frame is an open JSON object or array on the way to an offset.
type frame struct {
	path  string
	array bool
	index int                            // arrays: the next element's index
	key   string                         // objects: the key whose value comes next
	keyed bool                           // objects: key read, value not yet
	msg   protoreflect.MessageDescriptor // objects that are messages
	field protoreflect.FieldDescriptor   // the map or list field this is the value of
	isMap bool
}

// maxDepth bounds jsonPath's nesting (protojson refuses deeper input).
const maxDepth = 10000

// jsonPath names the field at byte offset off of data as the service
// names fields: proto names joined by '.', list indexes and map keys in
// brackets ("changes[2].put.fallback[eu].kind"). Keys it cannot resolve
// against md are kept as written. It returns "" when off is at the top.
func jsonPath(data []byte, off int, md protoreflect.MessageDescriptor) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	// child is the path and type of the value the top frame expects next.
	child := func() (string, protoreflect.MessageDescriptor, protoreflect.FieldDescriptor, bool) {
		if len(stack) == 0 {
			return "", md, nil, false
		}
		f := stack[len(stack)-1]
		switch {
		case f.array:
			p := f.path + "[" + strconv.Itoa(f.index) + "]"
			if f.field != nil && f.field.Message() != nil {
				return p, f.field.Message(), nil, false
			}
			return p, nil, nil, false
		case f.isMap:
			p := f.path + "[" + f.key + "]"
			if f.field != nil && f.field.MapValue().Message() != nil {
				return p, f.field.MapValue().Message(), nil, false
			}
			return p, nil, nil, false
		}
		name, fd := f.key, protoreflect.FieldDescriptor(nil)
		if f.msg != nil {
			fd = f.msg.Fields().ByName(protoreflect.Name(f.key))
			if fd == nil {
				fd = f.msg.Fields().ByJSONName(f.key)
			}
			if fd != nil {
				name = string(fd.Name())
			}
		}
		p := name
		if f.path != "" {
			p = f.path + "." + name
		}
		if fd == nil {
			return p, nil, nil, false
		}
		if fd.IsMap() || fd.IsList() {
			return p, nil, fd, true
		}
		return p, fd.Message(), nil, false
	}
	// done marks the top frame's current value as read.
	done := func() {
		if len(stack) == 0 {
			return
		}
		f := stack[len(stack)-1]
		if f.array {
			f.index++
		} else {
			f.keyed = false
		}
	}
	for range len(data) + 1 { // at most one token per byte
		start := dec.InputOffset()
		tok, err := dec.Token()
		end := dec.InputOffset()
		hit := err != nil || (off >= int(start) && off < int(end))
		if err != nil {
			if len(stack) == 0 {
				return ""
			}
			if f := stack[len(stack)-1]; !f.array && !f.keyed {
				return f.path
			}
			p, _, _, _ := child()
			return p
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			top := stack[len(stack)-1]
			if hit {
				return top.path
			}
			stack = stack[:len(stack)-1]
			done()
			continue
		}
		if s, ok := tok.(string); ok && len(stack) > 0 && !stack[len(stack)-1].array && !stack[len(stack)-1].keyed {
			top := stack[len(stack)-1]
			top.key, top.keyed = s, true
			if hit {
				p, _, _, _ := child()
				return p
			}
			continue
		}
		p, msg, fd, container := child()
		if hit {
			return p
		}
		if d, ok := tok.(json.Delim); ok {
			nf := &frame{path: p, array: d == '['}
			switch {
			case container && fd != nil && fd.IsMap() && d == '{':
				nf.isMap, nf.field = true, fd
			case container && fd != nil && fd.IsList() && d == '[':
				nf.field = fd
			case d == '{':
				nf.msg = msg
			}
			if len(stack) >= maxDepth {
				return p
			}
			stack = append(stack, nf)
			continue
		}
		done()
	}
	return ""
}
