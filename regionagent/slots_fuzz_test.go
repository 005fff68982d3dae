package regionagent

import (
	"strings"
	"testing"

	"leasehold/internal/vocab"
	"leasehold/regionagent/store"
)

// FuzzValidSlotID: whatever the input, validSlotID does not panic, and
// what it accepts is a slot id the slot set can have made: a valid
// holder id, "~", a positive number, within the length bound.
func FuzzValidSlotID(f *testing.F) {
	for _, s := range []string{"job-1~1", "a~0", "~1", "a~", "a~b~1", "a~99999999999999999999", strings.Repeat("h", 128) + "~1", "é~1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if validSlotID(id) != nil {
			return
		}
		h := store.HolderOf(id)
		if vocab.ValidateRequestID("holder", h) != nil || !strings.HasPrefix(id, h+"~") || len(id) > maxHolderID+21 || strings.Count(id, "~") != 1 {
			t.Fatalf("accepted %q (holder %q)", id, h)
		}
	})
}
