package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the address of the client a request came from, trusting
// X-Forwarded-For only as far as it was written by trusted proxies.
//
// If the peer (r.RemoteAddr) is not in trusted, it is the client: a
// client-supplied X-Forwarded-For is ignored. If the peer is a trusted
// proxy, X-Forwarded-For is read from the right (the hop nearest to us)
// and the first address that is not a trusted proxy is the client. Every
// trusted proxy appends the address it received the request from, so
// nothing left of that address can be trusted. If every listed hop is
// trusted, the leftmost one is returned; if an entry cannot be parsed, the
// nearest trusted hop so far is returned (what wrote the bad entry is not
// known). An unparsable RemoteAddr gives the zero Addr.
//
// IPv4-mapped IPv6 addresses are unmapped before matching. Only
// X-Forwarded-For is read (not Forwarded).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHop(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	client := peer
	values := r.Header.Values("X-Forwarded-For")
	for i := len(values) - 1; i >= 0; i-- {
		hops := strings.Split(values[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			h := strings.TrimSpace(hops[j])
			if h == "" {
				continue
			}
			a := parseHop(h)
			if !a.IsValid() {
				return client
			}
			client = a
			if !isTrusted(a, trusted) {
				return a
			}
		}
	}
	return client
}

// parseHop parses "addr", "addr:port" or "[addr]:port".
func parseHop(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParsePrefixes parses comma-separated CIDRs or bare addresses (a bare
// address is a /32 or /128), e.g. "10.0.0.0/8, 192.0.2.7".
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, err
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}
