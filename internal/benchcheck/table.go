package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// result is what one server did in one case, as the driver saw it and as
// the kernel counted the server's CPU.
type result struct {
	decisions int           // answers received (errors included)
	notOK     int           // answers that were not OK, errors included
	errors    int           // calls that failed
	elapsed   time.Duration // from the first call to the last answer
	p50, p99  time.Duration // latency of one call, as the caller saw it
	cpu       time.Duration // the server process's utime+stime during the case
	redis     time.Duration // redis-server's utime+stime during the case
	alloc     time.Duration // the allocator's (with its embedded etcd) during the case
	redisCmds int64         // Redis commands run during the case (a script call is one)
	grants    int64         // leases the allocator granted during the case
	commands  string        // the most called Redis commands, per decision
}

// rate is decisions per second.
func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.decisions) / r.elapsed.Seconds()
}

// cpuPer is the server's CPU per decision.
func (r result) cpuPer() time.Duration { return per(r.cpu, r.decisions) }

// redisPer and allocPer are Redis's and the allocator's CPU per
// decision: what the agent's decisions cost elsewhere.
func (r result) redisPer() time.Duration { return per(r.redis, r.decisions) }
func (r result) allocPer() time.Duration { return per(r.alloc, r.decisions) }

func per(d time.Duration, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return d / time.Duration(n)
}

// ratios are the agent's figures divided by the do-nothing server's in
// the same case: throughput wants to be near 1, p50 and CPU near 1 from
// above. A ratio is NaN when the floor's figure is zero.
type ratios struct {
	throughput, p50, cpu float64
}

func compare(agent, floor result) ratios {
	return ratios{
		throughput: div(agent.rate(), floor.rate()),
		p50:        div(float64(agent.p50), float64(floor.p50)),
		cpu:        div(float64(agent.cpuPer()), float64(floor.cpuPer())),
	}
}

func div(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// row is one line of the table: a case, a server, what it did, and for the
// agent its ratios to the floor (nil for the floor itself).
type row struct {
	c      benchCase
	server string
	r      result
	vs     *ratios
}

var header = []string{"api", "keys", "callers", "server", "decisions", "decisions/s", "p50", "p99",
	"CPU/decision", "Redis CPU/dec", "alloc CPU/dec", "Redis cmds/dec", "grants/dec", "not OK", "throughput vs noop", "p50 vs noop", "CPU vs noop"}

// writeTable prints rows as one Markdown table, columns padded so that it
// reads as well in a terminal.
func writeTable(w io.Writer, rows []row) error {
	cells := [][]string{header}
	for _, x := range rows {
		redis, alloc, cmds, grants := "-", "-", "-", "-"
		if x.vs != nil {
			redis, alloc = micros(x.r.redisPer()), micros(x.r.allocPer())
			cmds, grants = perDecision(x.r.redisCmds, x.r.decisions), perDecision(x.r.grants, x.r.decisions)
		}
		line := []string{x.c.api, x.c.label(), strconv.Itoa(x.c.callers), x.server,
			thousands(float64(x.r.decisions)), thousands(x.r.rate()) + "/s",
			micros(x.r.p50), micros(x.r.p99), micros(x.r.cpuPer()), redis, alloc, cmds, grants,
			percent(float64(x.r.notOK), float64(x.r.decisions)), "-", "-", "-"}
		if x.vs != nil {
			line[14], line[15], line[16] = pct(x.vs.throughput), times(x.vs.p50), times(x.vs.cpu)
		}
		cells = append(cells, line)
	}
	width := make([]int, len(header))
	for _, line := range cells {
		for i, c := range line {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for n, line := range cells {
		for i, c := range line {
			fmt.Fprintf(&b, "| %s%s ", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		b.WriteString("|\n")
		if n == 0 {
			for i := range line {
				fmt.Fprintf(&b, "|%s", strings.Repeat("-", width[i]+2))
			}
			b.WriteString("|\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// thousands formats v rounded to an integer with comma separators.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// micros formats d in microseconds: one decimal below 100 µs.
func micros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if us < 100 {
		return strconv.FormatFloat(us, 'f', 1, 64) + " µs"
	}
	return thousands(us) + " µs"
}

// perDecision is n per decision with three decimals (a count, so it
// stays comparable between noisy runs), "-" without decisions.
func perDecision(n int64, decisions int) string {
	if decisions <= 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(n)/float64(decisions), 'f', 3, 64)
}

// percent is part/whole as a percentage, with two decimals so that a
// handful of denials in 100,000 still shows.
func percent(part, whole float64) string {
	if whole == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*part/whole, 'f', 2, 64) + " %"
}

func pct(r float64) string {
	if math.IsNaN(r) {
		return "n/a"
	}
	return strconv.FormatFloat(100*r, 'f', 0, 64) + " %"
}

func times(r float64) string {
	if math.IsNaN(r) {
		return "n/a"
	}
	return strconv.FormatFloat(r, 'f', 2, 64) + "x"
}
