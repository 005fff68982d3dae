package main

import (
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"leasehold/internal/docflags"
)

// levelFlags is the flag set c parses: the global flags, and a leaf's own.
func levelFlags(c *command) *flagSet {
	f := newFlagSet(c.name)
	newEnv(io.Discard).globals.register(f)
	if c.sub == nil {
		c.flags(f)
	}
	return f
}

var placeholderRe = regexp.MustCompile(`^[a-z][a-z-]*$`)

// resolve walks a quotactl command line as quotactl would: flags at each
// level are checked against that level's flags, positionals name
// subcommands until a leaf. It returns the leaf (or the last group) and
// the problems found.
func resolve(args []string) (*command, []string) {
	cur, f := root, levelFlags(root)
	var bad []string
	for i := 0; i < len(args); i++ {
		w := strings.Trim(args[i], "[]")
		if len(w) > 1 && w[0] == '-' && w != "--" {
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if name == "h" || name == "help" || name == "" {
				continue
			}
			fl := f.Lookup(name)
			if fl == nil {
				bad = append(bad, fmt.Sprintf("quotactl %s has no flag --%s", strings.TrimSpace(path(cur)), name))
				continue
			}
			if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
				i++ // its value
			}
			continue
		}
		if cur.sub == nil || strings.HasPrefix(args[i], "[") || strings.HasSuffix(args[i], "]") {
			continue // a leaf's positional argument, or an optional part of a synopsis
		}
		if w == "help" {
			return cur, bad
		}
		if !placeholderRe.MatchString(w) {
			return nil, bad // COMMAND, ID, ...: a synopsis
		}
		next := cur.find(w)
		if next == nil {
			return nil, append(bad, fmt.Sprintf("quotactl %s has no command %q", strings.TrimSpace(path(cur)), w))
		}
		cur, f = next, levelFlags(next)
	}
	return cur, bad
}

// path is c's command path below root.
func path(c *command) string {
	var walk func(at *command, p string) string
	walk = func(at *command, p string) string {
		if at == c {
			return p
		}
		for _, s := range at.sub {
			if r := walk(s, strings.TrimSpace(p+" "+s.name)); r != "" {
				return r
			}
		}
		return ""
	}
	return walk(root, "")
}

var defaultRe = regexp.MustCompile(`\(default ([^)]+)\)`)

// TestDocsNameRealFlags: every flag the README and docs/ name in a
// `quotactl ...` line, or in a flag table of a quotactl command (the
// headings of docs/quotactl.md name them), exists on that command; a
// default a table states matches the one the flag's usage states.
func TestDocsNameRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("docs: %v %v", files, err)
	}
	cmds, rows, err := docflags.Scan(append(files, "../../README.md")...)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	where := func(file string, line int) string { return filepath.Base(file) + ":" + strconv.Itoa(line) }
	lines := 0
	for _, c := range cmds {
		if c.Binary != "quotactl" {
			continue
		}
		lines++
		_, problems := resolve(c.Args)
		for _, p := range problems {
			bad = append(bad, fmt.Sprintf("%s: %s: %s", where(c.File, c.Line), p, c.Text))
		}
	}
	tables := 0
	for _, r := range rows {
		var c *command
		switch {
		case filepath.Base(r.File) == "quotactl.md" && r.Heading == "Global flags":
			c = root
		case filepath.Base(r.File) == "quotactl.md":
			c, _ = resolve(strings.Fields(r.Heading))
		case r.Command != nil && r.Command.Binary == "quotactl":
			c, _ = resolve(r.Command.Args)
		default:
			continue
		}
		if c == nil {
			bad = append(bad, fmt.Sprintf("%s: a flag table under %q, which names no quotactl command", where(r.File, r.Line), r.Heading))
			continue
		}
		tables++
		f := levelFlags(c)
		for _, name := range r.Flags {
			fl := f.Lookup(name)
			if fl == nil {
				bad = append(bad, fmt.Sprintf("%s: table of quotactl %s: no flag --%s", where(r.File, r.Line), path(c), name))
				continue
			}
			if m := defaultRe.FindStringSubmatch(fl.Usage); m != nil && len(r.Flags) == 1 && r.Default != "" && r.Default != m[1] {
				bad = append(bad, fmt.Sprintf("%s: table of quotactl %s: --%s defaults to %q, the table says %q",
					where(r.File, r.Line), path(c), name, m[1], r.Default))
			}
		}
	}
	if lines < 30 || tables < 20 {
		t.Errorf("only %d quotactl lines and %d table rows found: the scan is broken", lines, tables)
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d flags in the docs do not match quotactl:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
