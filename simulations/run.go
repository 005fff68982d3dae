package simulations

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"leasehold/lease"
	"leasehold/overshoot"
)

// outcome is what a request got.
type outcome int

const (
	admitted    outcome = iota
	denied              // over the limit
	unavailable         // the limiter could not decide (partition, fallback closed)
)

// world is one run: a scenario, a strategy and a seed.
type world struct {
	sc       *Scenario
	seed     uint64
	eng      *Engine
	net      *Network
	rec      *recorder
	regionUp []bool
	allocUp  bool
	impl     impl
	// onAdmit, when set, sees every admitted request: its region, its
	// limit and the true time of its decision (RunKinds).
	onAdmit func(region, limit int, at time.Duration)
}

// impl is a strategy's behaviour.
type impl interface {
	start()
	check(region, limit int, start time.Duration, done func(o outcome, at time.Duration))
	fault(f Fault, begin bool)
	finish(r *Result)
}

const homeHost = "home"

// stream returns a PCG source for one purpose of a run, so that adding
// random draws to one part of the simulator does not change the others.
func stream(seed uint64, purpose, index uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15*(purpose+1), index*0xbf58476d1ce4e5b9+purpose))
}

// Run plays scenario sc with strategy s and seed, and measures it.
func Run(sc Scenario, s Strategy, seed uint64) Result { return run(sc, s, seed, nil) }

func run(sc Scenario, s Strategy, seed uint64, onAdmit func(region, limit int, at time.Duration)) Result {
	sc.Limits = slices.Clone(sc.Limits) // defaults writes; runs may share a Scenario
	sc.defaults()
	w := &world{sc: &sc, seed: seed, eng: &Engine{}, onAdmit: onAdmit}
	w.net = NewNetwork(w.eng, stream(seed, 1, 0))
	w.regionUp = make([]bool, len(sc.Regions))
	w.allocUp = true
	for i, r := range sc.Regions {
		w.regionUp[i] = true
		w.net.SetLink(r.Name, homeHost, Link{Delay: r.RTT / 2, Jitter: r.Jitter, Loss: r.Loss, Dup: r.Dup})
	}
	w.rec = newRecorder(&sc)
	switch s {
	case Independent, StaticSplit:
		w.impl = newLocal(w, s == StaticSplit)
	case Central:
		w.impl = newCentral(w)
	default:
		w.impl = newLeasehold(w)
	}
	w.impl.start()
	for i := range sc.Flows {
		w.startFlow(i)
	}
	for _, f := range sc.Faults {
		w.eng.At(f.At, func() { w.applyFault(f, true) })
		if f.Duration > 0 && f.Kind != RegionLoss {
			w.eng.At(f.At+f.Duration, func() { w.applyFault(f, false) })
		}
	}
	end := sc.Duration()
	w.eng.Run(end + 2*time.Second) // let in-flight work settle; only full windows count
	res := w.rec.result(&sc, s)
	res.Events = w.eng.events
	w.impl.finish(&res)
	return res
}

func (w *world) applyFault(f Fault, begin bool) {
	switch f.Kind {
	case Partition:
		w.net.Cut(w.sc.Regions[f.Region].Name, homeHost, begin)
	case RegionLoss:
		w.regionUp[f.Region] = false
		w.net.SetDown(w.sc.Regions[f.Region].Name, true)
	case AllocatorFailover:
		w.allocUp = !begin
		w.net.SetDown(homeHost, begin)
	}
	w.impl.fault(f, begin)
}

