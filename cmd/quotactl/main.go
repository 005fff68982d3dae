// Command quotactl sets, reads, lists and deletes Leasehold's global limits
// through the allocator's Admin gRPC API, with a required reason and
// optional dry runs; shows a limit's history and the audit log; plans and
// applies limits files (YAML) all or nothing against pinned versions;
// reports a limit's recent windows against G and the overshoot bound
// (windows), and tries a limit against a region agent (check). It speaks
// plaintext or TLS, with a client certificate or a bearer token. It is for
// finance, product and SREs; docs/quotactl.md is the reference.
//
// Exit codes: 0 success, 1 the operation failed (allocator error,
// unreachable, not found, version conflict), 2 bad usage. Every failure
// prints one line on stderr, prefixed "quotactl: ".
//
// The commands live in a dispatch table (commands.go), one file per
// command; run is the testable entry point and main only calls it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
