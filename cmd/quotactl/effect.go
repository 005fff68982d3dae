package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"leasehold/internal/planbind"
	pb "leasehold/proto/leasehold/v1"
)

// maxReason bounds --reason; the allocator records it with every change.
const maxReason = 1000

// changeFlags are the flags of every command that changes limits.
type changeFlags struct {
	reason    string
	effective pb.Effective
	dryRun    bool
}

// registerChangeFlags declares --reason and --dry-run on f, and
// --effective when withEffective (a deletion has no effective time).
func registerChangeFlags(f *flagSet, withEffective bool) *changeFlags {
	c := &changeFlags{}
	f.value("reason", "`TEXT`: why, recorded in the limit's history and the audit log (required)", func(s string) error {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
			return errors.New("want a non-empty reason")
		case len(s) > maxReason:
			return fmt.Errorf("want at most %d bytes", maxReason)
		}
		c.reason = s
		return nil
	})
	if withEffective {
		f.value("effective", "`now|next-window`: when a change to an existing limit governs (default next-window; creating is always immediate)", func(s string) error {
			switch s {
			case "now":
				c.effective = pb.Effective_EFFECTIVE_NOW
			case "next-window":
				c.effective = pb.Effective_EFFECTIVE_NEXT_WINDOW
			default:
				return errors.New("want now or next-window")
			}
			return nil
		})
	}
	f.boolVar(&c.dryRun, "dry-run", "show what would change and its effect on the current window; write nothing")
	return c
}

// printDryRun prints a dry run's answer: resp as JSON, or the effect for
// people.
func (e *env) printDryRun(resp proto.Message, eff *pb.ChangeEffect) error {
	if e.json {
		return writeJSON(e.stdout, false, resp)
	}
	var b strings.Builder
	b.WriteString("dry run: nothing was written\n")
	writeEffect(&b, eff)
	_, err := io.WriteString(e.stdout, b.String())
	return err
}

// writeEffect writes one change's effect as "key: value" lines: what
// changes, from when, and what it does to the current window.
func writeEffect(w io.Writer, eff *pb.ChangeEffect) {
	kv := func(k, v string) { fmt.Fprintf(w, "%-15s %s\n", k+":", v) }
	kv("limit", cell(eff.GetLimitId(), "-"))
	kv("action", cell(eff.GetAction(), "-"))
	if len(eff.GetChanges()) == 0 {
		kv("changes", "none")
	} else {
		io.WriteString(w, "changes:\n")
		ds := make([]fieldDiff, len(eff.GetChanges()))
		for i, c := range eff.GetChanges() {
			ds[i] = fieldDiff{c.GetField(), c.GetOld(), c.GetNew()}
		}
		writeFieldDiffs(w, "  ", false, ds)
	}
	if eff.GetAction() == "delete" {
		kv("effective-from", "now (a deleted limit grants nothing more)")
	} else {
		kv("effective-from", cell(formatTS(eff.GetEffectiveFrom()), "-"))
	}
	bucket := eff.GetKind() == pb.LimitKind_LIMIT_KIND_BUCKET
	if bucket && !planbind.IsPlan(eff.GetLimitId()) {
		// No window, pool or window bound: the changes govern at once.
		kv("kind", "bucket (no windows: quotactl windows shows its intervals and shares)")
		return
	}
	if planbind.IsPlan(eff.GetLimitId()) {
		// A plan has no windows of its own: its tenants do.
		over := "admitted more in their last window than the new G"
		conc := eff.GetKind() == pb.LimitKind_LIMIT_KIND_CONCURRENCY
		switch {
		case bucket:
			// A bucket plan's tenants have reporting intervals and shares.
			kv("kind", "bucket (each tenant's changes govern at once, from its next share)")
			over = "admitted more in their last minute than the new burst + rate x 1 min"
		case conc:
			kv("kind", "concurrency (each tenant's changes govern at once, from its next share)")
			if eff.GetAction() != "delete" {
				kv("new-n", strconv.FormatInt(eff.GetNewLimitTokens(), 10))
			}
			over = "hold more slots now than the new N"
		case eff.GetAction() != "delete":
			kv("new-g", strconv.FormatInt(eff.GetNewLimitTokens(), 10))
		}
		if eff.GetAction() == "delete" {
			over = "every tenant on the plan: it has no limit left"
		}
		used := " (used the plan in the windows the allocator keeps)"
		if bucket || conc {
			used = " (used the plan in the shares the allocator keeps)"
		}
		kv("tenants", strconv.FormatInt(eff.GetPlanTenants(), 10)+used)
		denying := "none"
		if n := eff.GetPlanTenantsDenyingCount(); n > 0 {
			denying = strconv.FormatInt(n, 10) + ": " + oneLine(strings.Join(eff.GetPlanTenantsDenying(), ","))
			if int64(len(eff.GetPlanTenantsDenying())) < n {
				denying += ", ..."
			}
		}
		kv("denying", denying+" ("+over+")")
		return
	}
	if eff.GetWindowStart() == nil {
		kv("window", "none yet (a new limit)")
	} else {
		kv("window", fmt.Sprintf("%s (running), G %d", formatTS(eff.GetWindowStart()), eff.GetCurrentLimitTokens()))
		kv("granted", strconv.FormatInt(eff.GetGranted(), 10))
		kv("admitted", strconv.FormatInt(eff.GetAdmitted(), 10))
	}
	if eff.GetAction() != "delete" {
		kv("new-g", strconv.FormatInt(eff.GetNewLimitTokens(), 10))
	}
	if eff.GetWindowStart() != nil {
		kv("pool-after", strconv.FormatInt(eff.GetPoolAfter(), 10))
		denying := "none"
		if len(eff.GetRegionsDenying()) > 0 {
			denying = oneLine(strings.Join(eff.GetRegionsDenying(), ","))
		}
		kv("denying", denying)
	}
	if eff.GetAction() != "delete" {
		bound := strconv.FormatInt(eff.GetBound(), 10)
		if eff.GetBoundInfinite() {
			bound = "+Inf"
		}
		kv("bound", bound)
	}
}
