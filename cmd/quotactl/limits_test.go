package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/etcdtest"
	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// TestLimitsLifecycle drives one real allocator on embedded etcd through
// set, get, list, a stale set, delete and a get of the deleted limit.
func TestLimitsLifecycle(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	at := []string{"--allocator", ta.addr}
	q := func(args ...string) result { return quotactl(append(append([]string{}, at...), args...)...) }

	// Flags after the ID, fallback both repeated and comma separated.
	r := q("limits", "set", "--reason", "test", "tenant/atlas", "--limit", "1000", "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--fallback", "us=local:100", "--fallback", "eu=closed",
		"--ttl", "15s", "--min-chunk", "5", "--max-chunk", "100", "--standing", "5", "--owner", "finance",
		"--description", "Atlas contract, 2026", "--tag", "tier=gold", "--tag", "team=payments").want(t, 0)
	want := map[string]string{
		"id": "tenant/atlas", "limit": "1000", "window": "1m", "regions": "eu,us", "mode": "bounded",
		"fallback": "eu=closed,us=local:100", "ttl": "15s", "min-chunk": "5", "max-chunk": "100", "standing": "5",
		"owner": "finance", "description": "Atlas contract, 2026", "tags": "team=payments,tier=gold",
		"version": "1",
	}
	checkKV(t, kv(t, r.stdout), want)

	// Flags before the ID; global flags after the command; defaults filled in.
	r = quotactl("limits", "set", "--reason", "test", "--limit", "50", "--window", "1s", "--regions", "us", "--mode", "strict",
		"--expect-version", "0", "tenant/beta", "--allocator", ta.addr).want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{
		"id": "tenant/beta", "window": "1s", "mode": "strict", "fallback": "us=closed",
		"ttl": "250ms", "min-chunk": "1", "max-chunk": "0 (no cap)", "owner": "", "version": "1",
	})

	checkKV(t, kv(t, q("limits", "get", "tenant/atlas").want(t, 0).stdout), want)

	// A new version with --expect-version; then the same version again is stale.
	r = q("limits", "set", "--reason", "test", "tenant/atlas", "--limit", "2000", "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--fallback", "eu=closed,us=local:100", "--expect-version", "1").want(t, 0)
	checkKV(t, kv(t, r.stdout), map[string]string{"limit": "2000", "version": "2", "owner": ""})
	r = q("limits", "set", "--reason", "test", "tenant/atlas", "--limit", "3000", "--window", "1m", "--regions", "eu,us",
		"--mode", "bounded", "--expect-version", "1").want(t, 1)
	if !strings.Contains(r.stderr, "version") || r.stdout != "" {
		t.Fatalf("stale set: stdout %q stderr %q, want the version conflict", r.stdout, r.stderr)
	}
	r = q("limits", "set", "--reason", "test", "tenant/beta", "--limit", "5", "--window", "1s", "--regions", "us",
		"--mode", "strict", "--expect-version", "0").want(t, 1)
	if !strings.Contains(r.stderr, "version") {
		t.Fatalf("create-only set of an existing limit: %q", r.stderr)
	}

	// The table: header and one row per limit, in id order.
	r = q("limits", "list").want(t, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("list printed %d lines, want 3:\n%s", len(lines), r.stdout)
	}
	wantRows := [][]string{
		{"ID", "G", "WINDOW", "REGIONS", "MODE", "FALLBACK", "VERSION", "OWNER"},
		{"tenant/atlas", "2000", "1m", "eu,us", "bounded", "eu=closed,us=local:100", "2", "-"},
		{"tenant/beta", "50", "1s", "us", "strict", "us=closed", "1", "-"},
	}
	for i, line := range lines {
		if got := strings.Fields(line); strings.Join(got, " ") != strings.Join(wantRows[i], " ") {
			t.Errorf("list line %d = %q, want fields %q", i, line, wantRows[i])
		}
		if i > 0 && strings.Index(line, wantRows[i][1]) != strings.Index(lines[0], "G") {
			t.Errorf("column G not aligned:\n%s", r.stdout)
		}
	}
	r = q("limits", "list", "--prefix", "tenant/b").want(t, 0)
	if strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, "tenant/beta") {
		t.Fatalf("list --prefix tenant/b:\n%s", r.stdout)
	}

	// Delete: a stale version is refused, the right one deletes.
	r = q("limits", "delete", "--reason", "test", "tenant/atlas", "--expect-version", "1").want(t, 1)
	if !strings.Contains(r.stderr, "version") {
		t.Fatalf("stale delete: %q", r.stderr)
	}
	r = q("limits", "delete", "--reason", "test", "tenant/atlas", "--expect-version", "2").want(t, 0)
	if r.stdout != "deleted tenant/atlas\n" {
		t.Fatalf("delete printed %q", r.stdout)
	}
	r = q("limits", "get", "tenant/atlas").want(t, 1)
	if !strings.Contains(r.stderr, "not found") || !strings.Contains(r.stderr, "tenant/atlas") {
		t.Fatalf("get after delete: %q", r.stderr)
	}
	q("limits", "delete", "--reason", "test", "tenant/atlas").want(t, 1)
	q("limits", "delete", "--reason", "test", "tenant/beta").want(t, 0)
	if r := q("limits", "list").want(t, 0); r.stdout != "ID  G  WINDOW  REGIONS  MODE  FALLBACK  VERSION  OWNER\n" {
		t.Fatalf("empty list printed %q", r.stdout)
	}
	if r := q("--json", "limits", "list").want(t, 0); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty JSON list printed %q", r.stdout)
	}
}

