package allocator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator/auth"
	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

var (
	viewer  = &auth.Principal{Name: "vera", Kind: auth.KindUser, Role: auth.RoleViewer, Via: auth.ViaToken}
	editor  = &auth.Principal{Name: "eddie", Kind: auth.KindUser, Role: auth.RoleEditor, Scopes: []string{"tenant/*"}, Via: auth.ViaToken}
	editor2 = &auth.Principal{Name: "erin", Kind: auth.KindUser, Role: auth.RoleEditor, Scopes: []string{"tenant/*"}, Via: auth.ViaCertificate}
	admin   = &auth.Principal{Name: "ada", Kind: auth.KindUser, Role: auth.RoleAdmin, Via: auth.ViaCertificate}
	agentEU = &auth.Principal{Name: "agent-eu", Kind: auth.KindAgent, Region: "eu", Via: auth.ViaCertificate}
)

func as(p *auth.Principal) context.Context {
	return auth.NewContext(context.Background(), p)
}

// simpleLimit is a strict limit spent in eu and us.
func simpleLimit(id string, g int64, w time.Duration) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Window: durationpb.New(w), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT}
}

// allAudit reads the whole audit log from etcd.
func allAudit(t *testing.T, a *Allocator) []*pb.AuditEvent {
	t.Helper()
	var out []*pb.AuditEvent
	token := ""
	for range 1000 {
		page, err := a.store.ListAudit(context.Background(), time.Time{}, "", 1000, token)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Events...)
		if page.Next == "" {
			return out
		}
		token = page.Next
	}
	t.Fatal("audit log never ended")
	return nil
}

func history(t *testing.T, a *Allocator, id string) []*pb.AuditEvent {
	t.Helper()
	page, err := a.store.LimitHistory(context.Background(), id, 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}

func wantCode(t *testing.T, err error, code codes.Code, what string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

func revision(t *testing.T, c *etcdtest.Cluster) int64 {
	t.Helper()
	resp, err := c.Client(t).Get(context.Background(), "rev-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// Two editors race on one limit with the same expected version, released
// together: exactly one wins, the other is refused (ABORTED, audited as a
// conflict), and the history shows exactly one change: the winner's.
func TestTwoEditorsRace(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator, WithAuthRequired(true))
	if _, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: simpleLimit("tenant/race", 1000, time.Minute), Reason: "contract signed"}); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		v := int64(1 + round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := map[string]error{}
		var mu sync.Mutex
		for i, p := range []*auth.Principal{editor, editor2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := simpleLimit("tenant/race", int64(2000+10*round+i), time.Minute)
				<-start
				_, err := srv.PutLimit(as(p), &pb.PutLimitRequest{Limit: l, ExpectedVersion: &v, Reason: "raise by " + p.Name})
				mu.Lock()
				errs[p.Name] = err
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		var winner, loser string
		for name, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				if winner != "" {
					t.Fatalf("round %d: both editors won", round)
				}
				winner = name
			case codes.Aborted:
				loser = name
				if !strings.Contains(status.Convert(err).Message(), "tenant/race") {
					t.Errorf("conflict does not name the limit: %v", err)
				}
			default:
				t.Fatalf("round %d: %s: %v", round, name, err)
			}
		}
		if winner == "" || loser == "" {
			t.Fatalf("round %d: want one winner and one loser, got %v", round, errs)
		}
		h := history(t, a.Allocator, "tenant/race")
		if len(h) != 2+round {
			t.Fatalf("round %d: history has %d changes, want %d", round, len(h), 2+round)
		}
		last := h[len(h)-1]
		if last.Principal != winner || last.Reason != "raise by "+winner || last.NewVersion != v+1 || last.OldVersion != v ||
			last.Outcome != pb.AuditOutcome_AUDIT_OUTCOME_APPLIED {
			t.Fatalf("round %d: last change %v, want %s's", round, last, winner)
		}
		var conflicts int
		for _, e := range allAudit(t, a.Allocator) {
			if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_CONFLICT && e.Principal == loser && e.Reason == "raise by "+loser {
				conflicts++
			}
		}
		if conflicts < 1 {
			t.Fatalf("round %d: the loser's conflict was not audited", round)
		}
	}
}

