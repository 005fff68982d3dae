package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// fakeLimit is one limit of fakeChecker: a budget that only goes down.
type fakeLimit struct {
	g, left     int64
	window      time.Duration
	reset       time.Duration
	retry       time.Duration
	unavailable bool // the agent cannot decide (fails closed, no lease)
	fallback    bool // admitted by the fallback (OPEN)
}

// fakeChecker decides like regionagent.Agent.CheckMulti against per-limit
// budgets: all limits are charged or none; unknown limits and costs above
// G are errors worded as the agent words them. It records every call.
type fakeChecker struct {
	mu     sync.Mutex
	limits map[string]*fakeLimit
	calls  [][]regionagent.CheckItem
	err    error         // returned by every call when set
	delay  time.Duration // before deciding (honours ctx)
}

func newFake(limits map[string]*fakeLimit) *fakeChecker {
	for _, l := range limits {
		if l.window == 0 {
			l.window = time.Minute
		}
		if l.reset == 0 {
			l.reset = 30 * time.Second
		}
		if l.retry == 0 {
			l.retry = 1500 * time.Millisecond
		}
	}
	return &fakeChecker{limits: limits}
}

func (f *fakeChecker) CheckMulti(ctx context.Context, items []regionagent.CheckItem) ([]regionagent.Decision, error) {
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, slices.Clone(items))
	if f.err != nil {
		return nil, f.err
	}
	if len(items) == 0 || len(items) > 16 {
		return nil, &regionagent.FieldError{Field: "checks", Reason: "1..16"}
	}
	need := map[string]int64{}
	for i, it := range items {
		l := f.limits[it.Limit]
		if l == nil {
			return nil, fmt.Errorf("%w: %q is not a limit of region %s", regionagent.ErrUnknownLimit, it.Limit, "eu")
		}
		cost := max(it.Cost, 1)
		if cost > l.g {
			return nil, &regionagent.FieldError{Field: fmt.Sprintf("checks[%d].cost", i), Reason: fmt.Sprintf("must be 1..%d (the limit's G), got %d", l.g, it.Cost)}
		}
		need[it.Limit] += cost
	}
	out := make([]regionagent.Decision, len(items))
	ok := true
	for _, it := range items {
		l := f.limits[it.Limit]
		if l.unavailable {
			for i := range out {
				out[i] = regionagent.Decision{Reason: pb.Reason_REASON_UNAVAILABLE, RetryAfter: time.Second}
			}
			return out, nil
		}
		ok = ok && l.left >= need[it.Limit]
	}
	if ok {
		for id, n := range need {
			f.limits[id].left -= n
		}
	}
	for i, it := range items {
		l := f.limits[it.Limit]
		d := regionagent.Decision{Allowed: ok, Reason: pb.Reason_REASON_OK, Remaining: l.left, ResetAfter: l.reset,
			Limit: l.g, Window: l.window, Version: 1}
		if ok && l.fallback {
			d.Reason = pb.Reason_REASON_FALLBACK
		}
		if !ok {
			d.Reason, d.RetryAfter = pb.Reason_REASON_OVER_LIMIT, l.retry
		}
		out[i] = d
	}
	return out, nil
}

func (f *fakeChecker) left(id string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.limits[id].left
}

func (f *fakeChecker) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeChecker) lastCall() []regionagent.CheckItem {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return nil
	}
	return f.calls[len(f.calls)-1]
}

// mustParse parses a mapping or fails the test.
func mustParse(t testing.TB, yaml string) *Mapping {
	t.Helper()
	m, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func quietLogger() *slog.Logger {
	if os.Getenv("ENVOYRLS_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// serve serves s over an in-memory connection and returns the Envoy
// client stub on it.
func serve(t testing.TB, s *Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// harness is a Server on a fake checker, served over bufconn, with its
// metrics on a registry of its own.
type harness struct {
	fake *fakeChecker
	srv  *Server
	cl   rlsv3.RateLimitServiceClient
	reg  *prometheus.Registry
}

func newHarness(t testing.TB, mapping string, limits map[string]*fakeLimit) *harness {
	t.Helper()
	h := &harness{fake: newFake(limits), reg: prometheus.NewRegistry()}
	h.srv = NewServer(h.fake, mustParse(t, mapping), WithRegisterer(h.reg), WithLogger(quietLogger()))
	h.cl = serve(t, h.srv)
	return h
}

func (h *harness) call(t testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.cl.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// desc builds a descriptor from key, value pairs.
func desc(kvs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kvs); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kvs[i], Value: kvs[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

// codes lists the per-descriptor codes of a response.
func codesOf(r *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for _, s := range r.Statuses {
		out = append(out, s.Code)
	}
	return out
}

// headerMap is a response's headers to add, in order, as "Key: value".
func headerList(r *rlsv3.RateLimitResponse) []string {
	var out []string
	for _, h := range r.ResponseHeadersToAdd {
		out = append(out, h.Key+": "+h.Value)
	}
	return out
}

// writeFile replaces path atomically (write then rename), as a config
// management tool or a Kubernetes ConfigMap update does.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".tmp-%d", time.Now().UnixNano()))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every few milliseconds for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}
