package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	pb "leasehold/proto/leasehold/v1"
)

var limitsDeleteCmd = &command{
	name:    "delete",
	args:    "ID [--expect-version V]",
	summary: "delete a limit",
	flags: func(f *flagSet) action {
		var expect int64
		f.int64Var(&expect, "expect-version", "`V`: delete only if the stored version is V")
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			req := &pb.DeleteLimitRequest{Id: id}
			if f.isSet("expect-version") {
				req.ExpectedVersion = &expect
			}
			err = e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error {
				_, err := c.DeleteLimit(ctx, req, opt)
				return err
			})
			if err != nil {
				return err
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
