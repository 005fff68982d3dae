// Command leasehold runs Leasehold's servers:
//
//	leasehold allocator   the home-region allocator (embedded etcd by default)
//	leasehold agent       a region agent
//	leasehold dev         everything in one process: etcd, allocator, two agents
//	leasehold cluster     the production topology on one machine, from real processes
//	leasehold etcd        one etcd member (leasehold cluster runs three)
//	leasehold gateway     a reverse proxy that puts a global limit in front of an HTTP service
//	leasehold certs       a development CA, certificates and an auth file (docs/security.md)
//	leasehold history     check histories the servers recorded (-history) against the invariants
//
// Run `leasehold COMMAND -h` for a command's flags. Exit codes: 0 on a clean
// shutdown, 1 when a server fails, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"allocator": {"run the home-region allocator", runAllocatorCmd},
	"agent":     {"run a region agent", runAgentCmd},
	"certs":     {"write a development CA, certificates and an auth file", runCertsCmd},
	"cluster":   {"run the production topology on this machine from real processes (docs/deploy.md)", runClusterCmd},
	"etcd":      {"run one etcd member (leasehold cluster runs three)", runEtcdCmd},
	"dev":       {"run everything in one process on embedded defaults", runDevCmd},
	"gateway":   {"run a reverse proxy that puts a global limit in front of an HTTP service", runGatewayCmd},
	"history":   {"check histories recorded with -history against the per-window invariants", runHistoryCmd},
}

// usageError is bad usage: exit code 2 with a one-line reason.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: leasehold COMMAND [flags]")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}

// run is the testable entry point.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "leasehold: unknown command %q (try: leasehold help)\n", args[0])
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "leasehold %s: %s\n", args[0], oneLine(ue.msg))
		return 2
	default:
		fmt.Fprintf(stderr, "leasehold %s: %s\n", args[0], oneLine(err.Error()))
		return 1
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
