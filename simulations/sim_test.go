package simulations

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt")

// testScenarios are the report's scenarios, with the random one small
// enough for a test under -race.
func testScenarios(seed uint64) []Scenario {
	scs := Scenarios(seed)
	for i := range scs {
		if scs[i].Name == "random" {
			scs[i] = RandomScenario(seed, 10, 20, 2, 20*second)
		}
	}
	return scs
}

var (
	goldenOnce sync.Once
	goldenRes  [][]Result // per test scenario, per strategy
)

// seed1 runs every test scenario with every strategy at seed 1, once.
func seed1(t *testing.T) [][]Result {
	t.Helper()
	goldenOnce.Do(func() {
		scs := testScenarios(1)
		goldenRes = make([][]Result, len(scs))
		var jobs []job
		for i, sc := range scs {
			goldenRes[i] = make([]Result, len(Strategies))
			for j, s := range Strategies {
				jobs = append(jobs, job{sc: sc, s: s, out: &goldenRes[i][j]})
			}
		}
		runJobs(jobs, 1)
	})
	return goldenRes
}

func byName(t *testing.T, name string, s Strategy) Result {
	t.Helper()
	for i, sc := range testScenarios(1) {
		if sc.Name == name {
			for j, st := range Strategies {
				if st == s {
					return seed1(t)[i][j]
				}
			}
		}
	}
	t.Fatalf("no result for %s / %v", name, s)
	return Result{}
}

// TestGolden compares every scenario's key figures at seed 1 with
// testdata/golden.txt (go test ./simulations -run Golden -update rewrites
// it). A change of the allocator, the sizing or the agent logic shows here
// as a diff to review.
func TestGolden(t *testing.T) {
	var b bytes.Buffer
	for i, sc := range testScenarios(1) {
		for _, r := range seed1(t)[i] {
			fmt.Fprintf(&b, "%-10s %-26s %s\n", sc.Name, r.Strategy, Summary(r))
		}
	}
	path := filepath.Join("testdata", "golden.txt")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		gl, wl := strings.Split(b.String(), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("line %d:\n got %s\nwant %s", i+1, g, w)
			}
		}
		t.Fatal("key figures changed: review, then go test ./simulations -run Golden -update")
	}
}

// TestSameSeedSameOutput: two runs with one seed give the same report,
// byte for byte (markdown and PNG).
func TestSameSeedSameOutput(t *testing.T) {
	o := Options{Seed: 7, RandomRegions: 4, RandomLimits: 5, RandomWindows: 2}
	render := func() map[string][]byte {
		files, err := BuildReport(o).Render()
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	a, b := render(), render()
	if len(a) != len(b) || len(a) < 2 {
		t.Fatalf("files: %d and %d", len(a), len(b))
	}
	for name, x := range a {
		if !bytes.Equal(x, b[name]) {
			t.Errorf("%s differs between two runs with the same seed", name)
		}
	}
	sc := Scenarios(3)[1]
	if r1, r2 := Run(sc, Leasehold, 3), Run(sc, Leasehold, 3); !reflect.DeepEqual(r1, r2) {
		t.Errorf("same seed, different results:\n%+v\n%+v", r1, r2)
	}
	if r1, r2 := Run(sc, Leasehold, 3), Run(sc, Leasehold, 4); reflect.DeepEqual(r1.Series, r2.Series) && r1.Requests == r2.Requests {
		t.Errorf("seeds 3 and 4 gave the same run: the seed is not used")
	}
}

// strict checks what Leasehold in strict mode promises in every window.
func strict(t *testing.T, what string, r Result) {
	t.Helper()
	if r.MaxOvershoot != 0 || r.OvershootWindows != 0 {
		t.Errorf("%s: observed overshoot %d in %d windows, want 0", what, r.MaxOvershoot, r.OvershootWindows)
	}
	if r.BoundViolations != 0 || r.Bound != 0 || r.BoundInfinite {
		t.Errorf("%s: bound %d (inf %v), %d violations; want 0, 0", what, r.Bound, r.BoundInfinite, r.BoundViolations)
	}
	if r.LateSpends != 0 {
		t.Errorf("%s: %d tokens spent outside their lease's window", what, r.LateSpends)
	}
	if r.Admitted == 0 {
		t.Errorf("%s: nothing admitted", what)
	}
}

// TestLeaseholdStrictEveryScenario: observed overshoot 0 in every scenario.
func TestLeaseholdStrictEveryScenario(t *testing.T) {
	for _, sc := range testScenarios(1) {
		strict(t, sc.Name, byName(t, sc.Name, Leasehold))
	}
}

// TestLeaseholdStrictRandomSeeds: 200 seeds of the random scenario, each
// with random faults (a partition, an allocator failover) on top of random
// RTTs, loss, duplication, clock offsets and drift. -short runs 20.
func TestLeaseholdStrictRandomSeeds(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 20
	}
	var jobs []job
	results := make([]Result, seeds)
	for i := range seeds {
		seed := uint64(1000 + i)
		sc := RandomScenario(seed, 4, 3, 2, 10*second)
		rng := stream(seed, 10, 0)
		span := int64(sc.Duration())
		sc.Faults = []Fault{
			{Kind: Partition, At: time.Duration(rng.Int64N(span)), Region: rng.IntN(len(sc.Regions)),
				Duration: time.Duration(rng.Int64N(int64(8 * second)))},
			{Kind: AllocatorFailover, At: time.Duration(rng.Int64N(span)), Duration: time.Duration(1 + rng.Int64N(int64(6*second)))},
		}
		jobs = append(jobs, job{sc: sc, s: Leasehold, out: &results[i]})
	}
	for i := range seeds {
		runJobs(jobs[i:i+1], uint64(1000+i))
	}
	for i, r := range results {
		strict(t, fmt.Sprintf("seed %d", 1000+i), r)
	}
}

