package regionagent

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Captured from redis-server 7.0.15: a primary with one replica (CRLF line
// ends, as Redis sends them), and that replica after REPLICAOF NO ONE.
const (
	infoPrimary = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n" +
		"slave0:ip=127.0.0.1,port=17002,state=online,offset=42,lag=1\r\n" +
		"master_failover_state:no-failover\r\nmaster_replid:385331d3d1af968ece8849a055375eeb85ce1f6d\r\n" +
		"master_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:50\r\n" +
		"second_repl_offset:-1\r\nrepl_backlog_active:1\r\nrepl_backlog_size:1048576\r\n" +
		"repl_backlog_first_byte_offset:1\r\nrepl_backlog_histlen:50\r\n"
	infoPromoted = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\n" +
		"master_replid:855461f49d998ab28778d74b569aaf8bb2928a1a\r\n" +
		"master_replid2:385331d3d1af968ece8849a055375eeb85ce1f6d\r\nmaster_repl_offset:42\r\n" +
		"second_repl_offset:43\r\nrepl_backlog_active:0\r\n"
	infoReplica = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:17001\r\n" +
		"master_link_status:up\r\nslave_repl_offset:42\r\nconnected_slaves:0\r\n" +
		"master_replid:385331d3d1af968ece8849a055375eeb85ce1f6d\r\n" +
		"master_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:42\r\nsecond_repl_offset:-1\r\n"
)

func TestParseReplInfo(t *testing.T) {
	got, err := parseReplInfo(infoPrimary)
	if err != nil {
		t.Fatal(err)
	}
	want := replInfo{Role: "master", ReplID: "385331d3d1af968ece8849a055375eeb85ce1f6d", Offset: 50, SecondOffset: -1,
		Replicas: []replicaInfo{{Addr: "127.0.0.1:17002", State: "online", Offset: 42, Lag: time.Second}}}
	if !equalInfo(got, want) {
		t.Fatalf("primary:\n got %+v\nwant %+v", got, want)
	}
	got, err = parseReplInfo(infoPromoted)
	if err != nil {
		t.Fatal(err)
	}
	want = replInfo{Role: "master", ReplID: "855461f49d998ab28778d74b569aaf8bb2928a1a",
		ReplID2: "385331d3d1af968ece8849a055375eeb85ce1f6d", Offset: 42, SecondOffset: 43}
	if !equalInfo(got, want) {
		t.Fatalf("promoted:\n got %+v\nwant %+v", got, want)
	}
	got, err = parseReplInfo(infoReplica)
	if err != nil || got.Role != "slave" {
		t.Fatalf("replica: %+v, %v", got, err)
	}
	// A whole INFO reply: other sections are ignored.
	if got, err := parseReplInfo("# Server\nredis_version:7.0.15\nuptime_in_seconds:3\n\n" + infoPrimary); err != nil || got.Offset != 50 {
		t.Fatalf("whole INFO: %+v, %v", got, err)
	}
	for name, bad := range map[string]string{
		"empty":           "",
		"no role":         "master_replid:abc\nmaster_repl_offset:1\n",
		"master no id":    "role:master\nmaster_repl_offset:1\n",
		"master no off":   "role:master\nmaster_replid:abc\n",
		"negative offset": "role:master\nmaster_replid:abc\nmaster_repl_offset:-5\n",
		"bad offset":      "role:master\nmaster_replid:abc\nmaster_repl_offset:12x\n",
		"bad id":          "role:master\nmaster_replid:a b\nmaster_repl_offset:1\n",
		"bad second":      "role:master\nmaster_replid:abc\nmaster_repl_offset:1\nsecond_repl_offset:-7\n",
		"replica no off":  "role:master\nmaster_replid:abc\nmaster_repl_offset:1\nslave0:ip=h,port=1,state=online,lag=0\n",
		"replica bad lag": "role:master\nmaster_replid:abc\nmaster_repl_offset:1\nslave0:ip=h,port=1,state=online,offset=1,lag=-1\n",
		"replica garbage": "role:master\nmaster_replid:abc\nmaster_repl_offset:1\nslave0:nonsense\n",
	} {
		if _, err := parseReplInfo(bad); !errors.Is(err, errReplInfo) {
			t.Errorf("%s: err %v, want errReplInfo", name, err)
		}
	}
}

func equalInfo(a, b replInfo) bool {
	if a.Role != b.Role || a.ReplID != b.ReplID || a.ReplID2 != b.ReplID2 || a.Offset != b.Offset ||
		a.SecondOffset != b.SecondOffset || len(a.Replicas) != len(b.Replicas) {
		return false
	}
	for i := range a.Replicas {
		if a.Replicas[i] != b.Replicas[i] {
			return false
		}
	}
	return true
}

// master builds the INFO of a master with online replicas at offsets.
func master(id, id2 string, offset, second int64, replicas ...int64) replInfo {
	i := replInfo{Role: "master", ReplID: id, ReplID2: id2, Offset: offset, SecondOffset: second}
	for _, o := range replicas {
		i.Replicas = append(i.Replicas, replicaInfo{State: "online", Offset: o, Lag: 0})
	}
	return i
}

// TestReplStateSteps drives the history follower at fixed instants t0..t9.
func TestReplStateSteps(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		at     float64
		node   string
		info   *replInfo // nil: the poll failed
		cut    bool
		lag    float64 // lag gauge after the step (NaN: unknown)
		wantFn func(t *testing.T, c replCut)
	}
	ptr := func(i replInfo) *replInfo { return &i }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"promoted after a blackholed link", []step{
			{at: 0, node: "p", info: ptr(master("A", "", 100, -1, 100)), lag: 0},
			{at: 1, node: "p", info: ptr(master("A", "", 200, -1, 100)), lag: 1},
			{at: 2, node: "p", info: ptr(master("A", "", 300, -1, 100)), lag: 2},
			{at: 3, node: "p", lag: 2}, // the primary died
			{at: 4, node: "p", lag: 2},
			{at: 5, node: "p", info: ptr(master("B", "A", 100, 101)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				want := replCut{Kind: cutPromoted, Node: "p", OldID: "A", NewID: "B", Point: 100, LostBytes: 200,
					LossFrom: at(0), LossTo: at(3), LagSeen: 2 * time.Second, ID: "failover/B/100"}
				if c != want {
					t.Fatalf("cut\n got %+v\nwant %+v", c, want)
				}
				if c.Lag() != 3*time.Second {
					t.Fatalf("lag %v, want 3s", c.Lag())
				}
			}},
		}},
		{"promoted with part of the lag replicated", []step{
			{at: 0, node: "p", info: ptr(master("A", "", 100, -1, 100)), lag: 0},
			{at: 1, node: "p", info: ptr(master("A", "", 200, -1, 100)), lag: 1},
			{at: 2, node: "p", info: ptr(master("A", "", 300, -1, 100)), lag: 2},
			// The promoted replica had received up to 250, more than it acked.
			{at: 2.5, node: "p", info: ptr(master("B", "A", 250, 251)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				if c.LossFrom != at(1) || c.LossTo != at(2.5) || c.LostBytes != 50 {
					t.Fatalf("cut %+v: want loss from t1 to t2.5, 50 bytes", c)
				}
			}},
		}},
		{"a failed poll then recovery does not end the loss early", []step{
			{at: 0, node: "p", info: ptr(master("A", "", 100, -1, 100)), lag: 0},
			{at: 1, node: "p"},
			{at: 2, node: "p", info: ptr(master("A", "", 150, -1, 100)), lag: 2},
			{at: 3, node: "p", info: ptr(master("B", "A", 100, 101)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				if c.LossFrom != at(0) || c.LossTo != at(3) {
					t.Fatalf("cut %+v: want loss from t0 to t3", c)
				}
			}},
		}},
		{"rollback: same id, lower offset", []step{
			{at: 0, node: "p", info: ptr(master("A", "", 100, -1)), lag: math.NaN()},
			{at: 1, node: "p", info: ptr(master("A", "", 200, -1)), lag: math.NaN()},
			{at: 2, node: "p", info: ptr(master("A", "", 120, -1)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				if c.Kind != cutRollback || c.Point != 120 || c.LossFrom != at(0) || c.LostBytes != 80 || c.ID != "failover/A/120" {
					t.Fatalf("cut %+v", c)
				}
			}},
		}},
		{"unlinked: a restart", []step{
			{at: 0, node: "p", info: ptr(master("A", "", 100, -1, 100)), lag: 0},
			{at: 1, node: "p", info: ptr(master("A", "", 200, -1, 150)), lag: 1},
			{at: 2, node: "p", info: ptr(master("C", "", 0, -1)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				if c.Kind != cutUnlinked || c.Point != -1 || c.LossFrom != at(0) || c.LostBytes != -1 || c.ID != "failover/C/-1" {
					t.Fatalf("cut %+v", c)
				}
			}},
		}},
		{"a replica (role slave) is ignored", []step{
			{at: 0, node: "p", info: ptr(replInfo{Role: "slave", ReplID: "A"}), lag: 0},
			{at: 1, node: "p", info: ptr(master("A", "", 10, -1, 10)), lag: 0},
		}},
		{"cluster: a replica of one master is promoted at another address", []step{
			{at: 0, node: "n1", info: ptr(master("A", "", 100, -1, 100)), lag: 0},
			{at: 0, node: "n2", info: ptr(master("X", "", 500, -1, 500)), lag: 0},
			{at: 1, node: "n1", info: ptr(master("A", "", 180, -1, 100)), lag: 1},
			{at: 1, node: "n2", info: ptr(master("X", "", 500, -1, 500)), lag: 1},
			{at: 2, node: "n1", lag: 1},
			{at: 3, node: "n3", info: ptr(master("B", "A", 100, 101)), cut: true, lag: math.NaN(), wantFn: func(t *testing.T, c replCut) {
				if c.Kind != cutPromoted || c.Node != "n1" || c.LossFrom != at(0) || c.LossTo != at(2) {
					t.Fatalf("cut %+v", c)
				}
			}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s replState
			for i, st := range tc.steps {
				var c replCut
				var cut bool
				if st.info == nil {
					s.failed(at(st.at), st.node)
				} else {
					c, cut = s.observe(at(st.at), st.node, *st.info)
				}
				if cut != st.cut {
					t.Fatalf("step %d: cut %v, want %v (%+v)", i, cut, st.cut, c)
				}
				if st.wantFn != nil {
					st.wantFn(t, c)
				}
				lag, _ := s.lag()
				if !(lag == st.lag || math.IsNaN(lag) && math.IsNaN(st.lag)) {
					t.Fatalf("step %d: lag %v, want %v", i, lag, st.lag)
				}
			}
		})
	}
}

