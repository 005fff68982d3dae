package explore

import (
	"testing"
	"time"
)

func TestDigestTimes(t *testing.T) {
	now := time.Now() // with a monotonic reading
	if digestOf(&now) != digestOf(new(now.Round(0))) {
		t.Fatal("the same instant with and without a monotonic reading digests differently")
	}
	if digestOf(new(time.Unix(5, 0))) != digestOf(new(time.Unix(5, 0).In(time.FixedZone("x", 3600)))) {
		t.Fatal("the same instant in two zones digests differently")
	}
	if digestOf(&now) == digestOf(new(now.Add(time.Nanosecond))) {
		t.Fatal("different instants, equal digests")
	}
}

type node struct {
	M    map[string]*node
	Next *node
	I    any
	S    []int8
	n    int
}

func TestDigestMapsAndCycles(t *testing.T) {
	a := &node{M: map[string]*node{}, n: 1, I: 3, S: []int8{1, 2}}
	for i := range 50 {
		a.M[string(rune('a'+i%26))+string(rune('a'+i/26))] = &node{n: i}
	}
	a.Next = a // a cycle
	d := digestOf(a)
	for range 20 { // map iteration order is random; the digest is not
		if digestOf(a) != d {
			t.Fatal("digest depends on map order")
		}
	}
	for _, c := range []struct { // in this order: the last shortens the slice
		name   string
		change func()
	}{
		{"deep in a map", func() { a.M["aa"].n = 99 }},
		{"an interface", func() { a.I = 4 }},
		{"interface type", func() { a.I = int64(4) }},
		{"a slice", func() { a.S[1] = 3 }},
		{"a slice length", func() { a.S = a.S[:1] }},
	} {
		name := c.name
		c.change()
		if nd := digestOf(a); nd == d {
			t.Fatalf("a change to %s did not change the digest", name)
		} else {
			d = nd
		}
	}
	if digestOf(&node{n: 1}) == digestOf(&node{n: 1, M: map[string]*node{}}) {
		t.Fatal("nil map and empty map digest alike")
	}
}
