package main

import (
	"strings"
	"testing"
)

// TestUsageErrors: bad command lines exit 2 with one line on stderr that
// says what was wrong, and print nothing on stdout. None reaches the
// allocator (the address given is closed; a dial would exit 1).
func TestUsageErrors(t *testing.T) {
	closed := closedAddr(t)
	set := func(extra ...string) []string {
		return append([]string{"limits", "set", "tenant/atlas", "--limit", "100", "--window", "1m",
			"--regions", "eu,us", "--mode", "bounded"}, extra...)
	}
	for _, tc := range []struct {
		args []string
		want string // the whole line, or a part of it
	}{
		{nil, "quotactl: missing command"},
		{[]string{"bogus"}, `quotactl: unknown command "bogus" (want limits, plans, check, windows, audit, whoami or groups)`},
		{[]string{"--json"}, "quotactl: missing command"},
		{[]string{"limits"}, "quotactl: limits: missing command (want set, get, list, delete, history, override, plan, apply or export"},
		{[]string{"limits", "bogus"}, `quotactl: limits: unknown command "bogus" (want set, get, list, delete, history, override, plan, apply or export)`},
		{[]string{"limits", "get"}, "quotactl: limits get: missing ID"},
		{[]string{"limits", "get", ""}, "quotactl: limits get: missing ID"},
		{[]string{"limits", "get", "a", "b"}, `quotactl: limits get: unexpected argument "b"`},
		{[]string{"limits", "delete"}, "quotactl: limits delete: missing ID"},
		{[]string{"limits", "delete", "x", "--expect-version", "two"}, `quotactl: limits delete: --expect-version "two": want a whole number`},
		{[]string{"limits", "list", "extra"}, `quotactl: limits list: unexpected argument "extra"`},
		{[]string{"limits", "list", "--page-size", "0"}, `--page-size "0": want a whole number from 1 to 1000`},
		{[]string{"limits", "list", "--page-size", "1001"}, `--page-size "1001"`},
		{[]string{"limits", "list", "--prefix"}, "quotactl: limits list: --prefix needs a value"},
		{[]string{"limits", "set"}, "quotactl: limits set: missing ID"},
		{[]string{"limits", "set", "x"}, "quotactl: limits set: --limit is required"},
		{[]string{"limits", "set", "x", "--limit", "5"}, "quotactl: limits set: --window is required"},
		{[]string{"limits", "set", "x", "--limit", "5", "--window", "1m"}, "quotactl: limits set: --regions is required"},
		{[]string{"limits", "set", "x", "--limit", "5", "--window", "1m", "--regions", "eu"}, "quotactl: limits set: --mode is required"},
		{set("--limit", "abc"), `quotactl: limits set: --limit "abc": want a whole number`},
		{set("--limit", "1.5"), `--limit "1.5": want a whole number`},
		{set("--limit", "99999999999999999999"), `--limit "99999999999999999999": want a whole number`},
		{set("--limit"), "quotactl: limits set: --limit needs a value"},
		{set("--window", "5"), `quotactl: limits set: --window "5": want a duration with a unit`},
		{set("--window", "soon"), `--window "soon"`},
		{set("--ttl", "1x"), `--ttl "1x"`},
		{set("--min-chunk", "x"), `--min-chunk "x": want a whole number`},
		{set("--limit", "1125899906842625"), `quotactl: limits set: --limit "1125899906842625": want a whole number from 1 to 1125899906842624`},
		{set("--limit", "0"), `--limit "0": want a whole number from 1 to 1125899906842624`},
		{set("--min-chunk", "1125899906842625"), `--min-chunk "1125899906842625": want a whole number from 0 to 1125899906842624`},
		{set("--max-chunk", "-1"), `--max-chunk "-1": want a whole number from 0 to 1125899906842624`},
		{set("--fallback", "eu=local:1125899906842625"), `--fallback "eu=local:1125899906842625": want`},
		{set("--max-chunk", ""), `--max-chunk "": want a whole number`},
		{set("--expect-version", "v1"), `--expect-version "v1": want a whole number`},
		{set("--mode", "loose"), `quotactl: limits set: --mode "loose": want strict or bounded`},
		{set("--mode", "STRICT"), `--mode "STRICT": want strict or bounded`},
		{set("--regions", "eu,,us"), `--regions "eu,,us": want a comma-separated list without empty items`},
		{set("--fallback", "eu=loose"), `quotactl: limits set: --fallback "eu=loose": want REGION=closed|local:A|open`},
		{set("--fallback", "eu"), `--fallback "eu": want REGION=closed|local:A|open`},
		{set("--fallback", "=closed"), `--fallback "=closed": want REGION=closed|local:A|open`},
		{set("--fallback", "eu=local"), `--fallback "eu=local": want REGION=closed|local:A|open`},
		{set("--fallback", "eu=local:"), `--fallback "eu=local:": want`},
		{set("--fallback", "eu=local:ten"), `--fallback "eu=local:ten": want`},
		{set("--fallback", "eu=closed,us=loose"), `--fallback "us=loose": want REGION=closed|local:A|open`},
		{set("--fallback", "eu=closed,"), `--fallback "": want`},
		{set("--fallback", "eu=closed", "--fallback", "eu=open"), `--fallback "eu=open": region "eu" given twice`},
		{set("--tag", "novalue"), `--tag "novalue": want KEY=VALUE`},
		{set("--tag", "=v"), `--tag "=v": want KEY=VALUE`},
		{set("--tag", "a=1", "--tag", "a=2"), `--tag "a=2": tag "a" given twice`},
		{set("--bogus"), "quotactl: limits set: unknown flag --bogus"},
		{set("--bogus=1"), "quotactl: limits set: unknown flag --bogus"},
		{set("-limit=x"), `--limit "x": want a whole number`},
		{set("---limit", "5"), "quotactl: limits set: bad flag syntax: ---limit"},
		{set("extra"), `quotactl: limits set: unexpected argument "extra"`},
		{[]string{"--timeout", "0s", "limits", "list"}, `quotactl: --timeout "0s": want a positive duration`},
		{[]string{"--timeout", "-1s", "limits", "list"}, `--timeout "-1s": want a positive duration`},
		{[]string{"--timeout", "5", "limits", "list"}, `--timeout "5": want a positive duration`},
		{[]string{"limits", "list", "--timeout", "abc"}, `quotactl: limits list: --timeout "abc"`},
		{[]string{"--allocator", "", "limits", "list"}, `quotactl: --allocator "": want host:port`},
		{[]string{"--allocator", "a b:1", "limits", "list"}, `--allocator "a b:1": want host:port without spaces`},
		{[]string{"--json=maybe", "limits", "list"}, `quotactl: --json "maybe": want true or false`},
		{[]string{"--bogus", "limits"}, "quotactl: unknown flag --bogus"},
		{[]string{"limits", "--bogus"}, "quotactl: limits: unknown flag --bogus"},
		{[]string{"help", "bogus"}, `quotactl: help: unknown command "bogus"`},
		{[]string{"limits", "help", "bogus"}, `quotactl: limits help: unknown command "limits bogus"`},
		{[]string{"limits", "get", "--", "--json"}, ""}, // "--json" is the ID here: exit 1, not 2 (see below)
		{[]string{"limits", "set", "x\ny", "--limit", "z\nz"}, `--limit "z\nz"`},
		{[]string{"limits", "get", "bad\xffid"}, `quotactl: limits get: ID "bad\xffid": want UTF-8 text`},
		{set("--owner", "\xff"), `--owner "\xff": want UTF-8 text`},
		{[]string{"limits", "set", "x", "--limit", "5", "--window", "1m", "--regions", "eu", "--mode", "strict"}, "quotactl: limits set: --reason is required"},
		{set("--reason", " "), `quotactl: limits set: --reason " ": want a non-empty reason`},
		{set("--reason", "r", "--effective", "later"), `quotactl: limits set: --effective "later": want now or next-window`},
		{set("--reason", "r", "--dry-run=maybe"), `--dry-run "maybe": want true or false`},
		{[]string{"limits", "delete", "x"}, "quotactl: limits delete: --reason is required"},
		{[]string{"limits", "delete", "x", "--reason", "r", "--effective", "now"}, "quotactl: limits delete: unknown flag --effective"},
		{[]string{"limits", "history"}, "quotactl: limits history: missing ID"},
		{[]string{"limits", "history", "a", "b"}, `quotactl: limits history: unexpected argument "b"`},
		{[]string{"limits", "plan"}, "quotactl: limits plan: -f is required"},
		{[]string{"limits", "plan", "-f"}, "quotactl: limits plan: -f needs a value"},
		{[]string{"limits", "plan", "-f", "/nonexistent/limits.yaml"}, `quotactl: limits plan: -f "/nonexistent/limits.yaml": no such file or directory`},
		{[]string{"limits", "apply", "--reason", "r"}, `quotactl: limits apply: -f FILE or --plan PLAN is required`},
		{[]string{"limits", "apply", "--plan", "plan.json"}, "quotactl: limits apply: --reason is required"},
		{[]string{"limits", "apply", "--plan", "/nonexistent/plan.json", "--reason", "r"}, `quotactl: limits apply: --plan "/nonexistent/plan.json": no such file or directory`},
		{[]string{"limits", "export", "--prefix", "tenant/*"}, `quotactl: limits export: --prefix "tenant/*": a prefix is plain text`},
		{[]string{"limits", "export", "x"}, `quotactl: limits export: unexpected argument "x"`},
		{[]string{"audit", "--since", "yesterday"}, `quotactl: audit: --since "yesterday": want a duration back from now`},
		{[]string{"audit", "--since", "-2h"}, `--since "-2h": want a positive duration`},
		{[]string{"audit", "x"}, `quotactl: audit: unexpected argument "x"`},
		{[]string{"whoami", "x"}, `quotactl: whoami: unexpected argument "x"`},
	} {
		name := strings.Join(tc.args, " ")
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--allocator", closed, "--timeout", "2s"}, tc.args...)
			r := quotactl(args...)
			if tc.want == "" {
				r.want(t, 1)
				return
			}
			r.want(t, 2)
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tc.want)
			}
		})
	}
}

