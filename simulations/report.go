package simulations

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Options sizes a report run.
type Options struct {
	Seed uint64
	// RandomRegions, RandomLimits, RandomWindows size the random scenario
	// (report: 10, 1000, 2).
	RandomRegions, RandomLimits, RandomWindows int
	// Sweep adds the TTL x chunk sweep and the drift sweep.
	Sweep bool
}

// ReportOptions are the options of make sim.
func ReportOptions(seed uint64) Options {
	return Options{Seed: seed, RandomRegions: 10, RandomLimits: 1000, RandomWindows: 2, Sweep: true}
}

// ScenarioResults is one scenario with every strategy's result.
type ScenarioResults struct {
	Scenario Scenario
	Results  []Result
}

// SweepPoint is one Leasehold run of the TTL x chunk sweep.
type SweepPoint struct {
	TTL      time.Duration
	MaxChunk int64
	Result   Result
}

// DriftPoint is one run of the drift sweep.
type DriftPoint struct {
	DriftPPM float64
	RTT      time.Duration
	Strategy Strategy
	Result   Result
}

// Report is everything the report shows.
type Report struct {
	Options   Options
	Scenarios []ScenarioResults
	Sweep     []SweepPoint
	Drift     []DriftPoint
	// Kinds is the kinds scenarios' results (KindScenarios), each a
	// window limit and a bucket limit under the same traffic.
	Kinds []KindRun
}

// KindRun is one kinds scenario and its results.
type KindRun struct {
	Scenario Scenario
	Results  []KindResult
}

// job is one run; runs are independent and may execute in parallel, each
// deterministic.
type job struct {
	sc  Scenario
	s   Strategy
	out *Result
}

func runJobs(jobs []job, seed uint64) {
	// Longest first, so the big runs do not end up last on one core.
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return len(jobs[b].sc.Flows)*jobs[b].sc.Windows - len(jobs[a].sc.Flows)*jobs[a].sc.Windows
	})
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				*jobs[i].out = Run(jobs[i].sc, jobs[i].s, seed)
			}
		}()
	}
	for _, i := range order {
		next <- i
	}
	close(next)
	wg.Wait()
}

// BuildReport runs every scenario with every strategy (and the sweeps).
func BuildReport(o Options) *Report {
	rep := &Report{Options: o}
	var jobs []job
	for _, sc := range Scenarios(o.Seed) {
		if sc.Name == "random" {
			sc = RandomScenario(o.Seed, o.RandomRegions, o.RandomLimits, o.RandomWindows, 20*second)
		}
		rep.Scenarios = append(rep.Scenarios, ScenarioResults{Scenario: sc, Results: make([]Result, len(Strategies))})
		sr := &rep.Scenarios[len(rep.Scenarios)-1]
		for i, s := range Strategies {
			jobs = append(jobs, job{sc: sc, s: s, out: &sr.Results[i]})
		}
	}
	if o.Sweep {
		base := Scenarios(o.Seed)[1] // shift
		for _, ttl := range sweepTTLs {
			for _, mc := range sweepChunks {
				sc := base
				sc.Limits = slices.Clone(base.Limits)
				sc.Limits[0].TTL, sc.Limits[0].MaxChunk = ttl, mc
				rep.Sweep = append(rep.Sweep, SweepPoint{TTL: ttl, MaxChunk: mc})
			}
		}
		for i := range rep.Sweep {
			sc := base
			sc.Limits = slices.Clone(base.Limits)
			sc.Limits[0].TTL, sc.Limits[0].MaxChunk = rep.Sweep[i].TTL, rep.Sweep[i].MaxChunk
			jobs = append(jobs, job{sc: sc, s: Leasehold, out: &rep.Sweep[i].Result})
		}
		drift := Scenarios(o.Seed)[7]
		for _, rtt := range []time.Duration{80 * ms, 300 * ms} {
			for _, ppm := range sweepDrifts {
				for _, s := range []Strategy{StaticSplit, Leasehold} {
					rep.Drift = append(rep.Drift, DriftPoint{DriftPPM: ppm, RTT: rtt, Strategy: s})
				}
			}
		}
		for i := range rep.Drift {
			d := &rep.Drift[i]
			sc := drift
			sc.Name = "drift-sweep"
			sc.Home = Clock{DriftPPM: d.DriftPPM}
			sc.Regions = slices.Clone(drift.Regions)
			for ri := range sc.Regions {
				r := &sc.Regions[ri]
				r.RTT = d.RTT
				sign := 1.0
				if ri%2 == 1 {
					sign = -1
				}
				r.Agent.DriftPPM, r.Redis.DriftPPM = sign*d.DriftPPM, -sign*d.DriftPPM
			}
			jobs = append(jobs, job{sc: sc, s: d.Strategy, out: &d.Result})
		}
	}
	runJobs(jobs, o.Seed)
	for _, sc := range KindScenarios() {
		rep.Kinds = append(rep.Kinds, KindRun{Scenario: sc, Results: RunKinds(sc, o.Seed)})
	}
	return rep
}

