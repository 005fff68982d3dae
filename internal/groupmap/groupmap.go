// Package groupmap says which allocator group owns each limit, window by
// window.
//
// An allocator group is one allocator deployment: its replicas campaign
// for one election on one etcd prefix (or cluster), and its leader is the
// only authority for the limits the group owns. The map is versioned; a
// version governs the windows that START at or after its From instant, so
// a limit moves between groups only at one of its own window boundaries:
// the window in progress at From stays with the old owner until it ends,
// the next one belongs to the new owner, and no (limit, window) ever has
// two owners (Owner is a function of the limit and the window's start).
//
// A limit is owned by its explicit placement in the governing version, if
// it has one (a large tenant on a group of its own), and otherwise by
// rendezvous hashing of its id over the version's groups: adding a group
// moves to it about 1/n of the limits and moves nothing between the old
// groups.
//
// The package is pure: no I/O, time as an argument, standard library only.
package groupmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"leasehold/internal/vocab"
)

// Bounds on a map. They keep the map one small etcd value that every agent
// can hold and re-read.
const (
	MaxGroups        = 64
	MaxGroupNameLen  = 32
	MaxAllocators    = 16
	MaxAddressLen    = 256
	MaxPlacements    = 10_000
	MaxVersions      = 32
	MaxReasonLen     = 512
	MaxEncodedLength = 2 << 20
)

// Group is one allocator group.
type Group struct {
	// Name names the group: 1-32 of [a-z0-9-], starting and ending with a
	// letter or digit.
	Name string `json:"name"`
	// Allocators lists addresses (host:port) of the group's allocator
	// replicas; any replica names its leader.
	Allocators []string `json:"allocators"`
}

// Version is one version of the map.
type Version struct {
	// Number increases by one per version.
	Number int64 `json:"version"`
	// From is the instant (allocator clock) from which windows that start
	// at or after it are owned as this version says.
	From time.Time `json:"from"`
	// Groups are the groups, sorted by name.
	Groups []Group `json:"groups"`
	// Place places limits explicitly: limit id -> group name.
	Place map[string]string `json:"place,omitempty"`
	// Reason says why the version was made (audit).
	Reason string `json:"reason,omitempty"`
}

// Map is the sequence of versions, ascending by Number and by From. The
// first version governs every window that starts before the second's From
// (there is no owner before the first version: the map starts with the
// deployment).
type Map struct {
	Versions []Version `json:"versions"`
}

// Every validation error is a *vocab.FieldError naming its field (it
// matches vocab.ErrInvalid).
var fieldErr = vocab.InvalidField

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidateName checks a group name.
func ValidateName(field, name string) error {
	switch {
	case name == "":
		return fieldErr(field, "required")
	case len(name) > MaxGroupNameLen:
		return fieldErr(field, "longer than %d characters", MaxGroupNameLen)
	case !nameRe.MatchString(name):
		return fieldErr(field, "%q: use [a-z0-9-], starting and ending with a letter or digit", name)
	}
	return nil
}

// Current is the newest version (the zero Version of an empty map).
func (m *Map) Current() Version {
	if len(m.Versions) == 0 {
		return Version{}
	}
	return m.Versions[len(m.Versions)-1]
}

// governing returns the version that governs a window starting at start.
func (m *Map) governing(start time.Time) *Version {
	if len(m.Versions) == 0 {
		return nil
	}
	i := sort.Search(len(m.Versions), func(i int) bool { return m.Versions[i].From.After(start) })
	if i == 0 {
		return &m.Versions[0]
	}
	return &m.Versions[i-1]
}

// Owner names the group that owns limit's window starting at start, and
// the version that says so. ok is false only for an empty map.
func (m *Map) Owner(limit string, start time.Time) (group string, version int64, ok bool) {
	v := m.governing(start)
	if v == nil {
		return "", 0, false
	}
	return v.Owner(limit), v.Number, true
}

// Owner names the group of limit under this version.
func (v *Version) Owner(limit string) string {
	if g, ok := v.Place[limit]; ok {
		return g
	}
	return Rendezvous(limit, v.Groups)
}

