package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// FuzzArgs feeds arbitrary argument lists (NUL-separated) to run against a
// closed loopback port with a tiny timeout: it never panics, always exits
// 0, 1 or 2, and a failure is exactly one "quotactl: " line on stderr.
func FuzzArgs(f *testing.F) {
	for _, args := range [][]string{
		{},
		{"--help"},
		{"limits"},
		{"limits", "get", "tenant/atlas"},
		{"--json", "limits", "list", "--prefix", "tenant/"},
		{"limits", "list", "--page-size", "2"},
		{"limits", "delete", "tenant/atlas", "--expect-version", "3"},
		{"limits", "set", "tenant/atlas", "--limit", "1000", "--window", "1m", "--regions", "eu,us",
			"--mode", "bounded", "--fallback", "eu=closed,us=local:100", "--ttl", "15s", "--min-chunk", "5",
			"--max-chunk", "100", "--owner", "finance", "--description", "Atlas", "--tag", "team=x", "--expect-version", "0"},
		{"limits", "set", "--limit", "abc", "x"},
		{"limits", "set", "x", "--fallback", "eu=loose"},
		{"limits", "set", "x", "--window", "5", "--", "--limit"},
		{"limits", "get", "--", "-x"},
		{"help", "limits", "set"},
		{"--timeout", "1h", "limits", "get", "x"},
		{"limits", "set", "x", "--tag", "=", "--mode", "", "--regions", ",", "--json=x"},
		{"-", "--", "---", "-=", "--=x"},
		{"check", "--limit", "tenant/atlas"},
		{"check", "--limit", "x", "--cost", "2", "--count", "3", "--concurrency", "2", "--duration", "1s", "--rate", "100", "--json"},
		{"check", "--limit", "x", "--duration", "1h", "--rate", "0.5"},
		{"check", "--limit", "x", "--concurrency", "1025", "--rate", "-1"},
		{"windows", "tenant/atlas", "--last", "3", "--json"},
		{"windows", "--last", "0"},
		{"limits", "set", "x", "--limit", "5", "--window", "1m", "--regions", "eu", "--mode", "strict", "--reason", "r", "--effective", "now", "--dry-run"},
		{"limits", "delete", "x", "--reason", "r", "--dry-run", "--json"},
		{"limits", "history", "tenant/atlas", "--json"},
		{"limits", "plan", "-f", "/nonexistent", "-o", "/nonexistent"},
		{"limits", "apply", "--plan", "/nonexistent", "--reason", "r", "-f", "x"},
		{"limits", "export", "--prefix", "tenant/"},
		{"audit", "--since", "2026-11-29T19:00:00Z", "--prefix", "tenant/"},
		{"whoami", "--tls", "--token", "t", "--tls-server-name", "x"},
		{"limits", "list", "--tls-ca", "/nonexistent", "--tls-cert", "a", "--tls-key", "b", "--token-file", "/nonexistent"},
	} {
		f.Add(strings.Join(args, "\x00"))
	}
	addr := closedAddr(f)
	f.Fuzz(func(t *testing.T, joined string) {
		var args []string
		if joined != "" {
			args = strings.Split(joined, "\x00")
		}
		if len(args) > 64 {
			args = args[:64]
		}
		// Keep every dial on the closed loopback port: drop any
		// --allocator or --agent the input carries (and its value, if
		// separate); check's --agent is put back after "check".
		kept := []string{"--allocator", addr, "--timeout", "50ms"}
		for i := 0; i < len(args); i++ {
			name := strings.TrimLeft(args[i], "-")
			if args[i] == "check" {
				kept = append(kept, args[i], "--agent", addr)
				continue
			}
			if args[i] != name && (strings.HasPrefix(name, "allocator") || strings.HasPrefix(name, "agent")) {
				if !strings.Contains(name, "=") {
					i++
				}
				continue
			}
			kept = append(kept, args[i])
		}
		var o, e bytes.Buffer
		code := run(context.Background(), kept, &o, &e)
		r := result{o.String(), e.String(), code}
		if code != 0 && code != 1 && code != 2 {
			t.Fatalf("%q: exit %d", kept, code)
		}
		checkStderr(t, r)
		if strings.Contains(r.stderr, "internal error") {
			t.Fatalf("%q: %s", kept, r.stderr)
		}
	})
}
