package vocab

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCapString: a string within its cap is kept; one over it is cut on a
// character boundary to at most the cap, saying its length.
func TestCapString(t *testing.T) {
	if got := Cap("short", 10); got != "short" {
		t.Fatalf("Cap kept %q", got)
	}
	got := Cap(strings.Repeat("é", 600), 100) // 1200 bytes of 2-byte runes
	if len(got) > 100 || !utf8.ValidString(got) || !strings.HasSuffix(got, "... (1200 bytes cut)") {
		t.Fatalf("Cap = %q (%d bytes)", got, len(got))
	}
}
