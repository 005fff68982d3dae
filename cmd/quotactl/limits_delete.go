package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "leasehold/proto/leasehold/v1"
)

var limitsDeleteCmd = &command{
	name:    "delete",
	args:    "ID --reason TEXT [--expect-version V] [--dry-run]",
	summary: "delete a limit",
	detail: `--reason is required and recorded in the limit's history. --dry-run prints
what the deletion would do and deletes nothing.`,
	flags: func(f *flagSet) action {
		var expect int64
		f.int64Var(&expect, "expect-version", "`V`: delete only if the stored version is V")
		ch := registerChangeFlags(f, false)
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			req := &pb.DeleteLimitRequest{Id: id, Reason: ch.reason, DryRun: ch.dryRun}
			if f.isSet("expect-version") {
				req.ExpectedVersion = &expect
			}
			var resp *pb.DeleteLimitResponse
			names, g, err := e.planGroupNames(ctx, id)
			if err != nil {
				return err
			}
			if names != nil {
				// A plan with allocator groups: deleted in every group.
				if req.ExpectedVersion != nil {
					return usagef("--expect-version: a plan's version is per allocator group; delete it without")
				}
				var eff *pb.ChangeEffect
				_, eff, _, err = e.planEverywhere(ctx, g, names, id, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (*pb.Limit, *pb.ChangeEffect, error) {
					r, err := c.DeleteLimit(ctx, req, opt)
					if status.Code(err) == codes.NotFound {
						return nil, nil, nil // not in this group (any more): deleting it again is done
					}
					return nil, r.GetEffect(), err
				})
				resp = &pb.DeleteLimitResponse{Effect: eff}
			} else {
				err = e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
					resp, err = c.DeleteLimit(ctx, req, opt)
					return err
				})
			}
			if err != nil {
				return err
			}
			if ch.dryRun {
				return e.printDryRun(resp, resp.GetEffect())
			}
			if e.json {
				_, err = fmt.Fprintf(e.stdout, "{\n  \"id\": %s,\n  \"deleted\": true\n}\n", jsonString(id))
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "deleted %s\n", oneLine(id))
			return err
		}
	},
}