// TestHelp: -h, --help and "help" print usage on stdout and exit 0.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"Usage: quotactl [global flags] <command>", "limits", "check", "windows", "--allocator ADDR", "--timeout DUR", "--json"}},
		{[]string{"--help"}, []string{"Usage: quotactl", "Commands:"}},
		{[]string{"help"}, []string{"Usage: quotactl", "Commands:"}},
		{[]string{"limits", "--help"}, []string{"Usage: quotactl [global flags] limits <command>", "set", "get", "list", "delete", "history", "plan", "apply", "export"}},
		{[]string{"limits", "plan", "-h"}, []string{"Usage: quotactl limits plan -f FILE [-o PLAN]", "  -f FILE", "  -o PLAN", "manage"}},
		{[]string{"limits", "apply", "-h"}, []string{"Usage: quotactl limits apply (-f FILE | --plan PLAN [-f FILE]) --reason TEXT", "--effective now|next-window", "--dry-run"}},
		{[]string{"audit", "-h"}, []string{"Usage: quotactl audit", "--since 24h|RFC3339", "--prefix P"}},
		{[]string{"-h"}, []string{"--tls-ca FILE", "--tls-cert FILE", "--tls-key FILE", "--token TOKEN", "--token-file FILE"}},
		{[]string{"help", "limits"}, []string{"Usage: quotactl [global flags] limits <command>"}},
		{[]string{"limits", "set", "-h"}, []string{"Usage: quotactl limits set ID (--limit N --window DUR | --rate N/PERIOD --burst N)", "--rate N/PERIOD", "--burst N", "--fallback REGION=closed|local:A|open", "--expect-version V", "--tag KEY=VALUE", "--allocator ADDR"}},
		{[]string{"limits", "set", "tenant/x", "--limit", "5", "--help"}, []string{"Usage: quotactl limits set"}},
		{[]string{"help", "limits", "set"}, []string{"Usage: quotactl limits set"}},
		{[]string{"limits", "help", "set"}, []string{"Usage: quotactl limits set"}},
		{[]string{"limits", "help"}, []string{"Usage: quotactl [global flags] limits <command>"}},
		{[]string{"limits", "get", "--help"}, []string{"Usage: quotactl limits get ID"}},
		{[]string{"limits", "list", "-help"}, []string{"--prefix P", "--page-size N"}},
		{[]string{"limits", "delete", "-h"}, []string{"Usage: quotactl limits delete ID", "--expect-version V", "--reason TEXT", "--dry-run"}},
		{[]string{"help", "windows"}, []string{"Usage: quotactl windows ID [--last N]", "--last N"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := quotactl(tc.args...)
			r.want(t, 0)
			for _, w := range tc.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("help lacks %q:\n%s", w, r.stdout)
				}
			}
		})
	}
}
