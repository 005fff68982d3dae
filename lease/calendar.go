package lease

import (
	"errors"
	"strconv"
	"time"
)

// Unit is the length of a calendar window: a day, an ISO week (Monday to
// Sunday), a month or a year, in a time zone.
type Unit int8

// Units.
const (
	Day Unit = iota + 1
	Week
	Month
	Year
)

func (u Unit) String() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// Nominal is a unit's usual length (24 h, 7 days, 30 days, 365 days), for
// estimates that need one number for every window (a first lease's prior
// demand): a window's real length is its own (CalendarWindow.Length). 0
// for an unknown unit.
func (u Unit) Nominal() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// ErrUnit: a calendar unit that is not day, week, month or year.
var ErrUnit = errors.New("lease: calendar unit must be day, week, month or year")

// ParseUnit reads "day", "week", "month" or "year".
func ParseUnit(s string) (Unit, error) {
	for u := Day; u <= Year; u++ {
		if u.String() == s {
			return u, nil
		}
	}
	return 0, ErrUnit
}

// Calendar names the calendar windows of one Unit in one time zone: each
// starts at the first instant of its local date (a Monday for weeks, the
// 1st for months, 1 January for years) and ends where the next one starts,
// so its length follows daylight-saving changes, month lengths and leap
// years: a day in Europe/Berlin lasts 23 h on the last Sunday of March.
//
// Windows are numbered like [Window]'s, so that they compare with ==, key
// maps and name stored keys without formatting times: Index counts windows
// of the Unit from the one that holds the local date 1970-01-01 (for
// weeks, the ISO week of Monday 1969-12-29), negative before it.
//
// A local date that never was (Pacific/Apia skipped 30 December 2011) has
// an empty window: the windows either side touch. Windows exist for local
// years 1 to 9999: [Calendar.WindowOf] of an
// instant outside them, and a Calendar with an unknown Unit or a nil
// Loc, give the empty CalendarWindow (no instant, nothing left).
//
// A Calendar is a value; it is safe for concurrent use. Nothing here
// reads the clock: time is an argument.
type Calendar struct {
	Unit Unit
	Loc  *time.Location
}

// CalendarWindow is one calendar window [Start, End).
type CalendarWindow struct {
	Index      int64
	Start, End time.Time
}

// Empty reports whether the window holds no instant.
func (w CalendarWindow) Empty() bool { return !w.Start.Before(w.End) }

// Length is End - Start.
func (w CalendarWindow) Length() time.Duration {
	if w.Empty() {
		return 0
	}
	return w.End.Sub(w.Start)
}

// Contains reports whether t lies in [Start, End).
func (w CalendarWindow) Contains(t time.Time) bool {
	return !w.Empty() && !t.Before(w.Start) && t.Before(w.End)
}

// Left is what remains of the window at now, in [0, Length]: the whole
// Length before it starts, nothing at or after its end (as [Window.Left]).
func (w CalendarWindow) Left(now time.Time) time.Duration {
	if w.Empty() || !now.Before(w.End) {
		return 0
	}
	if now.Before(w.Start) {
		return w.Length()
	}
	return w.End.Sub(now)
}

// Schedule is [Schedule] for a calendar window: a lease with ttl granted
// at now becomes spendable at the window's start (at once for the current
// window) and never outlives the window's end: now + ExpiresIn <= End.
func (w CalendarWindow) Schedule(now time.Time, ttl time.Duration) Timing {
	left := w.End.Sub(now)
	if w.Empty() || left <= 0 {
		return Timing{}
	}
	startsIn := max(w.Start.Sub(now), 0)
	return Timing{StartsIn: startsIn, ExpiresIn: min(addSat(startsIn, max(ttl, 0)), left)}
}

// Clamp is [Clamp] for a calendar window: ttl shortened so that a lease
// granted at now with it ends by the window's end; 0 at or after the end
// and for ttl <= 0.
func (w CalendarWindow) Clamp(now time.Time, ttl time.Duration) time.Duration {
	left := w.End.Sub(now)
	if ttl <= 0 || w.Empty() || left <= 0 {
		return 0
	}
	return min(ttl, left)
}

// Bounds of the local years that have windows.
const (
	minYear = 1
	maxYear = 9999
)

