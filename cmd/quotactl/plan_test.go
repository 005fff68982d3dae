package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "leasehold/proto/leasehold/v1"
)

// liveLimit is a stored limit as the allocator returns it.
func liveLimit(t *testing.T, id string, g int64, version int64) *pb.Limit {
	t.Helper()
	l, err := normalizeLimit(&pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(time.Minute),
		Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT})
	if err != nil {
		t.Fatal(err)
	}
	l.Version = version
	l.EffectiveFrom = timestamppb.New(time.Unix(1000, 0))
	return l
}

func mustDecode(t *testing.T, src string) *limitsFile {
	t.Helper()
	lf, err := decodeLimitsFile("limits.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return lf
}

const planFile = `manage: [tenant/]
limits:
  - {id: tenant/a, limit: 100, window: 1m, regions: [eu, us], mode: strict}
  - {id: tenant/b, limit: 250, window: 1m, regions: [eu, us], mode: bounded, fallback: {us: "local:10"}, owner: finance}
  - {id: tenant/new, limit: 5, window: 1s, regions: [eu], mode: strict}
`

// TestMakePlan: creates, updates with field diffs, deletes only within the
// file's scope; unchanged limits are counted, not listed.
func TestMakePlan(t *testing.T) {
	live := []*pb.Limit{
		liveLimit(t, "tenant/a", 100, 3),    // unchanged (explicit closed fallbacks are no change)
		liveLimit(t, "tenant/b", 200, 7),    // updated
		liveLimit(t, "tenant/gone", 10, 2),  // deleted: in scope, absent from the file
		liveLimit(t, "other/keep", 10, 1),   // out of scope: untouched
		liveLimit(t, "tenantx/keep", 10, 1), // prefix is literal: "tenant/" does not cover it
	}
	live[0].Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}}
	p := makePlan(mustDecode(t, planFile), live)
	if p.Unchanged != 1 {
		t.Errorf("unchanged %d, want 1", p.Unchanged)
	}
	want := map[string]int64{"tenant/a": 3, "tenant/b": 7, "tenant/gone": 2}
	if len(p.Live) != len(want) {
		t.Errorf("live snapshot %v, want %v", p.Live, want)
	}
	for id, v := range want {
		if p.Live[id] != v {
			t.Errorf("live snapshot %v, want %v", p.Live, want)
		}
	}
	var got []string
	for _, ch := range p.Changes {
		got = append(got, ch.Action+" "+ch.ID)
	}
	if strings.Join(got, ", ") != "update tenant/b, delete tenant/gone, create tenant/new" {
		t.Fatalf("changes %q", got)
	}
	upd := p.Changes[0]
	if upd.ExpectedVersion != 7 || upd.Limit.GetLimitTokens() != 250 {
		t.Errorf("update %+v", upd)
	}
	wantFields := []fieldDiff{
		{"limit", "200", "250"}, {"mode", "strict", "bounded"},
		{"fallback.us", "closed", "local:10"}, {"owner", "", "finance"},
	}
	if len(upd.Fields) != len(wantFields) {
		t.Fatalf("update fields %v, want %v", upd.Fields, wantFields)
	}
	for i := range wantFields {
		if upd.Fields[i] != wantFields[i] {
			t.Errorf("field %d: %v, want %v", i, upd.Fields[i], wantFields[i])
		}
	}
	if p.Changes[1].ExpectedVersion != 2 || p.Changes[2].ExpectedVersion != 0 {
		t.Errorf("expected versions: delete %d, create %d", p.Changes[1].ExpectedVersion, p.Changes[2].ExpectedVersion)
	}

	// The request carries every change with its expected version.
	req := p.request("contract renewal", pb.Effective_EFFECTIVE_NOW, true)
	if len(req.Changes) != 3 || req.Reason != "contract renewal" || !req.DryRun || req.Effective != pb.Effective_EFFECTIVE_NOW ||
		req.Changes[0].GetPut().GetId() != "tenant/b" || req.Changes[0].ExpectedVersion != 7 ||
		req.Changes[1].GetDelete() != "tenant/gone" || req.Changes[1].ExpectedVersion != 2 ||
		req.Changes[2].GetPut().GetId() != "tenant/new" || req.Changes[2].ExpectedVersion != 0 {
		t.Fatalf("request %v", req)
	}

	// Without manage, nothing is deleted and the scope is the file's ids.
	noManage := strings.Replace(planFile, "manage: [tenant/]\n", "", 1)
	p = makePlan(mustDecode(t, noManage), live)
	for _, ch := range p.Changes {
		if ch.Action == actDelete {
			t.Errorf("without manage the plan deletes %s", ch.ID)
		}
	}
	if _, ok := p.Live["tenant/gone"]; ok || len(p.Live) != 2 {
		t.Errorf("without manage the snapshot is %v, want tenant/a and tenant/b", p.Live)
	}

	// manage "*" covers everything.
	p = makePlan(mustDecode(t, strings.Replace(planFile, "[tenant/]", `"*"`, 1)), live)
	if c, u, d := p.counts(); c != 1 || u != 1 || d != 3 {
		t.Errorf("manage *: %d creates, %d updates, %d deletes; want 1, 1, 3", c, u, d)
	}
}