func TestReplStateForgetsGoneNodes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s replState
	s.observe(t0, "n1", master("A", "", 1, -1))
	s.observe(t0.Add(time.Minute), "n2", master("B", "", 1, -1))
	s.forget(t0.Add(30 * time.Second))
	if len(s.tracks) != 1 || s.tracks["n2"] == nil {
		t.Fatalf("tracks %v: want n2 only", s.tracks)
	}
}

func TestEstimateLoss(t *testing.T) {
	w0 := time.Unix(6000, 0)
	sec := func(s float64) time.Time { return w0.Add(time.Duration(s * float64(time.Second))) }
	promoted := func(from, to float64) replCut {
		c := replCut{Kind: cutPromoted, LossTo: sec(to)}
		if from >= 0 {
			c.LossFrom = sec(from)
		}
		return c
	}
	win := windowLoss{Start: w0, End: sec(60), Rate: 100}
	with := func(f func(*windowLoss)) windowLoss { w := win; f(&w); return w }
	for _, tc := range []struct {
		name          string
		c             replCut
		w             windowLoss
		est, observed int64
	}{
		{"lag x rate", promoted(10, 12), with(func(w *windowLoss) { w.Seen, w.SeenAt, w.After, w.Exists = 1200, sec(11.5), 1000, true }), 200, 200},
		{"rounds up", promoted(10, 10.001), with(func(w *windowLoss) { w.Seen, w.SeenAt = 5000, sec(10) }), 1, 0},
		{"observed above the lag estimate wins", promoted(10, 11), with(func(w *windowLoss) {
			w.Seen, w.SeenAt, w.After, w.Exists = 1500, sec(10.5), 1000, true
		}), 500, 500},
		{"capped by what the window spent", promoted(0, 30), with(func(w *windowLoss) { w.Seen, w.SeenAt = 300, sec(30) }), 300, 0},
		{"cap adds the spends after the last reading", promoted(0, 30), with(func(w *windowLoss) { w.Seen, w.SeenAt = 300, sec(29) }), 400, 0},
		{"unknown loss start covers the window from its start", promoted(-1, 5), win, 500, 0},
		{"loss before the window counts from its start", promoted(-10, 2), with(func(w *windowLoss) { w.Seen, w.SeenAt = 1000, sec(2) }), 200, 0},
		{"window ended before the loss", promoted(70, 72), with(func(w *windowLoss) { w.Seen, w.SeenAt = 1000, sec(59) }), 0, 0},
		{"window starts after the loss", promoted(-1, -0.5), win, 0, 0},
		{"no rate, nothing seen", promoted(10, 12), with(func(w *windowLoss) { w.Rate = 0 }), 0, 0},
		{"unlinked, bucket kept its count", replCut{Kind: cutUnlinked, LossTo: sec(12)},
			with(func(w *windowLoss) { w.Seen, w.SeenAt, w.After, w.Exists = 1000, sec(11), 1000, true }), 0, 0},
		{"unlinked, bucket gone (restart empty)", replCut{Kind: cutUnlinked, LossTo: sec(12)},
			with(func(w *windowLoss) { w.Seen, w.SeenAt, w.After, w.Exists = 1000, sec(11), 0, false }), 0, 0},
		{"unlinked, bucket has fewer spends (new leases after a restart?)", replCut{Kind: cutUnlinked, LossTo: sec(12)},
			with(func(w *windowLoss) { w.Seen, w.SeenAt, w.After, w.Exists = 1000, sec(11), 700, true }), 0, 300},
		{"unknown rate saturates", promoted(10, 12), with(func(w *windowLoss) { w.Rate = math.Inf(1) }), math.MaxInt64, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			est, obs := estimateLoss(tc.c, tc.w)
			if est != tc.est || obs != tc.observed {
				t.Fatalf("estimate %d observed %d, want %d and %d", est, obs, tc.est, tc.observed)
			}
		})
	}
}

