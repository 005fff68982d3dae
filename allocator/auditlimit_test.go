package allocator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/allocatortest"
	"leasehold/internal/etcdtest"
	pb "leasehold/proto/leasehold/v1"
)

// TestRefusalLimiterStepTable drives one limiter (1 record/s, burst 2,
// summaries after 2 s quiet or every 10 s, 2 principals tracked) at fixed
// instants.
func TestRefusalLimiterStepTable(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	denied, invalid := pb.AuditOutcome_AUDIT_OUTCOME_DENIED, pb.AuditOutcome_AUDIT_OUTCOME_INVALID
	l := newRefusalLimiter(refusalAudit{rate: 1, burst: 2, quiet: 2 * time.Second, every: 10 * time.Second, max: 2})
	type step struct {
		at        time.Duration
		principal string
		outcome   pb.AuditOutcome
		want      bool
	}
	for i, s := range []step{
		{0, "vera", denied, true},
		{0, "vera", denied, true},
		{0, "vera", denied, false},                       // burst spent
		{500 * time.Millisecond, "vera", invalid, false}, // half a token
		{time.Second, "vera", denied, true},              // one token back
		{time.Second, "vera", denied, false},
		{time.Second, "bob", denied, true}, // each principal has its own bucket
	} {
		if got := l.allow(at(s.at), s.principal, "viewer", s.outcome); got != s.want {
			t.Fatalf("step %d (%v %s): allow = %v, want %v", i, s.at, s.principal, got, s.want)
		}
	}
	if got := l.due(at(2*time.Second), false); len(got) != 0 {
		t.Fatalf("summaries 1 s after the last drop: %v, want none (quiet is 2 s)", got)
	}
	got := l.due(at(3*time.Second), false)
	if len(got) != 1 || got[0].principal != "vera" || got[0].dropped[denied] != 2 || got[0].dropped[invalid] != 1 ||
		!got[0].from.Equal(at(0)) || !got[0].to.Equal(at(time.Second)) {
		t.Fatalf("summary after 2 s quiet: %+v, want vera: 2 denied, 1 invalid, from +0 to +1s", got)
	}
	if again := l.due(at(4*time.Second), true); len(again) != 0 {
		t.Fatalf("a summary was handed out twice: %+v", again)
	}
	events := l.summaryEvents(got[0])
	if len(events) != 2 || events[0].Outcome != denied || events[1].Outcome != invalid ||
		events[0].Action != auditDroppedAction || events[0].Principal != "vera" || events[0].Role != "viewer" ||
		!strings.HasPrefix(events[0].Reason, "2 denied attempts of vera") || !strings.HasPrefix(events[1].Reason, "1 invalid attempts") {
		t.Fatalf("summary events %v", events)
	}

	// A flood that does not stop is summarized every interval.
	for s := 4 * time.Second; s <= 15*time.Second; s += 100 * time.Millisecond {
		l.allow(at(s), "vera", "viewer", denied)
	}
	if got := l.due(at(15*time.Second), false); len(got) != 1 || got[0].dropped[denied] == 0 {
		t.Fatalf("a flood lasting 11 s: summaries %+v, want one", got)
	}

	// More principals than tracked (2): a new one takes the place of an
	// idle principal whose bucket is full again and has nothing to
	// summarize (bob), else it shares the overflow bucket.
	if !l.allow(at(15*time.Second), "eve", "viewer", denied) {
		t.Fatal("eve's new bucket starts full")
	}
	if _, ok := l.buckets["bob"]; ok {
		t.Fatal("bob's idle, full bucket was not forgotten for eve")
	}
	if !l.allow(at(15*time.Second), "mallory", "viewer", denied) {
		t.Fatal("the overflow bucket starts full")
	}
	if _, ok := l.buckets["mallory"]; ok || l.buckets[overflowPrincipal] == nil {
		t.Fatalf("mallory tracked beyond the cap while vera and eve are busy: %v", l.buckets)
	}
	l.allow(at(15*time.Second), "trent", "viewer", denied)
	if l.allow(at(15*time.Second), "mallory", "viewer", denied) {
		t.Fatal("the overflow bucket's burst of 2 was spent by mallory and trent")
	}
	if got := l.due(at(20*time.Second), false); len(got) != 1 || got[0].principal != overflowPrincipal || got[0].dropped[denied] != 1 {
		t.Fatalf("summaries %+v, want the overflow bucket's: 1 denied", got)
	}
}

