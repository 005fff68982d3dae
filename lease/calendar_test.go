package lease

import (
	"testing"
	"time"
)

func zone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("time zone %s: %v", name, err)
	}
	return loc
}

func rfc(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCalendarSteps: calendar windows at fixed instants, in Europe/Berlin
// and America/New_York, across both daylight-saving changes of 2024 and
// February of the leap year 2024: the window's start, end and length, the
// instants either side of each boundary, and a lease clamped to the end.
func TestCalendarSteps(t *testing.T) {
	berlin, ny := zone(t, "Europe/Berlin"), zone(t, "America/New_York")
	for _, s := range []struct {
		name       string
		unit       Unit
		loc        *time.Location
		t          string
		start, end string // RFC 3339 with the local offset
		length     time.Duration
	}{
		// Months in Berlin: February of a leap year, March (summer time
		// from 31 March 02:00 CET), October (winter time from 27 October
		// 03:00 CEST), and the instants at the March/April boundary.
		{"berlin feb 2024", Month, berlin, "2024-02-29T12:00:00Z", "2024-02-01T00:00:00+01:00", "2024-03-01T00:00:00+01:00", 29 * 24 * time.Hour},
		{"berlin feb 2023", Month, berlin, "2023-02-15T12:00:00Z", "2023-02-01T00:00:00+01:00", "2023-03-01T00:00:00+01:00", 28 * 24 * time.Hour},
		{"berlin first instant of feb", Month, berlin, "2024-01-31T23:00:00Z", "2024-02-01T00:00:00+01:00", "2024-03-01T00:00:00+01:00", 29 * 24 * time.Hour},
		{"berlin last instant of jan", Month, berlin, "2024-01-31T22:59:59.999999999Z", "2024-01-01T00:00:00+01:00", "2024-02-01T00:00:00+01:00", 31 * 24 * time.Hour},
		{"berlin march 2024 (23 h day)", Month, berlin, "2024-03-31T00:59:59Z", "2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 31*24*time.Hour - time.Hour},
		{"berlin last instant of march", Month, berlin, "2024-03-31T21:59:59.999999999Z", "2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 31*24*time.Hour - time.Hour},
		{"berlin first instant of april", Month, berlin, "2024-03-31T22:00:00Z", "2024-04-01T00:00:00+02:00", "2024-05-01T00:00:00+02:00", 30 * 24 * time.Hour},
		{"berlin october 2024 (25 h day)", Month, berlin, "2024-10-27T01:30:00Z", "2024-10-01T00:00:00+02:00", "2024-11-01T00:00:00+01:00", 31*24*time.Hour + time.Hour},
		// Days in Berlin across both changes.
		{"berlin 31 march", Day, berlin, "2024-03-31T01:30:00Z", "2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23 * time.Hour},
		{"berlin 27 october", Day, berlin, "2024-10-27T00:30:00Z", "2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 25 * time.Hour},
		{"berlin 29 february", Day, berlin, "2024-02-29T23:00:00Z", "2024-03-01T00:00:00+01:00", "2024-03-02T00:00:00+01:00", 24 * time.Hour},
		// New York: February 2024, March (EDT from 10 March 02:00),
		// November (EST from 3 November 02:00).
		{"ny feb 2024", Month, ny, "2024-02-29T23:59:59-05:00", "2024-02-01T00:00:00-05:00", "2024-03-01T00:00:00-05:00", 29 * 24 * time.Hour},
		{"ny first instant of march", Month, ny, "2024-03-01T05:00:00Z", "2024-03-01T00:00:00-05:00", "2024-04-01T00:00:00-04:00", 31*24*time.Hour - time.Hour},
		{"ny last instant of feb", Month, ny, "2024-03-01T04:59:59.999999999Z", "2024-02-01T00:00:00-05:00", "2024-03-01T00:00:00-05:00", 29 * 24 * time.Hour},
		{"ny november 2024", Month, ny, "2024-11-03T06:30:00Z", "2024-11-01T00:00:00-04:00", "2024-12-01T00:00:00-05:00", 30*24*time.Hour + time.Hour},
		{"ny 10 march", Day, ny, "2024-03-10T12:00:00-04:00", "2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00", 23 * time.Hour},
		{"ny 3 november", Day, ny, "2024-11-03T01:30:00-05:00", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25 * time.Hour},
		// Weeks (Monday) and years.
		{"berlin week of 31 march", Week, berlin, "2024-03-31T12:00:00Z", "2024-03-25T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 7*24*time.Hour - time.Hour},
		{"ny week of 1 jan 1970", Week, ny, "1970-01-01T12:00:00-05:00", "1969-12-29T00:00:00-05:00", "1970-01-05T00:00:00-05:00", 7 * 24 * time.Hour},
		{"berlin year 2024", Year, berlin, "2024-07-01T00:00:00Z", "2024-01-01T00:00:00+01:00", "2025-01-01T00:00:00+01:00", 366 * 24 * time.Hour},
	} {
		t.Run(s.name, func(t *testing.T) {
			c := Calendar{Unit: s.unit, Loc: s.loc}
			w := c.WindowOf(rfc(t, s.t))
			if !w.Start.Equal(rfc(t, s.start)) || !w.End.Equal(rfc(t, s.end)) || w.Length() != s.length {
				t.Fatalf("window %v - %v (%v), want %s - %s (%v)", w.Start, w.End, w.Length(), s.start, s.end, s.length)
			}
			if got := c.Window(w.Index); got != w {
				t.Fatalf("Window(%d) = %+v, want %+v", w.Index, got, w)
			}
			if next := c.WindowOf(w.End); next.Index != w.Index+1 || !next.Start.Equal(w.End) {
				t.Fatalf("the window at End: %+v, want index %d from %v", next, w.Index+1, w.End)
			}
			if prev := c.WindowOf(w.Start.Add(-time.Nanosecond)); prev.Index != w.Index-1 || !prev.End.Equal(w.Start) {
				t.Fatalf("the window before Start: %+v", prev)
			}
		})
	}
}

// TestCalendarIndexes: indexes count from 1970 in each unit.
func TestCalendarIndexes(t *testing.T) {
	berlin := zone(t, "Europe/Berlin")
	for _, s := range []struct {
		unit Unit
		t    string
		want int64
	}{
		{Month, "2024-02-10T00:00:00Z", (2024-1970)*12 + 1},
		{Month, "1969-12-31T23:30:00Z", 0}, // already 1970-01-01 in Berlin
		{Month, "1969-12-31T22:30:00Z", -1},
		{Year, "2024-02-10T00:00:00Z", 54},
		{Day, "1970-01-02T00:00:00Z", 1},
		{Week, "1970-01-05T12:00:00Z", 1},
	} {
		if got := (Calendar{Unit: s.unit, Loc: berlin}).WindowOf(rfc(t, s.t)).Index; got != s.want {
			t.Errorf("%v of %s: index %d, want %d", s.unit, s.t, got, s.want)
		}
	}
}

// TestCalendarLeaseClamp: a lease never outlives its calendar window: one
// granted a minute before the end of March in Berlin with a 15 min ttl
// expires at the end (the 23 h day does not matter); one granted early
// for April starts at April's start.
func TestCalendarLeaseClamp(t *testing.T) {
	c := Calendar{Unit: Month, Loc: zone(t, "Europe/Berlin")}
	now := rfc(t, "2024-03-31T21:59:00Z")
	w := c.WindowOf(now)
	if got := w.Schedule(now, 15*time.Minute); got != (Timing{ExpiresIn: time.Minute}) {
		t.Fatalf("schedule %+v, want expires in 1m", got)
	}
	if got := w.Clamp(now, 15*time.Minute); got != time.Minute {
		t.Fatalf("clamp %v", got)
	}
	next := c.Window(w.Index + 1)
	if got := next.Schedule(now, 15*time.Minute); got != (Timing{StartsIn: time.Minute, ExpiresIn: 16 * time.Minute}) {
		t.Fatalf("early lease for april %+v", got)
	}
	if got := w.Schedule(w.End, time.Minute); got != (Timing{}) {
		t.Fatalf("at the end: %+v, want expired", got)
	}
	if w.Left(now) != time.Minute || next.Left(now) != next.Length() || w.Left(w.End) != 0 {
		t.Fatalf("left %v %v %v", w.Left(now), next.Left(now), w.Left(w.End))
	}
}

// TestCalendarMidnightChanges: where a daylight-saving change happens at
// midnight the day starts at its first instant: at the change when
// midnight is skipped (Sao Paulo, 4 November 2018), at the first of the
// two midnights when it is repeated (Havana, 7 November 2021).
func TestCalendarMidnightChanges(t *testing.T) {
	sp := Calendar{Unit: Day, Loc: zone(t, "America/Sao_Paulo")}
	w := sp.WindowOf(rfc(t, "2018-11-04T12:00:00-02:00"))
	if !w.Start.Equal(rfc(t, "2018-11-04T03:00:00Z")) || w.Length() != 23*time.Hour {
		t.Fatalf("Sao Paulo 4 November 2018: %v, %v", w.Start, w.Length())
	}
	// A date that never was (Apia moved across the date line): an empty
	// window, between two that touch.
	apia := Calendar{Unit: Day, Loc: zone(t, "Pacific/Apia")}
	w = apia.WindowOf(rfc(t, "2011-12-29T12:00:00-10:00"))
	if gone := apia.Window(w.Index + 1); !gone.Empty() || !apia.WindowOf(w.End).Start.Equal(w.End) || apia.WindowOf(w.End).Index != w.Index+2 {
		t.Fatalf("Apia 30 December 2011: %+v after %+v", gone, w)
	}
	hv := Calendar{Unit: Day, Loc: zone(t, "America/Havana")}
	w = hv.WindowOf(rfc(t, "2021-11-07T12:00:00-05:00"))
	if !w.Start.Equal(rfc(t, "2021-11-07T04:00:00Z")) || w.Length() != 25*time.Hour {
		t.Fatalf("Havana 7 November 2021: %v, %v", w.Start, w.Length())
	}
}

// TestCalendarEdges: no windows outside years 1 to 9999 (the last week
// of 9999 ends in 10000), for an unknown
// unit or without a zone; nothing panics.
func TestCalendarEdges(t *testing.T) {
	utc := time.UTC
	for _, c := range []Calendar{{Unit: Month}, {Unit: 0, Loc: utc}, {Unit: 9, Loc: utc}} {
		if w := c.WindowOf(time.Unix(0, 0)); !w.Empty() || w.Contains(time.Unix(0, 0)) || w.Left(time.Unix(0, 0)) != 0 {
			t.Errorf("%+v: %+v, want empty", c, w)
		}
	}
	for _, u := range []Unit{Day, Week, Month, Year} {
		c := Calendar{Unit: u, Loc: utc}
		for _, ts := range []time.Time{time.Date(0, 12, 31, 23, 0, 0, 0, utc), time.Date(10000, 1, 1, 0, 0, 0, 0, utc)} {
			if w := c.WindowOf(ts); !w.Empty() {
				t.Errorf("%v of %v: %+v, want empty", u, ts, w)
			}
		}
		for _, i := range []int64{-1 << 63, 1<<63 - 1, 1 << 50} {
			if w := c.Window(i); !w.Empty() {
				t.Errorf("%v window %d: %+v, want empty", u, i, w)
			}
		}
		last := time.Date(9999, 12, 31, 23, 0, 0, 0, utc)
		if w := c.WindowOf(last); w.Empty() || !w.Contains(last) || u != Week && !w.End.Equal(time.Date(10000, 1, 1, 0, 0, 0, 0, utc)) {
			t.Errorf("%v of the last hour of 9999: %+v", u, w)
		}
	}
	if u, err := ParseUnit("month"); u != Month || err != nil {
		t.Fatal(u, err)
	}
	if _, err := ParseUnit("fortnight"); err != ErrUnit {
		t.Fatal(err)
	}
}

// FuzzCalendar: for any instant, unit and zone, the window holds the
// instant, is found again by its index, and touches its neighbours.
func FuzzCalendar(f *testing.F) {
	f.Add(int64(1711846800), int64(0), uint8(2), uint8(0))
	f.Add(int64(-62135596800), int64(0), uint8(0), uint8(1))
	f.Add(int64(253402300799), int64(999999999), uint8(3), uint8(2))
	zones := []string{"Europe/Berlin", "America/New_York", "America/Sao_Paulo", "America/Havana", "Pacific/Apia", "Australia/Lord_Howe", "UTC"}
	f.Fuzz(func(t *testing.T, sec, nsec int64, unit, z uint8) {
		loc := zone(t, zones[int(z)%len(zones)])
		c := Calendar{Unit: Unit(unit%4) + Day, Loc: loc}
		tt := time.Unix(sec, nsec%1_000_000_000)
		w := c.WindowOf(tt)
		if w.Empty() {
			if y := tt.In(loc).Year(); y >= 1 && y <= 9999 {
				t.Fatalf("no window for %v (year %d)", tt, y)
			}
			return
		}
		if !w.Contains(tt) || c.Window(w.Index) != w {
			t.Fatalf("%v: %+v", tt, w)
		}
		// Neighbours touch; the windows between them (a local date that
		// does not exist) are empty.
		if n := c.WindowOf(w.End); !n.Empty() {
			if n.Index <= w.Index || !n.Start.Equal(w.End) {
				t.Fatalf("after %+v: %+v", w, n)
			}
			for i := w.Index + 1; i < n.Index; i++ {
				if !c.Window(i).Empty() {
					t.Fatalf("window %d between %+v and %+v is not empty", i, w, n)
				}
			}
		}
		if p := c.WindowOf(w.Start.Add(-1)); !p.Empty() && (p.Index >= w.Index || !p.End.Equal(w.Start)) {
			t.Fatalf("before %+v: %+v", w, p)
		}
	})
}
