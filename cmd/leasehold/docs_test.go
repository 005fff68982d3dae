package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"leasehold/internal/docflags"
)

// docFiles are the documents whose flags are checked: README.md and
// docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("docs: %v %v", files, err)
	}
	return append(files, "../../README.md")
}

// TestDocsNameRealFlags: every flag the README and docs/ name in a
// `leasehold COMMAND ...` line or in a flag table of a leasehold command
// exists on that command, and every default a table states is the flag's.
func TestDocsNameRealFlags(t *testing.T) {
	cmds, rows, err := docflags.Scan(docFiles(t)...)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	where := func(file string, line int) string { return filepath.Base(file) + ":" + strconv.Itoa(line) }
	checked := 0
	for _, c := range cmds {
		if c.Binary != "leasehold" {
			continue
		}
		fs, name, problem := leaseholdFlags(c.Args)
		switch {
		case problem != "":
			bad = append(bad, fmt.Sprintf("%s: %s: %s", where(c.File, c.Line), problem, c.Text))
			continue
		case fs == nil:
			continue
		}
		for _, fl := range flagWords(fs, c.Args[1:]) {
			checked++
			if fs.Lookup(fl) == nil {
				bad = append(bad, fmt.Sprintf("%s: leasehold %s has no flag -%s: %s", where(c.File, c.Line), name, fl, c.Text))
			}
		}
	}
	for _, r := range rows {
		if r.Command == nil || r.Command.Binary != "leasehold" {
			continue
		}
		fs, name, problem := leaseholdFlags(r.Command.Args)
		if fs == nil || problem != "" {
			continue // reported above, or not a command
		}
		for _, fl := range r.Flags {
			checked++
			f := fs.Lookup(fl)
			if f == nil {
				bad = append(bad, fmt.Sprintf("%s: table of leasehold %s: no flag -%s", where(r.File, r.Line), name, fl))
				continue
			}
			if len(r.Flags) == 1 && r.Default != "" && !sameDefault(r.Default, f.DefValue) {
				bad = append(bad, fmt.Sprintf("%s: table of leasehold %s: -%s defaults to %q, the table says %q",
					where(r.File, r.Line), name, fl, f.DefValue, r.Default))
			}
		}
	}
	// The README's table of a command lists every flag it has.
	tabled := map[string]map[string]bool{}
	for _, r := range rows {
		if filepath.Base(r.File) != "README.md" || r.Command == nil || r.Command.Binary != "leasehold" || len(r.Command.Args) == 0 {
			continue
		}
		name := r.Command.Args[0]
		if tabled[name] == nil {
			tabled[name] = map[string]bool{}
		}
		for _, fl := range r.Flags {
			tabled[name][fl] = true
		}
	}
	for name, have := range tabled {
		fs, _, _ := leaseholdFlags([]string{name})
		if fs == nil {
			continue
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !have[f.Name] {
				bad = append(bad, fmt.Sprintf("README.md: the table of leasehold %s omits -%s (%s)", name, f.Name, f.Usage))
			}
		})
	}
	if checked < 100 {
		t.Errorf("only %d flag mentions found: the scan is broken", checked)
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d flags in the docs do not match the binary:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// TestEveryCommandHasFlags: the docs test knows every command's flags.
func TestEveryCommandHasFlags(t *testing.T) {
	for name := range commands {
		if commandFlags[name] == nil {
			t.Errorf("command %s has no entry in commandFlags (flagsets.go): the docs test cannot check its flags", name)
		}
	}
}

// leaseholdFlags returns the flag set of the command args name (nil, no
// problem: not a command, e.g. a placeholder or -h).
func leaseholdFlags(args []string) (*flag.FlagSet, string, string) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") || args[0] == "help" {
		return nil, "", ""
	}
	name := args[0]
	if !commandNameRe.MatchString(name) {
		return nil, "", "" // COMMAND, <cmd>, "agent:" in a log line, ...
	}
	reg := commandFlags[name]
	if reg == nil {
		return nil, "", fmt.Sprintf("no command %q", name)
	}
	if name == "history" && (len(args) < 2 || args[1] != "check") {
		return nil, "", "" // `leasehold history` on its own
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	reg(fs)
	return fs, name, ""
}

var commandNameRe = regexp.MustCompile(`^[a-z][a-z-]*$`)

// flagWords returns the names of the flags among args, skipping the value
// after a flag that takes one.
func flagWords(fs *flag.FlagSet, args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		w := strings.Trim(args[i], "[]")
		if len(w) < 2 || w[0] != '-' || w == "--" {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if name == "h" || name == "help" || name == "" {
			continue
		}
		out = append(out, name)
		f := fs.Lookup(name)
		if isBool := f != nil && isBoolFlag(f); !hasValue && !isBool && f != nil {
			i++ // its value
		}
	}
	return out
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// sameDefault: a table's default and the flag's, as values (1m is 1m0s).
func sameDefault(doc, def string) bool {
	if doc == def {
		return true
	}
	if a, err := time.ParseDuration(doc); err == nil {
		b, err := time.ParseDuration(def)
		return err == nil && a == b
	}
	if n, unit, ok := strings.Cut(doc, " "); ok { // 32 MiB
		mult := map[string]float64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
		a, err1 := strconv.ParseFloat(n, 64)
		b, err2 := strconv.ParseFloat(def, 64)
		return mult > 0 && err1 == nil && err2 == nil && a*mult == b
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		b, err := strconv.ParseFloat(def, 64)
		return err == nil && a == b
	}
	return slices.Equal(strings.Split(doc, ","), strings.Split(def, ","))
}
