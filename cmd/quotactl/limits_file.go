package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// maxPlanFile bounds what apply --plan reads.
const maxPlanFile = 64 << 20

// readLimitsFile reads and validates a limits file; any problem is a usage
// error naming the file and line (exit 2), found before any request.
func readLimitsFile(path string) (*limitsFile, []byte, error) {
	data, err := readSmall(path, maxLimitsFile)
	if err != nil {
		return nil, nil, usagef("-f %q: %v", path, err)
	}
	lf, err := decodeLimitsFile(path, data)
	if err != nil {
		return nil, nil, &usageError{msg: err.Error()}
	}
	return lf, data, nil
}

var limitsPlanCmd = &command{
	name:    "plan",
	args:    "-f FILE [-o PLAN]",
	summary: "print what applying a limits file would change; write nothing",
	detail: `plan diffs the limits in FILE against the live ones: creates, updates with
their field changes, and deletes of live limits that the file's scope
("manage:") covers but the file leaves out. Without "manage:" nothing is
deleted. With -o it writes the plan, pinned to the live versions it saw,
for "limits apply --plan PLAN". The file is validated before any request.`,
	flags: func(f *flagSet) action {
		var file, out string
		f.stringVar(&file, "f", "`FILE`: the limits file (YAML) (required)")
		f.stringVar(&out, "o", "`PLAN`: write the plan here (JSON), for limits apply --plan")
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if err := f.require("f"); err != nil {
				return err
			}
			p, err := e.planFile(ctx, file)
			if err != nil {
				return err
			}
			b, err := p.marshal()
			if err != nil {
				return err
			}
			if out != "" {
				if err := writeFileAtomic(out, b); err != nil {
					return fmt.Errorf("-o %q: %v", out, err)
				}
			}
			if e.json {
				_, err := e.stdout.Write(b)
				return err
			}
			if err := printPlan(e.stdout, p); err != nil {
				return err
			}
			if n := len(p.Changes); n > limitspec.MaxApplyChanges {
				fmt.Fprintf(e.stdout, "Note: %d changes; one apply takes at most %d: split the file (one manage prefix per file).\n", n, limitspec.MaxApplyChanges)
			}
			if c, u, d := p.counts(); out != "" && c+u+d > 0 {
				_, err = fmt.Fprintf(e.stdout, "Plan written to %s. Apply it with:\n  quotactl limits apply --plan %s --reason \"...\"\n", oneLine(out), oneLine(out))
			}
			return err
		}
	},
}

// planFile plans the limits file against the live limits in its scope.
func (e *env) planFile(ctx context.Context, file string) (*plan, error) {
	lf, data, err := readLimitsFile(file)
	if err != nil {
		return nil, err
	}
	live, err := e.listScope(ctx, lf.manage)
	if err != nil {
		return nil, err
	}
	p := makePlan(lf, live)
	p.Allocator, p.Created = e.addr, time.Now().UTC().Truncate(time.Millisecond)
	p.Source, p.SourceSHA256 = file, sha256Hex(data)
	return p, nil
}

// writeFileAtomic writes b to path through a temporary file in the same
// directory, so a reader never sees half a plan.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".quotactl-plan-*")
	if err != nil {
		return unwrapPath(err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return unwrapPath(err)
	}
	if err := tmp.Close(); err != nil {
		return unwrapPath(err)
	}
	return unwrapPath(os.Rename(tmp.Name(), path))
}

