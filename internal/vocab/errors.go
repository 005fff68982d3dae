package vocab

import (
	"errors"
	"fmt"
)

// ErrInvalid marks bad input. Every *FieldError matches it (errors.Is);
// servers map it to InvalidArgument.
var ErrInvalid = errors.New("vocab: invalid argument")

// FieldError is bad input in one field. It matches ErrInvalid. Its text is
// "field: reason", e.g. "limit.window: must be >= 1s, got 10ms".
type FieldError struct {
	Field  string // e.g. "limit.window" or "requests[3].limit_id"
	Reason string
}

func (e *FieldError) Error() string        { return e.Field + ": " + e.Reason }
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// InvalidField returns a *FieldError for field, its reason formatted as by
// fmt.Sprintf.
func InvalidField(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
