package limitspec

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

func TestParseContract(t *testing.T) {
	for _, tc := range []struct{ in, out, err string }{
		{in: "3000", out: "3000"},
		{in: "limit=3000", out: "3000"},
		{in: "limit=3000 mode=bounded regions=eu,us fallback=us=open,eu=local:50 window=1h ttl=90s min-chunk=2 max-chunk=0 shadow=true",
			out: "limit=3000 mode=bounded regions=eu,us fallback=eu=local:50,us=open window=1h ttl=1m30s min-chunk=2 max-chunk=0 shadow=true"},
		{in: "mode=strict", out: "mode=strict"},
		{in: "burst=100 rate=20 regions=eu", out: "rate=20 burst=100 regions=eu"},
		{in: "rate=0", err: ">= 1"},
		{in: "burst=-1", err: ">= 1"},
		{in: "shadow=false", out: "shadow=false"},
		{in: "min-chunk=5", out: "min-chunk=5 max-chunk=0"},
		{in: "", err: "empty"},
		{in: "0", err: ">= 1"},
		{in: "limit=x", err: "limit=x"},
		{in: "mode=loose", err: "strict or bounded"},
		{in: "colour=red", err: "unknown field"},
		{in: "limit=1 limit=2", err: "twice"},
		{in: "fallback=eu", err: "REGION="},
		{in: "fallback=eu=local:0", err: "local:A"},
		{in: "fallback=eu=open,eu=closed", err: "twice"},
		{in: "regions=eu,,us", err: "empty region"},
		{in: "window=soon", err: "window="},
		{in: "limit", err: "FIELD=VALUE"},
		{in: strings.Repeat("x", 5000), err: "longer"},
	} {
		c, err := ParseContract(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseContract(%q) = %v, %v; want an error saying %q", tc.in, c, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseContract(%q): %v", tc.in, err)
			continue
		}
		if got := FormatContract(c); got != tc.out {
			t.Errorf("FormatContract(ParseContract(%q)) = %q, want %q", tc.in, got, tc.out)
		}
	}
	if c, _ := ParseContract("window=1h ttl=1m"); c.Window.AsDuration() != time.Hour || c.Lease.Ttl.AsDuration() != time.Minute {
		t.Errorf("window and ttl: %v", c)
	}
}

// FuzzParseContract: no input panics, and what parses formats to text
// that parses to the same contract.
func FuzzParseContract(f *testing.F) {
	f.Add("3000")
	f.Add("limit=3000 mode=bounded regions=eu,us fallback=eu=local:50 window=1h ttl=15s min-chunk=1 max-chunk=0 shadow=true")
	f.Add("fallback=a=b=c")
	f.Add("rate=20 burst=100 ttl=30s")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseContract(s)
		if err != nil {
			return
		}
		again, err := ParseContract(FormatContract(c))
		if err != nil {
			t.Fatalf("%q formats to %q, which does not parse: %v", s, FormatContract(c), err)
		}
		if !proto.Equal(c, again) {
			t.Fatalf("%q: %v formats to %q, which parses to %v", s, c, FormatContract(c), again)
		}
	})
}