var (
	sweepTTLs   = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute}
	sweepChunks = []int64{0, 100, 25}
	sweepDrifts = []float64{0, 200, 1000, 5000, 20000}
)

// WriteReport runs the report (ReportOptions) and writes README.md and the
// plots to dir.
func WriteReport(dir string, seed uint64) error {
	rep := BuildReport(ReportOptions(seed))
	files, err := rep.Render()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), files[n], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func (r Result) boundCell() string {
	if r.BoundInfinite {
		return "+inf"
	}
	switch r.Strategy {
	case Independent:
		return fmt.Sprintf("%d (%s)", r.Bound, r.BoundNote)
	case StaticSplit:
		return "0 (" + r.BoundNote + ")"
	case Central:
		return "0 (exact)"
	}
	return fmt.Sprintf("%d", r.Bound)
}

// Table renders a scenario's results as a markdown table.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| strategy | admitted/G max | admitted/G mean | observed overshoot max | windows over G | computed bound | stranded max | stranded mean | allocator calls/s | latency added mean / p99 | unavailable |\n")
	b.WriteString("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %d (%s of G) | %d / %d | %s | %s | %s | %.2f | %.1f / %.1f ms | %d |\n",
			r.Strategy, r.MaxAdmittedG, r.MeanAdmittedG, r.MaxOvershoot, pct(r.MaxOvershootG), r.OvershootWindows, r.LimitWindows,
			r.boundCell(), pct(r.MaxStrandedG), fmt.Sprintf("%.2f%%", 100*r.MeanStrandedG), r.AllocCallsPerSec,
			r.LatencyMeanMs, r.LatencyP99Ms, r.Unavailable)
	}
	for _, r := range rs {
		if r.BoundViolations > 0 {
			fmt.Fprintf(&b, "\n**%s: observed overshoot above the computed bound in %d windows (a bug).**\n", r.Strategy, r.BoundViolations)
		}
		if len(r.Notes) > 0 {
			fmt.Fprintf(&b, "\n%s: %s.\n", r.Strategy, strings.Join(r.Notes, "; "))
		}
	}
	return b.String()
}

func find(rs []Result, s Strategy) Result {
	for _, r := range rs {
		if r.Strategy == s {
			return r
		}
	}
	return Result{}
}

// Render returns the report's files: README.md and the PNG plots.
func (rep *Report) Render() (map[string][]byte, error) {
	files := map[string][]byte{}
	var b bytes.Buffer
	o := rep.Options
	fmt.Fprintf(&b, "# Leasehold simulations\n\n")
	fmt.Fprintf(&b, "Generated by `make sim` (`go run ./simulations/cmd/sim -out docs/simulations -seed %d`). Do not edit: "+
		"change the simulator or the scenarios and run it again. The same seed gives the same report, byte for byte.\n\n", o.Seed)
	b.WriteString(reportIntro)
	for _, sr := range rep.Scenarios {
		sc := sr.Scenario
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", sc.Title, sc.About)
		b.WriteString(Table(sr.Results))
		b.WriteString("\n")
		if text := scenarioText[sc.Name]; text != nil {
			b.WriteString(text(sr.Results))
			b.WriteString("\n\n")
		}
		if sc.Name == "shift" {
			png, err := seriesPlot(sr)
			if err != nil {
				return nil, err
			}
			files["shift-admitted.png"] = png
			b.WriteString("![admitted / G per window, shift scenario](shift-admitted.png)\n\n")
			b.WriteString(shiftPlotText + "\n\n")
		}
	}
	if len(rep.Sweep) > 0 {
		b.WriteString(sweepIntro)
		b.WriteString("| lease ttl | max chunk | stranded max | stranded mean | admitted/G mean | allocator calls/s | observed overshoot max |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, p := range rep.Sweep {
			mc := "none"
			if p.MaxChunk > 0 {
				mc = fmt.Sprint(p.MaxChunk)
			}
			r := p.Result
			fmt.Fprintf(&b, "| %v | %s | %s | %.2f%% | %.3f | %.2f | %d |\n", p.TTL, mc, pct(r.MaxStrandedG), 100*r.MeanStrandedG,
				r.MeanAdmittedG, r.AllocCallsPerSec, r.MaxOvershoot)
		}
		b.WriteString("\n")
		strand, err := sweepPlot(rep.Sweep, "stranded tokens, mean % of G per window", func(r Result) float64 { return 100 * r.MeanStrandedG })
		if err != nil {
			return nil, err
		}
		calls, err := sweepPlot(rep.Sweep, "allocator calls per second", func(r Result) float64 { return r.AllocCallsPerSec })
		if err != nil {
			return nil, err
		}
		files["sweep-stranding.png"], files["sweep-calls.png"] = strand, calls
		b.WriteString("![stranding vs lease ttl](sweep-stranding.png)\n\n" + strandPlotText + "\n\n")
		b.WriteString("![allocator calls/s vs lease ttl](sweep-calls.png)\n\n" + callsPlotText + "\n\n")
	}
	if len(rep.Drift) > 0 {
		b.WriteString(driftIntro)
		b.WriteString("| drift (ppm) | RTT | strategy | observed overshoot max | windows over G | stranded mean |\n|---:|---:|---|---:|---:|---:|\n")
		for _, d := range rep.Drift {
			fmt.Fprintf(&b, "| %.0f | %v | %s | %d | %d | %.2f%% |\n", d.DriftPPM, d.RTT, d.Strategy, d.Result.MaxOvershoot,
				d.Result.OvershootWindows, 100*d.Result.MeanStrandedG)
		}
		b.WriteString("\n")
		png, err := driftPlot(rep.Drift)
		if err != nil {
			return nil, err
		}
		files["drift-overshoot.png"] = png
		b.WriteString("![observed overshoot vs clock drift](drift-overshoot.png)\n\n" + driftPlotText + "\n\n")
	}
	if len(rep.Kinds) > 0 {
		b.WriteString(kindsIntro)
		for _, k := range rep.Kinds {
			fmt.Fprintf(&b, "### %s\n\n%s\n\n", k.Scenario.Title, k.Scenario.About)
			b.WriteString(KindsTable(k.Results))
			b.WriteString("\n")
			if text := kindsText[k.Scenario.Name]; text != nil {
				b.WriteString(text(k.Results))
				b.WriteString("\n\n")
			}
		}
	}
	b.WriteString(reportMethod)
	files["README.md"] = b.Bytes()
	return files, nil
}

