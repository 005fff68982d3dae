package simulations

import (
	"time"

	"leasehold/lease"
)

// local is the independent and the static-split strategies: each region
// counts admissions per window of its own (Redis) clock against a fixed
// per-region limit, G or its share of G. No call leaves the region.
type local struct {
	w      *world
	static bool
	counts []map[int64]int64 // [region*limits+limit] window -> admitted
}

func newLocal(w *world, static bool) *local {
	l := &local{w: w, static: static, counts: make([]map[int64]int64, len(w.sc.Regions)*len(w.sc.Limits))}
	for i := range l.counts {
		l.counts[i] = map[int64]int64{}
	}
	return l
}

// share is the static split of G: G / regions, the remainder to the first
// regions.
func share(g int64, region, regions int) int64 {
	s := g / int64(regions)
	if int64(region) < g%int64(regions) {
		s++
	}
	return s
}

func (l *local) start() {}

func (l *local) check(region, limit int, start time.Duration, done func(outcome, time.Duration)) {
	sc := l.w.sc
	g := sc.Limits[limit].G
	if l.static {
		g = share(g, region, len(sc.Regions))
	}
	win := lease.WindowOf(sc.Regions[region].Redis.At(start), sc.Window).Index
	c := l.counts[region*len(sc.Limits)+limit]
	if c[win] >= g {
		l.w.eng.After(sc.LocalRTT, func() { done(denied, start) })
		return
	}
	c[win]++
	delete(c, win-2)
	l.w.eng.After(sc.LocalRTT, func() { done(admitted, start) })
}

func (l *local) fault(Fault, bool) {}

func (l *local) finish(r *Result) {
	// Neither strategy computes a bound; these are what they allow with
	// aligned clocks. Each region counts windows on its own clock, so an
	// offset moves admissions across the allocator's window boundary and
	// can add to them.
	if l.static {
		r.BoundNote = "0 with aligned clocks"
		return
	}
	for _, ls := range l.w.sc.Limits {
		r.Bound = max(r.Bound, int64(len(l.w.sc.Regions)-1)*ls.G)
	}
	r.BoundNote = "(regions - 1) x G with aligned clocks"
}

// central is the central authority: every request is decided by one exact
// counter per (limit, window) in the home region, on the allocator's clock.
// A request waits for the WAN round trip; one that gets no answer within
// the timeout (partition, loss, authority down) is answered unavailable.
type central struct {
	w       *world
	counts  []map[int64]int64
	calls   int64
	timeout time.Duration
}

func newCentral(w *world) *central {
	c := &central{w: w, counts: make([]map[int64]int64, len(w.sc.Limits)), timeout: time.Second}
	for i := range c.counts {
		c.counts[i] = map[int64]int64{}
	}
	return c
}

func (c *central) start() {}

func (c *central) check(region, limit int, start time.Duration, done func(outcome, time.Duration)) {
	w := c.w
	name := w.sc.Regions[region].Name
	answered := false
	finish := func(o outcome, at time.Duration) {
		if !answered {
			answered = true
			done(o, at)
		}
	}
	w.eng.After(c.timeout, func() { finish(unavailable, start) })
	w.net.Send(name, homeHost, func() {
		if !w.allocUp {
			return
		}
		c.calls++
		at := w.eng.Now()
		win := lease.WindowOf(w.sc.Home.At(at), w.sc.Window).Index
		o := denied
		if m := c.counts[limit]; m[win] < w.sc.Limits[limit].G {
			m[win]++
			delete(m, win-2)
			o = admitted
		}
		w.net.Send(homeHost, name, func() { finish(o, at) })
	})
}

func (c *central) fault(Fault, bool) {}

func (c *central) finish(r *Result) {
	r.AllocCallsPerSec = float64(c.calls) / c.w.sc.Duration().Seconds()
	r.BoundNote = "0 (one exact counter)"
	if r.MaxOvershoot > 0 {
		r.BoundViolations++
	}
}
