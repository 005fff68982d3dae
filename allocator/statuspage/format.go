package statuspage

import (
	"math"
	"strconv"
	"strings"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// fmtInt writes n with thousands separators: 1,234,567.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fmtCompact writes an axis label: 0, 750, 1.5k, 2M, 1.2G.
func fmtCompact(v float64) string {
	for _, u := range []struct {
		div  float64
		unit string
	}{{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if math.Abs(v) >= u.div {
			return strconv.FormatFloat(math.Round(v/u.div*10)/10, 'f', -1, 64) + u.unit
		}
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// fmtDuration writes a window length without zero parts: 1m, 2s, 1h30m.
func fmtDuration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// px writes an SVG coordinate with at most one decimal.
func px(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// addSat adds without wrapping past math.MaxInt64.
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// windowDesc is a window limit's W, with its phase offset when it has
// one: "1m", or "1m (phase 17s)" for windows starting at :17 past; a
// calendar limit's windows as "calendar month, Europe/Berlin".
func windowDesc(l *pb.Limit) string {
	if c := l.GetCalendar(); c != nil {
		return "calendar " + c.GetUnit() + ", " + c.GetZone()
	}
	w := fmtDuration(l.GetWindow().AsDuration())
	if p := l.GetWindowPhase().AsDuration(); p != 0 {
		w += " (phase " + fmtDuration(p) + ")"
	}
	return w
}
