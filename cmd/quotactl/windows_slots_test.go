package main

import (
	"encoding/json"
	"reflect"
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
