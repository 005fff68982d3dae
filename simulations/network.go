package simulations

import (
	"math/rand/v2"
	"time"
)

// Link is one direction of a network path between two hosts.
type Link struct {
	Delay  time.Duration // base one-way delay
	Jitter time.Duration // uniform extra delay in [0, Jitter)
	Loss   float64       // probability a message is lost
	Dup    float64       // probability a message is delivered twice
}

type linkKey struct{ from, to string }

// Network delivers messages between named hosts over links with delay,
// jitter, loss and duplication. A link can be cut (both directions) and a
// host can be down; a message is dropped if its path is cut or its
// destination is down when it is sent or when it would arrive, so a cut
// also loses what was in flight.
//
// Build one with NewNetwork. Not safe for concurrent use.
type Network struct {
	eng   *Engine
	rng   *rand.Rand
	links map[linkKey]Link
	cut   map[linkKey]bool
	down  map[string]bool

	Sent, Lost, Duplicated, Dropped int64 // message counts
}

// NewNetwork returns a network whose random choices come from rng.
func NewNetwork(eng *Engine, rng *rand.Rand) *Network {
	return &Network{eng: eng, rng: rng, links: map[linkKey]Link{}, cut: map[linkKey]bool{}, down: map[string]bool{}}
}

// SetLink sets the link from a to b and the one from b to a.
func (n *Network) SetLink(a, b string, l Link) {
	n.links[linkKey{a, b}] = l
	n.links[linkKey{b, a}] = l
}

// Cut cuts (or heals, with on false) the path between a and b.
func (n *Network) Cut(a, b string, on bool) {
	n.cut[linkKey{a, b}] = on
	n.cut[linkKey{b, a}] = on
}

// SetDown marks a host down (its messages, in and out, are dropped) or up.
func (n *Network) SetDown(host string, down bool) { n.down[host] = down }

// Down reports whether a host is down.
func (n *Network) Down(host string) bool { return n.down[host] }

// Reachable reports whether a message from a to b would not be dropped now
// by a cut or a down host (it may still be lost).
func (n *Network) Reachable(a, b string) bool {
	return !n.cut[linkKey{a, b}] && !n.down[a] && !n.down[b]
}

// Send delivers fn at b after the link's delay, unless lost or dropped; a
// duplicated message runs fn twice. It reports whether a copy is on its way.
func (n *Network) Send(a, b string, fn func()) bool {
	n.Sent++
	if !n.Reachable(a, b) {
		n.Dropped++
		return false
	}
	l := n.links[linkKey{a, b}]
	if l.Loss > 0 && n.rng.Float64() < l.Loss {
		n.Lost++
		return false
	}
	copies := 1
	if l.Dup > 0 && n.rng.Float64() < l.Dup {
		copies = 2
		n.Duplicated++
	}
	for range copies {
		d := l.Delay
		if l.Jitter > 0 {
			d += time.Duration(n.rng.Int64N(int64(l.Jitter)))
		}
		n.eng.After(d, func() {
			if !n.Reachable(a, b) {
				n.Dropped++
				return
			}
			fn()
		})
	}
	return true
}
