package lease_test

import (
	"fmt"
	"time"

	"leasehold/lease"
)

func ExampleWindowOf() {
	now := time.Date(2026, 5, 1, 12, 34, 56, 0, time.UTC)
	w := lease.WindowOf(now, time.Minute)
	fmt.Println("window", w.Index)
	fmt.Println("from", w.Start().UTC().Format(time.TimeOnly), "to", w.End().UTC().Format(time.TimeOnly))
	fmt.Println("left", w.Left(now))
	fmt.Println("next starts", w.Next().Start().UTC().Format(time.TimeOnly))
	// Output:
	// window 29627314
	// from 12:34:00 to 12:35:00
	// left 4s
	// next starts 12:35:00
}

func ExampleSchedule() {
	w := lease.WindowOf(time.Date(2026, 5, 1, 12, 34, 0, 0, time.UTC), time.Minute)
	ttl := 15 * time.Second

	// Early in the window the lease gets its whole ttl.
	fmt.Printf("%+v\n", lease.Schedule(w.Start().Add(10*time.Second), w, ttl))
	// Near the end it is clamped: no lease outlives its window.
	fmt.Printf("%+v\n", lease.Schedule(w.Start().Add(50*time.Second), w, ttl))
	// A lease for the next window, granted 5 s early, starts with it and
	// keeps its whole ttl.
	fmt.Printf("%+v\n", lease.Schedule(w.Start().Add(55*time.Second), w.Next(), ttl))
	// A window that is over gives an empty lease.
	fmt.Printf("%+v\n", lease.Schedule(w.End(), w, ttl))
	// Output:
	// {StartsIn:0s ExpiresIn:15s}
	// {StartsIn:0s ExpiresIn:10s}
	// {StartsIn:5s ExpiresIn:20s}
	// {StartsIn:0s ExpiresIn:0s}
}

func ExampleAllot() {
	// G = 600 tokens per 10 s; eu wants 480 tokens/s, us 20/s: fair
	// shares of 576 and 24. eu asks first, at the window's start.
	r := lease.SizeRequest{
		Pool: 600, Left: 10 * time.Second, Horizon: 5 * time.Second, G: 600,
		Region: "eu", Demands: []lease.RegionDemand{
			{Region: "eu", Rate: 480},
			{Region: "us", Rate: 20},
		},
	}
	a := lease.Allot(r)
	fmt.Printf("eu: %d of %d available\n", a.Tokens, a.Available)

	// eu asks again at once: what is left is us's.
	r.Pool, r.Demands[0].Granted = 600-a.Tokens, a.Tokens
	fmt.Printf("eu again: %+v\n", lease.Allot(r))

	// us asks: it gets its whole share.
	r.Region = "us"
	fmt.Println("us:", lease.Size(r))
	// Output:
	// eu: 576 of 576 available
	// eu again: {Tokens:0 Available:0 ShareSpent:true}
	// us: 24
}

func ExampleSize() {
	// G = 1000 tokens a minute; EU wants 1500/min, US 500/min.
	demands := []lease.RegionDemand{
		{Region: "eu", Rate: 1500.0 / 60},
		{Region: "us", Rate: 500.0 / 60},
	}
	r := lease.SizeRequest{
		Pool: 1000, Left: time.Minute, Horizon: 15 * time.Second,
		Region: "eu", Demands: demands,
	}
	// At the window's start the pool covers 15 s of everyone's demand
	// (375 + 125): each region gets what it asks.
	fmt.Println("pool 1000: eu", lease.Size(r))
	r.Region = "us"
	fmt.Println("pool 1000: us", lease.Size(r))

	// Later only 200 tokens are left: they are shared 3:1.
	r.Pool, r.Left = 200, 30*time.Second
	r.Region = "eu"
	fmt.Println("pool 200: eu", lease.Size(r))
	r.Region = "us"
	fmt.Println("pool 200: us", lease.Size(r))
	// Output:
	// pool 1000: eu 375
	// pool 1000: us 125
	// pool 200: eu 150
	// pool 200: us 50
}

func ExampleDeadline() {
	// The agent's own clock. In production these come from time.Now(),
	// whose monotonic reading the results keep.
	sent := time.Date(2026, 5, 1, 12, 34, 54, 950_000_000, time.UTC)
	received := sent.Add(100 * time.Millisecond) // one WAN round trip

	// The allocator answered a lease for the next window with this timing.
	tm := lease.Timing{StartsIn: 5 * time.Second, ExpiresIn: 20 * time.Second}

	// Expiry counts from when the request was sent, minus a margin for
	// clock drift: never later than the allocator's. The start counts from
	// when the reply arrived: never earlier.
	start := lease.StartAt(received, tm.StartsIn)
	deadline := lease.Deadline(sent, tm.ExpiresIn, 200*time.Millisecond)
	fmt.Println("spend from", start.Format("15:04:05.000"), "until", deadline.Format("15:04:05.000"))

	for _, now := range []time.Time{start.Add(-time.Millisecond), start, deadline.Add(-time.Millisecond), deadline} {
		fmt.Println(now.Format("15:04:05.000"), lease.Spendable(now, start, deadline))
	}
	// Output:
	// spend from 12:35:00.050 until 12:35:14.750
	// 12:35:00.049 false
	// 12:35:00.050 true
	// 12:35:14.749 true
	// 12:35:14.750 false
}

func ExampleLowWater() {
	// An agent spending 25 tokens/s whose renewals take up to 5 s asks
	// for more when its balance drops below 125 tokens.
	fmt.Println(lease.LowWater(25, 5*time.Second))
	// Output: 125
}

func ExampleRateEstimator() {
	e := lease.NewRateEstimator(5 * time.Second)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	// 10 tokens a second, reported every 100 ms, for 30 s.
	for now.Sub(t0) < 30*time.Second {
		now = now.Add(100 * time.Millisecond)
		e.Observe(now, 1)
	}
	fmt.Printf("busy: %.1f tokens/s\n", e.Rate(now))
	// Then silence for 30 s.
	fmt.Printf("quiet: %.2f tokens/s\n", e.Rate(now.Add(30*time.Second)))
	// Output:
	// busy: 10.0 tokens/s
	// quiet: 0.02 tokens/s
}
