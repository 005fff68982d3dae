package main

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	pb "leasehold/proto/leasehold/v1"
)

var limitsGetCmd = &command{
	name:    "get",
	args:    "ID",
	summary: "print one limit",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			return e.printStoredLimit(ctx, id)
		}
	},
}

// printStoredLimit reads limit (or plan) id through the Admin API and
// prints it.
func (e *env) printStoredLimit(ctx context.Context, id string) error {
	if names, g, err := e.planGroupNames(ctx, id); err != nil {
		return err
	} else if names != nil {
		// A plan with allocator groups: every group's copy.
		copies := e.planCopies(ctx, g, names, id)
		var first *pb.Limit
		var errs []error
		for _, c := range copies {
			if c.err != nil {
				errs = append(errs, fmt.Errorf("allocator group %s: %w", c.group, c.err))
			}
			if first == nil && c.limit != nil {
				first = c.limit
			}
		}
		if first == nil {
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			return fmt.Errorf("no plan %q in any allocator group", id)
		}
		e.planGroups = groupsRow(copies)
		return e.printLimit(first)
	}
	var resp *pb.GetLimitResponse
	err := e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
		resp, err = c.GetLimit(ctx, &pb.GetLimitRequest{Id: id}, opt)
		return err
	})
	if err != nil {
		return err
	}
	return e.printLimit(resp.GetLimit())
}
