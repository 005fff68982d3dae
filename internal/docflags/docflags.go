// Package docflags finds the command lines and flag tables of Markdown
// documents, so that a binary's tests can check that every flag the docs
// name for it exists (and has the default a table says). It knows nothing
// of the binaries: each binary's test resolves what Scan found against
// its own flag sets.
//
// A command line is a run of shell words starting with a binary's name
// (leasehold or quotactl, also as a path such as ./cmd/leasehold), in a
// fenced code block (lines ending in \ continue) or in an inline code
// span, up to a shell operator (|, &&, ;, >, ...) or a # comment. A
// binary's name counts only where a command starts: first, after a shell
// operator, an environment assignment, sudo, exec, nice, nohup, time or
// env, or go run; so `kubectl -n leasehold ...` names no command. A flag
// table is a Markdown table whose first column names flags in code spans
// (`--name ARG`); its command is the last command line between the
// heading above and the table (outside tables) when the heading names no
// command or one of the same binary, else the heading's (a quotactl line
// in the example output of a leasehold command does not take its table).
package docflags

import (
	"bufio"
	"os"
	"path"
	"regexp"
	"strings"
)

// Binaries are the names Scan recognises.
var Binaries = []string{"leasehold", "quotactl"}

// Command is one command line.
type Command struct {
	File   string
	Line   int
	Binary string   // leasehold or quotactl
	Args   []string // the shell words after the binary's name
	Text   string   // where it was found, for messages
}

// TableRow is one row of a flag table.
type TableRow struct {
	File    string
	Line    int
	Heading string   // the heading above the table, without its #s
	Command *Command // what the table documents (nil: none): see the package doc
	Flags   []string // the flag names of the first column, without dashes
	Default string   // the default column's only code span ("" if none, or several)
	Text    string
}

var (
	codeSpanRe = regexp.MustCompile("`([^`]+)`")
	fenceRe    = regexp.MustCompile("^\\s*(```|~~~)")
	separator  = regexp.MustCompile(`^\|?\s*:?-{3,}`)
)

// Scan reads the Markdown files and returns their command lines and flag
// table rows.
func Scan(files ...string) ([]Command, []TableRow, error) {
	var cmds []Command
	var rows []TableRow
	for _, f := range files {
		c, r, err := scanFile(f)
		if err != nil {
			return nil, nil, err
		}
		cmds, rows = append(cmds, c...), append(rows, r...)
	}
	return cmds, rows, nil
}

func scanFile(file string) ([]Command, []TableRow, error) {
	fh, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	var lines []string
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	var (
		cmds      []Command
		rows      []TableRow
		heading   string
		context   *Command // the last command line under the heading, or the heading's command
		headCmd   *Command // the heading's command (nil: none)
		inFence   bool
		cont      strings.Builder // a fenced line continued with \
		contStart int
		header    []string // the current table's header cells (nil: not in a table)
	)
	// found records the command lines of text; those outside tables
	// become the context of the next table.
	found := func(line int, text string, inTable bool) {
		for _, c := range commands(text) {
			c.File, c.Line = file, line
			cmds = append(cmds, c)
			if !inTable && (headCmd == nil || headCmd.Binary == c.Binary) {
				cc := c
				context = &cc
			}
		}
	}
	for i, line := range lines {
		n := i + 1
		if fenceRe.MatchString(line) {
			inFence = !inFence
			cont.Reset()
			continue
		}
		if inFence {
			if cont.Len() == 0 {
				contStart = n
			}
			if s, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), "\\"); ok {
				cont.WriteString(s + " ")
				continue
			}
			cont.WriteString(line)
			found(contStart, cont.String(), false)
			cont.Reset()
			continue
		}
		if strings.HasPrefix(line, "#") {
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
			context, headCmd, header = nil, nil, nil
			for _, m := range codeSpanRe.FindAllStringSubmatch(heading, -1) {
				if cs := commands(m[1]); len(cs) > 0 {
					c := cs[0]
					c.File, c.Line = file, n
					context, headCmd = &c, &c
				}
			}
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			header = nil
			for _, m := range codeSpanRe.FindAllStringSubmatch(line, -1) {
				found(n, m[1], false)
			}
			continue
		}
		// A table line.
		cells := splitRow(line)
		if header == nil {
			if i+1 < len(lines) && separator.MatchString(strings.TrimSpace(lines[i+1])) {
				header = cells
			}
			continue
		}
		if separator.MatchString(strings.TrimSpace(line)) {
			continue
		}
		for _, cell := range cells[1:] {
			for _, m := range codeSpanRe.FindAllStringSubmatch(cell, -1) {
				found(n, m[1], true)
			}
		}
		row := TableRow{File: file, Line: n, Heading: heading, Command: context, Text: line}
		for _, m := range codeSpanRe.FindAllStringSubmatch(cells[0], -1) {
			if w := strings.Fields(m[1]); len(w) > 0 && strings.HasPrefix(w[0], "-") {
				row.Flags = append(row.Flags, strings.TrimLeft(w[0], "-"))
			}
		}
		if len(row.Flags) == 0 {
			continue
		}
		for j, h := range header {
			if strings.EqualFold(strings.TrimSpace(h), "default") && j < len(cells) {
				if ms := codeSpanRe.FindAllStringSubmatch(cells[j], -1); len(ms) == 1 {
					row.Default = ms[0][1]
				}
			}
		}
		rows = append(rows, row)
	}
	return cmds, rows, nil
}

// splitRow splits a table row into its cells (\| is a | inside a cell).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, cur.String())
}

// operators end a command line.
var operators = map[string]bool{"|": true, "||": true, "&&": true, ";": true, "&": true, ">": true, ">>": true, "<": true, "2>&1": true, "2>": true}

// commands finds the command lines in one line of shell.
func commands(text string) []Command {
	words := shellWords(text)
	var out []Command
	for i := 0; i < len(words); i++ {
		bin := ""
		for _, b := range Binaries {
			if words[i] == b || path.Base(words[i]) == b && strings.Contains(words[i], "/") {
				bin = b
			}
		}
		if bin == "" || !commandStart(words, i) {
			continue
		}
		j := i + 1
		for j < len(words) && !operators[words[j]] && !strings.HasPrefix(words[j], "#") {
			j++
		}
		out = append(out, Command{Binary: bin, Args: words[i+1 : j], Text: strings.TrimSpace(text)})
		i = j
	}
	return out
}

// starters may come before a command's name.
var starters = map[string]bool{"sudo": true, "exec": true, "nice": true, "nohup": true, "time": true, "env": true}

var assignRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// commandStart: words[i] is where a command starts.
func commandStart(words []string, i int) bool {
	if i == 0 {
		return true
	}
	prev := words[i-1]
	return operators[prev] || starters[prev] || assignRe.MatchString(prev) || prev == "run" && i >= 2 && words[i-2] == "go"
}

// shellWords splits s into words as a shell would, roughly: quotes group,
// backslashes escape, operators are words of their own.
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			out = append(out, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '\'' || c == '"':
			inWord = true
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				cur.WriteString(s[i+1:])
				i = len(s)
				continue
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
		case c == '\\' && i+1 < len(s):
			inWord = true
			cur.WriteByte(s[i+1])
			i++
		case strings.IndexByte("|;&<>", c) >= 0 && !(c == '>' && inWord && cur.String() == "2"):
			flush()
			j := i
			for j < len(s) && strings.IndexByte("|;&<>", s[j]) >= 0 {
				j++
			}
			out = append(out, s[i:j])
			i = j - 1
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	flush()
	return out
}
