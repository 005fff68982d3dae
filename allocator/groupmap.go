package allocator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	clientv3 "go.etcd.io/etcd/client/v3"

	"leasehold/internal/groupmap"
	"leasehold/internal/limitspec"
)

// DefaultGroupMapKey is where the map of allocator groups is stored, in
// the etcd cluster every group can read (one cluster's, named by each
// allocator's group-map endpoints).
const DefaultGroupMapKey = "/leasehold/groupmap"

// DefaultMapNotice is how far ahead of the windows it governs a new map
// version is written: it must reach every agent (they re-read the map with
// their limit sync, every second, and fetch a next window's lease a few
// seconds ahead) and every allocator before it governs.
const DefaultMapNotice = 30 * time.Second

// MapStore keeps the group map in etcd under one key. Every change is a
// compare-and-swap on the key's revision, so two concurrent changes never
// both apply: the second sees ErrMapChanged and must read again.
type MapStore struct {
	cli *clientv3.Client
	key string
}

// NewMapStore returns the map store at key (DefaultGroupMapKey if empty).
func NewMapStore(cli *clientv3.Client, key string) *MapStore {
	if key == "" {
		key = DefaultGroupMapKey
	}
	return &MapStore{cli: cli, key: key}
}

// ErrMapChanged: the map changed since it was read.
var ErrMapChanged = errors.New("allocator: the group map changed since it was read; read it again")

// Get reads the map and the revision it was stored at (0 and an empty map
// when there is none).
func (s *MapStore) Get(ctx context.Context) (groupmap.Map, int64, error) {
	resp, err := s.cli.Get(ctx, s.key)
	if err != nil {
		return groupmap.Map{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return groupmap.Map{}, 0, nil
	}
	m, err := groupmap.Decode(resp.Kvs[0].Value)
	if err != nil {
		return groupmap.Map{}, 0, fmt.Errorf("allocator: stored group map at %s: %w", s.key, err)
	}
	return m, resp.Kvs[0].ModRevision, nil
}

// Change adds a version made of change to the map read at rev (0: none
// stored), effective notice after now, and stores it if the map is still
// at rev. It returns the new map and its revision.
func (s *MapStore) Change(ctx context.Context, rev int64, cur groupmap.Map, now time.Time, notice time.Duration, change groupmap.Change) (groupmap.Map, int64, error) {
	next, err := cur.Next(now, notice, limitspec.MaxWindow, change)
	if err != nil {
		return groupmap.Map{}, 0, err
	}
	b, err := groupmap.Encode(next)
	if err != nil {
		return groupmap.Map{}, 0, err
	}
	cmp := clientv3.Compare(clientv3.ModRevision(s.key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)
	}
	resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(s.key, string(b))).Commit()
	if err != nil {
		return groupmap.Map{}, 0, err
	}
	if !resp.Succeeded {
		return groupmap.Map{}, 0, ErrMapChanged
	}
	return next, resp.Header.Revision, nil
}

// MapView is a group map kept current from etcd by a watch: what an
// allocator of a group consults on every grant. Safe for concurrent use.
type MapView struct {
	store *MapStore

	mu      sync.RWMutex // protects m, rev, changed
	m       groupmap.Map
	rev     int64
	changed chan struct{} // closed and replaced when m changes
}

// NewMapView reads the map once; Run keeps it current.
func NewMapView(ctx context.Context, store *MapStore) (*MapView, error) {
	m, rev, err := store.Get(ctx)
	if err != nil {
		return nil, err
	}
	return &MapView{store: store, m: m, rev: rev, changed: make(chan struct{})}, nil
}

// Map returns the current map and its revision.
func (v *MapView) Map() (groupmap.Map, int64) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.m, v.rev
}

// Owner names the group that owns limit's window starting at start (ok
// false while no map is stored).
func (v *MapView) Owner(limit string, start time.Time) (group string, version int64, ok bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.m.Owner(limit, start)
}

// set installs a map read at rev unless a newer one is installed.
func (v *MapView) set(m groupmap.Map, rev int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rev > v.rev {
		v.m, v.rev = m, rev
		close(v.changed)
		v.changed = make(chan struct{})
	}
}

// Wait returns once the view holds the map stored at revision rev or a
// later one, or ctx's error.
func (v *MapView) Wait(ctx context.Context, rev int64) error {
	for {
		v.mu.RLock()
		cur, ch := v.rev, v.changed
		v.mu.RUnlock()
		if cur >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run watches the map's key until ctx ends, re-reading it whenever the
// watch breaks. A stored value that does not decode is logged by the
// caller's onError and ignored (the view keeps the last good map).
func (v *MapView) Run(ctx context.Context, onError func(error)) {
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for ctx.Err() == nil {
		m, rev, err := v.store.Get(ctx)
		if err != nil {
			onError(err)
			select {
			case <-ctx.Done():
			case <-time.After(bo.NextBackOff()):
			}
			continue
		}
		v.set(m, rev)
		wch := v.store.cli.Watch(clientv3.WithRequireLeader(ctx), v.store.key, clientv3.WithRev(rev+1))
		for resp := range wch {
			if resp.Err() != nil {
				onError(resp.Err())
				break
			}
			bo.Reset()
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				m, err := groupmap.Decode(ev.Kv.Value)
				if err != nil {
					onError(fmt.Errorf("allocator: stored group map at %s: %w", v.store.key, err))
					continue
				}
				v.set(m, ev.Kv.ModRevision)
			}
		}
		select { // the watch ended (no etcd leader): read again
		case <-ctx.Done():
		case <-time.After(bo.NextBackOff()):
		}
	}
}
