package regionagent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
	"leasehold/regionagent/httplimit"
)

// putConcLimit creates a concurrency limit of n slots through the Admin
// API (validated like quotactl's) and waits for the leader to apply it.
func (w *world) putConcLimit(id string, n int64, ttl time.Duration, regions ...string) {
	w.t.Helper()
	w.putLimit(&pb.Limit{Id: id, Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: n, Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl)}})
}

// slotsSettled waits for a's slot share request of limit in flight, if
// any (renewals run in the background).
func (a *Agent) slotsSettled(t *testing.T, limit string) {
	t.Helper()
	a.slots.mu.Lock()
	p := a.slots.plan(limit)
	var done chan struct{}
	if p.Pending {
		done = p.done
	}
	a.slots.mu.Unlock()
	if done != nil {
		awaitStopped(t, done, "the slot share request")
	}
}

func acquireOK(t *testing.T, a *Agent, limit, holder string, ttl time.Duration) SlotDecision {
	t.Helper()
	d, err := a.AcquireSlot(context.Background(), limit, holder, ttl)
	if err != nil || !d.Allowed || d.SlotID == "" {
		t.Fatalf("AcquireSlot(%s, %s) = %+v, %v; want a slot", limit, holder, d, err)
	}
	a.slotsSettled(t, limit)
	return d
}