// TestPlanMoved: any version change, deletion or creation in scope since
// the plan is reported; changes out of scope are not.
func TestPlanMoved(t *testing.T) {
	live := []*pb.Limit{liveLimit(t, "tenant/a", 100, 3), liveLimit(t, "tenant/b", 200, 7)}
	p := makePlan(mustDecode(t, planFile), live)
	if m := p.moved(live); m != "" {
		t.Fatalf("unchanged live state reported as moved: %s", m)
	}
	if m := p.moved(append(live[:2:2], liveLimit(t, "other/x", 1, 1))); m != "" {
		t.Fatalf("a limit out of scope reported as moved: %s", m)
	}
	for _, tc := range []struct {
		name string
		live []*pb.Limit
		want string
	}{
		{"version", []*pb.Limit{live[0], liveLimit(t, "tenant/b", 200, 8)}, "tenant/b is at version 8, the plan saw 7"},
		{"unchanged limit changed", []*pb.Limit{liveLimit(t, "tenant/a", 100, 4), live[1]}, "tenant/a is at version 4, the plan saw 3"},
		{"deleted", []*pb.Limit{live[1]}, "tenant/a was deleted (the plan saw version 3)"},
		{"created", append(live[:2:2], liveLimit(t, "tenant/z", 1, 1)), "tenant/z was created (version 1)"},
	} {
		if m := p.moved(tc.live); !strings.Contains(m, tc.want) {
			t.Errorf("%s: moved %q, want %q", tc.name, m, tc.want)
		}
	}
}