var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

func addLine(p *plot.Plot, name string, i int, pts plotter.XYs) error {
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	c := palette[i%len(palette)]
	l.Color, s.Color = c, c
	l.Width = vg.Points(1.5)
	s.Shape = draw.CircleGlyph{}
	s.Radius = vg.Points(2.5)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

func encode(p *plot.Plot) ([]byte, error) {
	wt, err := p.WriterTo(7*vg.Inch, 4*vg.Inch, "png")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func seriesPlot(sr ScenarioResults) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Demand shift: admitted / G per window"
	p.X.Label.Text = "window (minutes)"
	p.Y.Label.Text = "admitted / G"
	p.Legend.Left = true // bottom left, under the lines
	for i, r := range sr.Results {
		pts := make(plotter.XYs, len(r.Series))
		for w, v := range r.Series {
			pts[w] = plotter.XY{X: float64(w), Y: v}
		}
		if err := addLine(p, r.Strategy.String(), i, pts); err != nil {
			return nil, err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1.15
	return encode(p)
}

func sweepPlot(pts []SweepPoint, ylabel string, f func(Result) float64) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Leasehold, demand shift: " + ylabel + " vs lease ttl"
	p.X.Label.Text = "lease ttl (s, log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	for i, mc := range sweepChunks {
		var xy plotter.XYs
		for _, sp := range pts {
			if sp.MaxChunk == mc {
				xy = append(xy, plotter.XY{X: sp.TTL.Seconds(), Y: f(sp.Result)})
			}
		}
		name := "no max chunk"
		if mc > 0 {
			name = fmt.Sprintf("max chunk %d", mc)
		}
		if err := addLine(p, name, i, xy); err != nil {
			return nil, err
		}
	}
	p.Y.Min = 0
	return encode(p)
}

func driftPlot(pts []DriftPoint) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Observed overshoot vs clock drift (EU 700 / US 700, G = 1,000)"
	p.X.Label.Text = "clock drift of every host (ppm, log scale; 0 drawn at 10)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Label.Text = "max observed overshoot (tokens)"
	p.Legend.Top = true
	p.Legend.Left = true
	i := 0
	for _, rtt := range []time.Duration{80 * ms, 300 * ms} {
		for _, s := range []Strategy{StaticSplit, Leasehold} {
			var xy plotter.XYs
			for _, d := range pts {
				if d.RTT == rtt && d.Strategy == s {
					xy = append(xy, plotter.XY{X: max(d.DriftPPM, 10), Y: float64(d.Result.MaxOvershoot)})
				}
			}
			if err := addLine(p, fmt.Sprintf("%s, RTT %v", s, rtt), i, xy); err != nil {
				return nil, err
			}
			i++
		}
	}
	p.Y.Min = 0
	return encode(p)
}