// The role x action matrix: every Admin RPC for every kind of caller, in
// and out of an editor's scope. Each refusal of an authenticated caller
// is audited exactly once (DENIED, with the principal and the error); a
// call without a principal while authentication is on is refused and
// not stored.
func TestRoleActionMatrix(t *testing.T) {
	c := etcdtest.Start(t, 1)
	// Every refusal is recorded here: the audit rate limit is tested in
	// TestRefusalAuditFlood.
	a := startAllocator(t, c, "a", WithRefusalAudit(1000, 1000, time.Second, time.Minute))
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator, WithAuthRequired(true))
	ctxOf := func(p *auth.Principal) context.Context {
		if p == nil {
			return context.Background()
		}
		return as(p)
	}
	type op struct {
		name  string
		write bool // changes a limit (or would, dry)
		read  bool // reads limits
		audit bool // reads the audit log
		call  func(ctx context.Context, id string) error
	}
	ops := []op{
		{name: "put", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: simpleLimit(id, 77, time.Minute), Reason: "r", Effective: pb.Effective_EFFECTIVE_NOW})
			return err
		}},
		{name: "put-dry", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: simpleLimit(id, 77, time.Minute), Reason: "r", DryRun: true})
			return err
		}},
		{name: "delete", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: id, Reason: "r"})
			return err
		}},
		{name: "delete-dry", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: id, Reason: "r", DryRun: true})
			return err
		}},
		{name: "apply", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "r", Changes: []*pb.LimitChange{
				{Change: &pb.LimitChange_Put{Put: simpleLimit(id, 78, time.Minute)}, ExpectedVersion: 1}}})
			return err
		}},
		{name: "apply-dry", write: true, call: func(ctx context.Context, id string) error {
			_, err := srv.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "r", DryRun: true, Changes: []*pb.LimitChange{
				{Change: &pb.LimitChange_Put{Put: simpleLimit(id, 78, time.Minute)}, ExpectedVersion: 1}}})
			return err
		}},
		{name: "get", read: true, call: func(ctx context.Context, id string) error {
			_, err := srv.GetLimit(ctx, &pb.GetLimitRequest{Id: id})
			return err
		}},
		{name: "list", read: true, call: func(ctx context.Context, id string) error {
			_, err := srv.ListLimits(ctx, &pb.ListLimitsRequest{Prefix: id})
			return err
		}},
		{name: "windows", read: true, call: func(ctx context.Context, id string) error {
			_, err := srv.ListWindows(ctx, &pb.ListWindowsRequest{LimitId: id})
			return err
		}},
		{name: "history", read: true, call: func(ctx context.Context, id string) error {
			_, err := srv.LimitHistory(ctx, &pb.LimitHistoryRequest{Id: id})
			return err
		}},
		{name: "audit", audit: true, call: func(ctx context.Context, id string) error {
			_, err := srv.ListAudit(ctx, &pb.ListAuditRequest{LimitPrefix: id})
			return err
		}},
		{name: "whoami", call: func(ctx context.Context, _ string) error {
			_, err := srv.WhoAmI(ctx, &pb.WhoAmIRequest{})
			return err
		}},
	}
	// allowed is the matrix: may p do o on a limit in (or out of) the
	// editor's scope?
	allowed := func(p *auth.Principal, o op, inScope bool) codes.Code {
		switch {
		case p == nil:
			return codes.Unauthenticated
		case o.name == "whoami":
			return codes.OK
		case p.Kind == auth.KindAgent:
			return codes.PermissionDenied
		case o.read:
			return codes.OK
		case o.audit:
			if p.Role == auth.RoleAdmin {
				return codes.OK
			}
		case o.write:
			if p.Role == auth.RoleAdmin || p.Role == auth.RoleEditor && inScope {
				return codes.OK
			}
		}
		return codes.PermissionDenied
	}
	n := 0
	for _, p := range []*auth.Principal{nil, agentEU, viewer, editor, admin} {
		name := "nil"
		if p != nil {
			name = p.Name
		}
		for _, o := range ops {
			for _, inScope := range []bool{true, false} {
				n++
				id := fmt.Sprintf("plan/%s-%s-%d", name, o.name, n)
				if inScope {
					id = fmt.Sprintf("tenant/%s-%s-%d", name, o.name, n)
				}
				// Every case starts from its own limit at version 1.
				l, err := a.PutLimit(context.Background(), simpleLimit(id, 50, time.Minute), Change{Reason: "setup"})
				if err != nil {
					t.Fatal(err)
				}
				waitLimit(t, a.Allocator, id, l.Version)
				before := allAudit(t, a.Allocator)
				err = o.call(ctxOf(p), id)
				want := allowed(p, o, inScope)
				if status.Code(err) != want {
					t.Errorf("%s %s (in scope %v): got %v, want %v", name, o.name, inScope, err, want)
					continue
				}
				after := allAudit(t, a.Allocator)
				var denied []*pb.AuditEvent
				for _, e := range after[len(before):] {
					if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_DENIED {
						denied = append(denied, e)
					}
				}
				switch want {
				case codes.PermissionDenied:
					if len(denied) != 1 {
						t.Errorf("%s %s (in scope %v): %d DENIED events, want 1", name, o.name, inScope, len(denied))
						continue
					}
					e := denied[0]
					if e.Principal != name || e.Error == "" || !strings.Contains(e.Error, "permission denied") || e.Transport != "grpc" {
						t.Errorf("%s %s: DENIED event %v lacks principal, error or transport", name, o.name, e)
					}
				default:
					if len(denied) != 0 {
						t.Errorf("%s %s (in scope %v): %d DENIED events, want none", name, o.name, inScope, len(denied))
					}
					if want == codes.Unauthenticated && len(after) != len(before) {
						t.Errorf("%s %s: an unauthenticated call was stored in the audit log", name, o.name)
					}
				}
			}
		}
	}
	// WhoAmI names the caller.
	who, err := srv.WhoAmI(as(editor), &pb.WhoAmIRequest{})
	if err != nil || who.Principal != "eddie" || who.Role != "editor" || who.Via != "token" || len(who.Scopes) != 1 {
		t.Fatalf("whoami: %v %v", who, err)
	}
	// With authentication off, a call without a principal is Anonymous.
	open := NewServer(a.Allocator)
	who, err = open.WhoAmI(context.Background(), &pb.WhoAmIRequest{})
	if err != nil || who.Principal != "anonymous" || who.Via != "none" {
		t.Fatalf("whoami with auth off: %v %v", who, err)
	}
	// The transport comes from the context.
	before := len(allAudit(t, a.Allocator))
	_, err = srv.ListAudit(WithTransport(as(viewer), "http"), &pb.ListAuditRequest{})
	wantCode(t, err, codes.PermissionDenied, "viewer audit over http")
	if evs := allAudit(t, a.Allocator)[before:]; len(evs) != 1 || evs[0].Transport != "http" || evs[0].Action != "ListAudit" {
		t.Fatalf("audit of a refusal over http: %v", evs)
	}
}

