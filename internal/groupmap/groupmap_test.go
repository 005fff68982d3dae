package groupmap

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"leasehold/internal/vocab"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func groups(names ...string) []Group {
	out := make([]Group, len(names))
	for i, n := range names {
		out[i] = Group{Name: n, Allocators: []string{"127.0.0.1:" + fmt.Sprint(7000+i)}}
	}
	return out
}

func limits(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("tenant/t%06d", i)
	}
	return out
}

// TestRendezvousSpreadsAndMovesLittle: 100,000 limits over 4 groups, each
// within 5 % of a quarter; adding a fifth moves about a fifth of them, all
// to the new group, and none between the old ones.
func TestRendezvousSpreadsAndMovesLittle(t *testing.T) {
	ls := limits(100_000)
	four, five := groups("a", "b", "c", "d"), groups("a", "b", "c", "d", "e")
	count := map[string]int{}
	moved := 0
	for _, l := range ls {
		o4, o5 := Rendezvous(l, four), Rendezvous(l, five)
		count[o4]++
		if o4 != o5 {
			moved++
			if o5 != "e" {
				t.Fatalf("%s moved from %s to %s, not to the new group", l, o4, o5)
			}
		}
	}
	for _, g := range four {
		if c := count[g.Name]; c < 23_750 || c > 26_250 {
			t.Errorf("group %s owns %d of 100,000, want 25,000 +- 5 %%", g.Name, c)
		}
	}
	if moved < 19_000 || moved > 21_000 {
		t.Errorf("adding a fifth group moved %d of 100,000, want about 20,000", moved)
	}
	if Rendezvous("x", nil) != "" {
		t.Error("no groups: want no owner")
	}
}

// TestOwnerByWindowStart: a version governs the windows that start at or
// after its From; the window in progress keeps its owner; an explicit
// placement wins over the hash.
func TestOwnerByWindowStart(t *testing.T) {
	var m Map
	m, err := m.Next(t0, time.Minute, 31*24*time.Hour, Change{Groups: groups("a"), Reason: "start"})
	if err != nil {
		t.Fatal(err)
	}
	if v := m.Current(); v.Number != 1 || !v.From.Equal(t0) {
		t.Fatalf("first version = %d from %v, want 1 from now", v.Number, v.From)
	}
	now := t0.Add(time.Hour)
	m, err = m.Next(now, time.Minute, 31*24*time.Hour, Change{Groups: groups("a", "b"), Place: map[string]string{"tenant/big": "b"}, Reason: "add b"})
	if err != nil {
		t.Fatal(err)
	}
	from := now.Add(time.Minute)
	if v := m.Current(); v.Number != 2 || !v.From.Equal(from) {
		t.Fatalf("second version = %d from %v, want 2 from %v", v.Number, v.From, from)
	}
	// A limit the hash gives to b: the window that started a second
	// before the change is a's, the one starting at From is b's.
	var toB string
	for _, l := range limits(100) {
		if Rendezvous(l, groups("a", "b")) == "b" {
			toB = l
			break
		}
	}
	for _, c := range []struct {
		limit string
		start time.Time
		want  string
		ver   int64
	}{
		{toB, t0.Add(-24 * time.Hour), "a", 1}, // before the first version: the first governs
		{toB, from.Add(-time.Second), "a", 1},
		{toB, from, "b", 2},
		{"tenant/big", from.Add(-time.Nanosecond), "a", 1},
		{"tenant/big", from.Add(time.Hour), "b", 2},
	} {
		got, ver, ok := m.Owner(c.limit, c.start)
		if !ok || got != c.want || ver != c.ver {
			t.Errorf("Owner(%s, From%+v) = %s v%d %v, want %s v%d", c.limit, c.start.Sub(from), got, ver, ok, c.want, c.ver)
		}
	}
	moved := m.Moved(append(limits(1000), "tenant/big"), from.Add(-time.Second), from)
	if moved["tenant/big"] != [2]string{"a", "b"} || len(moved) < 400 || len(moved) > 600 {
		t.Errorf("Moved: %d limits (big: %v), want about half and the placed one", len(moved), moved["tenant/big"])
	}
	var empty Map
	if _, _, ok := empty.Owner("x", t0); ok {
		t.Error("an empty map named an owner")
	}
}

