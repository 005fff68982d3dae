package main

import (
	"context"

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
