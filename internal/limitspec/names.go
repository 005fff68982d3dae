package limitspec

import (
	"fmt"
	"strconv"

	pb "leasehold/proto/leasehold/v1"
)

// ModeName is a mode as quotactl and limits files write it: "strict" or
// "bounded".
func ModeName(m pb.Mode) string {
	switch m {
	case pb.Mode_MODE_STRICT:
		return "strict"
	case pb.Mode_MODE_BOUNDED:
		return "bounded"
	case pb.Mode_MODE_UNSPECIFIED:
		return "unspecified"
	}
	return fmt.Sprintf("mode(%d)", int32(m))
}

// FallbackName is a region's fallback as quotactl and limits files write
// it: "closed", "local:A" or "open". A region without one (nil) is closed.
func FallbackName(fb *pb.Fallback) string {
	if fb == nil {
		return "closed"
	}
	switch fb.Kind {
	case pb.FallbackKind_FALLBACK_KIND_CLOSED:
		return "closed"
	case pb.FallbackKind_FALLBACK_KIND_OPEN:
		return "open"
	case pb.FallbackKind_FALLBACK_KIND_LOCAL:
		return "local:" + strconv.FormatInt(fb.LocalTokens, 10)
	case pb.FallbackKind_FALLBACK_KIND_UNSPECIFIED:
		return "unspecified"
	}
	return fmt.Sprintf("kind(%d)", int32(fb.Kind))
}
