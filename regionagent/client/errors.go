package client

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Errors from a call wrap one of these and the gRPC status
// (status.FromError and status.Code still see it).
var (
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("client: closed")
	// ErrInvalid: bad input (an empty limit, a negative cost, a cost above
	// the limit's G).
	ErrInvalid = errors.New("client: invalid argument")
	// ErrUnknownLimit: the limit does not exist or is not spent in the
	// agent's region.
	ErrUnknownLimit = errors.New("client: unknown limit")
	// ErrUnavailable: the agent could not be asked, or did not answer in
	// time. For a Check it is not known whether the request was charged;
	// it is never sent again.
	ErrUnavailable = errors.New("client: agent unavailable")
)

// wrapRPC names the failed call and maps its gRPC code to a sentinel.
func wrapRPC(op, limit string, err error) error {
	var sentinel error
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		sentinel = ErrInvalid
	case codes.NotFound:
		sentinel = ErrUnknownLimit
	default:
		sentinel = ErrUnavailable
	}
	return fmt.Errorf("%w: %s %q: %w", sentinel, op, limit, err)
}
