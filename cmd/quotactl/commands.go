package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"unicode"
)

// command is one entry of the dispatch table: a group (sub set) or a leaf
// (flags set). Adding a command is adding one value in its own file and
// naming it in its parent's sub list.
type command struct {
	name    string
	args    string // synopsis after the command path, e.g. "ID [flags]"
	summary string // one line, lower case, no period
	detail  string // optional paragraphs for --help
	sub     []*command
	// flags declares the leaf's flags on f and returns its action. It is
	// called once per invocation, so the values it binds start fresh.
	flags func(f *flagSet) action
}

// action runs a leaf command with its positional arguments, flags parsed.
type action func(ctx context.Context, e *env, args []string) error

// root is the top of the dispatch table.
var root = &command{
	name:    "quotactl",
	summary: "manage Leasehold's global quota limits",
	sub:     []*command{limitsCmd, plansCmd, checkCmd, windowsCmd, auditCmd, whoamiCmd, groupsCmd},
}

// usageError is bad usage: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// run executes one quotactl invocation and returns its exit code: 0 on
// success or help, 1 when the operation failed, 2 on bad usage. Output goes
// to stdout; a failure writes exactly one line to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	e := newEnv(stdout)
	defer e.close()
	defer func() {
		// Never a stack trace, whatever the input: a bug is one line too.
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "quotactl: internal error: %s\n", oneLine(fmt.Sprint(r)))
			code = 1
		}
	}()
	err := root.exec(ctx, e, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	prefix := "quotactl: "
	if e.path != "" {
		prefix += e.path + ": "
	}
	fmt.Fprintf(stderr, "%s%s\n", prefix, oneLine(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// exec parses c's flags (global flags are accepted at every level) and
// runs c, or dispatches to the subcommand named by the first argument.
func (c *command) exec(ctx context.Context, e *env, args []string) error {
	if c != root {
		e.path = strings.TrimSpace(e.path + " " + c.name)
	}
	f := newFlagSet(c.name)
	e.globals.register(f)
	if c.sub == nil {
		act := c.flags(f)
		pos, err := f.parseInterspersed(args)
		if err != nil {
			return e.helpOr(c, err)
		}
		return act(ctx, e, pos)
	}
	// A group: flags up to the first positional, which names the
	// subcommand.
	rest, err := f.parse(args)
	if err != nil {
		return e.helpOr(c, err)
	}
	if len(rest) == 0 {
		return usagef("missing command (want %s; see --help)", c.names())
	}
	if rest[0] == "help" {
		return e.help(c, rest[1:])
	}
	sub := c.find(rest[0])
	if sub == nil {
		return usagef("unknown command %q (want %s)", rest[0], c.names())
	}
	return sub.exec(ctx, e, rest[1:])
}

func (c *command) find(name string) *command {
	for _, s := range c.sub {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (c *command) names() string {
	n := make([]string, len(c.sub))
	for i, s := range c.sub {
		n[i] = s.name
	}
	switch len(n) {
	case 1:
		return n[0]
	case 2:
		return n[0] + " or " + n[1]
	}
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// helpOr prints c's usage to stdout for -h/--help and passes any other
// error through.
func (e *env) helpOr(c *command, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		printUsage(e.stdout, c, e.path)
	}
	return err
}

// help is "quotactl [group] help [command...]": usage of the command named
// below group c.
func (e *env) help(c *command, names []string) error {
	path := e.path
	for _, n := range names {
		s := c.find(n)
		if s == nil {
			e.path = strings.TrimSpace(e.path + " help")
			return usagef("unknown command %q", strings.TrimSpace(path+" "+n))
		}
		c, path = s, strings.TrimSpace(path+" "+n)
	}
	printUsage(e.stdout, c, path)
	return nil
}

// printUsage writes c's help: synopsis, summary, subcommands or flags, and
// the global flags.
func printUsage(w io.Writer, c *command, path string) {
	full := "quotactl"
	if path != "" {
		full += " " + path
	}
	var b strings.Builder
	switch {
	case c.sub != nil && c == root:
		fmt.Fprintf(&b, "Usage: quotactl [global flags] <command> [flags]\n\nquotactl: %s.\n", c.summary)
	case c.sub != nil:
		fmt.Fprintf(&b, "Usage: quotactl [global flags] %s <command> [flags]\n\n%s.\n", path, upperFirst(c.summary))
	default:
		fmt.Fprintf(&b, "Usage: %s %s\n\n%s.\n", full, c.args, upperFirst(c.summary))
	}
	if c.detail != "" {
		fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(c.detail))
	}
	if c.sub != nil {
		b.WriteString("\nCommands:\n")
		width := 0
		for _, s := range c.sub {
			width = max(width, len(s.name))
		}
		for _, s := range c.sub {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, s.name, s.summary)
		}
		fmt.Fprintf(&b, "\nRun \"%s <command> --help\" for a command's flags.\n", full)
	} else {
		f := newFlagSet(c.name)
		c.flags(f)
		if len(f.order) > 0 {
			b.WriteString("\nFlags:\n")
			f.printFlags(&b)
		}
	}
	b.WriteString("\nGlobal flags (accepted anywhere on the command line):\n")
	g := newFlagSet("global")
	dg := defaultGlobals()
	dg.register(g)
	g.printFlags(&b)
	io.WriteString(w, b.String())
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// oneLine makes s safe to print as one line: control characters (newlines
// included) are escaped.
func oneLine(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) {
			q := fmt.Sprintf("%q", r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
