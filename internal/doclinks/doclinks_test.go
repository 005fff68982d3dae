package doclinks

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestAnchors(t *testing.T) {
	md := "# Leasehold\n\n" +
		"## `leasehold agent`: flags\n" +
		"### 2026-12-05, 12:32-12:40 UTC: the table\n" +
		"### Latency in µs (p50/p99)\n" +
		"```sh\n# not a heading\n```\n" +
		"## Tests\n## Tests\n"
	got := slices.Sorted(maps.Keys(Anchors(md)))
	want := []string{"2026-12-05-1232-1240-utc-the-table", "latency-in-µs-p50p99", "leasehold", "leasehold-agent-flags", "tests", "tests-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("anchors %q, want %q", got, want)
	}
}

func TestRelativeLinks(t *testing.T) {
	md := "See [design](design.md#the-check-path), [top](#leasehold) and\n" +
		"[the site](https://example.com/x.md) or `[not](a-link.md)`.\n" +
		"```\n[in code](nowhere.md)\n```\n" +
		"[mail](mailto:a@b) [dir](../deploy/)\n"
	var got []string
	for _, l := range RelativeLinks(md) {
		got = append(got, fmt.Sprintf("%s@%d", l.Target, l.Line))
	}
	want := []string{"design.md#the-check-path@1", "#leasehold@1", "../deploy/@6"}
	if !slices.Equal(got, want) {
		t.Fatalf("links %q, want %q", got, want)
	}
}

// TestRepositoryDocLinks: every relative link of the repository's
// Markdown files (README, docs/, ...) points at a file or directory that
// exists and, when it names an anchor of a Markdown file, at one of that
// file's headings.
func TestRepositoryDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "leasehold-data") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		a, err := FileAnchors(path)
		if err != nil {
			t.Fatal(err)
		}
		anchorsOf[path] = a
		return a
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range RelativeLinks(string(b)) {
			checked++
			where := filepath.ToSlash(strings.TrimPrefix(f, root+string(filepath.Separator)))
			path, anchor, _ := strings.Cut(l.Target, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link %q: no such file", where, l.Line, l.Target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(target)[anchor] {
				t.Errorf("%s:%d: link %q: no heading with that anchor", where, l.Line, l.Target)
			}
		}
	}
	if len(files) < 10 || checked < 100 {
		t.Fatalf("read %d Markdown files and %d links: the walk missed the docs", len(files), checked)
	}
	t.Logf("%d links in %d files", checked, len(files))
}
