package simulations

import (
	"fmt"
	"strings"
)

// Summary is one line of a run's key figures.
func Summary(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "adm/G max %.3f mean %.3f | over max %d (%.1f%%G, %d win) | bound %s viol %d | strand max %.1f%% mean %.2f%% | calls/s %.2f | lat mean %.1fms p99 %.1fms | req %d adm %d den %d unav %d",
		r.MaxAdmittedG, r.MeanAdmittedG, r.MaxOvershoot, 100*r.MaxOvershootG, r.OvershootWindows, boundText(r), r.BoundViolations,
		100*r.MaxStrandedG, 100*r.MeanStrandedG, r.AllocCallsPerSec, r.LatencyMeanMs, r.LatencyP99Ms, r.Requests, r.Admitted, r.Denied, r.Unavailable)
	for _, n := range r.Notes {
		b.WriteString(" | " + n)
	}
	return b.String()
}

func boundText(r Result) string {
	switch {
	case r.BoundInfinite:
		return "+inf"
	case r.Strategy == Independent:
		return fmt.Sprintf("%d", r.Bound)
	default:
		return fmt.Sprintf("%d", r.Bound)
	}
}
