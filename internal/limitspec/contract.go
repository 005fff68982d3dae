package limitspec

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// A contract as quotactl and limits files write it (docs/quotactl.md,
// "plans set"): "N" for a contract that replaces G only, otherwise
// space-separated FIELD=VALUE items, each a field the contract replaces:
//
//	limit=3000 mode=bounded regions=eu,us fallback=eu=local:50,us=closed
//	window=1h ttl=15s min-chunk=1 max-chunk=0 shadow=true
//	rate=20 burst=100 (a bucket plan's: tokens per the plan's rate period)
//
// ttl, min-chunk and max-chunk are the contract's lease settings, which
// replace the plan's together (one given, the others take their
// defaults).

// maxContractSpec bounds the text of one contract.
const maxContractSpec = 4096

// FormatContract writes c in the syntax ParseContract reads.
func FormatContract(c *pb.Contract) string {
	if c == nil {
		return ""
	}
	if gOnly(c) {
		return strconv.FormatInt(c.LimitTokens, 10)
	}
	var parts []string
	if c.LimitTokens != 0 {
		parts = append(parts, "limit="+strconv.FormatInt(c.LimitTokens, 10))
	}
	if c.RateTokens != 0 {
		parts = append(parts, "rate="+strconv.FormatInt(c.RateTokens, 10))
	}
	if c.BurstTokens != 0 {
		parts = append(parts, "burst="+strconv.FormatInt(c.BurstTokens, 10))
	}
	if c.Mode != pb.Mode_MODE_UNSPECIFIED {
		parts = append(parts, "mode="+ModeName(c.Mode))
	}
	if len(c.Regions) > 0 {
		parts = append(parts, "regions="+strings.Join(c.Regions, ","))
	}
	if len(c.Fallback) > 0 {
		var fbs []string
		for _, r := range slices.Sorted(maps.Keys(c.Fallback)) {
			fbs = append(fbs, r+"="+FallbackName(c.Fallback[r]))
		}
		parts = append(parts, "fallback="+strings.Join(fbs, ","))
	}
	if c.Window != nil {
		parts = append(parts, "window="+shortDuration(c.Window.AsDuration()))
	}
	if ls := c.Lease; ls != nil {
		if ls.Ttl != nil {
			parts = append(parts, "ttl="+shortDuration(ls.Ttl.AsDuration()))
		}
		parts = append(parts, "min-chunk="+strconv.FormatInt(ls.MinChunk, 10), "max-chunk="+strconv.FormatInt(ls.MaxChunk, 10))
		if ls.Standing != 0 {
			parts = append(parts, "standing="+strconv.FormatInt(ls.Standing, 10))
		}
	}
	if c.Shadow != nil {
		parts = append(parts, "shadow="+strconv.FormatBool(*c.Shadow))
	}
	return strings.Join(parts, " ")
}

// gOnly reports whether c replaces G and nothing else.
func gOnly(c *pb.Contract) bool {
	return c.LimitTokens != 0 && c.Mode == pb.Mode_MODE_UNSPECIFIED && len(c.Regions) == 0 && len(c.Fallback) == 0 &&
		c.Lease == nil && c.Shadow == nil && c.Window == nil && c.RateTokens == 0 && c.BurstTokens == 0
}

func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// ParseContract reads a contract written as FormatContract writes it. It
// checks the syntax only: what the contract makes of the tenant's limit
// is checked by ValidateLimit, with the plan.
func ParseContract(s string) (*pb.Contract, error) {
	if len(s) > maxContractSpec {
		return nil, fmt.Errorf("longer than %d bytes", maxContractSpec)
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("empty: want N (the tenant's G) or FIELD=VALUE items, e.g. \"limit=3000 mode=bounded\"")
	}
	if !strings.Contains(s, "=") {
		g, err := strconv.ParseInt(s, 10, 64)
		if err != nil || g < 1 {
			return nil, fmt.Errorf("%q: want a whole number of tokens >= 1, or FIELD=VALUE items", clipSpec(s))
		}
		return &pb.Contract{LimitTokens: g}, nil
	}
	c := &pb.Contract{}
	seen := map[string]bool{}
	lease := func() *pb.LeaseSettings {
		if c.Lease == nil {
			c.Lease = &pb.LeaseSettings{}
		}
		return c.Lease
	}
	for item := range strings.FieldsSeq(s) {
		key, val, ok := strings.Cut(item, "=")
		if !ok || val == "" {
			return nil, fmt.Errorf("%q: want FIELD=VALUE", clipSpec(item))
		}
		if seen[key] {
			return nil, fmt.Errorf("%s given twice", clipSpec(key))
		}
		seen[key] = true
		var err error
		switch key {
		case "limit":
			c.LimitTokens, err = positive(val)
		case "rate":
			c.RateTokens, err = positive(val)
		case "burst":
			c.BurstTokens, err = positive(val)
		case "mode":
			switch val {
			case "strict":
				c.Mode = pb.Mode_MODE_STRICT
			case "bounded":
				c.Mode = pb.Mode_MODE_BOUNDED
			default:
				err = errors.New("want strict or bounded")
			}
		case "regions":
			c.Regions = strings.Split(val, ",")
			if slices.Contains(c.Regions, "") {
				err = errors.New("want R,... with no empty region")
			}
		case "fallback":
			c.Fallback = map[string]*pb.Fallback{}
			for fb := range strings.SplitSeq(val, ",") {
				r, kind, ok := strings.Cut(fb, "=")
				if !ok || r == "" {
					err = errors.New("want REGION=closed|local:A|open, comma separated")
					break
				}
				if _, dup := c.Fallback[r]; dup {
					err = fmt.Errorf("region %q given twice", clipSpec(r))
					break
				}
				if c.Fallback[r], err = ParseFallback(kind); err != nil {
					break
				}
			}
		case "window":
			var d time.Duration
			if d, err = time.ParseDuration(val); err == nil {
				c.Window = durationpb.New(d)
			}
		case "ttl":
			var d time.Duration
			if d, err = time.ParseDuration(val); err == nil {
				lease().Ttl = durationpb.New(d)
			}
		case "min-chunk":
			lease().MinChunk, err = nonNegative(val)
		case "max-chunk":
			lease().MaxChunk, err = nonNegative(val)
		case "standing":
			lease().Standing, err = nonNegative(val)
		case "shadow":
			var b bool
			if b, err = strconv.ParseBool(val); err == nil {
				c.Shadow = &b
			}
		default:
			return nil, fmt.Errorf("unknown field %q: want limit, rate, burst, mode, regions, fallback, window, ttl, min-chunk, max-chunk, standing or shadow", clipSpec(key))
		}
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %v", key, clipSpec(val), err)
		}
	}
	return c, nil
}

// ParseFallback reads a fallback as FallbackName writes it.
func ParseFallback(s string) (*pb.Fallback, error) {
	switch s {
	case "closed":
		return &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}, nil
	case "open":
		return &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}, nil
	}
	a, ok := strings.CutPrefix(s, "local:")
	if !ok {
		return nil, fmt.Errorf("unknown fallback %q (want closed, local:A or open)", clipSpec(s))
	}
	n, err := strconv.ParseInt(a, 10, 64)
	if err != nil || n < 1 || n > vocab.MaxTokens {
		return nil, fmt.Errorf("want local:A with A a whole number from 1 to %d, got %q", vocab.MaxTokens, clipSpec(a))
	}
	return &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: n}, nil
}

func positive(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, errors.New("want a whole number >= 1")
	}
	return n, nil
}

func nonNegative(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("want a whole number >= 0")
	}
	return n, nil
}

func clipSpec(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