// TestRefusalAuditFlood: a viewer floods PutLimit with refused calls, half
// with 1 MB reasons (invalid: over the 1000-byte cap) and half that it may
// not make (denied). Every call is answered with a clear error; the audit
// log gets the burst of records (the clock stands still) with every
// string capped, the rest is counted in leasehold_admin_audit_dropped_total
// and in one summary record per outcome once the flood is quiet, and
// etcd's size stays bounded (uncut, the flood would add 150 MB).
func TestRefusalAuditFlood(t *testing.T) {
	c := etcdtest.Start(t, 1)
	var mu sync.Mutex // protects now
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	reg := prometheus.NewRegistry()
	const burst = 10
	a := startAllocatorReg(t, c, "a", reg, WithClock(clock), WithRefusalAudit(2, burst, 2*time.Second, time.Minute))
	allocatortest.WaitLeader(t, a)
	srv := NewServer(a.Allocator)
	cli := c.Client(t)
	ctx := context.Background()
	dbSize := func() int64 {
		st, err := cli.Status(ctx, c.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return st.DbSize
	}
	before := dbSize()

	const n = 300
	huge := strings.Repeat("r", 1<<20)
	for i := range n {
		reason := "let me in"
		if i%2 == 0 {
			reason = huge
		}
		_, err := srv.PutLimit(WithTransport(as(viewer), "http"), &pb.PutLimitRequest{Reason: reason, Limit: validLimit()})
		if i%2 == 0 {
			wantInvalid(t, err, "reason")
		} else if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("call %d: %v, want PermissionDenied", i, err)
		}
		if len(status.Convert(err).Message()) > 200 {
			t.Fatalf("call %d: the error quotes the input: %d bytes", i, len(status.Convert(err).Message()))
		}
	}
	recorded := allAudit(t, a.Allocator)
	if len(recorded) != burst {
		t.Fatalf("%d refusals recorded at one instant, want the burst %d", len(recorded), burst)
	}
	for _, e := range recorded {
		if size := proto.Size(e); size > 4<<10 {
			t.Errorf("audit event of %d bytes (reason %d bytes): not capped", size, len(e.Reason))
		}
	}
	dropped := testutil.ToFloat64(a.am.auditDropped.WithLabelValues("invalid")) + testutil.ToFloat64(a.am.auditDropped.WithLabelValues("denied"))
	if dropped != n-burst {
		t.Fatalf("leasehold_admin_audit_dropped_total = %v, want %d", dropped, n-burst)
	}

	// Quiet for 2 s: the summary is written (by the allocator's loop or
	// here, whichever takes it first), one event per outcome.
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	a.summarizeRefusals(ctx, clock(), false)
	var summary []*pb.AuditEvent
	for deadline := time.Now().Add(10 * time.Second); ; {
		summary = summary[:0]
		for _, e := range allAudit(t, a.Allocator) {
			if e.Action == auditDroppedAction {
				summary = append(summary, e)
			}
		}
		if len(summary) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a count written by the allocator's loop
	}
	if len(summary) != 2 {
		t.Fatalf("summary events %v, want 2 (denied, invalid)", summary)
	}
	total := 0
	for _, e := range summary {
		var k int
		if _, err := fmt.Sscan(e.Reason, &k); err != nil || e.Principal != viewer.Name {
			t.Fatalf("summary %v: %v", e, err)
		}
		total += k
	}
	if total != n-burst {
		t.Fatalf("summaries count %d dropped, want %d", total, n-burst)
	}
	// The bucket refilled: the next refusal is recorded again.
	_, err := srv.PutLimit(as(viewer), &pb.PutLimitRequest{Reason: "again", Limit: validLimit()})
	wantCode(t, err, codes.PermissionDenied, "viewer put after the flood")
	if got := len(allAudit(t, a.Allocator)); got != burst+2+1 {
		t.Fatalf("%d audit events after the flood, want %d", got, burst+2+1)
	}

	resp, err := cli.Get(ctx, a.store.auditPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var bytes int
	for _, kv := range resp.Kvs {
		bytes += len(kv.Value)
	}
	after := dbSize()
	t.Logf("%d refused calls (%d with 1 MB reasons): %d audit records, %d bytes; etcd db %d -> %d bytes", n, n/2, len(resp.Kvs), bytes, before, after)
	if bytes > 64<<10 {
		t.Errorf("the audit log holds %d bytes after the flood, want < 64 KiB", bytes)
	}
	if after-before > 2<<20 {
		t.Errorf("etcd grew by %d bytes during the flood, want < 2 MiB", after-before)
	}
}
