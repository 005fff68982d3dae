package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	pb "leasehold/proto/leasehold/v1"
)

// TestWindowsConcurrency: windows of a concurrency limit prints N, the
// slots leased and held, and the slot shares in force; --json prints one
// object; limits set --concurrency refuses window and bucket flags (exit
// 2).
func TestWindowsConcurrency(t *testing.T) {
	addr := startFakeAdmin(t, &fakeAdmin{buckets: map[string]*pb.ListWindowsResponse{"tenant/exports": {
		Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitSlots: 3,
		Shares: []*pb.ShareInForce{
			{Region: "eu", Slots: 2, AdmitSlots: 2, HeldSlots: 2, ExpiresAt: winAt(3), Seq: 7},
			{Region: "us", Slots: 1, AdmitSlots: 1, HeldSlots: 0, ExpiresAt: winAt(3), Seq: 2},
		},
	}}})
	r := quotactl("--allocator", addr, "windows", "tenant/exports").want(t, 0)
	want := `concurrency limit tenant/exports: N 3 (the bound at every instant), 3 leased by the shares below, 2 held as the regions last reported

REGION  HOLDER  SLOTS  ADMIT  HELD  EXPIRES_AT                SEQ
eu      -       2      2      2     2026-11-29T19:33:00.000Z  7
us      -       1      1      0     2026-11-29T19:33:00.000Z  2
`
	if r.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = quotactl("--json", "--allocator", addr, "windows", "tenant/exports").want(t, 0)
	var got slotWindowsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	wantJSON := slotWindowsJSON{Limit: "tenant/exports", Kind: "concurrency", LimitSlots: 3, Shares: []slotShareJSON{
		{Region: "eu", Slots: 2, AdmitSlots: 2, HeldSlots: 2, ExpiresAt: "2026-11-29T19:33:00.000Z", Seq: 7},
		{Region: "us", Slots: 1, AdmitSlots: 1, ExpiresAt: "2026-11-29T19:33:00.000Z", Seq: 2},
	}}
	if !reflect.DeepEqual(got, wantJSON) {
		t.Errorf("JSON:\n%s\nwant %+v", r.stdout, wantJSON)
	}

	for _, args := range [][]string{
		{"--concurrency", "3", "--limit", "5"},
		{"--concurrency", "3", "--window", "1m"},
		{"--concurrency", "3", "--rate", "5/s"},
		{"--concurrency", "0"},
	} {
		base := []string{"--allocator", addr, "limits", "set", "tenant/x", "--regions", "eu", "--mode", "strict", "--reason", "t"}
		quotactl(append(base, args...)...).want(t, 2)
	}
}

// TestLimitsFileConcurrency: a limits file describes a concurrency limit
// with "concurrency: N"; export writes it back the same; mixing it with
// a window's or a bucket's keys, and what a concurrency limit does not
// take, are refused at their line.
func TestLimitsFileConcurrency(t *testing.T) {
	src := `limits:
  - id: tenant/exports
    concurrency: 3
    regions: [us, eu]
    mode: strict
    lease: {ttl: 5s}
`
	lf, err := decodeLimitsFile("f.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	l := lf.limits[0].limit
	if l.Kind != pb.LimitKind_LIMIT_KIND_CONCURRENCY || l.LimitTokens != 3 || l.Window != nil || l.Lease.GetTtl().AsDuration().String() != "5s" {
		t.Fatalf("decoded: %v", l)
	}
	var b strings.Builder
	if err := encodeLimitsFile(&b, nil, []*pb.Limit{l}); err != nil {
		t.Fatal(err)
	}
	again, err := decodeLimitsFile("f.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var b2 strings.Builder
	if err := encodeLimitsFile(&b2, nil, []*pb.Limit{again.limits[0].limit}); err != nil {
		t.Fatal(err)
	}
	if b2.String() != b.String() || !strings.Contains(b.String(), "concurrency: 3") || again.limits[0].limit.Kind != pb.LimitKind_LIMIT_KIND_CONCURRENCY {
		t.Fatalf("round trip:\n%s\nthen:\n%s", b.String(), b2.String())
	}
	for _, tc := range []struct{ extra, want string }{
		{"    window: 1m\n", `f.yaml:7: tenant/exports: "window"`},
		{"    burst: 5\n", `f.yaml:7: tenant/exports: "burst"`},
		{"    shadow: true\n", "shadow"},
		{"    fallback: {eu: open}\n", "fallback"},
	} {
		_, err := decodeLimitsFile("f.yaml", []byte(src+tc.extra))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("with %q: %v, want an error containing %q", tc.extra, err, tc.want)
		}
	}
}
