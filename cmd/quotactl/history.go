package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "leasehold/proto/leasehold/v1"
)

// maxEventPages bounds how many pages history and audit follow.
const maxEventPages = 10000

var limitsHistoryCmd = &command{
	name:    "history",
	args:    "ID",
	summary: "list a limit's applied changes, oldest first: version, time, principal, reason, fields changed",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			id, err := oneID(args)
			if err != nil {
				return err
			}
			// With allocator groups the history of a limit that moved is
			// in every group it lived in: gather it, oldest first.
			group := ""
			page := func(ctx context.Context, c pb.AdminClient, token string, opt grpc.CallOption) ([]*pb.AuditEvent, string, error) {
				resp, err := c.LimitHistory(ctx, &pb.LimitHistoryRequest{Id: id, PageSize: 1000, PageToken: token}, opt)
				group = resp.GetGroup()
				return resp.GetEvents(), resp.GetNextPageToken(), err
			}
			evs, err := e.pageEvents(ctx, page)
			if err != nil {
				return err
			}
			if group != "" {
				err := e.otherGroups(ctx, group, func(call func(adminRPC) error) (string, error) {
					more, err := e.pageEventsVia(call, page)
					evs = append(evs, more...)
					return "", err
				})
				if err != nil {
					return err
				}
				slices.SortStableFunc(evs, func(a, b *pb.AuditEvent) int {
					return cmpInt64(tsNanos(a.GetTime()), tsNanos(b.GetTime()))
				})
			}
			if e.json {
				return writeEvents(e, evs)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tTIME\tACTION\tPRINCIPAL\tEFFECTIVE_FROM\tREASON\tCHANGES")
			for _, ev := range evs {
				v := ev.GetNewVersion()
				if isDelete(ev) {
					v = ev.GetOldVersion()
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", v, cell(formatTS(ev.GetTime()), "-"),
					cell(ev.GetAction(), "-"), cell(ev.GetPrincipal(), "-"),
					cell(formatTS(ev.GetEffectiveFrom()), "-"), cell(ev.GetReason(), "-"), eventChanges(ev))
			}
			return tw.Flush()
		}
	},
}

// isDelete reports an event that deleted its limit.
func isDelete(ev *pb.AuditEvent) bool {
	return ev.GetAction() == "delete" || (ev.GetOld() != nil && ev.GetNew() == nil && ev.GetOutcome() == pb.AuditOutcome_AUDIT_OUTCOME_APPLIED)
}

// eventChanges summarizes what an event changed: "created", "deleted" or
// "limit 1000->1500, fallback.us closed->local:100".
func eventChanges(ev *pb.AuditEvent) string {
	switch {
	case ev.GetOld() == nil && ev.GetNew() != nil:
		return "created"
	case ev.GetNew() == nil && isDelete(ev):
		return "deleted"
	case ev.GetNew() == nil:
		return "-"
	}
	ds := diffLimits(ev.GetOld(), ev.GetNew())
	if len(ds) == 0 {
		return "no setting changed"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Field + " " + showValue(d.Old) + "->" + showValue(d.New)
	}
	return oneLine(strings.Join(parts, ", "))
}

// eventPage fetches one page of events.
type eventPage func(ctx context.Context, c pb.AdminClient, token string, opt grpc.CallOption) ([]*pb.AuditEvent, string, error)

// pageEvents follows an event listing's pages to the end.
func (e *env) pageEvents(ctx context.Context, page eventPage) ([]*pb.AuditEvent, error) {
	return e.pageEventsVia(func(rpc adminRPC) error { return e.admin(ctx, rpc) }, page)
}

// pageEventsVia is pageEvents through call (an allocator of one group).
func (e *env) pageEventsVia(call func(adminRPC) error, page eventPage) ([]*pb.AuditEvent, error) {
	var all []*pb.AuditEvent
	token := ""
	for n := 0; ; n++ {
		if n == maxEventPages {
			return nil, errors.New("more than " + strconv.Itoa(maxEventPages) + " pages of events; narrow the request")
		}
		var evs []*pb.AuditEvent
		var next string
		err := call(func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
			evs, next, err = page(ctx, c, token, opt)
			return err
		})
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
		if next == "" {
			return all, nil
		}
		if next == token {
			return nil, errors.New("allocator returned the same page token twice")
		}
		token = next
	}
}

func writeEvents(e *env, evs []*pb.AuditEvent) error {
	msgs := make([]proto.Message, len(evs))
	for i, ev := range evs {
		msgs[i] = ev
	}
	return writeJSON(e.stdout, true, msgs...)
}