// TestNextKeepsVersionsThatGovernOpenWindows: versions are dropped only
// once a later one took effect longer than the longest window ago.
func TestNextKeepsVersionsThatGovernOpenWindows(t *testing.T) {
	var m Map
	maxW := 24 * time.Hour
	now := t0
	var err error
	for i := range 5 {
		m, err = m.Next(now, time.Minute, maxW, Change{Groups: groups("a", fmt.Sprintf("g%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(10 * time.Hour)
	}
	// Versions from t0, t0+10h+1m, +20h+1m, +30h+1m, +40h+1m, the last
	// made at t0+40h: the newest version with From <= t0+16h is the one
	// from t0+10h+1m; a window that started under the first has ended.
	if got := m.Versions[0].Number; got != 2 || len(m.Versions) != 4 {
		t.Fatalf("kept versions from %d (%d of them), want from 2 (4)", got, len(m.Versions))
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	// Back to back: From strictly increases even with no notice.
	m2, err := m.Next(now, 0, maxW, Change{Reason: "a"})
	if err != nil {
		t.Fatal(err)
	}
	m3, err := m2.Next(now, 0, maxW, Change{Reason: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.Versions[0].Number; got != 3 {
		t.Fatalf("at t0+50h kept versions from %d, want from 3", got)
	}
	if !m3.Current().From.After(m2.Current().From) {
		t.Fatalf("From did not increase: %v then %v", m2.Current().From, m3.Current().From)
	}
}

// TestBadInputNamesTheField: every refusal is a vocab.FieldError naming
// the field; nothing panics.
func TestBadInputNamesTheField(t *testing.T) {
	long := strings.Repeat("a", MaxGroupNameLen+1)
	for _, c := range []struct {
		change Change
		field  string
	}{
		{Change{Groups: []Group{}}, "groups"},
		{Change{Groups: groups("A")}, "groups[0].name"},
		{Change{Groups: groups(long)}, "groups[0].name"},
		{Change{Groups: groups("a", "a")}, "groups[1].name"},
		{Change{Groups: []Group{{Name: "a"}}}, "groups[0].allocators"},
		{Change{Groups: []Group{{Name: "a", Allocators: []string{"host"}}}}, "groups[0].allocators[0]"},
		{Change{Groups: []Group{{Name: "a", Allocators: []string{"h:1,h:2"}}}}, "groups[0].allocators[0]"},
		{Change{Groups: groups("a"), Place: map[string]string{"tenant/x": "b"}}, "place[tenant/x]"},
		{Change{Groups: groups("a"), Place: map[string]string{"/bad": "a"}}, "place[/bad]"},
		{Change{Groups: groups("a"), Reason: strings.Repeat("r", MaxReasonLen+1)}, "reason"},
	} {
		var m Map
		_, err := m.Next(t0, time.Minute, time.Hour, c.change)
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, vocab.ErrInvalid) {
			t.Errorf("%+v: err = %v, want a field error naming %s", c.change, err, c.field)
		}
	}
}

// TestEncodeDecode: a map survives its stored form; a stored map that
// breaks the rules is refused naming the field.
func TestEncodeDecode(t *testing.T) {
	var m Map
	m, _ = m.Next(t0, time.Minute, time.Hour, Change{Groups: groups("a", "b"), Place: map[string]string{"t/x": "b"}})
	m, _ = m.Next(t0, time.Minute, time.Hour, Change{Unplace: []string{"t/x"}})
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Versions) != 2 || got.Current().Place != nil || got.Versions[0].Place["t/x"] != "b" || !got.Current().From.Equal(m.Current().From) {
		t.Fatalf("decoded %+v, want %+v", got, m)
	}
	bad := strings.Replace(string(b), `"version":2`, `"version":5`, 1)
	if _, err := Decode([]byte(bad)); err == nil || !strings.Contains(err.Error(), "versions[1].version") {
		t.Errorf("a gap in the version numbers: err = %v", err)
	}
	if _, err := Decode([]byte(`{"versions":`)); !errors.Is(err, vocab.ErrInvalid) {
		t.Errorf("truncated JSON: err = %v", err)
	}
}

// FuzzDecode: any bytes decode to a valid map or a field error; a map
// that decodes answers Owner for any limit without panicking.
func FuzzDecode(f *testing.F) {
	var m Map
	m, _ = m.Next(t0, time.Minute, time.Hour, Change{Groups: groups("a", "b"), Place: map[string]string{"t/x": "b"}})
	b, _ := Encode(m)
	f.Add(b)
	f.Add([]byte(`{"versions":[{"version":1,"from":"2026-01-01T00:00:00Z","groups":[{"name":"a","allocators":["h:1"]}]}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, vocab.ErrInvalid) {
				t.Fatalf("error %v is not a field error", err)
			}
			return
		}
		for _, v := range m.Versions {
			g, _, ok := m.Owner("t/x", v.From)
			if !ok || g == "" {
				t.Fatalf("no owner under a valid map")
			}
			if _, ok := v.Group(g); !ok {
				t.Fatalf("owner %q is not a group of its version", g)
			}
		}
	})
}