// TestPlanFile: a plan survives its file format; a plan whose changes
// disagree with its own snapshot, or that is not a plan, is refused.
func TestPlanFile(t *testing.T) {
	live := []*pb.Limit{liveLimit(t, "tenant/a", 100, 3), liveLimit(t, "tenant/b", 200, 7), liveLimit(t, "tenant/gone", 1, 2)}
	p := makePlan(mustDecode(t, planFile), live)
	p.Allocator, p.Source, p.SourceSHA256 = "127.0.0.1:7400", "limits.yaml", sha256Hex([]byte(planFile))
	p.Created = time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)
	b, err := p.marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := unmarshalPlan(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if back.SourceSHA256 != p.SourceSHA256 || len(back.Changes) != 3 || back.Live["tenant/b"] != 7 ||
		!proto.Equal(back.Changes[0].Limit, p.Changes[0].Limit) || back.Changes[1].Limit != nil ||
		strings.Join(back.Manage, ",") != "tenant/" || back.Unchanged != 1 {
		t.Fatalf("plan changed in its file:\n%s", b)
	}
	for _, tc := range []struct{ name, edit, want string }{
		{"version tampered", `"expected_version": 7`, "inconsistent with the plan's live versions"},
		{"format", `"format": "quotactl-plan/1"`, "format"},
		{"action", `"action": "delete"`, "unknown action"},
		{"unknown key", `"unchanged": 1`, "unknown field"},
	} {
		repl := map[string]string{
			"version tampered": `"expected_version": 6`,
			"format":           `"format": "other"`,
			"action":           `"action": "drop"`,
			"unknown key":      `"unchanged": 1, "extra": 2`,
		}[tc.name]
		if !strings.Contains(string(b), tc.edit) {
			t.Fatalf("%s: plan lacks %s:\n%s", tc.name, tc.edit, b)
		}
		_, err := unmarshalPlan([]byte(strings.Replace(string(b), tc.edit, repl, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := unmarshalPlan([]byte("limits: []")); err == nil {
		t.Error("a YAML file accepted as a plan")
	}
}

// TestPrintPlan: the human plan shows each change and a summary.
func TestPrintPlan(t *testing.T) {
	live := []*pb.Limit{liveLimit(t, "tenant/a", 100, 3), liveLimit(t, "tenant/b", 200, 7), liveLimit(t, "tenant/gone", 1, 2)}
	p := makePlan(mustDecode(t, planFile), live)
	p.Allocator, p.Source = "127.0.0.1:7400", "limits.yaml"
	var buf bytes.Buffer
	if err := printPlan(&buf, p); err != nil {
		t.Fatal(err)
	}
	want := `plan: limits.yaml against 127.0.0.1:7400 (manage: tenant/)

~ update tenant/b (version 7)
    limit:       200 -> 250
    mode:        strict -> bounded
    fallback.us: closed -> local:10
    owner:       (none) -> finance

- delete tenant/gone (version 2)

+ create tenant/new
    limit:           5
    window:          1s
    regions:         eu
    mode:            strict
    fallback.eu:     closed
    lease.ttl:       250ms
    lease.min_chunk: 1
    lease.max_chunk: 0

1 to create, 1 to update, 1 to delete, 1 unchanged.
`
	if buf.String() != want {
		t.Fatalf("plan printed:\n%s\nwant:\n%s", buf.String(), want)
	}
	buf.Reset()
	_ = printPlan(&buf, makePlan(mustDecode(t, "limits: []\n"), live))
	if !strings.Contains(buf.String(), "No changes: the live limits match the file (0 unchanged).") ||
		!strings.Contains(buf.String(), "no manage: nothing is deleted") {
		t.Fatalf("empty plan printed:\n%s", buf.String())
	}
}

// TestWriteEffect: a dry run's effect reads as key: value lines with the
// field changes indented.
func TestWriteEffect(t *testing.T) {
	eff := &pb.ChangeEffect{
		LimitId: "tenant/atlas", Action: "update",
		Changes:            []*pb.FieldChange{{Field: "limit_tokens", Old: "1000", New: "500"}, {Field: "fallback.us", Old: "closed", New: "local:100"}},
		EffectiveFrom:      timestamppb.New(time.Date(2026, 11, 29, 19, 34, 0, 0, time.UTC)),
		WindowStart:        timestamppb.New(time.Date(2026, 11, 29, 19, 33, 0, 0, time.UTC)),
		CurrentLimitTokens: 1000, NewLimitTokens: 500, Granted: 700, Admitted: 650, PoolAfter: 300,
		RegionsDenying: []string{"eu", "us"}, Bound: 100,
	}
	var b strings.Builder
	writeEffect(&b, eff)
	want := `limit:          tenant/atlas
action:         update
changes:
  limit_tokens: 1000 -> 500
  fallback.us:  closed -> local:100
effective-from: 2026-11-29T19:34:00.000Z
window:         2026-11-29T19:33:00.000Z (running), G 1000
granted:        700
admitted:       650
new-g:          500
pool-after:     300
denying:        eu,us
bound:          100
`
	if b.String() != want {
		t.Fatalf("effect printed:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	writeEffect(&b, &pb.ChangeEffect{LimitId: "tenant/new", Action: "create", NewLimitTokens: 5, BoundInfinite: true})
	if !strings.Contains(b.String(), "window:         none yet (a new limit)\n") || !strings.Contains(b.String(), "bound:          +Inf\n") ||
		strings.Contains(b.String(), "pool-after") {
		t.Fatalf("create effect printed:\n%s", b.String())
	}
}

// TestParseSince: durations back from now and times.
func TestParseSince(t *testing.T) {
	if _, d, err := parseSince("24h"); err != nil || d != 24*time.Hour {
		t.Errorf("24h: %v %v", d, err)
	}
	if ts, _, err := parseSince("2026-11-29T19:00:00Z"); err != nil || !ts.Equal(time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)) {
		t.Errorf("RFC 3339: %v %v", ts, err)
	}
	if ts, _, err := parseSince("2026-11-29"); err != nil || !ts.Equal(time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("date: %v %v", ts, err)
	}
	for _, bad := range []string{"", "0s", "-1h", "yesterday", "24", "2026-13-01"} {
		if _, _, err := parseSince(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestSecurityFlags: TLS and token settings are checked before anything
// is sent; a token never goes out in plaintext.
func TestSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("  s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := closedAddr(t)
	t.Setenv(tokenEnv, "")
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--token", "abc"}, "", "quotactl: limits list: --token: a token is only sent over TLS: give --tls-ca (or --tls)"},
		{[]string{"--token-file", tokenFile}, "", "--token-file: a token is only sent over TLS"},
		{nil, "abc", "$LEASEHOLD_TOKEN: a token is only sent over TLS"},
		{[]string{"--token-file", empty, "--tls"}, "", `--token-file "` + empty + `": the file is empty`},
		{[]string{"--token-file", filepath.Join(dir, "nope"), "--tls"}, "", "no such file or directory"},
		{[]string{"--token", "a b", "--tls"}, "", "--token: a token is printable ASCII without spaces"},
		{[]string{"--tls-ca", notPEM}, "", `--tls-ca "` + notPEM + `": no PEM certificate in the file`},
		{[]string{"--tls-ca", filepath.Join(dir, "nope")}, "", "--tls-ca"},
		{[]string{"--tls-cert", notPEM}, "", "--tls-cert needs --tls-key"},
		{[]string{"--tls-key", notPEM}, "", "--tls-key needs --tls-cert"},
		{[]string{"--tls-cert", notPEM, "--tls-key", notPEM}, "", "--tls-cert"},
		{[]string{"--tls-server-name", "x"}, "", "--tls-server-name needs TLS"},
	} {
		t.Setenv(tokenEnv, tc.env)
		args := append([]string{"--allocator", closed, "limits", "list"}, tc.args...)
		r := quotactl(args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q (env %q): exit %d, stderr %q; want exit 2 with %q", tc.args, tc.env, r.code, r.stderr, tc.want)
		}
		checkStderr(t, r)
	}
	// A token over TLS is accepted (the closed port then fails: exit 1).
	t.Setenv(tokenEnv, "abc")
	r := quotactl("--allocator", closed, "--timeout", "200ms", "--tls", "limits", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "unavailable") {
		t.Fatalf("token over TLS to a closed port: exit %d %q", r.code, r.stderr)
	}
	// The agent never gets the token: check works without TLS while it is set.
	var s security
	s.token = "abc"
	if _, err := s.dialOptions(false); err != nil {
		t.Fatalf("dial options without the token: %v", err)
	}
}
