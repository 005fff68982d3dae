package client

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"leasehold/regionagent/client/clienttest"
)

var errDenied = errors.New("denied")

// benchClient is a client of a fake agent on loopback TCP with a limit
// too large to run dry; with sub-leases it is warmed up until decisions
// come from a chunk.
func benchClient(b *testing.B, sub bool) *Client {
	b.Helper()
	ag := clienttest.NewAgent(time.Now)
	ag.SetLimit(testLimit, 1<<50, 10*time.Second, 10*time.Second)
	addr := ag.ServeTCP(b)
	opts := []Option{WithoutDenialCache()}
	if sub {
		opts = append(opts, WithSubLeases(SubLeaseConfig{HotRate: 1, Horizon: time.Second, IdleAfter: time.Minute}))
	}
	c, err := New(addr, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := c.Allow(ctx, testLimit, 1)
		if err != nil {
			b.Fatal(err)
		}
		if !sub || d.Source == SourceSubLease || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // warming the rate estimate up, not ordering
	}
	return c
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs f b.N times (in parallel if parallel) and reports
// decisions per second, the process's CPU per decision (the fake agent
// runs in the same process: for BenchmarkAllowCheck that includes the
// server side of the RPC) and the share of calls that failed (a Check
// past its 250ms deadline on a loaded machine).
func measure(b *testing.B, parallel bool, f func() error) {
	var errs atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if f() != nil {
					errs.Add(1)
				}
			}
		})
	} else {
		for b.Loop() {
			if f() != nil {
				errs.Add(1)
			}
		}
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(errs.Load())/float64(b.N), "errors/op")
	if errs.Load() > int64(b.N)/100 {
		b.Errorf("%d of %d calls failed", errs.Load(), b.N)
	}
}

// BenchmarkAllowSubLease: decisions from a local sub-lease (the chunk is
// refilled in the background as it runs low).
func BenchmarkAllowSubLease(b *testing.B) {
	c := benchClient(b, true)
	ctx := context.Background()
	var miss int
	measure(b, false, func() error {
		d, err := c.Allow(ctx, testLimit, 1)
		if d.Source != SourceSubLease {
			miss++
		}
		return err
	})
	b.ReportMetric(float64(miss)/float64(b.N), "misses/op")
}

// BenchmarkAllowSubLeaseParallel: the same from GOMAXPROCS goroutines
// (they share the chunk's counter).
func BenchmarkAllowSubLeaseParallel(b *testing.B) {
	c := benchClient(b, true)
	ctx := context.Background()
	measure(b, true, func() error {
		_, err := c.Allow(ctx, testLimit, 1)
		return err
	})
}

// BenchmarkAllowCheck: a plain Check per decision through the fake agent
// over loopback TCP.
func BenchmarkAllowCheck(b *testing.B) {
	c := benchClient(b, false)
	ctx := context.Background()
	measure(b, false, func() error {
		_, err := c.Allow(ctx, testLimit, 1)
		return err
	})
}

// BenchmarkAllowCheckParallel: concurrent Checks (gRPC multiplexes them
// on one connection).
func BenchmarkAllowCheckParallel(b *testing.B) {
	c := benchClient(b, false)
	ctx := context.Background()
	b.SetParallelism(8)
	measure(b, true, func() error {
		_, err := c.Allow(ctx, testLimit, 1)
		return err
	})
}

// BenchmarkRateAllow is the floor the sub-lease decision is held to:
// golang.org/x/time/rate's Limiter.Allow, a single-process token bucket
// with a mutex, in the same run on the same machine.
func BenchmarkRateAllow(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1e12), 1<<40) // never dry, the arithmetic runs
	measure(b, false, func() error {
		if !l.Allow() {
			return errDenied
		}
		return nil
	})
}

// BenchmarkRateAllowParallel: the same from GOMAXPROCS goroutines.
func BenchmarkRateAllowParallel(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1e12), 1<<40) // never dry, the arithmetic runs
	measure(b, true, func() error {
		if !l.Allow() {
			return errDenied
		}
		return nil
	})
}

// BenchmarkSweep: one sweep of a client that knows 100,000 limits, none
// holding anything (each asked of once): the usual pass (every 250 ms),
// which visits only limits that hold something, and the full pass (one in
// fullSweep), which visits them all.
//
//	go test -run '^$' -bench BenchmarkSweep ./regionagent/client/
func BenchmarkSweep(b *testing.B) {
	const known = 100000
	c := NewInProcess(nil, "bench-", WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: time.Second, IdleAfter: time.Second}),
		withoutSweeper())
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	for i := range known {
		c.AskedOf("tenant/"+strconv.Itoa(i), 1, 1000)
	}
	now := c.mono()
	for _, pass := range []struct {
		name  string
		sweep func(int64)
	}{{"usual", c.sweepHeld}, {"full", c.sweep}} {
		b.Run("pass="+pass.name, func(b *testing.B) {
			for b.Loop() {
				pass.sweep(now)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/known, "ns/limit")
		})
	}
}