// Group returns the named group of this version.
func (v *Version) Group(name string) (Group, bool) {
	i, ok := slices.BinarySearchFunc(v.Groups, name, func(g Group, n string) int { return strings.Compare(g.Name, n) })
	if !ok {
		return Group{}, false
	}
	return v.Groups[i], true
}

// Rendezvous picks the group with the highest score for limit (ties, which
// need a 64-bit collision, by name). Empty groups: "".
func Rendezvous(limit string, groups []Group) string {
	best, bestScore := "", uint64(0)
	for _, g := range groups {
		s := score(g.Name, limit)
		if best == "" || s > bestScore || (s == bestScore && g.Name < best) {
			best, bestScore = g.Name, s
		}
	}
	return best
}

// score hashes (group, limit) with FNV-1a and a splitmix64 finaliser: stable
// across processes and versions, which the map's promise rests on.
func score(group, limit string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(group); i++ {
		h = (h ^ uint64(group[i])) * prime
	}
	h = (h ^ 0xff) * prime // separator (in no name): ("ab","c") and ("a","bc") differ
	for i := 0; i < len(limit); i++ {
		h = (h ^ uint64(limit[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Validate checks a version on its own: names, addresses, placements.
func (v *Version) Validate() error {
	if v.Number < 1 {
		return fieldErr("version", "must be >= 1, got %d", v.Number)
	}
	if v.From.IsZero() {
		return fieldErr("from", "required")
	}
	if len(v.Groups) == 0 {
		return fieldErr("groups", "at least one group")
	}
	if len(v.Groups) > MaxGroups {
		return fieldErr("groups", "at most %d, got %d", MaxGroups, len(v.Groups))
	}
	for i, g := range v.Groups {
		field := fmt.Sprintf("groups[%d]", i)
		if err := ValidateName(field+".name", g.Name); err != nil {
			return err
		}
		if i > 0 && v.Groups[i-1].Name >= g.Name {
			return fieldErr(field+".name", "%q: groups must be sorted by name without repeats", g.Name)
		}
		if len(g.Allocators) == 0 || len(g.Allocators) > MaxAllocators {
			return fieldErr(field+".allocators", "1 to %d addresses, got %d", MaxAllocators, len(g.Allocators))
		}
		for j, a := range g.Allocators {
			if err := validateAddress(fmt.Sprintf("%s.allocators[%d]", field, j), a); err != nil {
				return err
			}
		}
	}
	if len(v.Place) > MaxPlacements {
		return fieldErr("place", "at most %d placements, got %d", MaxPlacements, len(v.Place))
	}
	for _, limit := range sortedKeys(v.Place) {
		field := "place[" + vocab.Cap(limit, 64) + "]"
		if err := vocab.ValidateLimitID(field, limit); err != nil {
			return err
		}
		if _, ok := v.Group(v.Place[limit]); !ok {
			return fieldErr(field, "group %q is not in the version's groups", vocab.Cap(v.Place[limit], MaxGroupNameLen+8))
		}
	}
	if len(v.Reason) > MaxReasonLen {
		return fieldErr("reason", "longer than %d characters", MaxReasonLen)
	}
	return nil
}

func validateAddress(field, a string) error {
	switch {
	case a == "":
		return fieldErr(field, "required")
	case len(a) > MaxAddressLen:
		return fieldErr(field, "longer than %d characters", MaxAddressLen)
	case strings.ContainsAny(a, " \t\r\n,"):
		return fieldErr(field, "%q: one host:port, no spaces or commas", vocab.Cap(a, 64))
	case !strings.Contains(a, ":"):
		return fieldErr(field, "%q: want host:port", vocab.Cap(a, 64))
	}
	return nil
}

// Validate checks a whole map: every version valid, numbers consecutive,
// From strictly increasing.
func (m *Map) Validate() error {
	if len(m.Versions) > MaxVersions {
		return fieldErr("versions", "at most %d, got %d", MaxVersions, len(m.Versions))
	}
	for i := range m.Versions {
		v := &m.Versions[i]
		if err := v.Validate(); err != nil {
			var fe *vocab.FieldError
			if errors.As(err, &fe) {
				return &vocab.FieldError{Field: fmt.Sprintf("versions[%d].%s", i, fe.Field), Reason: fe.Reason}
			}
			return err
		}
		if i > 0 {
			p := &m.Versions[i-1]
			if v.Number != p.Number+1 {
				return fieldErr(fmt.Sprintf("versions[%d].version", i), "must be %d, got %d", p.Number+1, v.Number)
			}
			if !v.From.After(p.From) {
				return fieldErr(fmt.Sprintf("versions[%d].from", i), "must be after the previous version's (%s)", p.From.Format(time.RFC3339Nano))
			}
		}
	}
	return nil
}

// Change is what a new version changes.
type Change struct {
	// Groups, when non-nil, replaces the groups.
	Groups []Group
	// Place sets explicit placements (limit -> group); Unplace removes
	// some (the limit goes back to hashing).
	Place   map[string]string
	Unplace []string
	Reason  string
}

// Next returns the map with a new version made of change, governing from
// the first instant at or after now+notice that is after the current
// version's From (the first version of a map governs from now, and every
// window before). notice must cover how long an agent may go without
// re-reading the map and how far ahead it asks for a next window's lease:
// a version must be known everywhere before it governs. Versions that can
// no longer govern any open window (a later version took effect more than
// maxWindow before now) are dropped.
func (m *Map) Next(now time.Time, notice, maxWindow time.Duration, change Change) (Map, error) {
	cur := m.Current()
	nv := Version{Number: cur.Number + 1, From: now.Round(0), Reason: change.Reason}
	if len(m.Versions) > 0 {
		// The first version governs from the start (before it, the
		// deployment had no other owner); later ones after notice.
		nv.From = now.Add(notice).Round(0)
		if !nv.From.After(cur.From) {
			nv.From = cur.From.Add(time.Millisecond)
		}
	}
	nv.Groups = cur.Groups
	if change.Groups != nil {
		nv.Groups = slices.Clone(change.Groups)
		for i := range nv.Groups {
			nv.Groups[i].Allocators = slices.Clone(nv.Groups[i].Allocators)
		}
		slices.SortFunc(nv.Groups, func(a, b Group) int { return strings.Compare(a.Name, b.Name) })
	}
	nv.Place = map[string]string{}
	for k, g := range cur.Place {
		nv.Place[k] = g
	}
	for k, g := range change.Place {
		nv.Place[k] = g
	}
	for _, k := range change.Unplace {
		delete(nv.Place, k)
	}
	if len(nv.Place) == 0 {
		nv.Place = nil
	}
	if err := nv.Validate(); err != nil {
		return Map{}, err
	}
	out := Map{Versions: append(slices.Clone(m.Versions), nv)}
	out.prune(now, maxWindow)
	if len(out.Versions) > MaxVersions {
		return Map{}, fieldErr("versions", "%d versions would still govern open windows (at most %d): wait for older windows to end", len(out.Versions), MaxVersions)
	}
	return out, nil
}

// prune drops the versions before the newest one whose From is at least
// maxWindow before now: every window that started under them has ended.
func (m *Map) prune(now time.Time, maxWindow time.Duration) {
	keep := 0
	for i := range m.Versions {
		if !m.Versions[i].From.After(now.Add(-maxWindow)) {
			keep = i
		}
	}
	m.Versions = m.Versions[keep:]
}

// Moved lists the limits (of those given) whose owner differs between the
// version governing a window starting at a and one starting at b: what a
// version change moves, for a dry run.
func (m *Map) Moved(limits []string, a, b time.Time) map[string][2]string {
	va, vb := m.governing(a), m.governing(b)
	out := map[string][2]string{}
	if va == nil || vb == nil {
		return out
	}
	for _, l := range limits {
		if oa, ob := va.Owner(l), vb.Owner(l); oa != ob {
			out[l] = [2]string{oa, ob}
		}
	}
	return out
}

// Encode is the map's stored form (JSON).
func Encode(m Map) ([]byte, error) { return json.Marshal(m) }

// Decode parses and validates a stored map.
func Decode(b []byte) (Map, error) {
	if len(b) > MaxEncodedLength {
		return Map{}, fieldErr("map", "longer than %d bytes", MaxEncodedLength)
	}
	var m Map
	if err := json.Unmarshal(b, &m); err != nil {
		return Map{}, fieldErr("map", "not a group map: %s", vocab.Cap(err.Error(), 200))
	}
	if err := m.Validate(); err != nil {
		return Map{}, err
	}
	return m, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