var auditCmd = &command{
	name:    "audit",
	args:    "[--since 24h|RFC3339] [--prefix P]",
	summary: "list recorded changes and refused attempts, oldest first",
	detail: `audit lists every change the allocator recorded and every attempt it refused
(denied, conflict, invalid), with who, when, why, the outcome and the error.
It needs the admin role when authentication is on.`,
	flags: func(f *flagSet) action {
		since := 24 * time.Hour
		var sinceTime time.Time
		var prefix string
		f.value("since", "`24h|RFC3339`: events at or after this time, as a duration back from now or a time such as 2026-11-29T19:00:00Z (default 24h)", func(s string) error {
			t, d, err := parseSince(s)
			if err != nil {
				return err
			}
			sinceTime, since = t, d
			return nil
		})
		f.stringVar(&prefix, "prefix", "`P`: only events of limits whose ids start with P, e.g. tenant/")
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			from := sinceTime
			if from.IsZero() {
				from = time.Now().Add(-since)
			}
			ts := timestamppb.New(from)
			evs, err := e.pageEvents(ctx, func(ctx context.Context, c pb.AdminClient, token string, opt grpc.CallOption) ([]*pb.AuditEvent, string, error) {
				resp, err := c.ListAudit(ctx, &pb.ListAuditRequest{Since: ts, PageSize: 1000, PageToken: token, LimitPrefix: prefix}, opt)
				return resp.GetEvents(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			if e.json {
				return writeEvents(e, evs)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tOUTCOME\tACTION\tLIMIT\tPRINCIPAL\tROLE\tVERSION\tREASON\tERROR")
			for _, ev := range evs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(formatTS(ev.GetTime()), "-"),
					outcomeName(ev.GetOutcome()), cell(ev.GetAction(), "-"), cell(ev.GetLimitId(), "-"),
					cell(ev.GetPrincipal(), "-"), cell(ev.GetRole(), "-"), eventVersions(ev),
					cell(ev.GetReason(), "-"), cell(ev.GetError(), "-"))
			}
			return tw.Flush()
		}
	},
}

// parseSince reads --since: a positive duration back from now, or a time
// (RFC 3339, or a date YYYY-MM-DD in UTC).
func parseSince(s string) (time.Time, time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, 0, errors.New("want a positive duration (24h) or a time (2026-11-29T19:00:00Z)")
		}
		return time.Time{}, d, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			if t.Year() < 1 || t.Year() > 9999 {
				break
			}
			return t, 0, nil
		}
	}
	return time.Time{}, 0, errors.New("want a duration back from now (24h, 90m) or a time (2026-11-29T19:00:00Z, 2026-11-29)")
}

func outcomeName(o pb.AuditOutcome) string {
	switch o {
	case pb.AuditOutcome_AUDIT_OUTCOME_APPLIED:
		return "applied"
	case pb.AuditOutcome_AUDIT_OUTCOME_DENIED:
		return "denied"
	case pb.AuditOutcome_AUDIT_OUTCOME_CONFLICT:
		return "conflict"
	case pb.AuditOutcome_AUDIT_OUTCOME_INVALID:
		return "invalid"
	case pb.AuditOutcome_AUDIT_OUTCOME_UNSPECIFIED:
		return "-"
	}
	return fmt.Sprintf("outcome(%d)", int32(o))
}

// eventVersions is "old->new"; 0 is "no limit" (before a create, after
// a delete), as in --expect-version 0; "-" when the event names neither.
func eventVersions(ev *pb.AuditEvent) string {
	if ev.GetOldVersion() == 0 && ev.GetNewVersion() == 0 {
		return "-"
	}
	return strconv.FormatInt(ev.GetOldVersion(), 10) + "->" + strconv.FormatInt(ev.GetNewVersion(), 10)
}

var whoamiCmd = &command{
	name:    "whoami",
	summary: "print who the allocator says you are: principal, role, scopes and how you were authenticated",
	flags: func(f *flagSet) action {
		return func(ctx context.Context, e *env, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			var resp *pb.WhoAmIResponse
			err := e.admin(ctx, func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) (err error) {
				resp, err = c.WhoAmI(ctx, &pb.WhoAmIRequest{}, opt)
				return err
			})
			if err != nil {
				return err
			}
			if e.json {
				return writeJSON(e.stdout, false, resp)
			}
			_, err = fmt.Fprintf(e.stdout, "principal: %s\nrole:      %s\nscopes:    %s\nvia:       %s\n",
				cell(resp.GetPrincipal(), "-"), cell(resp.GetRole(), "-"),
				cell(strings.Join(resp.GetScopes(), ","), "-"), cell(resp.GetVia(), "-"))
			return err
		}
	},
}
