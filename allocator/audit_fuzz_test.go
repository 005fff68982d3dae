package allocator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "leasehold/proto/leasehold/v1"
)

// FuzzDecodeAuditRecord: no input makes the decoder panic, and whatever it
// accepts encodes back to an equal record.
func FuzzDecodeAuditRecord(f *testing.F) {
	events := []*pb.AuditEvent{
		{Id: "00000000000000000001-0a0b0c0d.000", Principal: "ada", Action: "put", LimitId: "tenant/a",
			Outcome: pb.AuditOutcome_AUDIT_OUTCOME_APPLIED, New: simpleLimit("tenant/a", 5, time.Minute), NewVersion: 1},
		{Id: "00000000000000000001-0a0b0c0d.001", Principal: "ada", Action: "delete", LimitId: "tenant/b"},
	}
	rec, err := encodeAuditRecord(events)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte{})
	f.Add([]byte{0x80})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(rec[:len(rec)-3])
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, err := decodeAuditRecord(b)
		if err != nil {
			return
		}
		again, err := encodeAuditRecord(evs)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		evs2, err := decodeAuditRecord(again)
		if err != nil || len(evs2) != len(evs) {
			t.Fatalf("round trip: %v, %d vs %d events", err, len(evs2), len(evs))
		}
		for i := range evs {
			if !proto.Equal(evs[i], evs2[i]) {
				t.Fatalf("event %d changed in a round trip", i)
			}
		}
	})
}

// FuzzParseEventID: the page token parser accepts exactly the ids
// eventID makes, and never panics.
func FuzzParseEventID(f *testing.F) {
	f.Add(eventID("01800000000000000000-deadbeef", 7))
	f.Add("01800000000000000000-deadbeef.")
	f.Add("")
	f.Add("99999999999999999999-deadbeef.000")
	f.Add("-1800000000000000000-deadbeef.000")
	f.Fuzz(func(t *testing.T, s string) {
		rid, idx, err := parseEventID(s)
		if err != nil {
			return
		}
		if eventID(rid, idx) != s {
			t.Fatalf("%q parsed to (%q, %d), which formats as %q", s, rid, idx, eventID(rid, idx))
		}
	})
}