// WindowOf returns the window that holds t: the one of t's local date in
// c.Loc.
func (c Calendar) WindowOf(t time.Time) CalendarWindow {
	if c.Loc == nil || c.Unit < Day || c.Unit > Year {
		return CalendarWindow{}
	}
	y, m, d := t.In(c.Loc).Date()
	if y < minYear || y > maxYear {
		return CalendarWindow{}
	}
	var idx int64
	switch c.Unit {
	case Day:
		idx = daysFromCivil(y, m, d)
	case Week:
		idx = floorDiv(daysFromCivil(y, m, d)+3, 7) // 1970-01-01 was a Thursday
	case Month:
		idx = int64(y-1970)*12 + int64(m-1)
	case Year:
		idx = int64(y - 1970)
	}
	w := c.Window(idx)
	// A local date whose first instant is after t cannot happen (t's own
	// date starts at or before t); guard the arithmetic all the same.
	if !w.Contains(t) {
		return CalendarWindow{}
	}
	return w
}

// Window returns the window of an index (empty outside years 1 to 9999).
func (c Calendar) Window(index int64) CalendarWindow {
	if c.Loc == nil {
		return CalendarWindow{}
	}
	y, m, d, ok := c.startDate(index)
	ny, nm, nd, nok := c.startDate(index + 1)
	if !ok || !nok || index == 1<<63-1 {
		return CalendarWindow{}
	}
	return CalendarWindow{Index: index, Start: dayStart(y, m, d, c.Loc), End: dayStart(ny, nm, nd, c.Loc)}
}

// startDate is the local date window index starts on.
func (c Calendar) startDate(index int64) (int, time.Month, int, bool) {
	var y int64
	m, d := int64(1), int64(1)
	switch c.Unit {
	case Day, Week:
		days := index
		if c.Unit == Week {
			const maxWeeks = 1 << 40 // far beyond year 9999, and no overflow below
			if index > maxWeeks || index < -maxWeeks {
				return 0, 0, 0, false
			}
			days = index*7 - 3
		}
		if days > 1<<40 || days < -(1<<40) {
			return 0, 0, 0, false
		}
		y, m, d = civilFromDays(days)
	case Month:
		y, m = 1970+floorDiv(index, 12), index-floorDiv(index, 12)*12+1
	case Year:
		y = 1970 + index
	default:
		return 0, 0, 0, false
	}
	if y < minYear || y > maxYear+1 { // the end of year 9999's last window starts in 10000
		return 0, 0, 0, false
	}
	return int(y), time.Month(m), int(d), true
}

// dayStart is the first instant whose local date in loc is y-m-d. It is
// local midnight, except where a daylight-saving change happens at
// midnight: when midnight is skipped the day starts at the change, and
// when it happens twice the day starts at the first one (time.Date leaves
// that choice open, so it is settled here with the zone's bounds).
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	s := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if !sameDate(s.In(loc), y, m, d) {
		// s fell on the day before: local midnight does not exist, and
		// the day begins where the zone period of s ends.
		if _, end := s.ZoneBounds(); !end.IsZero() && end.After(s) {
			return end
		}
		return s
	}
	if start, _ := s.ZoneBounds(); !start.IsZero() {
		if p := start.Add(-time.Nanosecond).In(loc); sameDate(p, y, m, d) {
			// The date began under the previous offset (midnight came
			// twice): its midnight in that offset.
			_, off := p.Zone()
			if first := time.Date(y, m, d, 0, 0, 0, 0, time.FixedZone("", off)); first.Before(s) {
				return first.In(loc)
			}
		}
	}
	return s
}

func sameDate(t time.Time, y int, m time.Month, d int) bool {
	ty, tm, td := t.Date()
	return ty == y && tm == m && td == d
}

// daysFromCivil is the number of days from 1970-01-01 to y-m-d in the
// proleptic Gregorian calendar (H. Hinnant's algorithm).
func daysFromCivil(y int, m time.Month, d int) int64 {
	yy := int64(y)
	if m <= 2 {
		yy--
	}
	era := floorDiv(yy, 400)
	yoe := yy - era*400
	mp := (int64(m) + 9) % 12
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays is the inverse of daysFromCivil.
func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	if m > 12 {
		m -= 12
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
