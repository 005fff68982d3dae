package allocator

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
)

// calpb renders a window's calendar for a lease or an answer: unset for
// fixed windows.
func calpb(c lease.Calendar) *pb.CalendarWindows {
	if c.Loc == nil {
		return nil
	}
	return &pb.CalendarWindows{Unit: c.Unit.String(), Zone: c.Loc.String()}
}

func cloneLimit(l *pb.Limit) *pb.Limit { return proto.Clone(l).(*pb.Limit) }

func durpb(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// phasepb renders a phase offset for a lease: unset for none, so that a
// lease of an epoch-aligned window reads as it always did.
func phasepb(p time.Duration) *durationpb.Duration {
	if p == 0 {
		return nil
	}
	return durpb(p)
}
