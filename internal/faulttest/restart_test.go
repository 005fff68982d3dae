package faulttest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/faulttest"
	pb "leasehold/proto/leasehold/v1"
)

// TestAgentRestartedWhileAllocatorDown: real processes (an allocator, the
// eu agent, `leasehold gateway` on its default flags in front of it, a
// redis-server), G = 600 per 10 s. The allocator is SIGKILLed; then the
// agent is SIGKILLed and started again while the allocator stays down. The
// restarted agent has no allocator to sync from: it enforces the snapshot
// of the region's limits it kept in Redis. Through the gateway, at 70
// requests a second per key:
//   - tenant/atlas (strict, fallback closed): no window above G, and none
//     admitted in the windows the restarted agent has no lease for (a
//     gateway that took UNAVAILABLE or NOT_FOUND for "no such limit" would
//     pass all 700);
//   - tenant/beta (bounded, fallback local:50): 50 a window in those
//     windows, the fallback the snapshot says;
//   - tenant/nobody (no such limit): passed by the default
//     --unknown-limit pass while the agent can say so, and refused while
//     it cannot (the restarted agent does not know whether it exists).
func TestAgentRestartedWhileAllocatorDown(t *testing.T) {
	skipShort(t)
	const G, local = 600, 50
	alloc := faulttest.StartAllocator(t, faulttest.AllocatorOptions{Regions: []string{"eu"}})
	s := &scenario{t: t, G: G, allocs: []*faulttest.Process{alloc}}
	rs := redisOf(t)
	agent := faulttest.StartAgent(t, faulttest.AgentOptions{Region: "eu", Allocators: []string{alloc.GRPCAddr}, Redis: rs["eu"].Addr()})
	for _, l := range []*pb.Limit{
		{Id: "tenant/atlas", LimitTokens: G, Window: durationpb.New(W), Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT},
		{Id: "tenant/beta", LimitTokens: G, Window: durationpb.New(W), Regions: []string{"eu"}, Mode: pb.Mode_MODE_BOUNDED,
			Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: local}}},
	} {
		faulttest.HistoryLimit(t, l)
		s.admin(func(ctx context.Context, a pb.AdminClient) error {
			_, err := a.PutLimit(ctx, &pb.PutLimitRequest{Reason: "test", Limit: l})
			return err
		})
	}
	up := newUpstream(t)
	gw := faulttest.StartGateway(t, faulttest.GatewayOptions{Agent: agent.GRPCAddr, Upstream: up.srv.URL})

	// Window w0: normal until the allocator dies 3 s in; the agent is
	// restarted at once. w1 and w2: the restarted agent, no allocator.
	w0 := nextWindowStart(time.Now(), 3*time.Second)
	killAt, end := w0.Add(3*time.Second), w0.Add(3*W)
	load := startHTTPLoad(t, gw.HTTPAddr, map[string]float64{"atlas": 70, "beta": 70, "nobody": 5}, time.Until(end))
	sleepUntil(killAt)
	alloc.Kill()
	agent.Restart() // waits until it serves: from the snapshot it kept
	restarted := time.Now()
	t.Logf("allocator killed at w0%+.1fs, agent serving again at w0%+.1fs", killAt.Sub(w0).Seconds(), restarted.Sub(w0).Seconds())
	if restarted.After(w0.Add(W - 3*time.Second)) {
		t.Fatalf("the agent took until w0%+.1fs to serve again", restarted.Sub(w0).Seconds())
	}
	health := httpGet(t, "http://"+agent.HTTPAddr+"/healthz")
	restoredMetric, _, err := faulttest.ScrapeMetric(context.Background(), agent.HTTPAddr, "leasehold_agent_limits_snapshot_restored")
	if err != nil {
		t.Fatal(err)
	}
	age, _, _ := faulttest.ScrapeMetric(context.Background(), agent.HTTPAddr, "leasehold_agent_limits_snapshot_age_seconds")
	load.wait()

	if !strings.Contains(health, "restored snapshot") || restoredMetric != 1 || !(age > 0 && age < 60) {
		t.Errorf("the restarted agent: /healthz %q, snapshot restored %v, age %v s: want it to say it enforces a restored snapshot",
			health, restoredMetric, age)
	}
	w0i := w0.UnixNano() / int64(W)
	perWindow := up.admitted()
	for w := w0i; w < w0i+3; w++ {
		atlas, beta := perWindow["atlas"][w], perWindow["beta"][w]
		t.Logf("window w0+%d: admitted atlas %d, beta %d (asked about 700 each); answers %v",
			w-w0i, atlas, beta, load.answersIn(windowStart(w), windowStart(w+1)))
		if atlas > G || beta > G {
			t.Errorf("window w0+%d: admitted atlas %d, beta %d: above G = %d", w-w0i, atlas, beta, G)
		}
		if w == w0i {
			continue
		}
		if atlas != 0 {
			t.Errorf("window w0+%d: atlas admitted %d with no allocator and no lease, want 0 (fallback closed)", w-w0i, atlas)
		}
		// At most local, counted without the first 50 ms of the window;
		// and at least local-3 counted with them: local:50 is spent in the
		// window's first 0.7 s, 3-4 of it in those 50 ms at 70/s.
		if whole := up.passedBetween("beta", windowStart(w), windowStart(w+1)); beta > local || whole < local-3 {
			t.Errorf("window w0+%d: beta admitted %d (%d with the window's first 50 ms), want its fallback local:%d",
				w-w0i, beta, whole, local)
		}
	}
	// w0's pool is never spent (about 300 of 600 before the kill), and
	// later windows have none: an OVER_LIMIT for atlas in them is a wrong
	// answer (the gateway's client once held the previous window's
	// denial into w0 for its jittered retry-after).
	if n := load.count("atlas", http.StatusTooManyRequests, w0.Add(50*time.Millisecond), end); n != 0 {
		t.Errorf("atlas: %d answers 429 in windows whose pool was not spent", n)
	}
	if n := up.passedBetween("nobody", w0, killAt); n == 0 {
		t.Errorf("tenant/nobody: none passed before the outage; the agent said it does not exist and --unknown-limit pass should pass it")
	}
	if n := up.passedBetween("nobody", restarted, end); n != 0 {
		t.Errorf("tenant/nobody: %d passed by the restarted agent, which cannot know whether the limit exists", n)
	}
}