// startFlow schedules a flow's arrivals. Each flow draws from its own
// stream, so every strategy sees the same arrivals.
func (w *world) startFlow(i int) {
	f := w.sc.Flows[i]
	rng := stream(w.seed, 2, uint64(i))
	end := w.sc.Duration()
	phase := 0
	rateAt := func(t time.Duration) (perMin float64, until time.Duration) {
		for phase+1 < len(f.Phases) && f.Phases[phase+1].At <= t {
			phase++
		}
		until = end
		if phase+1 < len(f.Phases) {
			until = f.Phases[phase+1].At
		}
		if len(f.Phases) == 0 || f.Phases[phase].At > t {
			return 0, until
		}
		return f.Phases[phase].PerMin, until
	}
	var next func(from time.Duration)
	next = func(from time.Duration) {
		for from < end {
			perMin, until := rateAt(from)
			if perMin <= 0 {
				from = until
				continue
			}
			mean := float64(time.Minute) / perMin
			var gap time.Duration
			if f.Poisson {
				gap = time.Duration(rng.ExpFloat64() * mean)
			} else {
				gap = time.Duration(mean)
			}
			at := from + gap
			if at >= until { // memoryless: restart at the phase change
				if !f.Poisson && until < end {
					from = until
					continue
				}
				from = until
				continue
			}
			w.eng.At(at, func() {
				if w.regionUp[f.Region] {
					w.request(f.Region, f.Limit)
				}
				next(at + 1) // +1ns keeps two arrivals from sharing an instant
			})
			return
		}
	}
	next(0)
}

var debugHook func(region, limit int, o outcome, at time.Duration)

func (w *world) request(region, limit int) {
	start := w.eng.Now()
	w.impl.check(region, limit, start, func(o outcome, at time.Duration) {
		if debugHook != nil {
			debugHook(region, limit, o, at)
		}
		w.rec.record(region, limit, o, at, w.eng.Now()-start)
		if o == admitted && w.onAdmit != nil {
			w.onAdmit(region, limit, at)
		}
	})
}

// winStat is one (limit, window) on the allocator's clock.
type winStat struct {
	admitted    int64
	denied      int64 // over limit
	unavailable int64
	perRegion   []int64 // admitted
	fallback    []bool  // region answered unavailable in the window
}

// recorder counts outcomes per (limit, window of the home clock at the
// instant of the decision), and the latency added to requests.
type recorder struct {
	sc      *Scenario
	base    int64 // window index of t = 0
	windows [][]winStat
	lat     []int64 // histogram, 0.1 ms buckets
	latSum  time.Duration
	n       int64
}

const latBuckets = 100_000 // 10 s in 0.1 ms

func newRecorder(sc *Scenario) *recorder {
	r := &recorder{sc: sc, base: lease.WindowOf(sc.Home.At(0), sc.Window).Index, lat: make([]int64, latBuckets)}
	r.windows = make([][]winStat, len(sc.Limits))
	for i := range r.windows {
		r.windows[i] = make([]winStat, sc.Windows)
		for j := range r.windows[i] {
			r.windows[i][j].perRegion = make([]int64, len(sc.Regions))
			r.windows[i][j].fallback = make([]bool, len(sc.Regions))
		}
	}
	return r
}

// window returns the measured window holding true time t, or -1.
func (r *recorder) window(t time.Duration) int {
	i := lease.WindowOf(r.sc.Home.At(t), r.sc.Window).Index - r.base
	if i < 0 || i >= int64(r.sc.Windows) {
		return -1
	}
	return int(i)
}

func (r *recorder) record(region, limit int, o outcome, at, latency time.Duration) {
	b := min(int(latency/(100*time.Microsecond)), latBuckets-1)
	r.lat[b]++
	r.latSum += latency
	r.n++
	wi := r.window(at)
	if wi < 0 {
		return
	}
	ws := &r.windows[limit][wi]
	switch o {
	case admitted:
		ws.admitted++
		ws.perRegion[region]++
	case denied:
		ws.denied++
	case unavailable:
		ws.unavailable++
		ws.fallback[region] = true
	}
}

