package vocab

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Cap cuts s to at most n bytes, ending on a whole UTF-8 character and
// saying how long s was: what a stored or logged string becomes when it
// is over its cap.
func Cap(s string, n int) string {
	if len(s) <= n {
		return s
	}
	mark := fmt.Sprintf("... (%d bytes cut)", len(s))
	cut := max(0, n-len(mark))
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "") + mark
}
