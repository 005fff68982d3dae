package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"leasehold/internal/vocab"
)

// errNotUTF8: the allocator's strings are protobuf strings, UTF-8 only.
var errNotUTF8 = errors.New("want UTF-8 text")

// flagSet wraps a flag.FlagSet: it keeps declaration order for --help,
// remembers which flags were given, and turns the flag package's errors into
// one-line usage errors that quote the bad value and say what was wanted.
type flagSet struct {
	*flag.FlagSet
	order []string        // flag names in declaration order
	err   error           // the first bad value, precisely worded
	given map[string]bool // flags present on the command line, after parse
}

func newFlagSet(name string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // we print usage and errors ourselves
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, given: map[string]bool{}}
}

// value declares a flag parsed by set. set's error says what was wanted,
// e.g. "want a whole number"; the message becomes `--name "value": want...`.
func (f *flagSet) value(name, usage string, set func(string) error) {
	f.order = append(f.order, name)
	f.Func(name, usage, func(s string) error {
		err := errNotUTF8
		if utf8.ValidString(s) {
			err = set(s)
		}
		if err != nil {
			if f.err == nil {
				var ue *usageError
				if errors.As(err, &ue) {
					f.err = err
				} else {
					f.err = usagef("%s %q: %v", dashed(name), s, err)
				}
			}
			return err
		}
		return nil
	})
}

func (f *flagSet) boolVar(p *bool, name, usage string) {
	f.order = append(f.order, name)
	f.BoolVar(p, name, *p, usage)
}

func (f *flagSet) stringVar(p *string, name, usage string) {
	f.value(name, usage, func(s string) error { *p = s; return nil })
}

func (f *flagSet) int64Var(p *int64, name, usage string) {
	f.value(name, usage, func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return errors.New("want a whole number")
		}
		*p = n
		return nil
	})
}

// tokensVar is int64Var for an amount of tokens: min..vocab.MaxTokens, the
// allocator's one maximum, so an amount it would refuse is a usage error.
func (f *flagSet) tokensVar(p *int64, name, usage string, min int64) {
	f.value(name, usage, func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return errors.New("want a whole number")
		}
		if n < min || n > vocab.MaxTokens {
			return fmt.Errorf("want a whole number from %d to %d", min, vocab.MaxTokens)
		}
		*p = n
		return nil
	})
}

func (f *flagSet) durationVar(p *time.Duration, name, usage string) {
	f.value(name, usage, func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return errors.New("want a duration with a unit, such as 30s, 1m or 1h30m")
		}
		*p = d
		return nil
	})
}

// listVar declares a repeatable, comma-separated list flag.
func (f *flagSet) listVar(p *[]string, name, usage string) {
	f.value(name, usage, func(s string) error {
		for _, v := range strings.Split(s, ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return errors.New("want a comma-separated list without empty items")
			}
			*p = append(*p, v)
		}
		return nil
	})
}

// dashed is how a flag is written: "-f" for a one-letter name, "--name"
// otherwise.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// isSet reports whether the flag was given on the command line.
func (f *flagSet) isSet(name string) bool { return f.given[name] }

// require returns a usage error naming the first flag not given.
func (f *flagSet) require(names ...string) error {
	for _, n := range names {
		if !f.isSet(n) {
			return usagef("%s is required", dashed(n))
		}
	}
	return nil
}

// parse parses flags up to the first positional argument and returns the
// rest (for command groups, whose first positional names a subcommand).
func (f *flagSet) parse(args []string) ([]string, error) {
	if err := f.Parse(args); err != nil {
		return nil, f.wrap(err)
	}
	f.Visit(func(fl *flag.Flag) { f.given[fl.Name] = true })
	return f.Args(), nil
}

// parseInterspersed parses flags anywhere among the positional arguments
// ("limits set ID --limit 5" and "limits set --limit 5 ID" mean the same)
// and returns the positionals in order. "--" ends the flags. It scans the
// arguments once, so it is bounded by len(args).
func (f *flagSet) parseInterspersed(args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimPrefix(a[1:], "-")
		if strings.Contains(name, "=") {
			continue
		}
		fl := f.Lookup(name)
		if fl == nil {
			continue // unknown: Parse reports it
		}
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i]) // the flag's value, whatever it looks like
		}
	}
	rest, err := f.parse(flags)
	if err != nil {
		return nil, err
	}
	return append(pos, rest...), nil
}

// wrap turns a flag package error into a usage error (ErrHelp passes).
func (f *flagSet) wrap(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if f.err != nil {
		return f.err
	}
	msg := err.Error()
	if n, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return usagef("unknown flag --%s", strings.TrimPrefix(n, "-"))
	}
	if n, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usagef("%s needs a value", dashed(strings.TrimPrefix(n, "-")))
	}
	if v, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		// invalid boolean value "x" for -json: parse error
		if i := strings.LastIndex(v, " for -"); i >= 0 {
			name, _, _ := strings.Cut(strings.TrimPrefix(v[i+len(" for -"):], "-"), ":")
			return usagef("--%s %s: want true or false", name, v[:i])
		}
	}
	return &usageError{msg: msg}
}

// printFlags writes "  --name PLACEHOLDER\n        usage" for each flag,
// in declaration order. Usage strings start with "`PLACEHOLDER`: ".
func (f *flagSet) printFlags(w io.Writer) {
	for _, n := range f.order {
		fl := f.Lookup(n)
		ph, usage := flag.UnquoteUsage(fl)
		if _, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok {
			ph = ""
		}
		usage = strings.TrimPrefix(usage, ph+": ")
		head := "  " + dashed(n)
		if ph != "" {
			head += " " + ph
		}
		fmt.Fprintf(w, "%s\n        %s\n", head, usage)
	}
}
