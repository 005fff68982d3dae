// Command testsummary reads the output of `go test` and prints, at its
// end, what a reader of a failed run needs first: the failed tests and
// packages, every panic, the tests running when a package timed out, and
// the goroutines blocked in this module's test code then (a hang's
// whereabouts, which the timeout's full goroutine dump buries under the
// embedded etcd's hundreds). `make test` runs it on a failure (the whole output is in test.log), so the last
// lines of a CI log name what broke.
//
//	go test ./... 2>&1 | tee test.log; go run ./internal/testsummary < test.log
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// module is the import path prefix of this repository's packages.
const module = "leasehold/"

// maxStacks bounds how many blocked goroutines are printed per dump.
const maxStacks = 20

func main() {
	if err := summarize(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

// summarize writes the summary of the go test output in r to w.
func summarize(r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var (
		out      []string
		running  bool     // inside a timeout's "running tests:" list
		stack    []string // the goroutine being read
		inStack  bool
		stacks   int
		omitted  int
		flushGor = func() {
			if !inStack {
				return
			}
			inStack = false
			if !blockedInTests(stack) {
				return
			}
			if stacks >= maxStacks {
				omitted++
				return
			}
			stacks++
			out = append(out, stack...)
			out = append(out, "")
		}
	)
	for sc.Scan() {
		line := sc.Text()
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "goroutine ") && strings.HasSuffix(line, ":"):
			flushGor()
			running = false
			inStack, stack = true, []string{line}
			continue
		case inStack:
			if t == "" {
				flushGor()
			} else {
				stack = append(stack, line)
			}
			continue
		}
		switch {
		case running && t != "":
			out = append(out, line)
			continue
		case t == "running tests:":
			running = true
			out = append(out, line)
		case strings.HasPrefix(t, "--- FAIL"), strings.HasPrefix(line, "FAIL"), strings.HasPrefix(line, "panic:"),
			strings.HasPrefix(line, "fatal error:"), strings.HasPrefix(t, "WARNING: DATA RACE"):
			running = false
			out = append(out, line)
		default:
			running = false
		}
	}
	flushGor()
	if err := sc.Err(); err != nil {
		return err
	}
	if omitted > 0 {
		out = append(out, fmt.Sprintf("(%d more goroutines blocked in test code not shown)", omitted))
	}
	if len(out) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\n=== summary of the failed run (full output above) ===")
	for _, l := range out {
		fmt.Fprintln(w, l)
	}
	return nil
}

// blockedInTests reports whether a goroutine's stack runs through a test
// file of this module: a test body or a test helper, where a hang shows.
func blockedInTests(stack []string) bool {
	for i, l := range stack {
		if strings.Contains(l, "_test.go:") && i > 0 && strings.Contains(stack[i-1], module) {
			return true
		}
	}
	return false
}
