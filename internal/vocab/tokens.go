package vocab

// MaxTokens is the largest number of tokens Leasehold handles anywhere: a
// limit's G, its lease chunks and local fallback, one Check's cost, one
// reservation or release. It is 2^50 (about 1.1e15).
//
// Why that number: the region agent's Redis scripts compute in Lua
// numbers (float64), exact only up to 2^53, and they add a few such
// amounts in one bucket (a window's leases, its fallback admits, its
// denied costs). 2^50 leaves eight of them of headroom below 2^53, and is
// still more than a trillion tokens a second over a 1 s window. JSON
// clients that read numbers as float64 read every value up to it exactly
// too. The allocator refuses a limit above it where the limit is written,
// so no agent is ever handed a limit its bucket cannot hold.
const MaxTokens int64 = 1 << 50

// ValidateTokens checks an amount of tokens: min..MaxTokens. The error is
// a *FieldError naming field.
func ValidateTokens(field string, n, min int64) error {
	if n < min || n > MaxTokens {
		return InvalidField(field, "must be %d..%d, got %d", min, MaxTokens, n)
	}
	return nil
}
