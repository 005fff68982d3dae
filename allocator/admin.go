package allocator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"leasehold/allocator/auth"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// The Admin service. Every method authorizes its caller itself
// (Principal.Allow), so every transport shares one decision; refusals of
// authenticated callers are audited here, once, whichever transport
// carried them. Limit changes (PutLimit, DeleteLimit, ApplyLimits) are
// served by the leader: they are fenced, and their effect is computed
// from the leader's state.

// principal returns the caller: the principal the transport put in ctx,
// or auth.Anonymous while authentication is off. With authentication on,
// a call without one is refused (never served as Anonymous); it is
// counted and logged, not audited (a flood of them would fill the log).
func (s *Server) principal(ctx context.Context, rpc string) (*auth.Principal, error) {
	if p := auth.FromContext(ctx); p != nil {
		return p, nil
	}
	if !s.authRequired {
		return auth.Anonymous, nil
	}
	s.a.am.unauthenticated.Inc()
	s.a.log.Warn("allocator: unauthenticated admin call refused", "rpc", rpc, "transport", transportOf(ctx))
	return nil, auth.ErrUnauthenticated
}

// allow authorizes a read; a refusal of an authenticated caller is
// audited. Callers check the sizes of what they name first: nothing
// unbounded reaches the audit log.
func (s *Server) allow(ctx context.Context, rpc string, action auth.Action, limit string) (*auth.Principal, error) {
	p, err := s.principal(ctx, rpc)
	if err != nil {
		return nil, err
	}
	if err := p.Allow(action, limit, ""); err != nil {
		s.a.recordRefusal(ctx, newEvent(ctx, p, rpc, limit, ""), pb.AuditOutcome_AUDIT_OUTCOME_DENIED, err)
		return nil, err
	}
	return p, nil
}

// overrideFor is req's override_for (0: none; an invalid duration is
// refused by validateChanges as out of range).
func overrideFor(req *pb.PutLimitRequest) time.Duration {
	d := req.GetOverrideFor()
	if d == nil {
		return 0
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
		return -1
	}
	return d.AsDuration()
}

// PutLimit implements pb.AdminServer.
func (s *Server) PutLimit(ctx context.Context, req *pb.PutLimitRequest) (*pb.PutLimitResponse, error) {
	p, err := s.principal(ctx, "PutLimit")
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.applyChanges(ctx, p, changeSet{
		action: "put", reason: req.GetReason(), effective: req.GetEffective(), dryRun: req.GetDryRun(),
		items:       []changeItem{{put: req.GetLimit(), expected: req.ExpectedVersion, field: "limit", expField: "expected_version"}},
		overrideFor: overrideFor(req),
	})
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.PutLimitResponse{Limit: res.limits[0], Effect: res.effects[0]}, nil
}

// DeleteLimit implements pb.AdminServer.
func (s *Server) DeleteLimit(ctx context.Context, req *pb.DeleteLimitRequest) (*pb.DeleteLimitResponse, error) {
	p, err := s.principal(ctx, "DeleteLimit")
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	res, err := s.a.applyChanges(ctx, p, changeSet{
		action: "delete", reason: req.GetReason(), dryRun: req.GetDryRun(),
		items: []changeItem{{del: req.GetId(), deleting: true, expected: req.ExpectedVersion, field: "id", expField: "expected_version"}},
	})
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.DeleteLimitResponse{Effect: res.effects[0]}, nil
}

