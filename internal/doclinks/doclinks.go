// Package doclinks reads the links and heading anchors of Markdown
// documents, so that tests can check that every relative link in the
// docs points at a file that exists and, for a Markdown file, at one of
// its headings.
package doclinks

import (
	"iter"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Anchors returns the anchors of the headings of Markdown text as GitHub
// makes them: lower case, spaces as hyphens, letters, digits, hyphens and
// underscores kept, everything else (code-span backticks, punctuation)
// dropped; a heading met again gets -1, -2, ... Headings inside fenced
// code blocks do not count.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range lines(md) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var a strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				a.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		id := a.String()
		if n := seen[id]; n > 0 {
			out[id+"-"+strconv.Itoa(n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

// FileAnchors is Anchors of the file at path.
func FileAnchors(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Anchors(string(b)), nil
}

// Link is one inline link of a Markdown document.
type Link struct {
	Line   int    // 1-based
	Target string // as written: a path, path#anchor or #anchor
}

// linkRe is an inline link [text](target), target without spaces.
var linkRe = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// codeSpanRe is an inline code span: a link inside one is text.
var codeSpanRe = regexp.MustCompile("`[^`]*`")

// schemeRe starts an absolute URL (https:, mailto:, ...).
var schemeRe = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// RelativeLinks returns the links of Markdown text that are not absolute
// URLs, outside fenced code blocks and code spans.
func RelativeLinks(md string) []Link {
	var out []Link
	for n, line := range lines(md) {
		for _, m := range linkRe.FindAllStringSubmatch(codeSpanRe.ReplaceAllString(line, ""), -1) {
			if !schemeRe.MatchString(m[1]) {
				out = append(out, Link{Line: n, Target: m[1]})
			}
		}
	}
	return out
}

// lines yields the lines of md outside fenced code blocks (the fences
// themselves excluded), with their 1-based numbers.
func lines(md string) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		inCode := false
		for i, line := range strings.Split(md, "\n") {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
				continue
			}
			if !inCode && !yield(i+1, line) {
				return
			}
		}
	}
}
