package seeded

import "testing"

func TestOnFollowsArm(t *testing.T) {
	if !enabled {
		if On(NoClamp) {
			t.Fatal("On is true in a build without the tag")
		}
		defer func() {
			if recover() == nil {
				t.Fatal("Arm(NoClamp) did not panic without the tag")
			}
		}()
		Arm(NoClamp)
		return
	}
	defer Arm(None)
	for _, b := range All() {
		Arm(b)
		for _, o := range All() {
			if On(o) != (o == b) {
				t.Fatalf("armed %v: On(%v) = %v", b, o, On(o))
			}
		}
	}
}

func TestNames(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range append(All(), None) {
		n := b.String()
		if n == "bug?" || seen[n] {
			t.Fatalf("bug %d: name %q", b, n)
		}
		seen[n] = true
	}
}
