package lease

import (
	"fmt"
	"testing"
	"time"
)

// Sinks keep the compiler from optimising the benchmarked calls away.
var (
	sinkInt    int64
	sinkWindow Window
	sinkTiming Timing
	sinkFloat  float64
)

func BenchmarkSize(b *testing.B) {
	for _, n := range []int{2, 10} {
		b.Run(fmt.Sprintf("regions=%d", n), func(b *testing.B) {
			r := benchRequest(n)
			b.ReportAllocs()
			for b.Loop() {
				sinkInt = Size(r)
			}
		})
	}
}

func BenchmarkWindowOf(b *testing.B) {
	now := time.Date(2026, 5, 1, 12, 34, 56, 789, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		sinkWindow = WindowOf(now, time.Minute)
	}
}

func BenchmarkSchedule(b *testing.B) {
	now := time.Date(2026, 5, 1, 12, 34, 56, 789, time.UTC)
	w := WindowOf(now, time.Minute).Next()
	b.ReportAllocs()
	for b.Loop() {
		sinkTiming = Schedule(now, w, 15*time.Second)
	}
}

func BenchmarkRateEstimator(b *testing.B) {
	e := NewRateEstimator(DefaultTau)
	now := time.Date(2026, 5, 1, 12, 34, 56, 789, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		e.Observe(now, 1)
		sinkFloat = e.Rate(now)
	}
}