// ApplyLimits implements pb.AdminServer: every change validated,
// authorized and compared with its expected version, then all written in
// one etcd transaction, or none.
func (s *Server) ApplyLimits(ctx context.Context, req *pb.ApplyLimitsRequest) (*pb.ApplyLimitsResponse, error) {
	p, err := s.principal(ctx, "ApplyLimits")
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	items := make([]changeItem, len(req.GetChanges()))
	for i, ch := range req.GetChanges() {
		exp := ch.GetExpectedVersion()
		it := changeItem{expected: &exp, expField: fmt.Sprintf("changes[%d].expected_version", i)}
		switch c := ch.GetChange().(type) {
		case *pb.LimitChange_Put:
			it.put, it.field = c.Put, fmt.Sprintf("changes[%d].put", i)
		case *pb.LimitChange_Delete:
			it.del, it.deleting, it.field = c.Delete, true, fmt.Sprintf("changes[%d].delete", i)
		default:
			it.field = fmt.Sprintf("changes[%d]", i) // neither: refused as "changes[i]: required"
		}
		items[i] = it
	}
	res, err := s.a.applyChanges(ctx, p, changeSet{action: "apply", reason: req.GetReason(),
		effective: req.GetEffective(), dryRun: req.GetDryRun(), items: items})
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &pb.ApplyLimitsResponse{Effects: res.effects, ChangeId: res.changeID}
	for i, it := range items {
		if !it.deleting {
			out.Limits = append(out.Limits, res.limits[i])
		}
	}
	return out, nil
}

