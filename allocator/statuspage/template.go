package statuspage

import (
	_ "embed"
	"fmt"
	"html/template"
	"strings"
	"time"
)

//go:embed page.html
var pageHTML string

// fmtAny is fmtInt for the template's ints and int64s.
func fmtAny(v any) string {
	switch n := v.(type) {
	case int:
		return fmtInt(int64(n))
	case int64:
		return fmtInt(n)
	}
	return fmt.Sprint(v)
}

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"px":   px,
	"int":  fmtAny,
	"add":  func(a, b float64) float64 { return a + b },
	"sub":  func(a, b float64) float64 { return a - b },
	"join": func(s []string) string { return strings.Join(s, ", ") },
	"utc":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
	"hms":  func(t time.Time) string { return t.UTC().Format("15:04:05") },
}).Parse(pageHTML))