// TestStranding: under contention and in the demand shift, Leasehold
// strands at most 1% of G in any window; the static split's figure is shown
// beside it, and must show the shift's stranding.
func TestStranding(t *testing.T) {
	for _, name := range []string{"contention", "shift"} {
		lh, st := byName(t, name, Leasehold), byName(t, name, StaticSplit)
		t.Logf("%-10s stranded per window: leasehold max %.2f%% mean %.2f%% | static split max %.2f%% mean %.2f%%",
			name, 100*lh.MaxStrandedG, 100*lh.MeanStrandedG, 100*st.MaxStrandedG, 100*st.MeanStrandedG)
		if lh.MaxStrandedG > 0.01 {
			t.Errorf("%s: leasehold strands %.2f%% of G in a window, want <= 1%%", name, 100*lh.MaxStrandedG)
		}
	}
	if st := byName(t, "shift", StaticSplit); st.MaxStrandedG < 0.3 {
		t.Errorf("shift: static split strands at most %.1f%% of G; the simulator should show ~40%%", 100*st.MaxStrandedG)
	}
}

// TestDetection: the simulator sees the failure modes of the other
// strategies, so a zero for Leasehold means something.
func TestDetection(t *testing.T) {
	if r := byName(t, "burst", Independent); r.MaxAdmittedG < 1.9 {
		t.Errorf("burst: independent admits at most %.2f x G, want ~2x", r.MaxAdmittedG)
	}
	if r := byName(t, "contention", Independent); r.MeanAdmittedG < 1.4 {
		t.Errorf("contention: independent admits %.2f x G, want ~1.5x", r.MeanAdmittedG)
	}
	if r := byName(t, "shift", Independent); r.MaxAdmittedG > 1.15 {
		t.Errorf("shift: independent admits %.2f x G; demand is G, so only noise should go over", r.MaxAdmittedG)
	}
	if r := byName(t, "regionloss", StaticSplit); r.MeanStrandedG < 0.1 {
		t.Errorf("regionloss: static split strands %.1f%% on average, want the lost half", 100*r.MeanStrandedG)
	}
	if r := byName(t, "failover", Central); r.Unavailable == 0 {
		t.Errorf("failover: the central authority answered every request while down")
	}
	if r := byName(t, "partition", Leasehold); r.Unavailable == 0 {
		t.Errorf("partition: the cut-off region never fell back")
	}
	if lh := byName(t, "burst", Leasehold); lh.MaxStrandedG > 0.01 {
		t.Errorf("burst: leasehold strands %.1f%%, want <= 1%%", 100*lh.MaxStrandedG)
	}
}

// TestKinds plays the kinds scenarios (a window limit and a bucket limit
// under the same traffic, Leasehold): no limit admits more than its kind
// promises in any interval; at a boundary burst the window limit admits
// well over 1.5 G within two seconds while the bucket limit admits at most
// B + R x 2 s (a fifth of it or less); under a demand shift both follow
// demand (the busy region admits over three times the quiet one). The figures are kept in
// testdata/kinds.txt (-update rewrites it).
func TestKinds(t *testing.T) {
	var b strings.Builder
	for _, sc := range KindScenarios() {
		rs := RunKinds(sc, 1)
		for _, r := range rs {
			for i, T := range KindLengths {
				if r.MaxIn[i] > r.Bound[i] {
					t.Errorf("%s %s: %d admitted within %v, above its bound %d", sc.Name, r.Limit, r.MaxIn[i], T, r.Bound[i])
				}
			}
		}
		if err := WriteKinds(&b, rs); err != nil {
			t.Fatal(err)
		}
		if sc.Name == "kinds-burst" {
			win, bkt := rs[0], rs[1]
			// 2 s: index 1 of KindLengths.
			if win.MaxIn[1] < 1500 || bkt.MaxIn[1]*5 > win.MaxIn[1] {
				t.Errorf("boundary burst within 2 s: window %d, bucket %d (bound %d)", win.MaxIn[1], bkt.MaxIn[1], bkt.Bound[1])
			}
		}
		if sc.Name == "kinds-shift" {
			for _, r := range rs {
				if r.After["us"] < 3*r.After["eu"] {
					t.Errorf("%s after the shift: us %d, eu %d: does not follow demand", r.Limit, r.After["us"], r.After["eu"])
				}
			}
		}
	}
	path := filepath.Join("testdata", "kinds.txt")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != b.String() {
		t.Errorf("kinds figures changed: review, then go test ./simulations -run Kinds -update\ngot:\n%s\nwant:\n%s", b.String(), want)
	}
}