func checkKV(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

// TestJSONOutput: every command's --json output parses; limits are
// protojson with snake_case names.
func TestJSONOutput(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	q := func(args ...string) result {
		return quotactl(append([]string{"--allocator", ta.addr, "--json"}, args...)...)
	}
	r := q("limits", "set", "--reason", "test", "tenant/atlas", "--limit", "1000", "--window", "1m", "--regions", "us,eu",
		"--mode", "bounded", "--fallback", "us=local:100,eu=open", "--tag", "team=payments").want(t, 0)
	set := &pb.Limit{}
	if err := protojson.Unmarshal([]byte(r.stdout), set); err != nil {
		t.Fatalf("set --json: %v\n%s", err, r.stdout)
	}
	if set.Version != 1 || set.LimitTokens != 1000 || set.Window.AsDuration() != time.Minute ||
		set.Fallback["us"].GetLocalTokens() != 100 || set.Fallback["eu"].GetKind() != pb.FallbackKind_FALLBACK_KIND_OPEN {
		t.Fatalf("set --json decoded to %v", set)
	}
	for _, key := range []string{`"limit_tokens"`, `"local_tokens"`, `"min_chunk"`, `"max_chunk"`, `"owner"`} {
		if !strings.Contains(r.stdout, key) {
			t.Errorf("set --json lacks %s:\n%s", key, r.stdout)
		}
	}

	r = q("limits", "get", "tenant/atlas").want(t, 0)
	got := &pb.Limit{}
	if err := protojson.Unmarshal([]byte(r.stdout), got); err != nil {
		t.Fatalf("get --json: %v", err)
	}
	if formatFallbacks(got.Fallback) != "eu=open,us=local:100" || got.Version != 1 {
		t.Fatalf("get --json decoded to %v", got)
	}

	for i := range 3 {
		q("limits", "set", "--reason", "test", fmt.Sprintf("tenant/t%d", i), "--limit", "10", "--window", "1s",
			"--regions", "eu", "--mode", "strict").want(t, 0)
	}
	r = q("limits", "list", "--page-size", "2").want(t, 0)
	var arr []json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &arr); err != nil {
		t.Fatalf("list --json is not an array: %v\n%s", err, r.stdout)
	}
	var ids []string
	for _, raw := range arr {
		l := &pb.Limit{}
		if err := protojson.Unmarshal(raw, l); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.Id)
	}
	if strings.Join(ids, " ") != "tenant/atlas tenant/t0 tenant/t1 tenant/t2" {
		t.Fatalf("list --json across pages of 2: %v", ids)
	}

	r = q("limits", "delete", "--reason", "test", "tenant/t0").want(t, 0)
	var del struct {
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &del); err != nil || del.ID != "tenant/t0" || !del.Deleted {
		t.Fatalf("delete --json: %v %q", err, r.stdout)
	}
	// Failures print nothing on stdout, even with --json.
	if r := q("limits", "get", "tenant/t0").want(t, 1); r.stdout != "" {
		t.Fatalf("failed get printed %q on stdout", r.stdout)
	}
}

