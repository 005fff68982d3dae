package statuspage

import (
	"fmt"
	"math"
	"strings"

	"leasehold/allocator"
)

// chartSize is a chart's geometry in CSS pixels.
type chartSize struct {
	W, H             float64
	padL, padR       float64
	padT, padB       float64
	maxBar, barRatio float64
}

var (
	smallChart = chartSize{W: 380, H: 150, padL: 38, padR: 8, padT: 10, padB: 20, maxBar: 22, barRatio: 0.7}
	bigChart   = chartSize{W: 1180, H: 260, padL: 48, padR: 12, padT: 12, padB: 22, maxBar: 36, barRatio: 0.7}
)

// palette colours regions (red is kept for the bound).
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"}

// colorOf gives every region of a page the same colour in every chart:
// the regions in the order they first appear (the largest limits first).
type colorOf map[string]string

func newColors(regions []string) colorOf {
	c := colorOf{}
	for _, r := range regions {
		if _, ok := c[r]; !ok {
			c[r] = palette[len(c)%len(palette)]
		}
	}
	return c
}

// chart is an inline SVG bar chart of a limit's recent windows: admitted
// per window stacked per region, a step line at G, a dashed step line at
// G + bound (at the top edge when the bound is infinite or off scale).
type chart struct {
	Limit           string
	N               int // chart number on the page (element ids)
	W, H            float64
	Left, Right     float64 // plot area
	Top, Bottom     float64
	Title, Desc     string
	Grid            []gridLine
	Cols            []column
	GPath           string
	BoundPath       string
	InfPath         string
	InfMarks        []point
	XLabels         []xLabel
	Legend          []legendItem
	AnyInfinite     bool
	Regions         []string
	Windows         []windowRow // newest first, for the text table
	OverBoundWindow int         // windows over their bound
	// Table shows Windows in a <details> under the chart (the index page;
	// a limit's page has its own table).
	Table bool
}

type gridLine struct {
	Y     float64
	Label string
}

type column struct {
	X, W    float64 // the whole slot (hover area)
	Tip     string
	Segs    []segment
	Pending bool // running, or waiting for usage reports: drawn faded
	Over    bool
	// Outline is the bar's outline (drawn when Over).
	BarX, BarW, BarY, BarH float64
}

type segment struct {
	Y, H  float64
	Color string
	Tip   string
}

type point struct{ X, Y float64 }

type xLabel struct {
	X      float64
	Anchor string
	Text   string
}

type legendItem struct {
	Name  string
	Color string
}

// newChart draws reps (oldest first) in at least slots slots, newest on
// the right.
func newChart(v view, n int, limit string, reps []allocator.WindowReport, regions []string, colors colorOf, sz chartSize, slots int) *chart {
	c := &chart{Limit: limit, N: n, W: sz.W, H: sz.H, Left: sz.padL, Right: sz.W - sz.padR, Top: sz.padT,
		Bottom: sz.H - sz.padB, Regions: regions}
	for _, r := range regions {
		c.Legend = append(c.Legend, legendItem{Name: r, Color: colors[r]})
	}
	for i := len(reps) - 1; i >= 0; i-- {
		c.Windows = append(c.Windows, newWindowRow(v, reps[i], regions))
	}

	// Scale: the largest of admitted and G, and G + bound up to 1.5 times
	// that (a larger bound is drawn at the top edge, its value in the
	// tooltip), so that the bars keep most of the height.
	var base, ceil float64
	for _, r := range reps {
		base = max(base, float64(r.AdmittedTotal), float64(r.LimitTokens))
		if !r.Bound.Infinite {
			ceil = max(ceil, float64(addSat(r.LimitTokens, r.Bound.Tokens)))
		}
	}
	base = max(base, 1)
	top := niceCeil(max(base, min(ceil, 1.5*base)) * 1.05)
	plotH := c.Bottom - c.Top
	y := func(v float64) float64 {
		return c.Bottom - min(max(v, 0), top)/top*plotH
	}
	for _, v := range []float64{0, top / 2, top} {
		c.Grid = append(c.Grid, gridLine{Y: y(v), Label: fmtCompact(v)})
	}

	slots = max(slots, len(reps), 1)
	slotW := (c.Right - c.Left) / float64(slots)
	barW := min(slotW*sz.barRatio, sz.maxBar)
	first := slots - len(reps)
	gSteps := make([]step, len(reps))
	bSteps := make([]step, len(reps))
	iSteps := make([]step, len(reps))
	for i, r := range reps {
		x0 := c.Left + float64(first+i)*slotW
		col := column{X: x0, W: slotW, Pending: !v.final(r), BarW: barW, BarX: x0 + (slotW-barW)/2}
		col.Tip = windowTip(v, r, regions)
		stackTop := 0.0
		for _, reg := range regions {
			a := r.Admitted[reg]
			if a <= 0 {
				continue
			}
			y0, y1 := y(stackTop), y(stackTop+float64(a))
			stackTop += float64(a)
			col.Segs = append(col.Segs, segment{Y: y1, H: max(y0-y1, 0.5), Color: colors[reg],
				Tip: fmt.Sprintf("%s: %s admitted", reg, fmtInt(a))})
		}
		col.BarY, col.BarH = y(stackTop), c.Bottom-y(stackTop)
		if !r.Bound.Infinite && r.ObservedOvershoot > r.Bound.Tokens {
			col.Over = true
			c.OverBoundWindow++
		}
		c.Cols = append(c.Cols, col)
		gSteps[i] = step{ok: true, x0: x0, x1: x0 + slotW, y: y(float64(r.LimitTokens))}
		if r.Bound.Infinite {
			c.AnyInfinite = true
			iSteps[i] = step{ok: true, x0: x0, x1: x0 + slotW, y: c.Top}
			if i == 0 || !reps[i-1].Bound.Infinite { // one mark per run of infinite windows
				c.InfMarks = append(c.InfMarks, point{X: x0 + slotW/2, Y: c.Top + 11})
			}
		} else {
			bSteps[i] = step{ok: true, x0: x0, x1: x0 + slotW, y: y(float64(addSat(r.LimitTokens, r.Bound.Tokens)))}
		}
	}
	c.GPath, c.BoundPath, c.InfPath = stepPath(gSteps), stepPath(bSteps), stepPath(iSteps)
	if len(reps) > 0 {
		firstX := c.Left + float64(first)*slotW
		fmtT := func(i int) string { return reps[i].WindowStart.Format("15:04:05") }
		switch {
		case len(reps) == 1:
			c.XLabels = []xLabel{{X: firstX + slotW/2, Anchor: "middle", Text: fmtT(0)}}
		case c.Right-firstX < 110: // no room for two labels: the newest only
			c.XLabels = []xLabel{{X: c.Right, Anchor: "end", Text: fmtT(len(reps) - 1)}}
		default:
			c.XLabels = []xLabel{{X: firstX, Anchor: "start", Text: fmtT(0)}, {X: c.Right, Anchor: "end", Text: fmtT(len(reps) - 1)}}
		}
	}
	c.Title = fmt.Sprintf("%s: admitted per window vs G and G + bound", limit)
	c.Desc = chartDesc(reps)
	return c
}