// Result is what one run measured. Ratios are per (limit, window) of the
// allocator's clock, over every limit and every window of the run.
type Result struct {
	Scenario string
	Strategy Strategy
	Seed     uint64

	LimitWindows  int     // (limit, window) pairs measured
	DemandG       float64 // mean demand / G
	MaxAdmittedG  float64 // max admitted / G
	MeanAdmittedG float64 // mean admitted / G
	// MaxOvershoot is the largest observed overshoot max(0, admitted - G)
	// of a window, in tokens; OvershootWindows counts windows above G.
	MaxOvershoot     int64
	MaxOvershootG    float64
	OvershootWindows int
	// Bound is the largest computed bound of a window (Leasehold: from
	// overshoot.Compute on what the allocator committed; the others: what
	// the strategy allows by construction). BoundInfinite when unbounded.
	Bound         int64
	BoundInfinite bool
	BoundNote     string
	// BoundViolations counts windows whose observed overshoot exceeds
	// their bound: a bug.
	BoundViolations int
	// Stranded is per window min(denied, G - admitted): tokens denied
	// (over limit or unavailable) although the window ended with room for
	// them. In % of G.
	MaxStrandedG, MeanStrandedG float64
	// LeaseStranded (Leasehold): overshoot.Stranded, granted tokens neither
	// returned nor admitted, max over windows, % of G.
	LeaseStrandedG float64
	// AllocCallsPerSec counts calls (attempts) received by the home region:
	// lease acquires and returns, or central decisions.
	AllocCallsPerSec float64
	LatencyMeanMs    float64
	LatencyP99Ms     float64
	Requests         int64
	Admitted         int64
	Denied           int64
	Unavailable      int64
	// Series is admitted / G per window of the scenario's Series limit.
	Series []float64
	// SeriesRegions is admitted / G per region per window of that limit.
	SeriesRegions [][]float64
	Events        uint64
	// LateSpends (Leasehold) counts tokens spent from a lease outside its
	// window of the allocator's clock, in true time: must be 0.
	LateSpends int64
	Notes      []string
}

func (r *recorder) result(sc *Scenario, s Strategy) Result {
	res := Result{Scenario: sc.Name, Strategy: s}
	var sumAdm, sumDem, sumStr float64
	for li, wins := range r.windows {
		g := sc.Limits[li].G
		for wi := range wins {
			ws := &wins[wi]
			res.LimitWindows++
			adm := float64(ws.admitted) / float64(g)
			sumAdm += adm
			sumDem += float64(ws.admitted+ws.denied+ws.unavailable) / float64(g)
			res.MaxAdmittedG = max(res.MaxAdmittedG, adm)
			obs := overshoot.Observed(r.overshootWindow(li, wi, 0, 0))
			if obs > 0 {
				res.OvershootWindows++
			}
			res.MaxOvershoot = max(res.MaxOvershoot, obs)
			res.MaxOvershootG = max(res.MaxOvershootG, float64(obs)/float64(g))
			str := float64(min(ws.denied+ws.unavailable, max(0, g-ws.admitted))) / float64(g)
			sumStr += str
			res.MaxStrandedG = max(res.MaxStrandedG, str)
			res.Requests += ws.admitted + ws.denied + ws.unavailable
			res.Admitted += ws.admitted
			res.Denied += ws.denied
			res.Unavailable += ws.unavailable
			if li == sc.Series {
				res.Series = append(res.Series, adm)
				per := make([]float64, len(ws.perRegion))
				for ri, a := range ws.perRegion {
					per[ri] = float64(a) / float64(g)
				}
				res.SeriesRegions = append(res.SeriesRegions, per)
			}
		}
	}
	if res.LimitWindows > 0 {
		n := float64(res.LimitWindows)
		res.MeanAdmittedG, res.DemandG, res.MeanStrandedG = sumAdm/n, sumDem/n, sumStr/n
	}
	var seen int64
	p99 := int64(math.Ceil(0.99 * float64(r.n)))
	for b, c := range r.lat {
		seen += c
		if seen >= p99 && c > 0 {
			res.LatencyP99Ms = float64(b+1) / 10
			break
		}
	}
	if r.n > 0 {
		res.LatencyMeanMs = float64(r.latSum) / float64(r.n) / float64(time.Millisecond)
	}
	return res
}

// overshootWindow is (limit, window) in the overshoot package's terms,
// with what the allocator granted and had returned.
func (r *recorder) overshootWindow(li, wi int, granted, returned int64) overshoot.Window {
	ws := &r.windows[li][wi]
	g := r.sc.Limits[li].G
	ow := overshoot.Window{Limit: g, Granted: granted, Returned: returned}
	for ri, reg := range r.sc.Regions {
		or := overshoot.Region{Name: reg.Name, Admitted: ws.perRegion[ri]}
		if ws.fallback[ri] {
			or.Fallback = overshoot.FallbackClosed
		}
		ow.Regions = append(ow.Regions, or)
	}
	return ow
}
