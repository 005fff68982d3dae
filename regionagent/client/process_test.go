package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/faulttest"
	"leasehold/internal/ports"
	"leasehold/internal/redistest"
	pb "leasehold/proto/leasehold/v1"
)

// childEnv switches the test binary into a child client process of
// TestSubLeaseProcesses; its value is the childSpec as JSON.
const childEnv = "LEASEHOLD_SUBLEASE_CHILD"

// childSpec is what one child process does.
type childSpec struct {
	Agent  string        `json:"agent"`
	Limit  string        `json:"limit"`
	Window time.Duration `json:"window"`
	Rate   float64       `json:"rate"`  // Allow calls per second
	Start  time.Time     `json:"start"` // wall clock: all children start together
	Drive  time.Duration `json:"drive"` // how long it drives
	// Pauses (the limit idle for Pause) from each of these offsets on:
	// a pause starts at the first call after its offset at which the
	// client holds a chunk with tokens left and half its life ahead,
	// so that the idle release has a live chunk to give back (or
	// pauseWait after the offset, whatever the client holds).
	PauseAt []time.Duration `json:"pause_at"`
	Pause   time.Duration   `json:"pause"`
	Out     string          `json:"out"` // result file
	NoSub   bool            `json:"no_sub"`
}

// childResult is what a child reports.
type childResult struct {
	// Admitted cost per window index (the window of the allocator's
	// clock, epoch-aligned), by source.
	Admitted map[string]map[int64]int64 `json:"admitted"`
	Denied   int64                      `json:"denied"`
	Errors   int64                      `json:"errors"`
	Calls    int64                      `json:"calls"`
	// Releases: what was given back, and the releases sent well before
	// their chunk's deadline whose tokens did not all come back.
	Releases      int      `json:"releases"`
	Unspent       int64    `json:"unspent"`
	Returned      int64    `json:"returned"`
	ShortReturned []string `json:"short_returned"`
	// Chunks: how many, tokens granted, left when expired, left when
	// given up alive, and their lifetimes (deadline - sent).
	Chunks       int           `json:"chunks"`
	Granted      int64         `json:"granted"`
	Expired      int64         `json:"expired"`
	LeftAlive    int64         `json:"left_alive"`
	Lifetime     time.Duration `json:"lifetime"`
	ShortLived   int           `json:"short_lived"` // lifetime < 100ms
	CacheDenials int64         `json:"cache_denials"`
	CloseErr     string        `json:"close_err"`
}

