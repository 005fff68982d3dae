package auth

import (
	"reflect"
	"strings"
	"testing"
)

const goodHash = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestParseConfig(t *testing.T) {
	good := "users:\n  - name: alice\n    role: admin\n    tokens: [" + goodHash + "]\n" +
		"  - name: bob\n    role: editor\n    scopes: [tenant/*, team/a]\n  - name: carol\n    role: viewer\n"
	c, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{Users: []UserConfig{
		{Name: "alice", Role: "admin", Tokens: []string{goodHash}},
		{Name: "bob", Role: "editor", Scopes: []string{"tenant/*", "team/a"}},
		{Name: "carol", Role: "viewer"},
	}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v", c)
	}
	// Marshal writes what ParseConfig reads back.
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if c2, err := ParseConfig(b); err != nil || !reflect.DeepEqual(c2, c) {
		t.Fatalf("round trip: %+v %v\n%s", c2, err, b)
	}
	if c, err := ParseConfig(nil); err != nil || len(c.Users) != 0 {
		t.Fatalf("empty file: %v %v", c, err)
	}

	for _, tc := range []struct{ in, want string }{
		{"users:\n  - name: alice\n    role: root\n", "users[0].role"},
		{"users:\n  - name: a b\n    role: admin\n", "users[0].name"},
		{"users:\n  - name: a\n    role: admin\n  - name: a\n    role: viewer\n", `users[1].name: "a" appears twice`},
		{"users:\n  - name: a\n    role: editor\n", "users[0].scopes: an editor needs"},
		{"users:\n  - name: a\n    role: viewer\n    scopes: [x]\n", "users[0].scopes: only editors"},
		{"users:\n  - name: a\n    role: editor\n    scopes: [ten*ant]\n", "users[0].scopes[0]"},
		{"users:\n  - name: a\n    role: admin\n    tokens: [lht_plaintexttoken]\n", "users[0].tokens[0]: want \"sha256:\""},
		{"users:\n  - name: a\n    role: admin\n    tokens: [" + strings.ToUpper(goodHash) + "]\n", "users[0].tokens[0]"},
		{"users:\n  - name: a\n    role: admin\n    tokens: [" + goodHash + "]\n  - name: b\n    role: admin\n    tokens: [" + goodHash + "]\n",
			"users[1].tokens[0]: the same token hash as users[0].tokens[0]"},
		{"users:\n  - name: a\n    role: admin\n    password: x\n", "field password not found"},
		{"users: []\n---\nusers: []\n", "want one document"},
		{"users: {a: b}\n", "yaml"},
	} {
		_, err := ParseConfig([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.in, err, tc.want)
		}
	}
}

func TestTokenHashing(t *testing.T) {
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tok2, _ := NewToken()
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) != len(TokenPrefix)+43 || tok == tok2 {
		t.Fatalf("tokens %q %q", tok, tok2)
	}
	h := HashToken(tok)
	if strings.Contains(h, tok) || strings.Contains(h, tok[len(TokenPrefix):]) || h == HashToken(tok2) {
		t.Fatalf("hash %q reveals or collides", h)
	}
	if err := validHash(h); err != nil {
		t.Fatal(err)
	}
	// What is stored is the hash: an auth file with it authenticates the
	// token and not the hash itself.
	u, err := NewUsers(&Config{Users: []UserConfig{{Name: "alice", Role: "admin", Tokens: []string{h}}}})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := u.Authenticate(nil, tok); err != nil || p.Name != "alice" || p.Via != ViaToken {
		t.Fatalf("token: %v %v", p, err)
	}
	for _, bad := range []string{h, strings.TrimPrefix(h, "sha256:"), tok2, tok + "x", strings.Repeat("a", 10000)} {
		if _, err := u.Authenticate(nil, bad); FailureReason(err) != ReasonBadToken {
			t.Errorf("%.20q: %v, want %s", bad, err, ReasonBadToken)
		}
	}
}

// FuzzParseConfig: no input panics, and what is accepted is valid and
// survives Marshal and ParseConfig unchanged.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("users:\n  - name: alice\n    role: admin\n    tokens: [" + goodHash + "]\n"))
	f.Add([]byte("users:\n  - name: bob\n    role: editor\n    scopes: [tenant/*]\n"))
	f.Add([]byte("users: []\n"))
	f.Add([]byte("users:\n  - &a {name: x, role: viewer}\n  - *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ParseConfig(b)
		if err != nil {
			t.Fatalf("re-reading %q: %v", b, err)
		}
		if len(c2.Users) != len(c.Users) {
			t.Fatalf("round trip changed the users: %+v -> %+v", c, c2)
		}
		if _, err := NewUsers(c); err != nil {
			t.Fatal(err)
		}
	})
}

// BenchmarkAuthenticateToken: one token check against 100 users (every
// stored hash compared).
func BenchmarkAuthenticateToken(b *testing.B) {
	c := &Config{}
	var last string
	for i := range 100 {
		tok, _ := NewToken()
		last = tok
		c.Users = append(c.Users, UserConfig{Name: "u" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + strings.Repeat("0", i/26), Role: "viewer", Tokens: []string{HashToken(tok)}})
	}
	u, err := NewUsers(c)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u.Authenticate(nil, last); err != nil {
			b.Fatal(err)
		}
	}
}
