package zones

import (
	"testing"
	"time"

	"leasehold/lease"
)

// TestLoadOnce: every load of a zone gives the same location, so
// schedules built from it compare equal; machine-dependent and unknown
// names are refused.
func TestLoadOnce(t *testing.T) {
	a, err := Load("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Load("Europe/Berlin")
	if a != b {
		t.Fatal("two loads of Europe/Berlin gave two locations")
	}
	c1, _ := Calendar("month", "Europe/Berlin")
	c2, _ := Parse("month Europe/Berlin")
	if lease.CalendarWindows(c1) != lease.CalendarWindows(c2) || Format(c2) != "month Europe/Berlin" {
		t.Fatalf("schedules %v and %v differ", c1, c2)
	}
	if Describe(c1) != "calendar month, Europe/Berlin" {
		t.Errorf("Describe: %q", Describe(c1))
	}
	for _, bad := range []string{"", "Local", "Mars/Olympus", "../../etc/passwd", string(make([]byte, 65))} {
		if _, err := Load(bad); err == nil {
			t.Errorf("Load(%q) accepted", bad)
		}
	}
	if d := Shortest(lease.Day); d != 22*time.Hour {
		t.Errorf("shortest day %v", d)
	}
}

// FuzzParse: Parse never panics, and what it accepts Format writes back.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "month Europe/Berlin", "day UTC", "week America/New_York", "year", "fortnight UTC", "month  UTC", "month Local"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		if got := Format(c); got != s {
			t.Fatalf("Parse(%q) formats as %q", s, got)
		}
	})
}
