package main

import (
	"strings"
	"unicode/utf8"
)

// limitsCmd groups the commands on global limits.
var limitsCmd = &command{
	name:    "limits",
	summary: "create, read, list and delete global limits, see their history, apply limits files",
	sub: []*command{limitsSetCmd, limitsGetCmd, limitsListCmd, limitsDeleteCmd, limitsHistoryCmd,
		limitsOverrideCmd, limitsPlanCmd, limitsApplyCmd, limitsExportCmd},
}

// oneID returns the single positional ID argument.
func oneID(args []string) (string, error) {
	switch {
	case len(args) == 0 || args[0] == "":
		return "", usagef("missing ID")
	case len(args) > 1:
		return "", usagef("unexpected argument %q (one ID at a time)", args[1])
	case !utf8.ValidString(args[0]):
		return "", usagef("ID %q: %v", args[0], errNotUTF8)
	}
	return args[0], nil
}

// noArgs rejects positional arguments.
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", strings.Join(args, " "))
	}
	return nil
}
