package bucket

import (
	"testing"

	"leasehold/internal/vocab"
)

// TestMaxTokensFitsTheScripts: Leasehold's one maximum for tokens leaves
// the scripts' exact range (float64 integers) room for eight amounts of
// that size in one bucket (see vocab.MaxTokens).
func TestMaxTokensFitsTheScripts(t *testing.T) {
	if 8*vocab.MaxTokens > maxExact || !checkInt(vocab.MaxTokens) {
		t.Fatalf("vocab.MaxTokens = %d: 8 of them exceed the scripts' exact range %d", vocab.MaxTokens, int64(maxExact))
	}
}
