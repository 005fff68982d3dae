// Package zones loads the time zones of calendar windows once per process
// and names a calendar schedule in records.
//
// Two calendar schedules (lease.Windows) compare equal only when they hold
// the same *time.Location, and window states, answers and reports compare
// schedules with ==. So every place that turns a zone name into a
// location goes through [Load], which loads each zone once and hands out
// the same *time.Location ever after. The time zone database is embedded
// (time/tzdata), so a zone the allocator accepts is one every agent loads
// the same way, on a machine without /usr/share/zoneinfo.
package zones

import (
	"errors"
	"strings"
	"sync"
	"time"
	_ "time/tzdata"

	"leasehold/lease"
)

// MaxZoneLen bounds a zone name (IANA names are at most about 30 bytes).
const MaxZoneLen = 64

// maxCached bounds the cache: only zones of validated limits reach it, and
// the IANA database has about 600 names.
const maxCached = 1024

var (
	mu    sync.Mutex                    // protects cache
	cache = map[string]*time.Location{} // zone name -> its one location
)

// ErrZone: a zone name that is empty, too long or not in the database.
var ErrZone = errors.New("zones: unknown time zone")

// Load returns the location of an IANA zone name, the same pointer for the
// same name on every call. "" and "Local" are refused: a calendar window
// must not depend on the machine's settings. Safe for concurrent use.
func Load(name string) (*time.Location, error) {
	if name == "" || len(name) > MaxZoneLen || name == "Local" {
		return nil, ErrZone
	}
	mu.Lock()
	defer mu.Unlock()
	if loc, ok := cache[name]; ok {
		return loc, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, ErrZone
	}
	if len(cache) < maxCached {
		cache[name] = loc
	}
	return loc, nil
}

// Calendar returns the calendar of a unit ("day", "week", "month",
// "year") in a zone, its location from [Load].
func Calendar(unit, zone string) (lease.Calendar, error) {
	u, err := lease.ParseUnit(unit)
	if err != nil {
		return lease.Calendar{}, err
	}
	loc, err := Load(zone)
	if err != nil {
		return lease.Calendar{}, err
	}
	return lease.Calendar{Unit: u, Loc: loc}, nil
}

// Format names a calendar as records keep it: "month Europe/Berlin"; ""
// for the zero Calendar (fixed windows).
func Format(c lease.Calendar) string {
	if c.Loc == nil {
		return ""
	}
	return c.Unit.String() + " " + c.Loc.String()
}

// Parse reads what [Format] wrote; "" is the zero Calendar.
func Parse(s string) (lease.Calendar, error) {
	if s == "" {
		return lease.Calendar{}, nil
	}
	unit, zone, ok := strings.Cut(s, " ")
	if !ok {
		return lease.Calendar{}, lease.ErrUnit
	}
	return Calendar(unit, zone)
}

// Describe names a calendar for people: "calendar month, Europe/Berlin".
func Describe(c lease.Calendar) string {
	if c.Loc == nil {
		return ""
	}
	return "calendar " + c.Unit.String() + ", " + c.Loc.String()
}

// Shortest is the shortest non-empty window a calendar unit can have in a
// zone that moves its clocks by at most two hours: a lease ttl is bounded
// by it (ttl <= W) and defaults to a quarter of it, as a fixed window's
// ttl defaults to W/4. 0 for an unknown unit.
func Shortest(u lease.Unit) time.Duration {
	const day = 24 * time.Hour
	switch u {
	case lease.Day:
		return day - 2*time.Hour
	case lease.Week:
		return 7*day - 2*time.Hour
	case lease.Month:
		return 28*day - 2*time.Hour
	case lease.Year:
		return 365*day - 2*time.Hour
	}
	return 0
}