// step is one window's horizontal segment of a step line.
type step struct {
	ok     bool
	x0, x1 float64
	y      float64
}

// stepPath joins consecutive segments into one SVG path ("" if none).
func stepPath(steps []step) string {
	var b strings.Builder
	prev := false
	for _, s := range steps {
		if !s.ok {
			prev = false
			continue
		}
		if prev {
			fmt.Fprintf(&b, "V%sH%s", px(s.y), px(s.x1))
		} else {
			fmt.Fprintf(&b, "M%s %sH%s", px(s.x0), px(s.y), px(s.x1))
		}
		prev = true
	}
	return b.String()
}

// niceCeil rounds v up to 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a
// power of ten.
func niceCeil(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*exp >= v {
			return m * exp
		}
	}
	return 10 * exp
}

// windowTip is a window's tooltip: every number of its row.
func windowTip(v view, r allocator.WindowReport, regions []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s–%s UTC", r.WindowStart.Format("15:04:05"), r.WindowEnd.Format("15:04:05"))
	switch {
	case !r.Closed:
		b.WriteString(" (running: counts still grow)")
	case !v.final(r):
		b.WriteString(" (just closed: usage reports may still come in)")
	}
	fmt.Fprintf(&b, "\nadmitted %s, G %s", fmtInt(r.AdmittedTotal), fmtInt(r.LimitTokens))
	var per []string
	for _, reg := range regions {
		if a, ok := r.Admitted[reg]; ok {
			per = append(per, reg+" "+fmtInt(a))
		}
	}
	if len(per) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(per, ", "))
	}
	if r.Bound.Infinite {
		b.WriteString("\nbound ∞: a region was OPEN")
	} else {
		fmt.Fprintf(&b, "\nbound %s: G + bound = %s", fmtInt(r.Bound.Tokens), fmtInt(addSat(r.LimitTokens, r.Bound.Tokens)))
	}
	fmt.Fprintf(&b, "\nobserved overshoot %s, stranded %s", fmtInt(r.ObservedOvershoot), fmtInt(r.Stranded))
	if !r.Bound.Infinite && r.ObservedOvershoot > r.Bound.Tokens {
		b.WriteString("\nOBSERVED ABOVE BOUND: a bug")
	}
	for _, reg := range sortedKeys(r.Fallback) {
		fmt.Fprintf(&b, "\n%s in %s fallback", reg, kindName(r.Fallback[reg]))
	}
	return b.String()
}

// chartDesc summarises the chart for screen readers.
func chartDesc(reps []allocator.WindowReport) string {
	if len(reps) == 0 {
		return "No windows."
	}
	var closed, over, inf int
	for _, r := range reps {
		if r.Closed {
			closed++
		}
		if r.Bound.Infinite {
			inf++
		} else if r.ObservedOvershoot > r.Bound.Tokens {
			over++
		}
	}
	return fmt.Sprintf("%d windows (%d closed) from %s UTC; %d over their bound; %d with an infinite bound. The table below has every number.",
		len(reps), closed, reps[0].WindowStart.Format("15:04:05"), over, inf)
}
