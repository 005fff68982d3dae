// Package seeded holds the switches of the bugs that the protocol explorer
// (simulations/explore) must find: mutation testing of the proofs. Each Bug
// names one mistake that a change to the real code could make; the code
// that would make it asks [On] at the one place where it would be made.
//
// Without the build tag leasehold_seeded, [On] is the constant false and the
// compiler removes every seeded branch: a product build contains none of
// them. With the tag (go test -tags leasehold_seeded ./simulations/explore/),
// a test arms one bug at a time with [Arm] and expects the explorer to
// report a violation with its shortest trace.
package seeded

import "sync/atomic"

// Bug is one seeded mistake.
type Bug int32

// The seeded bugs. Each comment says where the mistake is made and which
// invariant of docs/design.md it breaks.
const (
	// None: the clean build.
	None Bug = iota
	// NoClamp: lease.Schedule does not clamp a lease to its window's end
	// (Clamp).
	NoClamp
	// SpendAtDeadline: the in-memory bucket (store.Mem) lets a lease be
	// spent at its deadline instant (spend strictly before the deadline).
	SpendAtDeadline
	// RegrantRetry: allocator.Core forgets request ids, so a retried
	// request is granted again rather than replayed (Idempotency).
	RegrantRetry
	// NoFence: allocator.Fence's compare holds for any election key, so a
	// deposed leader's commit lands (Fencing).
	NoFence
	// DoubleCredit: allocator.Core credits a retried return a second time
	// (returns are counted once).
	DoubleCredit
	// UncountedFallback: the agent core admits under local fallback
	// without marking the window's mode, so the bound leaves the fallback
	// term out (Bound: observed never above the computed bound).
	UncountedFallback
	numBugs
)

// All lists the seeded bugs, None excluded.
func All() []Bug {
	out := make([]Bug, 0, numBugs-1)
	for b := None + 1; b < numBugs; b++ {
		out = append(out, b)
	}
	return out
}

// String returns the bug's name.
func (b Bug) String() string {
	switch b {
	case None:
		return "none"
	case NoClamp:
		return "no-clamp"
	case SpendAtDeadline:
		return "spend-at-deadline"
	case RegrantRetry:
		return "regrant-retry"
	case NoFence:
		return "no-fence"
	case DoubleCredit:
		return "double-credit"
	case UncountedFallback:
		return "uncounted-fallback"
	}
	return "bug?"
}

var armed atomic.Int32

// On reports whether bug b is armed. It is the constant false unless the
// build has the tag leasehold_seeded.
func On(b Bug) bool { return enabled && Bug(armed.Load()) == b }

// Arm arms bug b (None disarms) and returns the bug armed before. It
// panics in a build without the tag leasehold_seeded, where no bug can be
// armed: a test that believes it armed one would pass for nothing.
func Arm(b Bug) Bug {
	if !enabled && b != None {
		panic("seeded: Arm(" + b.String() + ") in a build without -tags leasehold_seeded")
	}
	return Bug(armed.Swap(int32(b)))
}

// Enabled reports whether this build can arm bugs (the tag leasehold_seeded).
func Enabled() bool { return enabled }