func TestFailoverUsage(t *testing.T) {
	f := &failoverWatcher{rollback: map[failKey]*rollbackTotal{
		{"tenant/b", 3}: {tokens: 5},
		{"tenant/a", 7}: {tokens: 40},
		{"tenant/a", 6}: {tokens: 1},
	}}
	got := f.usage()
	want := []*pb.Usage{{LimitId: "tenant/a", WindowIndex: 6, RedisRollbackTokens: 1},
		{LimitId: "tenant/a", WindowIndex: 7, RedisRollbackTokens: 40}, {LimitId: "tenant/b", WindowIndex: 3, RedisRollbackTokens: 5}}
	if len(got) != len(want) {
		t.Fatalf("usage %v, want %v", got, want)
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("usage[%d] %v, want %v", i, got[i], want[i])
		}
	}
	if err := vocab.ValidateRequestID("reporter", failoverReporter); err != nil {
		t.Fatal(err)
	}
}

// prunedWatcher is a failover watcher of an agent with a key grace of a
// minute, its loops not running: for its pruning alone.
func prunedWatcher() *failoverWatcher {
	return newFailoverWatcher(&Agent{opt: options{keyGrace: time.Minute}})
}

// TestFailoverPruneFollowsEnds: the watcher forgets a window a key grace
// after its end, and the admit rate of a limit with no window left, at
// the first poll after that instant and not before: the earliest end it
// holds (pruneAt) moves to the next window, a rollback estimate's
// included.
func TestFailoverPruneFollowsEnds(t *testing.T) {
	f := prunedWatcher()
	t1 := time.Unix(1_800_000_000, 0)
	f.saw("t/short", 1, t1.Add(10*time.Second), 5, t1)
	f.saw("t/day", 1, t1.Add(24*time.Hour), 5, t1)
	f.rollback[failKey{"t/hour", 1}] = &rollbackTotal{tokens: 3, end: t1.Add(time.Hour)}
	f.holdUntil(t1.Add(time.Hour))
	f.reported[failKey{"t/hour", 1}] = 3
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruneLocked(t1.Add(69 * time.Second)) // 10 s + the grace: not yet
	if len(f.seen) != 2 || f.rates["t/short"] == nil {
		t.Fatalf("before the short window's end and grace: seen %v, rates %v; want both kept", f.seen, f.rates)
	}
	f.pruneLocked(t1.Add(71 * time.Second))
	if _, ok := f.seen[failKey{"t/short", 1}]; ok || len(f.seen) != 1 || f.rates["t/short"] != nil || f.rates["t/day"] == nil {
		t.Fatalf("after it: seen %v, rates %v; want the short window and its rate gone, the day's kept", f.seen, f.rates)
	}
	if !f.pruneAny || !f.pruneAt.Equal(t1.Add(time.Hour)) {
		t.Fatalf("pruneAt %v (%v), want the rollback's end, an hour on", f.pruneAt, f.pruneAny)
	}
	f.pruneLocked(t1.Add(time.Hour + 61*time.Second))
	if len(f.rollback) != 0 || len(f.reported) != 0 || len(f.seen) != 1 || !f.pruneAt.Equal(t1.Add(24*time.Hour)) {
		t.Fatalf("after the hour: rollback %v, reported %v, seen %v, pruneAt %v", f.rollback, f.reported, f.seen, f.pruneAt)
	}
	f.pruneLocked(t1.Add(25 * time.Hour))
	if len(f.seen) != 0 || len(f.rates) != 0 || f.pruneAny {
		t.Fatalf("after the day: seen %v, rates %v, pruneAny %v; want nothing held", f.seen, f.rates, f.pruneAny)
	}
}

// BenchmarkFailoverPrune is a watcher's prune at a poll while it holds
// 50,000 windows that end in a day (a day's limits, each seen once): the
// poll's cost with nothing to forget.
//
//	go test -run '^$' -bench BenchmarkFailoverPrune ./regionagent/
func BenchmarkFailoverPrune(b *testing.B) {
	f := prunedWatcher()
	t1 := time.Unix(1_800_000_000, 0)
	for i := range 50_000 {
		f.saw("t/"+strconv.Itoa(i), 1, t1.Add(24*time.Hour), 1, t1)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for b.Loop() {
		f.pruneLocked(t1.Add(time.Second))
	}
	if len(f.seen) != 50_000 {
		b.Fatalf("%d windows held, want 50,000", len(f.seen))
	}
}
