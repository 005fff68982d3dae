package regionagent

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// FuzzDecisionWindow: any decision id either names a window (and is one
// decisionID could have made) or is refused as bad input naming
// decision_id; nothing panics.
//
//	go test -run '^$' -fuzz '^FuzzDecisionWindow$' -fuzztime 30s ./regionagent/
func FuzzDecisionWindow(f *testing.F) {
	f.Add(decisionID(29938096))
	f.Add("s1-" + strings.Repeat("0", 32))
	f.Add("s-1-" + strings.Repeat("0", 32))
	f.Add("s99999999999999999999-" + strings.Repeat("a", 32))
	f.Add("client-1")
	f.Add("")
	f.Fuzz(func(t *testing.T, id string) {
		w, err := decisionWindow(id)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "decision_id" {
				t.Fatalf("%q: %v, want a field error naming decision_id", id, err)
			}
			return
		}
		if w < 0 || !strings.HasPrefix(id, "s"+strconv.FormatInt(w, 10)+"-") {
			t.Fatalf("%q names window %d", id, w)
		}
	})
}
