package allocator

import (
	"context"

	"leasehold/overshoot"
	pb "leasehold/proto/leasehold/v1"
)

// WindowReport is one (limit, window) as SREs see it: the overshoot
// package's report plus whether the window is over and each region's
// fail mode in it.
type WindowReport struct {
	overshoot.Report
	// Closed is false for the window still running (its counts grow).
	Closed bool `json:"closed"`
	// Fallback is, per region, the most permissive fail mode in force in
	// the window (absent: none).
	Fallback map[string]pb.FallbackKind `json:"fallback,omitempty"`
}

// Limits returns every limit (any replica; read from etcd).
func (a *Allocator) Limits(ctx context.Context) ([]*pb.Limit, error) {
	return a.store.AllLimits(ctx)
}

// Reports returns the last windows of a limit, oldest first, the running
// window included. It is served by the leader (ErrNotLeader elsewhere);
// ErrNotFound for an unknown limit.
func (a *Allocator) Reports(limit string, last int) ([]WindowReport, error) {
	return nil, ErrNotFound // implemented in the next commit
}