// TestListFollowsPages: list prints every limit whatever the page size.
func TestListFollowsPages(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	for i := range 7 {
		quotactl("--allocator", ta.addr, "limits", "set", "--reason", "test", fmt.Sprintf("tenant/p%02d", i), "--limit", "10",
			"--window", "1s", "--regions", "eu", "--mode", "strict").want(t, 0)
	}
	quotactl("--allocator", ta.addr, "limits", "set", "--reason", "test", "other/x", "--limit", "10",
		"--window", "1s", "--regions", "eu", "--mode", "strict").want(t, 0)
	for _, size := range []string{"1", "2", "3", "7", "1000"} {
		before := ta.gate.served.Load()
		r := quotactl("--allocator", ta.addr, "limits", "list", "--prefix", "tenant/", "--page-size", size).want(t, 0)
		if n := strings.Count(r.stdout, "tenant/p"); n != 7 || strings.Contains(r.stdout, "other/x") {
			t.Errorf("page size %s: %d limits listed:\n%s", size, n, r.stdout)
		}
		if size == "1" && ta.gate.served.Load()-before < 7 {
			t.Errorf("page size 1 took %d requests", ta.gate.served.Load()-before)
		}
	}
}

// TestServerValidation: the allocator's INVALID_ARGUMENT is an operation
// failure (exit 1) whose one line names the field; what quotactl can tell
// without the allocator (a token count outside 1..vocab.MaxTokens) is a
// usage error (exit 2) naming the flag, and nothing is sent.
func TestServerValidation(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	base := func(extra ...string) []string {
		args := []string{"--allocator", ta.addr, "limits", "set", "--reason", "test", "tenant/atlas", "--limit", "100",
			"--window", "1m", "--regions", "eu,us", "--mode", "bounded"}
		return append(args, extra...)
	}
	for _, tc := range []struct {
		args  []string
		field string
	}{
		{[]string{"--allocator", ta.addr, "limits", "set", "--reason", "test", "tenant/atlas", "--limit", "100",
			"--window", "1m", "--regions", "mars", "--mode", "strict"}, "limit.regions[0]"},
		{base("--regions", "mars"), "limit.regions[2]"},
		{base("--window", "500ms"), "limit.window"},
		{base("--window", "-1m"), "limit.window"},
		{base("--ttl", "2m"), "limit.lease.ttl"},
		{base("--fallback", "ap=open"), "limit.fallback[ap]"},
		{base("--mode", "strict", "--fallback", "us=open"), "limit.fallback[us]"},
		{base("--min-chunk", "500"), "limit.lease.min_chunk"},
		{base("--standing", "51"), "limit.lease.standing"},
		{[]string{"--allocator", ta.addr, "limits", "set", "--reason", "test", "tenant//atlas", "--limit", "1",
			"--window", "1m", "--regions", "eu", "--mode", "strict"}, "limit.id"},
		{[]string{"--allocator", ta.addr, "limits", "get", "bad id!"}, "id"},
		{[]string{"--allocator", ta.addr, "limits", "delete", "--reason", "test", "/x"}, "id"},
	} {
		t.Run(strings.Join(tc.args[2:], " "), func(t *testing.T) {
			r := quotactl(tc.args...).want(t, 1)
			if !strings.Contains(r.stderr, ": "+tc.field+": ") {
				t.Fatalf("stderr %q does not name %s", r.stderr, tc.field)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{base("--limit", "0"), `--limit "0"`},
		{base("--limit", "-5"), `--limit "-5"`},
		{base("--limit", "9223372036854775807"), `--limit "9223372036854775807"`},
		{base("--fallback", "eu=local:0"), `--fallback "eu=local:0"`},
		{base("--max-chunk", "-1"), `--max-chunk "-1"`},
	} {
		t.Run(strings.Join(tc.args[2:], " "), func(t *testing.T) {
			r := quotactl(tc.args...).want(t, 2)
			if !strings.Contains(r.stderr, tc.flag) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("stderr %q: want one line naming %s", r.stderr, tc.flag)
			}
		})
	}
}

// TestListLargePage: a change too large for one etcd transaction is
// refused as InvalidArgument naming the changes; a page of limits larger than gRPC's default 4 MiB
// receive limit (400 limits with the largest description and tags, about
// 6 MB) is listed in one call: quotactl accepts what the allocator may
// send.
func TestListLargePage(t *testing.T) {
	ta := startAllocator(t, etcdtest.Start(t, 1))
	waitLeader(t, ta)
	conn, err := grpc.NewClient(ta.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tags := map[string]string{}
	for i := range limitspec.MaxTags {
		k := fmt.Sprintf("k%02d", i)
		tags[k+strings.Repeat("k", limitspec.MaxTagLen-len(k))] = strings.Repeat("v", limitspec.MaxTagLen)
	}
	big := func(j int) *pb.LimitChange {
		return &pb.LimitChange{Change: &pb.LimitChange_Put{Put: &pb.Limit{
			Id: fmt.Sprintf("tenant/big-%03d", j), LimitTokens: 100, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
			Description: strings.Repeat("d", limitspec.MaxDescriptionLen), Tags: tags,
		}}}
	}
	// 40 such limits in one change are more than one etcd transaction may
	// carry: a clear InvalidArgument, not etcd's "request is too large"
	// as UNAVAILABLE.
	tooBig := &pb.ApplyLimitsRequest{Reason: "large page", Effective: pb.Effective_EFFECTIVE_NOW}
	for j := range 40 {
		tooBig.Changes = append(tooBig.Changes, big(j))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = pb.NewAdminClient(conn).ApplyLimits(ctx, tooBig)
	cancel()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "changes") {
		t.Fatalf("40 largest limits in one change: %v, want InvalidArgument naming changes", err)
	}
	const n = 400
	for i := 0; i < n; i += 10 { // etcd takes requests up to 1.5 MiB
		req := &pb.ApplyLimitsRequest{Reason: "large page", Effective: pb.Effective_EFFECTIVE_NOW}
		for j := i; j < i+10; j++ {
			req.Changes = append(req.Changes, big(j))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := pb.NewAdminClient(conn).ApplyLimits(ctx, req)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	before := ta.gate.served.Load()
	r := quotactl("--allocator", ta.addr, "--json", "limits", "list", "--prefix", "tenant/big-", "--page-size", "1000").want(t, 0)
	if got := strings.Count(r.stdout, `"tenant/big-`); got != n {
		t.Fatalf("%d limits listed, want %d (%d bytes of output)", got, n, len(r.stdout))
	}
	if calls := ta.gate.served.Load() - before; calls != 1 {
		t.Fatalf("%d ListLimits calls, want 1 (one large page)", calls)
	}
	if len(r.stdout) < 5<<20 {
		t.Fatalf("%d bytes listed: the page was not above 4 MiB", len(r.stdout))
	}
}