// upstream is the service behind the gateway: it records when each
// request of each key reached it (that is, was admitted).
type upstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[string][]time.Time
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{got: map[string][]time.Time{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		u.mu.Lock()
		k := r.Header.Get("X-Tenant")
		u.got[k] = append(u.got[k], now)
		u.mu.Unlock()
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// admitted counts each key's requests by the window they reached the
// upstream in, leaving out the first 50 ms of each window: a request the
// agent admitted just before a boundary can arrive just after it.
func (u *upstream) admitted() map[string]map[int64]int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]map[int64]int64{}
	for k, ts := range u.got {
		out[k] = map[int64]int64{}
		for _, at := range ts {
			w := at.UnixNano() / int64(W)
			if at.Sub(windowStart(w)) >= 50*time.Millisecond {
				out[k][w]++
			}
		}
	}
	return out
}

func (u *upstream) passedBetween(key string, from, to time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, at := range u.got[key] {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// httpLoad sends requests through the gateway, each key at its rate.
type httpLoad struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []httpAnswer
}

type httpAnswer struct {
	at     time.Time
	key    string
	status int // 0: no answer
}

// startHTTPLoad sends rates[key] requests a second with X-Tenant: key to
// addr for d (bounded: rate x d requests per key, each with a 2 s timeout).
func startHTTPLoad(t *testing.T, addr string, rates map[string]float64, d time.Duration) *httpLoad {
	l := &httpLoad{}
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for key, rate := range rates {
		n := int(rate * d.Seconds())
		every := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		sem := make(chan struct{}, 32) // at most 32 requests of the key in flight
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var inner sync.WaitGroup
			for i := range n {
				time.Sleep(time.Until(start.Add(time.Duration(i) * every))) // pacing the load
				sem <- struct{}{}
				inner.Add(1)
				go func() {
					defer inner.Done()
					defer func() { <-sem }()
					req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/orders", nil)
					req.Header.Set("X-Tenant", key)
					a := httpAnswer{key: key}
					if resp, err := cl.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						a.status = resp.StatusCode
					}
					a.at = time.Now()
					l.mu.Lock()
					l.answers = append(l.answers, a)
					l.mu.Unlock()
				}()
			}
			inner.Wait()
		}()
	}
	t.Cleanup(l.wait)
	return l
}

func (l *httpLoad) wait() { l.wg.Wait() }

// answersIn counts the answers between from and to by key and status.
func (l *httpLoad) answersIn(from, to time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, a := range l.answers {
		if !a.at.Before(from) && a.at.Before(to) {
			n[fmt.Sprintf("%s:%d", a.key, a.status)]++
		}
	}
	return fmt.Sprint(n)
}

// count is how many answers of key had status between from and to.
func (l *httpLoad) count(key string, status int, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.answers {
		if a.key == key && a.status == status && !a.at.Before(from) && a.at.Before(to) {
			n++
		}
	}
	return n
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.Status + " " + string(b)
}