// A reason is required, dry runs included; a refusal as invalid is
// audited.
func TestReasonRequired(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	ctx := as(admin)
	_, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: simpleLimit("tenant/r", 5, time.Minute)})
	wantInvalid(t, err, "reason")
	_, err = srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: simpleLimit("tenant/r", 5, time.Minute), DryRun: true, Reason: "  "})
	wantInvalid(t, err, "reason")
	_, err = srv.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: "tenant/r"})
	wantInvalid(t, err, "reason")
	_, err = srv.ApplyLimits(ctx, &pb.ApplyLimitsRequest{DryRun: true, Changes: []*pb.LimitChange{{Change: &pb.LimitChange_Delete{Delete: "tenant/r"}}}})
	wantInvalid(t, err, "reason")
	var invalid int
	for _, e := range allAudit(t, a.Allocator) {
		if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_INVALID && e.Principal == "ada" && strings.HasPrefix(e.Error, "reason:") {
			invalid++
		}
	}
	if invalid != 4 {
		t.Fatalf("%d INVALID events, want 4", invalid)
	}
}

// ApplyLimits is all or nothing: one invalid change writes nothing and
// names its index and field; a moved version refuses the whole apply;
// a valid apply writes every change in one transaction with one change
// id, and the same file again changes nothing.
func TestApplyLimitsAllOrNothing(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	ctx := as(admin)
	if _, err := a.PutLimit(ctx, simpleLimit("tenant/a", 100, time.Minute), Change{Reason: "setup"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutLimit(ctx, simpleLimit("tenant/gone", 100, time.Minute), Change{Reason: "setup"}); err != nil {
		t.Fatal(err)
	}
	bad := simpleLimit("tenant/c", 0, time.Minute)
	plan := func(third *pb.Limit, expA int64) *pb.ApplyLimitsRequest {
		return &pb.ApplyLimitsRequest{Reason: "quarterly review", Effective: pb.Effective_EFFECTIVE_NOW, Changes: []*pb.LimitChange{
			{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/a", 200, time.Minute)}, ExpectedVersion: expA},
			{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/b", 300, time.Minute)}, ExpectedVersion: 0},
			{Change: &pb.LimitChange_Put{Put: third}, ExpectedVersion: 0},
			{Change: &pb.LimitChange_Delete{Delete: "tenant/gone"}, ExpectedVersion: 1},
		}}
	}
	rev := revision(t, c)
	_, err := srv.ApplyLimits(ctx, plan(bad, 1))
	wantInvalid(t, err, "changes[2].put.limit_tokens")
	// The refusal is audited in its own write; nothing else moved.
	if got := revision(t, c); got != rev+1 {
		t.Fatalf("an invalid apply moved etcd from revision %d to %d (want only its audit record)", rev, got)
	}
	for _, id := range []string{"tenant/b", "tenant/c"} {
		if _, err := a.store.GetLimit(ctx, id); !errorsIs(err, ErrNotFound) {
			t.Fatalf("%s written by a refused apply: %v", id, err)
		}
	}
	// Duplicates, a missing change and the size cap name the field.
	dup := plan(simpleLimit("tenant/a", 5, time.Minute), 1)
	_, err = srv.ApplyLimits(ctx, dup)
	wantInvalid(t, err, "changes[2].put")
	_, err = srv.ApplyLimits(ctx, &pb.ApplyLimitsRequest{Reason: "x", Changes: []*pb.LimitChange{{}}})
	wantInvalid(t, err, "changes[0]")
	big := &pb.ApplyLimitsRequest{Reason: "x"}
	for i := range a.maxChanges() + 1 {
		big.Changes = append(big.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: simpleLimit(fmt.Sprintf("tenant/n%d", i), 1, time.Minute)}})
	}
	_, err = srv.ApplyLimits(ctx, big)
	wantInvalid(t, err, "changes")

	// A version that moved since the plan refuses everything.
	if _, err := a.PutLimit(ctx, simpleLimit("tenant/a", 150, time.Minute), Change{Reason: "someone else"}); err != nil {
		t.Fatal(err)
	}
	rev = revision(t, c)
	_, err = srv.ApplyLimits(ctx, plan(simpleLimit("tenant/c", 400, time.Minute), 1))
	wantCode(t, err, codes.Aborted, "apply against a moved version")
	if !strings.Contains(status.Convert(err).Message(), `"tenant/a"`) {
		t.Fatalf("conflict does not name the limit: %v", err)
	}
	if got := revision(t, c); got != rev+1 {
		t.Fatalf("a refused apply moved etcd from revision %d to %d", rev, got)
	}
	var conflict *pb.AuditEvent
	for _, e := range allAudit(t, a.Allocator) {
		if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_CONFLICT {
			conflict = e
		}
	}
	if conflict == nil || conflict.LimitId != "tenant/a" || conflict.Action != "apply" {
		t.Fatalf("conflict audit: %v", conflict)
	}

	// Planned against the live versions, it applies, all in one change.
	res, err := srv.ApplyLimits(ctx, plan(simpleLimit("tenant/c", 400, time.Minute), 2))
	if err != nil {
		t.Fatal(err)
	}
	if res.ChangeId == "" || len(res.Limits) != 3 || len(res.Effects) != 4 {
		t.Fatalf("apply: %v", res)
	}
	for i, want := range []struct {
		id      string
		version int64
		action  string
	}{{"tenant/a", 3, "update"}, {"tenant/b", 1, "create"}, {"tenant/c", 1, "create"}} {
		if l := res.Limits[i]; l.Id != want.id || l.Version != want.version || res.Effects[i].Action != want.action {
			t.Fatalf("limit %d: %v %v, want %v", i, l, res.Effects[i], want)
		}
	}
	if res.Effects[3].Action != "delete" {
		t.Fatalf("delete effect: %v", res.Effects[3])
	}
	if _, err := a.store.GetLimit(ctx, "tenant/gone"); !errorsIs(err, ErrNotFound) {
		t.Fatalf("deleted limit still there: %v", err)
	}
	var applied []*pb.AuditEvent
	for _, e := range allAudit(t, a.Allocator) {
		if e.ChangeId == res.ChangeId {
			applied = append(applied, e)
		}
	}
	if len(applied) != 4 || applied[0].LimitId != "tenant/a" || applied[3].LimitId != "tenant/gone" || applied[3].Old == nil {
		t.Fatalf("audit of the apply: %v", applied)
	}
	if h := history(t, a.Allocator, "tenant/a"); len(h) != 3 || h[2].ChangeId != res.ChangeId || h[2].Reason != "quarterly review" {
		t.Fatalf("history of tenant/a: %v", h)
	}
	// The same file again (at the new versions) changes nothing.
	rev = revision(t, c)
	again := &pb.ApplyLimitsRequest{Reason: "re-apply", Changes: []*pb.LimitChange{
		{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/a", 200, time.Minute)}, ExpectedVersion: 3},
		{Change: &pb.LimitChange_Put{Put: simpleLimit("tenant/b", 300, time.Minute)}, ExpectedVersion: 1},
	}}
	res, err = srv.ApplyLimits(ctx, again)
	if err != nil || res.ChangeId != "" || res.Effects[0].Action != "unchanged" || res.Limits[0].Version != 3 {
		t.Fatalf("re-apply: %v %v", res, err)
	}
	if got := revision(t, c); got != rev {
		t.Fatalf("an unchanged apply moved etcd from %d to %d", rev, got)
	}
}

// A dry run writes nothing and reports the effect on the running window
// from the leader's state: granted, the pool after the change, regions
// that would start denying, the new bound.
func TestDryRunEffect(t *testing.T) {
	c := etcdtest.Start(t, 1)
	t0 := time.Unix(1_800_000_000, 0).Truncate(time.Minute) // a window start
	clk := newFakeClock(t0)
	a := startAllocator(t, c, "a", clk.opt())
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	ctx := as(admin)
	l := &pb.Limit{Id: "tenant/dry", LimitTokens: 1000, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_BOUNDED, Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 40}},
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(30 * time.Second)}}
	put, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: l, Reason: "new contract"})
	if err != nil {
		t.Fatal(err)
	}
	if e := put.Effect; e.Action != "create" || e.PoolAfter != 1000 || e.Bound != 40 || e.NewLimitTokens != 1000 {
		t.Fatalf("create effect: %v", e)
	}
	waitLimit(t, a.Allocator, l.Id, 1)
	// At 30 s into the window: eu and us each demand 10/s and were granted
	// 300 each (they hold 100 each), and 100 of eu's came back.
	clk.Add(30 * time.Second)
	for _, r := range []string{"eu", "us"} {
		res, err := a.AcquireLeases(context.Background(), r, []*pb.LeaseRequest{{RequestId: "q-" + r, LimitId: l.Id,
			DemandPerSecond: 10, HeldTokens: 100, WantTokens: 300}})
		if err != nil || res[0].Lease.GetTokens() != 300 {
			t.Fatalf("acquire %s: %v %v", r, res, err)
		}
		if r == "eu" {
			if _, err := a.ReturnLeases(context.Background(), "eu", []*pb.LeaseReturn{{LimitId: l.Id, LeaseId: res[0].Lease.LeaseId, Unspent: 100}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := a.ReportUsage(context.Background(), "eu", "r1", []*pb.Usage{{LimitId: l.Id,
		WindowIndex: t0.UnixNano() / int64(time.Minute), Admitted: 150, FallbackAdmitted: 5}}); err != nil {
		t.Fatal(err)
	}
	// Granted net 500, pool 500. Lowering G to 600 at once leaves 100:
	// each region needs 10/s x 30 s = 300 and would have 100 held + 50,
	// so both start denying (before, 100 + 250 covered 300).
	lower := cloneLimit(l)
	lower.LimitTokens = 600
	lower.Fallback["us"] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}
	rev := revision(t, c)
	dry, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: lower, Reason: "cut", DryRun: true, Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil {
		t.Fatal(err)
	}
	if got := revision(t, c); got != rev {
		t.Fatalf("a dry run moved etcd from revision %d to %d", rev, got)
	}
	e := dry.Effect
	if e.Action != "update" || e.Granted != 500 || e.Admitted != 155 || e.CurrentLimitTokens != 1000 || e.NewLimitTokens != 600 ||
		e.PoolAfter != 100 || strings.Join(e.RegionsDenying, ",") != "eu,us" || !e.BoundInfinite ||
		!e.WindowStart.AsTime().Equal(t0) || !e.EffectiveFrom.AsTime().Equal(clk.Now()) {
		t.Fatalf("dry-run effect now: %v", e)
	}
	var fields []string
	for _, f := range e.Changes {
		fields = append(fields, f.Field+"="+f.Old+">"+f.New)
	}
	if got := strings.Join(fields, " "); got != "limit_tokens=1000>600 fallback.us=closed>open" {
		t.Fatalf("diff: %s", got)
	}
	if dry.Limit.Version != 2 {
		t.Fatalf("dry run shows version %d, want 2", dry.Limit.Version)
	}
	// The same change for the next window leaves the running window's
	// pool alone. In the next window each region needs 600: under the old
	// G it would get 500, under the new 300, so it denies either way and
	// none starts to; a G of 1300 (650 each) makes none deny.
	dry, err = srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: lower, Reason: "cut", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := dry.Effect; e.PoolAfter != 500 || !e.EffectiveFrom.AsTime().Equal(t0.Add(time.Minute)) ||
		len(e.RegionsDenying) != 0 || dry.Limit.Previous.GetLimitTokens() != 1000 {
		t.Fatalf("dry-run effect next window: %v", e)
	}
	up := cloneLimit(l)
	up.LimitTokens = 1300
	dry, err = srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: up, Reason: "raise", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := dry.Effect; e.PoolAfter != 500 || len(e.RegionsDenying) != 0 || e.Bound != 40 || e.BoundInfinite {
		t.Fatalf("dry-run effect next window: %v", e)
	}
	// A dry delete shows the delete; nothing changes.
	del, err := srv.DeleteLimit(ctx, &pb.DeleteLimitRequest{Id: l.Id, Reason: "r", DryRun: true})
	if err != nil || del.Effect.Action != "delete" || del.Effect.Granted != 500 {
		t.Fatalf("dry delete: %v %v", del, err)
	}
	if got := revision(t, c); got != rev {
		t.Fatalf("dry runs moved etcd from revision %d to %d", rev, got)
	}
	// A real change returns the effect too.
	real, err := srv.PutLimit(ctx, &pb.PutLimitRequest{Limit: lower, Reason: "cut", Effective: pb.Effective_EFFECTIVE_NOW})
	if err != nil || real.Effect.PoolAfter != 100 || real.Limit.Version != 2 {
		t.Fatalf("real change: %v %v", real, err)
	}
}

// A follower refuses changes and dry runs with the leader's address.
func TestChangesServedByLeader(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := startAllocator(t, c, "a")
	allocatortest.WaitLeader(t, a)
	b := startAllocator(t, c, "b")
	srv := NewServer(b.Allocator)
	_, err := srv.PutLimit(as(admin), &pb.PutLimitRequest{Limit: simpleLimit("tenant/f", 5, time.Minute), Reason: "r", DryRun: true})
	wantCode(t, err, codes.Unavailable, "dry run on a follower")
	// Reads of the history are answered by any replica.
	if _, err := a.PutLimit(as(admin), simpleLimit("tenant/f", 5, time.Minute), Change{Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	h, err := srv.LimitHistory(as(viewer), &pb.LimitHistoryRequest{Id: "tenant/f"})
	if err != nil || len(h.Events) != 1 || h.Events[0].Principal != "ada" {
		t.Fatalf("history on a follower: %v %v", h, err)
	}
}

var _ = clientv3.WithPrefix
