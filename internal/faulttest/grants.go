package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// GrantsPrefix is where the allocator (default --etcd-prefix) writes its
// grant records.
const GrantsPrefix = "/leasehold/grants/"

// GrantRecord is the part of an allocator grant record (JSON in etcd) the
// checks use.
type GrantRecord struct {
	LeaseID   string `json:"id"`
	Limit     string `json:"limit"`
	Region    string `json:"region"`
	RequestID string `json:"req"`
	Window    int64  `json:"w"`
	Tokens    int64  `json:"n"`
	GrantedAt int64  `json:"at"` // unix ns, allocator clock
	Returned  bool   `json:"ret"`
	Unspent   int64  `json:"un"`
	Credited  int64  `json:"cr"`

	Key      string    `json:"-"`
	Seen     time.Time `json:"-"` // when the test first saw the record
	Revision int64     `json:"-"` // etcd revision that created it
}

// GrantLog watches the grant records in etcd from its start and keeps
// every version of every record, so that a grant overwritten by a second
// one (same key, other tokens) or a request id granted under two keys is
// caught even if retention later deletes the records.
type GrantLog struct {
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex                 // protects the fields below
	first    map[string]GrantRecord     // by key: the record as first written
	latest   map[string]GrantRecord     // by key: the newest version
	problems []string                   // inconsistent versions of one key
	byReq    map[string]map[string]bool // "limit|region|req" -> keys
}

// WatchGrants connects to etcd at endpoints and records grant records
// from now on (records already there are loaded first).
func WatchGrants(t testing.TB, endpoints []string) *GrantLog {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("faulttest: etcd client: %v", err)
	}
	g := &GrantLog{cli: cli, done: make(chan struct{}), first: map[string]GrantRecord{},
		latest: map[string]GrantRecord{}, byReq: map[string]map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := cli.Get(gctx, GrantsPrefix, clientv3.WithPrefix())
	gcancel()
	if err != nil {
		cancel()
		cli.Close()
		t.Fatalf("faulttest: read grants: %v", err)
	}
	for _, kv := range resp.Kvs {
		g.add(string(kv.Key), kv.Value, kv.CreateRevision)
	}
	go g.watch(ctx, resp.Header.Revision+1)
	t.Cleanup(g.Close)
	return g
}

func (g *GrantLog) watch(ctx context.Context, rev int64) {
	defer close(g.done)
	// A watch survives member failures (the client moves to another
	// member) and a quorum loss (events resume when it returns).
	for ctx.Err() == nil {
		wch := g.cli.Watch(clientv3.WithRequireLeader(ctx), GrantsPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					g.add(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision)
				}
				rev = ev.Kv.ModRevision + 1
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // watch ended (no leader): try again
		}
	}
}

func (g *GrantLog) add(key string, value []byte, createRev int64) {
	var r GrantRecord
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := json.Unmarshal(value, &r); err != nil {
		g.problems = append(g.problems, fmt.Sprintf("%s: not a grant record: %v", key, err))
		return
	}
	r.Key, r.Seen, r.Revision = key, time.Now(), createRev
	if f, ok := g.first[key]; ok {
		if f.LeaseID != r.LeaseID || f.Tokens != r.Tokens || f.Window != r.Window || f.RequestID != r.RequestID ||
			f.Revision != r.Revision {
			g.problems = append(g.problems, fmt.Sprintf("%s rewritten as another grant: first %+v, now %+v", key, f, r))
		}
		r.Seen = f.Seen
		g.latest[key] = r
		return
	}
	g.first[key], g.latest[key] = r, r
	rk := r.Limit + "|" + r.Region + "|" + r.RequestID
	if g.byReq[rk] == nil {
		g.byReq[rk] = map[string]bool{}
	}
	g.byReq[rk][key] = true
}

// Records returns the newest version of every grant record seen, oldest
// grant first.
func (g *GrantLog) Records() []GrantRecord {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]GrantRecord, 0, len(g.latest))
	for _, r := range g.latest {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out
}

// Duplicates lists every violation of "one request id, one lease": a key
// rewritten as another grant, a request id granted under several keys, a
// lease id used twice.
func (g *GrantLog) Duplicates() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := append([]string(nil), g.problems...)
	for rk, keys := range g.byReq {
		if len(keys) > 1 {
			ks := make([]string, 0, len(keys))
			for k := range keys {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			out = append(out, fmt.Sprintf("request %s granted %d leases: %s", rk, len(keys), strings.Join(ks, ", ")))
		}
	}
	ids := map[string]string{}
	for k, r := range g.first {
		if o, ok := ids[r.LeaseID]; ok {
			out = append(out, fmt.Sprintf("lease id %s under two keys: %s and %s", r.LeaseID, o, k))
		}
		ids[r.LeaseID] = k
	}
	sort.Strings(out)
	return out
}

// WindowGrants sums one limit's records per window: tokens granted, and
// unspent tokens credited back while the window was open.
type WindowGrants struct {
	Grants   int
	Granted  int64
	Credited int64
	// PerRegion is granted minus unspent-at-return per region: the most a
	// region's leases could have admitted.
	PerRegion map[string]int64
}

// ByWindow sums the records of limit per window.
func (g *GrantLog) ByWindow(limit string) map[int64]*WindowGrants {
	out := map[int64]*WindowGrants{}
	for _, r := range g.Records() {
		if r.Limit != limit {
			continue
		}
		w := out[r.Window]
		if w == nil {
			w = &WindowGrants{PerRegion: map[string]int64{}}
			out[r.Window] = w
		}
		w.Grants++
		w.Granted += r.Tokens
		w.Credited += r.Credited
		spendable := r.Tokens
		if r.Returned {
			spendable -= r.Unspent
		}
		w.PerRegion[r.Region] += spendable
	}
	return out
}

// SyncNow reads the grant prefix once more and merges it (a final read
// after the watch may lag). It fails the test if etcd cannot answer.
func (g *GrantLog) SyncNow(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := g.cli.Get(ctx, GrantsPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("faulttest: read grants: %v", err)
	}
	for _, kv := range resp.Kvs {
		g.add(string(kv.Key), kv.Value, kv.CreateRevision)
	}
}

// Close stops the watch.
func (g *GrantLog) Close() {
	g.cancel()
	<-g.done
	g.cli.Close()
}