// TestSubLeaseChild is the body of one child process (skipped unless
// started by TestSubLeaseProcesses).
func TestSubLeaseChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("run by TestSubLeaseProcesses")
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithTimeout(time.Second)}
	if os.Getenv("LEASEHOLD_SUBLEASE_NOCACHE") != "" {
		opts = append(opts, WithoutDenialCache())
	}
	if !spec.NoSub {
		opts = append(opts, WithSubLeases(SubLeaseConfig{HotRate: 50, Horizon: 200 * time.Millisecond, IdleAfter: 300 * time.Millisecond}))
	}
	c, err := New(spec.Agent, opts...)
	if err != nil {
		t.Fatal(err)
	}
	res := childResult{Admitted: map[string]map[int64]int64{}}
	var mu sync.Mutex // protects res's release fields (releases run in the background)
	c.onRelease = func(r *reservation, sentAt, unspent, returned int64) {
		mu.Lock()
		defer mu.Unlock()
		res.Releases++
		res.Unspent += unspent
		res.Returned += max(0, returned)
		if returned != unspent && r.deadline-sentAt > int64(50*time.Millisecond) {
			res.ShortReturned = append(res.ShortReturned, fmt.Sprintf("%s: unspent %d returned %d, sent %v before the deadline",
				r.id, unspent, returned, time.Duration(r.deadline-sentAt)))
		}
	}
	c.onRetire = func(r *reservation, unspent, now int64) {
		mu.Lock()
		defer mu.Unlock()
		res.Chunks++
		res.Granted += r.granted
		life := time.Duration(r.deadline - r.sent)
		res.Lifetime += life
		if life < 100*time.Millisecond {
			res.ShortLived++
		}
		if now >= r.deadline {
			res.Expired += unspent
		} else {
			res.LeftAlive += unspent
		}
	}
	W := int64(spec.Window)
	time.Sleep(time.Until(spec.Start)) // the common start, not ordering
	start := time.Now()
	ctx := context.Background()
	maxCalls := int64(spec.Rate * spec.Drive.Seconds())
	const pauseWait = 4 * time.Second
	var pausedUntil time.Duration // elapsed time the current pause ends at
	for res.Calls < maxCalls {
		el := time.Since(start)
		if el >= spec.Drive {
			break
		}
		if len(spec.PauseAt) > 0 && el >= spec.PauseAt[0] && (el >= spec.PauseAt[0]+pauseWait || c.freshChunk(spec.Limit)) {
			spec.PauseAt = spec.PauseAt[1:]
			pausedUntil = el + spec.Pause
		}
		if el < pausedUntil {
			time.Sleep(time.Millisecond) // the idle pause
			continue
		}
		if float64(res.Calls) >= el.Seconds()*spec.Rate {
			time.Sleep(time.Millisecond) // pacing the load
			continue
		}
		t0 := time.Now()
		d, err := c.Allow(ctx, spec.Limit, 1)
		t1 := time.Now()
		res.Calls++
		switch {
		case err != nil:
			res.Errors++
			continue
		case !d.Allowed:
			res.Denied++
			if d.Source == SourceDenialCache {
				res.CacheDenials++
			}
			continue
		}
		var w int64
		if d.Source == SourceSubLease {
			// Spent in process while Allow ran: the window then. A token
			// spent after its chunk's deadline would land in the next.
			w = t0.UnixNano() / W
			if t1.UnixNano()/W != w {
				// Allow straddled a boundary (a loaded machine: it began
				// in one window and spent from the next one's chunk): the
				// chunk's own window ends reset_after after the spend.
				w = int64(math.Round(float64(t1.Add(d.ResetAfter).UnixNano())/float64(W))) - 1
			}
		} else {
			// Spent by the agent between t0 and t1, from the window that
			// ends ResetAfter later.
			mid := t0.Add(t1.Sub(t0) / 2)
			w = int64(math.Round(float64(mid.Add(d.ResetAfter).UnixNano())/float64(W))) - 1
		}
		src := d.Source.String()
		if res.Admitted[src] == nil {
			res.Admitted[src] = map[int64]int64{}
		}
		res.Admitted[src][w]++
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Close(cctx); err != nil {
		res.CloseErr = err.Error()
	}
	mu.Lock()
	defer mu.Unlock()
	b, _ := json.Marshal(res)
	if err := os.WriteFile(spec.Out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSubLeaseProcesses: an allocator, two agents of region eu sharing one
// redis-server and one agent of region us, as real processes; eight
// client processes with sub-leases (three per eu agent, two on us) drive
// one limit at 1.6x its G. Counted from the children's own decisions,
// every window admits at most G; sub-lease spends are counted in the
// window they happened in, so a token spent after its chunk's deadline
// would show up in the next window. Releases sent while a chunk was alive
// get all their unspent tokens back.
func TestSubLeaseProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child")
	}
	const (
		limit = "tenant/sublease"
		G     = 4000
		W     = 4 * time.Second
	)
	bin, alloc := startAllocatorProcess(t)
	redisEU, redisUS := redistest.Start(t), redistest.Start(t)
	agents := []string{ports.Addr(t), ports.Addr(t), ports.Addr(t)}
	for i, a := range []struct{ region, redis, id string }{
		{"eu", redisEU.Addr(), "eu-1"}, {"eu", redisEU.Addr(), "eu-2"}, {"us", redisUS.Addr(), "us-1"},
	} {
		startProcess(t, bin, "agent", "--region", a.region, "--allocator", alloc, "--redis", a.redis,
			"--grpc-addr", agents[i], "--http-addr", ports.Addr(t), "--replica-id", a.id)
	}
	for _, a := range agents {
		// SERVING: the agent has its limits from the allocator.
		if err := faulttest.WaitHealthy(a, pb.RegionAgent_ServiceDesc.ServiceName, 90*time.Second, nil); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := grpc.NewClient(alloc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	if _, err := pb.NewAdminClient(conn).PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: &pb.Limit{Id: limit, LimitTokens: G,
		Window: durationpb.New(W), Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		waitKnows(t, a, limit)
	}

	// 8 children x 200/s = 1600/s against G/W = 1000/s. Odd children
	// pause twice for 1.5 s mid-run, each time right after taking a
	// chunk: their chunks go idle and are released while alive.
	dir := t.TempDir()
	// Diagnostics: LEASEHOLD_SUBLEASE_OFF=1 runs the children without
	// sub-leases, LEASEHOLD_SUBLEASE_NOCACHE=1 without the denial cache.
	noSub := os.Getenv("LEASEHOLD_SUBLEASE_OFF") != ""
	start := time.Now().Add(2 * time.Second) // children start together
	const drive = 17 * time.Second
	var wg sync.WaitGroup
	results := make([]childResult, 8)
	for i := range 8 {
		spec := childSpec{Agent: agents[[]int{0, 0, 0, 1, 1, 1, 2, 2}[i]], Limit: limit, Window: W, Rate: 200,
			Start: start, Drive: drive, Out: filepath.Join(dir, fmt.Sprintf("child-%d.json", i)),
			NoSub: noSub}
		if i%2 == 1 {
			off := time.Duration(i) * 300 * time.Millisecond
			spec.PauseAt, spec.Pause = []time.Duration{5*time.Second + off, 11*time.Second + off}, 1500*time.Millisecond
		}
		raw, _ := json.Marshal(spec)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSubLeaseChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("child %d: %v\n%s", i, err, out)
				return
			}
			b, err := os.ReadFile(spec.Out)
			if err == nil {
				err = json.Unmarshal(b, &results[i])
			}
			if err != nil {
				t.Errorf("child %d result: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	perWindow := map[int64]int64{}
	var subTotal, returned int64
	for i, r := range results {
		sub := int64(0)
		for src, ws := range r.Admitted {
			for w, n := range ws {
				perWindow[w] += n
				if src == SourceSubLease.String() {
					sub += n
				}
			}
		}
		subTotal += sub
		returned += r.Returned
		t.Logf("child %d: %d calls, %d from sub-leases, %d denied (%d by the cache), %d errors; %d releases gave back %d of %d",
			i, r.Calls, sub, r.Denied, r.CacheDenials, r.Errors, r.Releases, r.Returned, r.Unspent)
		if r.Chunks > 0 {
			t.Logf("child %d: %d chunks of %d tokens on average, living %v on average (%d under 100ms); %d tokens expired unspent, %d left alive",
				i, r.Chunks, r.Granted/int64(r.Chunks), r.Lifetime/time.Duration(r.Chunks), r.ShortLived, r.Expired, r.LeftAlive)
		}
		if sub == 0 && !noSub {
			t.Errorf("child %d never spent from a sub-lease", i)
		}
		for _, s := range r.ShortReturned {
			t.Errorf("child %d: a release of a live chunk came back short: %s", i, s)
		}
		if r.CloseErr != "" {
			t.Errorf("child %d: Close: %s", i, r.CloseErr)
		}
		if r.Errors > r.Calls/100 {
			t.Errorf("child %d: %d errors in %d calls", i, r.Errors, r.Calls)
		}
	}
	var ws []int64
	for w := range perWindow {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i] < ws[j] })
	full := 0
	for _, w := range ws {
		n := perWindow[w]
		from := time.Unix(0, w*int64(W))
		isFull := !from.Before(start) && !from.Add(W).After(start.Add(drive))
		t.Logf("window %s: admitted %d of %d (full window: %v)", from.Format("15:04:05"), n, G, isFull)
		if n > G {
			t.Errorf("window %s admitted %d > G = %d", from.Format("15:04:05"), n, G)
		}
		if isFull {
			full++
			// Not a bound, a sign the run was over the limit: the denial
			// cache over-denies while the region renews (see
			// docs/client.md), so a window admits well below G.
			if n < G/4 {
				t.Errorf("window %s admitted only %d while demand was 1.6 G", from.Format("15:04:05"), n)
			}
		}
	}
	if full < 3 {
		t.Errorf("only %d full windows", full)
	}
	if returned == 0 && !noSub {
		t.Error("no unspent sub-lease token came back")
	}
	t.Logf("%d admitted from sub-leases; %d unspent tokens came back", subTotal, returned)
	if reps, err := pb.NewAdminClient(conn).ListWindows(ctx, &pb.ListWindowsRequest{LimitId: limit, Last: 10}); err == nil {
		for _, r := range reps.Windows {
			t.Logf("allocator: window %s granted %d returned %d admitted %v stranded %d",
				r.WindowStart.AsTime().Format("15:04:05"), r.Granted, r.Returned, r.Admitted, r.Stranded)
		}
	}
}

// freshChunk reports whether the client holds a chunk of limit with
// tokens left and more than half its life ahead.
func (c *Client) freshChunk(limit string) bool {
	v, ok := c.states.Load(limit)
	if !ok {
		return false
	}
	r := v.(*limitState).cur.Load()
	now := c.mono()
	return r != nil && r.usable(now) && r.deadline-now > (r.deadline-r.sent)/2
}

// startProcess runs bin with args until the test ends (SIGINT, then
// SIGKILL after 20 s).
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s %s stderr (tail):\n%s", filepath.Base(bin), args[0], tail(stderr.String(), 2000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitKnows waits until the agent at addr knows limit (its limits sync
// runs every second).
func waitKnows(t *testing.T, addr, limit string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ra := pb.NewRegionAgentClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := ra.Check(ctx, &pb.CheckRequest{LimitId: limit, Cost: 1})
		cancel()
		if status.Code(err) != codes.NotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s does not know %s: %v", addr, limit, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the agent's limit sync
	}
}

// startAllocatorProcess builds cmd/leasehold and starts it as an
// allocator of regions eu and us (its etcd embedded) on free loopback
// ports: it returns the binary and the allocator's gRPC address.
func startAllocatorProcess(t *testing.T) (bin, alloc string) {
	t.Helper()
	bin = filepath.Join(t.TempDir(), "leasehold")
	if out, err := exec.Command("go", "build", "-o", bin, "leasehold/cmd/leasehold").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	alloc = ports.Addr(t)
	startProcess(t, bin, "allocator", "--grpc-addr", alloc, "--http-addr", ports.Addr(t),
		"--data-dir", filepath.Join(t.TempDir(), "alloc"), "--etcd-client-addr", ports.Addr(t),
		"--etcd-peer-addr", ports.Addr(t), "--regions", "eu,us")
	return bin, alloc
}
