// Command sim runs Leasehold's simulations and writes the report and the
// plots (make sim).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"leasehold/simulations"
)

func main() {
	out := flag.String("out", "docs/simulations", "directory for README.md and the plots")
	seed := flag.Uint64("seed", 1, "seed of every run")
	only := flag.String("only", "", "run only this scenario and print its table (no files written)")
	flag.Parse()
	start := time.Now()
	if *only != "" {
		for _, sc := range simulations.Scenarios(*seed) {
			if sc.Name != *only {
				continue
			}
			for _, s := range simulations.Strategies {
				t0 := time.Now()
				r := simulations.Run(sc, s, *seed)
				fmt.Printf("%-12s %s  (%v, %d events)\n", s, simulations.Summary(r), time.Since(t0).Round(time.Millisecond), r.Events)
			}
		}
		return
	}
	if err := simulations.WriteReport(*out, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "sim: wrote %s in %v\n", *out, time.Since(start).Round(time.Millisecond))
}