// GetLimit implements pb.AdminServer. A change scheduled for the next
// window shows as the limit with effective_from and previous (the version
// in force until then).
func (s *Server) GetLimit(ctx context.Context, req *pb.GetLimitRequest) (*pb.GetLimitResponse, error) {
	if err := vocab.ValidateLimitID("id", req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if _, err := s.allow(ctx, "GetLimit", auth.ActionRead, req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := s.a.elsewhere(req.Id); err != nil {
		return nil, toStatus(ctx, err) // another group's limit: read it there
	}
	l, err := s.a.store.GetLimit(ctx, req.Id)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.GetLimitResponse{Limit: asShown(l, s.a.opt.now())}, nil
}

// pageSize checks a page_size: 0 means 100, at most 1000.
func pageSize(n int32) (int, error) {
	switch {
	case n < 0 || n > 1000:
		return 0, fieldErr("page_size", "must be 0-1000, got %d", n)
	case n == 0:
		return 100, nil
	}
	return int(n), nil
}

// ListLimits implements pb.AdminServer.
func (s *Server) ListLimits(ctx context.Context, req *pb.ListLimitsRequest) (*pb.ListLimitsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if len(req.GetPrefix()) > vocab.MaxLimitIDLen {
		return nil, toStatus(ctx, fieldErr("prefix", "longer than %d characters", vocab.MaxLimitIDLen))
	}
	if len(req.GetPageToken()) > vocab.MaxLimitIDLen {
		return nil, toStatus(ctx, fieldErr("page_token", "longer than %d characters", vocab.MaxLimitIDLen))
	}
	if _, err := s.allow(ctx, "ListLimits", auth.ActionRead, req.GetPrefix()); err != nil {
		return nil, toStatus(ctx, err)
	}
	ls, next, err := s.a.store.ListLimits(ctx, req.GetPrefix(), size, req.GetPageToken())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	now := s.a.opt.now()
	shown := ls[:0]
	for _, l := range ls {
		// With allocator groups, the limits this group is the authority
		// for: a limit that moved away keeps its record here only for
		// the windows in progress at the move.
		if s.a.ownedHere(l.Id) {
			shown = append(shown, asShown(l, now))
		}
	}
	return &pb.ListLimitsResponse{Limits: shown, NextPageToken: next, Group: s.a.opt.group}, nil
}

// maxReportWindows bounds ListWindows.last.
const maxReportWindows = 1000

// ListWindows implements pb.AdminServer.
func (s *Server) ListWindows(ctx context.Context, req *pb.ListWindowsRequest) (*pb.ListWindowsResponse, error) {
	if err := vocab.ValidateLimitID("limit_id", req.GetLimitId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if _, err := s.allow(ctx, "ListWindows", auth.ActionRead, req.GetLimitId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	last := int(req.GetLast())
	switch {
	case last < 0 || last > maxReportWindows:
		return nil, toStatus(ctx, fieldErr("last", "must be 0-%d, got %d", maxReportWindows, last))
	case last == 0:
		last = 10
	}
	if ss, err := s.a.SlotStatus(req.LimitId); err == nil {
		// A concurrency limit: its slot shares in force, no windows.
		out := &pb.ListWindowsResponse{Group: s.a.opt.group, Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitSlots: ss.N,
			Plan: s.a.planOf(req.LimitId), Overridden: s.a.overriddenNow(req.LimitId)}
		for _, sh := range ss.Shares {
			out.Shares = append(out.Shares, sh.ToProto())
		}
		return out, nil
	} else if !errors.Is(err, ErrNotFound) {
		return nil, toStatus(ctx, err)
	}
	if bs, err := s.a.BucketStatus(req.LimitId, last); err == nil {
		// A bucket limit: reporting intervals and shares, no windows.
		out := &pb.ListWindowsResponse{Group: s.a.opt.group, Kind: pb.LimitKind_LIMIT_KIND_BUCKET, Plan: s.a.planOf(req.LimitId),
			Overridden: s.a.overriddenNow(req.LimitId)}
		for _, r := range bs.Intervals {
			out.Intervals = append(out.Intervals, r.ToProto())
		}
		for _, sh := range bs.Shares {
			out.Shares = append(out.Shares, sh.ToProto())
		}
		return out, nil
	} else if !errors.Is(err, ErrNotFound) {
		return nil, toStatus(ctx, err)
	}
	reps, err := s.a.Reports(req.LimitId, last)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &pb.ListWindowsResponse{Windows: make([]*pb.WindowReport, len(reps)), Group: s.a.opt.group, Kind: pb.LimitKind_LIMIT_KIND_WINDOW,
		Overridden: s.a.overriddenNow(req.LimitId)}
	for i, r := range reps {
		out.Windows[i] = r.ToProto()
	}
	return out, nil
}

// LimitHistory implements pb.AdminServer: any replica answers from etcd.
func (s *Server) LimitHistory(ctx context.Context, req *pb.LimitHistoryRequest) (*pb.LimitHistoryResponse, error) {
	if err := vocab.ValidateLimitID("id", req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	if _, err := s.allow(ctx, "LimitHistory", auth.ActionRead, req.GetId()); err != nil {
		return nil, toStatus(ctx, err)
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	page, err := s.a.store.LimitHistory(ctx, req.Id, size, req.GetPageToken())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.LimitHistoryResponse{Events: page.Events, NextPageToken: page.Next, Group: s.a.opt.group}, nil
}

// ListAudit implements pb.AdminServer (admins only): any replica answers
// from etcd.
func (s *Server) ListAudit(ctx context.Context, req *pb.ListAuditRequest) (*pb.ListAuditResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if len(req.GetLimitPrefix()) > vocab.MaxLimitIDLen {
		return nil, toStatus(ctx, fieldErr("limit_prefix", "longer than %d characters", vocab.MaxLimitIDLen))
	}
	if _, err := s.allow(ctx, "ListAudit", auth.ActionAudit, req.GetLimitPrefix()); err != nil {
		return nil, toStatus(ctx, err)
	}
	var since time.Time
	if req.Since != nil {
		if err := req.Since.CheckValid(); err != nil {
			return nil, toStatus(ctx, fieldErr("since", "%v", err))
		}
		since = req.Since.AsTime()
	}
	page, err := s.a.store.ListAudit(ctx, since, req.GetLimitPrefix(), size, req.GetPageToken())
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.ListAuditResponse{Events: page.Events, NextPageToken: page.Next}, nil
}

// WhoAmI implements pb.AdminServer: it names any authenticated caller.
func (s *Server) WhoAmI(ctx context.Context, _ *pb.WhoAmIRequest) (*pb.WhoAmIResponse, error) {
	p, err := s.principal(ctx, "WhoAmI")
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.WhoAmIResponse{Principal: p.Name, Role: p.Role.String(), Scopes: p.Scopes, Via: string(p.Via), Region: p.Region}, nil
}