var limitsApplyCmd = &command{
	name:    "apply",
	args:    "(-f FILE | --plan PLAN [-f FILE]) --reason TEXT [--effective now|next-window] [--dry-run]",
	summary: "apply a limits file or a plan made by limits plan -o, all or nothing",
	detail: `apply applies the changes of a plan in one ApplyLimits request, each with the
version the plan saw: all or nothing.

With --plan PLAN (the reviewed plan written by "limits plan -o") it first
re-reads the live limits in the plan's scope and refuses, writing nothing,
if any of them moved since the plan (changed, created or deleted); the
allocator refuses too if a change's version moved in between. With -f as
well it checks that FILE is still the file planned.

With -f FILE alone it plans now, prints the plan, and applies it pinned to
the versions it just read: if anything moves between that read and the
write, nothing is applied. Plan again after a refusal.`,
	flags: func(f *flagSet) action {
		var planPath, file string
		f.stringVar(&planPath, "plan", "`PLAN`: the plan written by limits plan -o")
		f.stringVar(&file, "f", "`FILE`: the limits file (alone: plan and apply in one step; with --plan: refused if it changed since the plan)")
		ch := registerChangeFlags(f, true)
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if err := f.require("reason"); err != nil {
				return err
			}
			var p *plan
			switch {
			case f.isSet("plan"):
				data, err := readSmall(planPath, maxPlanFile)
				if err != nil {
					return usagef("--plan %q: %v", planPath, err)
				}
				if p, err = unmarshalPlan(data); err != nil {
					return usagef("--plan %q: %v", planPath, err)
				}
				if file != "" {
					_, src, err := readLimitsFile(file)
					if err != nil {
						return err
					}
					if sha256Hex(src) != p.SourceSHA256 {
						return fmt.Errorf("%s changed since the plan (planned %s); nothing was applied: plan again", file, cell(p.Source, "-"))
					}
				}
			case f.isSet("f"):
				// One step: plan now, print it, apply it pinned to the
				// versions just read.
				var err error
				if p, err = e.planFile(ctx, file); err != nil {
					return err
				}
				if !e.json {
					if err := printPlan(e.stdout, p); err != nil {
						return err
					}
				}
			default:
				return usagef("-f FILE or --plan PLAN is required")
			}
			if len(p.Changes) == 0 {
				if e.json {
					return writeJSON(e.stdout, false, &pb.ApplyLimitsResponse{})
				}
				_, err := fmt.Fprintln(e.stdout, "No changes to apply.")
				return err
			}
			if len(p.Changes) > limitspec.MaxApplyChanges {
				return fmt.Errorf("the plan has %d changes; one apply takes at most %d: split the file (one manage prefix per file)", len(p.Changes), limitspec.MaxApplyChanges)
			}
			live, err := e.listScope(ctx, p.Manage)
			if err != nil {
				return err
			}
			if m := p.moved(live); m != "" {
				return fmt.Errorf("the live limits moved since the plan: %s; nothing was applied: plan again", m)
			}
			req := p.request(ch.reason, ch.effective, ch.dryRun)
			resp, code, err := e.applyByGroup(ctx, req)
			if err != nil {
				if code == codes.Aborted {
					return fmt.Errorf("nothing was applied: %v (the live limits moved since the plan: plan again)", err)
				}
				return fmt.Errorf("nothing was applied: %w", err)
			}
			if e.json {
				return writeJSON(e.stdout, false, resp)
			}
			return printApplied(e, p, resp, ch.dryRun)
		}
	},
}

// printApplied reports an ApplyLimits answer: one line per change, or on
// a dry run each change's effect.
func printApplied(e *env, p *plan, resp *pb.ApplyLimitsResponse, dryRun bool) error {
	var b strings.Builder
	if dryRun {
		b.WriteString("dry run: nothing was written\n")
		for _, eff := range resp.GetEffects() {
			b.WriteString("\n")
			writeEffect(&b, eff)
		}
		_, err := e.stdout.Write([]byte(b.String()))
		return err
	}
	stored := map[string]*pb.Limit{}
	for _, l := range resp.GetLimits() {
		stored[l.GetId()] = l
	}
	for _, ch := range p.Changes {
		switch ch.Action {
		case actDelete:
			fmt.Fprintf(&b, "deleted %s\n", oneLine(ch.ID))
		default:
			l := stored[ch.ID]
			fmt.Fprintf(&b, "%sd %s: version %d", ch.Action, oneLine(ch.ID), l.GetVersion())
			if ts := formatTS(l.GetEffectiveFrom()); ts != "" {
				fmt.Fprintf(&b, ", effective from %s", ts)
			}
			b.WriteString("\n")
		}
	}
	c, u, d := p.counts()
	fmt.Fprintf(&b, "Applied: %d created, %d updated, %d deleted", c, u, d)
	if resp.GetChangeId() != "" {
		fmt.Fprintf(&b, " (change %s)", oneLine(resp.GetChangeId()))
	}
	b.WriteString(".\n")
	_, err := e.stdout.Write([]byte(b.String()))
	return err
}

var limitsExportCmd = &command{
	name:    "export",
	args:    "[--prefix P]",
	summary: "write the live limits as a limits file (YAML) on stdout",
	detail: `export writes the live limits (those under --prefix, or all) as a limits
file whose scope ("manage:") is the prefix, or "*" for all: planning it
against the same live limits shows no changes. A limit with an override in
force (limits override) is written as the version the override returns to.`,
	flags: func(f *flagSet) action {
		var prefix string
		f.stringVar(&prefix, "prefix", "`P`: only ids that start with P, e.g. tenant/; the file manages P")
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if strings.Contains(prefix, "*") {
				return usagef("--prefix %q: a prefix is plain text, without '*'", prefix)
			}
			ls, err := e.listLimits(ctx, prefix, 1000)
			if err != nil {
				return err
			}
			if e.json {
				msgs := make([]proto.Message, len(ls))
				for i, l := range ls {
					msgs[i] = l
				}
				return writeJSON(e.stdout, true, msgs...)
			}
			manage := []string{manageAll}
			if prefix != "" {
				manage = []string{prefix}
			}
			for i, l := range ls {
				if a := l.GetOverride().GetAfter(); a != nil {
					// An override in force ends by itself: the file holds
					// the version it returns to (planning the file shows
					// the override as a change).
					b := proto.Clone(a).(*pb.Limit)
					b.Id, b.Version, b.EffectiveFrom, b.Previous, b.Override = l.GetId(), 0, nil, nil, nil
					ls[i], l = b, b
				}
				if _, err := normalizeLimit(l); err != nil {
					return errors.New("live limit " + l.GetId() + " does not fit a limits file: " + err.Error())
				}
			}
			return encodeLimitsFile(e.stdout, manage, ls)
		}
	},
}
