package main

import (
	"context"
	"errors"
	"strconv"
)

// maxListPages bounds how many pages limits list follows (10 million
// limits at the default page size), so a misbehaving allocator cannot keep
// it looping.
const maxListPages = 10000

var limitsListCmd = &command{
	name:    "list",
	args:    "[--prefix P] [--page-size N]",
	summary: "list limits in id order, following pages to the end",
	flags: func(f *flagSet) action {
		var prefix string
		pageSize := int32(1000)
		f.stringVar(&prefix, "prefix", "`P`: only ids that start with P, e.g. tenant/")
		f.value("page-size", "`N`: limits fetched per request, 1-1000 (default 1000)", func(s string) error {
			n, err := strconv.ParseInt(s, 10, 32)
			if err != nil || n < 1 || n > 1000 {
				return errors.New("want a whole number from 1 to 1000")
			}
			pageSize = int32(n)
			return nil
		})
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			all, err := e.listLimits(ctx, prefix, pageSize)
			if err != nil {
				return err
			}
			return e.printLimits(all)
		}
	},
}
