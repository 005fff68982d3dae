package vocab

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check func(field, v string) error
		in    string
		want  string // the error's text; "" for valid
	}{
		{"limit", ValidateLimitID, "tenant/atlas", ""},
		{"limit", ValidateLimitID, "a.b/c_d-1", ""},
		{"limit", ValidateLimitID, "", "id: required"},
		{"limit", ValidateLimitID, strings.Repeat("x", 200), ""},
		{"limit", ValidateLimitID, strings.Repeat("x", 201), "id: longer than 200 characters"},
		{"limit", ValidateLimitID, "a//b", `id: "a//b": use [A-Za-z0-9._-] in segments separated by single '/'`},
		{"limit", ValidateLimitID, "/a", `id: "/a": use [A-Za-z0-9._-] in segments separated by single '/'`},
		{"limit", ValidateLimitID, "a b", `id: "a b": use [A-Za-z0-9._-] in segments separated by single '/'`},
		{"limit", ValidateLimitID, "a/../b", `id: "a/../b": a segment may not be ".."`},
		{"limit", ValidateLimitID, "./a", `id: "./a": a segment may not be "."`},
		{"limit", ValidateLimitID, "a/.b", ""},
		{"request", ValidateRequestID, "r-1.x_y", ""},
		{"request", ValidateRequestID, "", "id: required"},
		{"request", ValidateRequestID, strings.Repeat("x", 128), ""},
		{"request", ValidateRequestID, strings.Repeat("x", 129), "id: longer than 128 characters"},
		{"request", ValidateRequestID, "a/b", `id: "a/b": use only [A-Za-z0-9._-]`},
		{"region", ValidateRegion, "eu", ""},
		{"region", ValidateRegion, "us-east-1", ""},
		{"region", ValidateRegion, "", "id: required"},
		{"region", ValidateRegion, strings.Repeat("a", 33), "id: longer than 32 characters"},
		{"region", ValidateRegion, "EU", `id: "EU": use [a-z0-9-], starting and ending with a letter or digit`},
		{"region", ValidateRegion, "-eu", `id: "-eu": use [a-z0-9-], starting and ending with a letter or digit`},
		{"region", ValidateRegion, "eu-", `id: "eu-": use [a-z0-9-], starting and ending with a letter or digit`},
	} {
		err := tc.check("id", tc.in)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s %q: %v, want valid", tc.name, tc.in, err)
			}
			continue
		}
		var fe *FieldError
		if err == nil || err.Error() != tc.want || !errors.As(err, &fe) || fe.Field != "id" || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s %q: %v, want a FieldError %q matching ErrInvalid", tc.name, tc.in, err, tc.want)
		}
	}
}

func TestFieldError(t *testing.T) {
	err := InvalidField("limit.window", "must be >= %v, got %v", "1s", "10ms")
	if err.Error() != "limit.window: must be >= 1s, got 10ms" || !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v", err)
	}
	if errors.Is(errors.New("limit.window: x"), ErrInvalid) {
		t.Fatal("a plain error matched ErrInvalid")
	}
}

// TestStandardLibraryOnly: the package imports nothing outside the
// standard library, directly or not, so that clients and the agent can
// import it without linking a server.
func TestStandardLibraryOnly(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goCmd, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "leasehold/internal/vocab" {
			t.Errorf("vocab depends on %s, outside the standard library", p)
		}
	}
}
