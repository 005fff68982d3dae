package vocab

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateHashTag(t *testing.T) {
	for _, tc := range []struct {
		tag string
		ok  bool
	}{
		{"", true},
		{"atlas", true},
		{"tenant/atlas", true},
		{"a.b-c_D9", true},
		{strings.Repeat("x", MaxHashTagLen), true},
		{strings.Repeat("x", MaxHashTagLen+1), false},
		{"{atlas}", false},
		{"at{las", false},
		{"atlas}", false},
		{"a:b", false},
		{"a b", false},
		{"/atlas", false},
		{"a//b", false},
		{"é", false},
	} {
		err := ValidateHashTag("limit.hash_tag", tc.tag)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok %v", tc.tag, err, tc.ok)
		}
		var fe *FieldError
		if err != nil && (!errors.As(err, &fe) || fe.Field != "limit.hash_tag" || !errors.Is(err, ErrInvalid)) {
			t.Errorf("%q: %v, want a FieldError naming limit.hash_tag", tc.tag, err)
		}
	}
}

// FuzzValidateHashTag: no input panics, and an accepted tag is short and
// can never end or open a Redis Cluster hash tag, nor split a key.
func FuzzValidateHashTag(f *testing.F) {
	for _, s := range []string{"", "atlas", "tenant/atlas", "{x}", "a:b", strings.Repeat("y", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tag string) {
		if ValidateHashTag("hash_tag", tag) != nil {
			return
		}
		if len(tag) > MaxHashTagLen || strings.ContainsAny(tag, "{}: \n") {
			t.Fatalf("accepted %q", tag)
		}
	})
}