// TestConcurrencyEndToEnd: a concurrency limit of 3 slots, created
// through the Admin API, acquired by agents of two regions through real
// redis-servers and a real allocator on etcd, on one driven clock: the
// first region's share is the whole cap (only it asked); a fourth holder
// is denied with a retry-after of the earliest slot's expiry; the other
// region is denied while the first holds every slot; acquire is
// idempotent by holder; a release frees a slot at once (twice: answered,
// not held); a heartbeat of a released slot is NOT_FOUND; a holder that
// stops heartbeating loses its slot at its ttl; a slot never outlives
// the region's share; once the first region's share expired, its slots
// go to the other region.
func TestConcurrencyEndToEnd(t *testing.T) {
	w := newWorld(t, "eu", "us")
	w.putConcLimit("c/e2e", 3, 10*time.Second, "eu", "us")
	ctx := context.Background()
	eu, us := w.agent("eu", "eu-1"), w.agent("us", "us-1")

	h1 := acquireOK(t, eu, "c/e2e", "job-1", 4*time.Second)
	if h1.Slots != 3 || h1.Limit != 3 || h1.Held != 1 || h1.ExpiresIn != 4*time.Second {
		t.Fatalf("first slot: %+v, want the whole cap as the region's share, 4s", h1)
	}
	h2 := acquireOK(t, eu, "c/e2e", "job-2", 4*time.Second)
	w.clock.Add(time.Second)
	h3 := acquireOK(t, eu, "c/e2e", "job-3", 30*time.Second)
	if h3.ExpiresIn >= 10*time.Second {
		t.Fatalf("a slot of ttl 30s lives %v: past the region's share", h3.ExpiresIn)
	}
	d, err := eu.AcquireSlot(ctx, "c/e2e", "job-4", 4*time.Second)
	if err != nil || d.Allowed || d.Reason != pb.Reason_REASON_OVER_LIMIT || d.RetryAfter != 3*time.Second || d.Held != 3 {
		t.Fatalf("a fourth holder: %+v, %v; want OVER_LIMIT, retry after 3s (job-1's expiry), 3 held", d, err)
	}
	d, err = us.AcquireSlot(ctx, "c/e2e", "job-u", 4*time.Second)
	if err != nil || d.Allowed || d.Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("the other region while eu holds every slot: %+v, %v; want OVER_LIMIT", d, err)
	}
	if again := acquireOK(t, eu, "c/e2e", "job-2", 4*time.Second); again.SlotID != h2.SlotID {
		t.Fatalf("the same holder again: slot %q, want its own %q", again.SlotID, h2.SlotID)
	}

	// A release frees the slot at once; twice is answered, not held.
	if ok, err := eu.ReleaseSlot(ctx, "c/e2e", h2.SlotID); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	if ok, err := eu.ReleaseSlot(ctx, "c/e2e", h2.SlotID); ok || err != nil {
		t.Fatalf("second release: %v, %v; want false, nil", ok, err)
	}
	if _, err := eu.HeartbeatSlot(ctx, "c/e2e", h2.SlotID, 4*time.Second); !errors.Is(err, ErrSlotNotHeld) {
		t.Fatalf("heartbeat of a released slot: %v, want ErrSlotNotHeld", err)
	}
	h4 := acquireOK(t, eu, "c/e2e", "job-4", 4*time.Second)

	// job-1 stops heartbeating: its slot is free at its ttl, not before.
	left, err := eu.HeartbeatSlot(ctx, "c/e2e", h4.SlotID, 4*time.Second)
	if err != nil || left != 4*time.Second {
		t.Fatalf("heartbeat: %v, %v", left, err)
	}
	w.clock.Add(3*time.Second - time.Millisecond) // T+4s-1ms: job-1 still holds its slot
	if d, _ := eu.AcquireSlot(ctx, "c/e2e", "job-5", 4*time.Second); d.Allowed {
		t.Fatalf("job-5 got a slot before job-1's expired: %+v", d)
	}
	w.clock.Add(time.Millisecond)
	h5 := acquireOK(t, eu, "c/e2e", "job-5", 4*time.Second)
	if ok, over := testutil.ToFloat64(eu.m.slotAcquires.WithLabelValues("ok")), testutil.ToFloat64(eu.m.slotAcquires.WithLabelValues("over_limit")); ok != 6 || over != 2 {
		t.Fatalf("leasehold_agent_slot_acquires_total: ok %v, over_limit %v; want 6, 2", ok, over)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(slotsCollector{eu})
	if n, err := testutil.GatherAndCount(reg, "leasehold_agent_slots"); err != nil || n != 2 {
		t.Fatalf("leasehold_agent_slots: %d series, %v; want held and share of c/e2e", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP leasehold_agent_slots Concurrency limits this replica served recently: the region's slots held (kind held, as this replica last saw them in Redis) and the slots its share in force allows (kind share, 0: none).
# TYPE leasehold_agent_slots gauge
leasehold_agent_slots{kind="held",limit="c/e2e"} 3
leasehold_agent_slots{kind="share",limit="c/e2e"} 3
`), "leasehold_agent_slots"); err != nil {
		t.Fatal(err)
	}
	if _, err := eu.HeartbeatSlot(ctx, "c/e2e", h1.SlotID, 4*time.Second); !errors.Is(err, ErrSlotNotHeld) {
		t.Fatalf("heartbeat of an expired slot: %v, want ErrSlotNotHeld", err)
	}

	// eu's holders keep heartbeating; eu's agent renews its share at half
	// life while they do, and they keep their slots past the first
	// share's end (T+10s).
	for i := range 5 {
		for _, s := range []string{h3.SlotID, h4.SlotID, h5.SlotID} {
			if _, err := eu.HeartbeatSlot(ctx, "c/e2e", s, 4*time.Second); err != nil {
				t.Fatalf("heartbeat %d of %s: %v", i, s, err)
			}
		}
		eu.slotsSettled(t, "c/e2e")
		w.clock.Add(2 * time.Second)
	}

	// eu's jobs end; eu's agent hears no more of the limit: its share
	// expires, and us gets the slots.
	for _, s := range []string{h3.SlotID, h4.SlotID, h5.SlotID} {
		if ok, err := eu.ReleaseSlot(ctx, "c/e2e", s); !ok || err != nil {
			t.Fatalf("release %s: %v, %v", s, ok, err)
		}
	}
	w.clock.Add(11 * time.Second)
	u := acquireOK(t, us, "c/e2e", "job-u", 4*time.Second)
	if u.Slots < 1 {
		t.Fatalf("us after eu's share expired: %+v", u)
	}
	var reserved int64
	_ = w.alloc.View(func(now time.Time, c *allocator.Core) { reserved = c.ReservedSlots("c/e2e", now) })
	if reserved > 3 {
		t.Fatalf("the allocator reserves %d slots of 3", reserved)
	}
}

// TestSlotBadInput: bad fields are INVALID_ARGUMENT naming the field
// over gRPC; a slot not held is NOT_FOUND; an unknown limit NOT_FOUND; a
// Check or a sub-lease of a concurrency limit, and a slot of a window
// limit, are refused naming limit_id.
func TestSlotBadInput(t *testing.T) {
	w := newWorld(t, "eu")
	w.putConcLimit("c/bad", 2, 10*time.Second, "eu")
	w.putLimit(limit("w/bad", 100, time.Minute, 15*time.Second, "eu"))
	a := w.agent("eu", "eu-1")
	cl := serveAgent(t, a)
	ctx := context.Background()
	ttl := durationpb.New(time.Second)
	got := acquireOK(t, a, "c/bad", "h", time.Second)

	for _, tc := range []struct {
		name  string
		call  func() error
		code  codes.Code
		field string
	}{
		{"ttl missing", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "h"})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"ttl 0", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "h", Ttl: durationpb.New(0)})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"ttl negative", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "h", Ttl: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"ttl above the maximum", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "h", Ttl: durationpb.New(MaxSlotTTL + time.Millisecond)})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"ttl not whole ms", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "h", Ttl: durationpb.New(time.Second + time.Microsecond)})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"holder missing", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "holder_id"},
		{"holder too long", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: strings.Repeat("h", 129), Ttl: ttl})
			return err
		}, codes.InvalidArgument, "holder_id"},
		{"holder with a ~", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/bad", HolderId: "a~1", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "holder_id"},
		{"limit id invalid", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "/x/", HolderId: "h", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "limit_id"},
		{"a window limit", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "w/bad", HolderId: "h", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "limit_id"},
		{"unknown limit", func() error {
			_, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/none", HolderId: "h", Ttl: ttl})
			return err
		}, codes.NotFound, "limit_id"},
		{"Check of a concurrency limit", func() error {
			_, err := cl.Check(ctx, &pb.CheckRequest{LimitId: "c/bad", Cost: 1})
			return err
		}, codes.InvalidArgument, "limit_id"},
		{"sub-lease of a concurrency limit", func() error {
			_, err := cl.Reserve(ctx, &pb.ReserveRequest{LimitId: "c/bad", ReservationId: "r1", Tokens: 1})
			return err
		}, codes.InvalidArgument, "limit_id"},
		{"heartbeat: slot id missing", func() error {
			_, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "slot_id"},
		{"heartbeat: slot id malformed", func() error {
			_, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", SlotId: "h~x", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "slot_id"},
		{"heartbeat: slot id too long", func() error {
			_, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", SlotId: strings.Repeat("h", 200) + "~1", Ttl: ttl})
			return err
		}, codes.InvalidArgument, "slot_id"},
		{"heartbeat: ttl 0", func() error {
			_, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", SlotId: got.SlotID, Ttl: durationpb.New(0)})
			return err
		}, codes.InvalidArgument, "ttl"},
		{"heartbeat: unknown slot", func() error {
			_, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", SlotId: "nobody~7", Ttl: ttl})
			return err
		}, codes.NotFound, "slot_id"},
		{"release: slot id malformed", func() error {
			_, err := cl.ReleaseSlot(ctx, &pb.ReleaseSlotRequest{LimitId: "c/bad", SlotId: "nobody"})
			return err
		}, codes.InvalidArgument, "slot_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("got %v, want %v naming %s", err, tc.code, tc.field)
			}
		})
	}
	// A heartbeat of a released slot: NOT_FOUND; its release again:
	// answered, not an error.
	if r, err := cl.ReleaseSlot(ctx, &pb.ReleaseSlotRequest{LimitId: "c/bad", SlotId: got.SlotID}); err != nil || !r.Released {
		t.Fatalf("release: %v, %v", r, err)
	}
	if _, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/bad", SlotId: got.SlotID, Ttl: ttl}); status.Code(err) != codes.NotFound {
		t.Fatalf("heartbeat of a released slot: %v, want NOT_FOUND", err)
	}
	if r, err := cl.ReleaseSlot(ctx, &pb.ReleaseSlotRequest{LimitId: "c/bad", SlotId: got.SlotID}); err != nil || r.Released {
		t.Fatalf("second release: %v, %v; want released false", r, err)
	}
}

// TestSlotsRedisDown: with the region's Redis SIGKILLed, a concurrency
// limit answers UNAVAILABLE (its slots live only in Redis: a slot that
// cannot be counted is not granted), heartbeats and releases fail
// UNAVAILABLE over gRPC, never a grant or NOT_FOUND.
func TestSlotsRedisDown(t *testing.T) {
	w := newWorld(t, "eu")
	w.putConcLimit("c/down", 2, 10*time.Second, "eu")
	a := w.agent("eu", "eu-1", WithTimeouts(2*time.Second, 5*time.Second, 300*time.Millisecond))
	cl := serveAgent(t, a)
	ctx := context.Background()
	held := acquireOK(t, a, "c/down", "job-1", 4*time.Second)

	w.redis["eu"].Kill()
	for i := range 5 { // before and after the agent marks Redis down
		r, err := cl.AcquireSlot(ctx, &pb.AcquireSlotRequest{LimitId: "c/down", HolderId: "job-2", Ttl: durationpb.New(time.Second)})
		if err != nil || r.Allowed || r.Reason != pb.Reason_REASON_UNAVAILABLE || r.RetryAfter.AsDuration() <= 0 {
			t.Fatalf("acquire %d with Redis dead: %v, %v; want UNAVAILABLE with a retry-after", i, r, err)
		}
	}
	if _, err := cl.HeartbeatSlot(ctx, &pb.HeartbeatSlotRequest{LimitId: "c/down", SlotId: held.SlotID, Ttl: durationpb.New(time.Second)}); status.Code(err) != codes.Unavailable {
		t.Fatalf("heartbeat with Redis dead: %v, want UNAVAILABLE", err)
	}
	if _, err := cl.ReleaseSlot(ctx, &pb.ReleaseSlotRequest{LimitId: "c/down", SlotId: held.SlotID}); status.Code(err) != codes.Unavailable {
		t.Fatalf("release with Redis dead: %v, want UNAVAILABLE", err)
	}
}

// TestSlotsMiddleware: httplimit.Slots holds a slot of a concurrency
// limit of 1 for each request's life, through the Go client and a real
// agent: a second request while the first runs is 429 with Retry-After
// and a problem+json body; once the first returned, its slot is free
// again; an unknown limit and a dead Redis are 503.
func TestSlotsMiddleware(t *testing.T) {
	w := newWorld(t, "eu")
	w.putConcLimit("c/http", 1, 10*time.Second, "eu")
	a := w.agent("eu", "eu-1", WithTimeouts(2*time.Second, 5*time.Second, 300*time.Millisecond))
	c := client.NewInProcess(serveAgent(t, a), "t-", client.WithTimeout(2*time.Second))
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	entered, release := make(chan struct{}), make(chan struct{})
	h := httplimit.Slots(c, 5*time.Second, httplimit.Key(func(r *http.Request) (string, bool) {
		return r.Header.Get("X-Limit"), true
	}), httplimit.Jitter(0))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "ran")
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(limit string, block bool) (*http.Response, string) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Limit", limit)
		if block {
			req.Header.Set("X-Block", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	first := make(chan int, 1)
	go func() {
		resp, _ := get("c/http", true)
		if resp == nil {
			first <- 0
			return
		}
		first <- resp.StatusCode
	}()
	<-entered // the first request holds the only slot
	resp, body := get("c/http", false)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, httplimit.TypeSlotsHeld) || !strings.Contains(body, `"limit":"c/http"`) {
		t.Fatalf("a second request while the first holds the slot: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	close(release)
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the first request: %d", code)
	}
	if resp, body := get("c/http", false); resp.StatusCode != http.StatusOK || body != "ran" {
		t.Fatalf("after the first released its slot: %d %q", resp.StatusCode, body)
	}
	if resp, _ := get("c/none", false); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("an unknown limit: %d, want 503", resp.StatusCode)
	}
	w.redis["eu"].Kill()
	if resp, body := get("c/http", false); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("Redis dead: %d %q, want 503 with Retry-After", resp.StatusCode, body)
	}
}

// TestSlotsRedisForgotShare: Redis forgets the region's slot share (a
// failover that lost writes; here FLUSHALL) while the replica believes
// it is in force: the next acquire asks the allocator again and is
// answered, rather than UNAVAILABLE until the share's renewal time.
func TestSlotsRedisForgotShare(t *testing.T) {
	w := newWorld(t, "eu")
	w.putConcLimit("c/forgot", 2, 10*time.Second, "eu")
	a := w.agent("eu", "eu-1")
	acquireOK(t, a, "c/forgot", "job-1", 4*time.Second)
	if err := a.cfg.Redis.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	w.clock.Add(time.Second)
	if d := acquireOK(t, a, "c/forgot", "job-2", 4*time.Second); d.Slots < 1 {
		t.Fatalf("after Redis forgot the share: %+v", d)
	}
}

// TestSlotsLocalFallback: a concurrency limit whose fallback in the region
// is local:2 holds at most 2 slots of its own while the allocator is
// unreachable and its share has ended (answered REASON_FALLBACK, counted
// as such), never a third; UNAVAILABLE before the agent knows the
// allocator is down; back to the allocator's shares (REASON_OK) once it
// answers again. The allocator exports the bound N + A.
func TestSlotsLocalFallback(t *testing.T) {
	w := newWorld(t, "eu")
	w.putLimit(&pb.Limit{Id: "c/fb", Kind: pb.LimitKind_LIMIT_KIND_CONCURRENCY, LimitTokens: 3, Regions: []string{"eu"},
		Mode:     pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 2}},
		Lease:    &pb.LeaseSettings{Ttl: durationpb.New(10 * time.Second)}})
	w.clock.Add(time.Second)
	cut := &cutDialer{}
	a := w.cutAgent(cut)
	ctx := context.Background()
	if d := acquireOK(t, a, "c/fb", "job-0", 30*time.Second); d.Reason != pb.Reason_REASON_OK || d.Slots != 3 {
		t.Fatalf("before the partition: %+v, want OK under the allocator's share of 3", d)
	}
	a.slotsSettled(t, "c/fb")

	cut.set(true)
	w.clock.Add(11 * time.Second) // the share (and job-0's slot with it) has ended
	var d SlotDecision
	var unavailable int
	for i := 0; i < 40; i++ {
		w.clock.Add(time.Second) // past SlotRetry and the breaker's cooldowns
		var err error
		if d, err = a.AcquireSlot(ctx, "c/fb", "job-1", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		a.slotsSettled(t, "c/fb")
		if d.Reason != pb.Reason_REASON_UNAVAILABLE {
			break
		}
		unavailable++
	}
	if !d.Allowed || d.Reason != pb.Reason_REASON_FALLBACK || d.Slots != 2 || d.Held != 1 {
		t.Fatalf("cut off, share ended: %+v after %d UNAVAILABLE; want a slot under the local fallback of 2", d, unavailable)
	}
	if d.ExpiresIn > 10*time.Second {
		t.Fatalf("a fallback slot lives %v: past the fallback share's ttl", d.ExpiresIn)
	}
	d2 := acquireOK(t, a, "c/fb", "job-2", 30*time.Second)
	if d2.Reason != pb.Reason_REASON_FALLBACK || d2.Held != 2 {
		t.Fatalf("second fallback slot: %+v", d2)
	}
	if d3, err := a.AcquireSlot(ctx, "c/fb", "job-3", 30*time.Second); err != nil || d3.Allowed || d3.Reason != pb.Reason_REASON_OVER_LIMIT {
		t.Fatalf("a third slot while cut off: %+v, %v; want OVER_LIMIT (local:2)", d3, err)
	}
	if got := testutil.ToFloat64(a.m.slotAcquires.WithLabelValues("fallback")); got != 2 {
		t.Fatalf("leasehold_agent_slot_acquires_total{result=fallback} = %v, want 2", got)
	}

	cut.set(false)
	var healed SlotDecision
	for i := 0; i < 40 && healed.Reason != pb.Reason_REASON_OK; i++ {
		w.clock.Add(time.Second)
		a.slotsSettled(t, "c/fb")
		healed, _ = a.AcquireSlot(ctx, "c/fb", "job-4", 30*time.Second)
		a.slotsSettled(t, "c/fb")
	}
	if healed.Reason != pb.Reason_REASON_OK || healed.Slots != 3 {
		t.Fatalf("healed: %+v, want OK under the allocator's share of 3", healed)
	}

	var st allocator.SlotStatus
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if st, err = w.alloc.SlotStatus("c/fb"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // a leader to ask
	}
	if st.N != 3 || st.Bound != 5 {
		t.Fatalf("slot status %+v, want N 3 and the bound N + A = 5", st)
	}
}
