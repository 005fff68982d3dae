package docflags

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	md := "# Title\n\n" +
		"Run `leasehold agent --region eu --redis 'h:1' | tee log` or\n" +
		"`go run ./cmd/quotactl --json limits list`.\n\n" +
		"```sh\n" +
		"quotactl limits set tenant/a --limit 5 \\\n" +
		"  --reason \"new contract\" # a comment --not-a-flag\n" +
		"curl -i http://x/ && /tmp/bin/leasehold dev --traffic\n" +
		"kubectl -n leasehold create secret x\n" +
		"```\n\n" +
		"## `leasehold allocator`\n\n" +
		"| flag | default | meaning |\n|---|---|---|\n" +
		"| `--grpc-addr ADDR` | `127.0.0.1:7400` | see `leasehold gateway --listen X` |\n" +
		"| `--tls-cert`, `--tls-key` | `a`, `b` | two |\n" +
		"| not a flag | x | y |\n\n" +
		"## Other\n\n" +
		"`quotactl check --limit ID`\n\n" +
		"| flag | meaning |\n|---|---|\n| `--count N` | calls |\n\n" +
		"## `leasehold cluster`\n\n```\nTry: go run ./cmd/quotactl windows x\n```\n\n" +
		"| flag | meaning |\n|---|---|\n| `--dir` | its directory |\n"
	f := filepath.Join(t.TempDir(), "x.md")
	if err := os.WriteFile(f, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	cmds, rows, err := Scan(f)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cmds {
		got = append(got, c.Binary+" "+strings.Join(c.Args, " "))
	}
	want := []string{
		"leasehold agent --region eu --redis h:1",
		"quotactl --json limits list",
		"quotactl limits set tenant/a --limit 5 --reason new contract",
		"leasehold dev --traffic",
		"leasehold gateway --listen X",
		"quotactl check --limit ID",
		"quotactl windows x",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	if r := rows[0]; r.Command == nil || strings.Join(r.Command.Args, " ") != "allocator" || r.Flags[0] != "grpc-addr" || r.Default != "127.0.0.1:7400" {
		t.Errorf("row 0: %+v (command %+v)", r, r.Command)
	}
	if r := rows[1]; strings.Join(r.Flags, ",") != "tls-cert,tls-key" || r.Default != "" {
		t.Errorf("row 1: %+v", r)
	}
	// Under a heading without a command, the last command line above the
	// table (not one inside a table) names it.
	if r := rows[2]; r.Command == nil || r.Command.Binary != "quotactl" || r.Command.Args[0] != "check" || r.Flags[0] != "count" {
		t.Errorf("row 2: %+v (command %+v)", r, r.Command)
	}
	// A quotactl line in a leasehold command's section does not take its
	// table.
	if r := rows[3]; r.Command == nil || r.Command.Binary != "leasehold" || r.Command.Args[0] != "cluster" {
		t.Errorf("row 3: %+v (command %+v)", r, r.Command)
	}
}
