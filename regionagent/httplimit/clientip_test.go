package httplimit

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted, err := ParsePrefixes("10.0.0.0/8, 192.0.2.1, 2001:db8:ffff::/48")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		want   string
	}{
		{"untrusted peer, no header", "203.0.113.5:1234", nil, "203.0.113.5"},
		{"untrusted peer spoofs the header", "203.0.113.5:1234", []string{"1.2.3.4"}, "203.0.113.5"},
		{"untrusted peer spoofs a trusted hop", "203.0.113.5:1234", []string{"198.51.100.7, 10.0.0.2"}, "203.0.113.5"},
		{"trusted peer, no header", "10.0.0.1:80", nil, "10.0.0.1"},
		{"trusted peer, one hop", "10.0.0.1:80", []string{"198.51.100.7"}, "198.51.100.7"},
		{"client prepends a spoofed hop", "10.0.0.1:80", []string{"1.2.3.4, 198.51.100.7"}, "198.51.100.7"},
		{"client claims to be a trusted proxy", "10.0.0.1:80", []string{"10.0.0.5, 198.51.100.7"}, "198.51.100.7"},
		{"trusted hops are skipped", "10.0.0.1:80", []string{"198.51.100.7, 10.0.0.2, 192.0.2.1"}, "198.51.100.7"},
		{"several header lines", "10.0.0.1:80", []string{"1.1.1.1", "198.51.100.7, 10.0.0.3"}, "198.51.100.7"},
		{"every hop trusted", "10.0.0.1:80", []string{"10.0.0.9, 10.0.0.8"}, "10.0.0.9"},
		{"garbage left of the client", "10.0.0.1:80", []string{"garbage, 198.51.100.7"}, "198.51.100.7"},
		{"garbage written by the nearest hop", "10.0.0.1:80", []string{"198.51.100.7, garbage"}, "10.0.0.1"},
		{"garbage behind a trusted hop", "10.0.0.1:80", []string{"garbage, 10.0.0.7"}, "10.0.0.7"},
		{"hop with a port", "10.0.0.1:80", []string{"198.51.100.7:5555"}, "198.51.100.7"},
		{"IPv6 hop with a port", "10.0.0.1:80", []string{"[2001:db8::7]:443"}, "2001:db8::7"},
		{"empty entries", "10.0.0.1:80", []string{" , 198.51.100.7 ,"}, "198.51.100.7"},
		{"IPv6 untrusted peer", "[2001:db8::1]:443", []string{"1.2.3.4"}, "2001:db8::1"},
		{"IPv6 trusted peer", "[2001:db8:ffff::1]:443", []string{"2001:db8::9"}, "2001:db8::9"},
		{"IPv4-mapped trusted peer", "[::ffff:10.0.0.1]:80", []string{"198.51.100.7"}, "198.51.100.7"},
		{"IPv4-mapped hop", "10.0.0.1:80", []string{"::ffff:198.51.100.7"}, "198.51.100.7"},
		{"peer without a port", "10.0.0.1", []string{"198.51.100.7"}, "198.51.100.7"},
		{"bad peer", "nonsense", []string{"198.51.100.7"}, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := ClientIP(r, trusted).String(); got != tc.want {
				t.Fatalf("ClientIP = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestClientIPNothingTrusted(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:80"
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	if got := ClientIP(r, nil); got != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("ClientIP = %v with no trusted proxies", got)
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes(" 10.1.2.3/8,192.0.2.1 ,, ::1 ")
	if err != nil || len(got) != 3 || got[0].String() != "10.0.0.0/8" || got[1].String() != "192.0.2.1/32" || got[2].String() != "::1/128" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0"} {
		if _, err := ParsePrefixes(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
