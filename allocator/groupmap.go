package allocator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/allocator/auth"
	"leasehold/internal/groupmap"
	"leasehold/internal/limitspec"
	"leasehold/internal/planbind"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// DefaultGroupMapKey is where the map of allocator groups is stored, in
// the etcd cluster every group can read (one cluster's, named by each
// allocator's group-map endpoints).
const DefaultGroupMapKey = "/leasehold/groupmap"

// DefaultMapNotice is how far ahead of the windows it governs a new map
// version is written: it must reach every agent (they re-read the map with
// their limit sync, every second, and fetch a next window's lease a few
// seconds ahead) and every allocator before it governs. Half of it is the
// margin for the writer's clock against an allocator's (MapView).
const DefaultMapNotice = 30 * time.Second

// MapStore keeps the group map in etcd under one key. Every change is a
// compare-and-swap on the key's revision, so two concurrent changes never
// both apply: the second sees ErrMapChanged and must read again.
type MapStore struct {
	cli    *clientv3.Client
	key    string
	notice time.Duration
}

// NewMapStore returns the map store at key (DefaultGroupMapKey if empty)
// whose new versions govern notice after they are written
// (DefaultMapNotice if <= 0). Every writer and every view of one map must
// use the same notice: a view's horizon rests on it.
func NewMapStore(cli *clientv3.Client, key string, notice time.Duration) *MapStore {
	if key == "" {
		key = DefaultGroupMapKey
	}
	if notice <= 0 {
		notice = DefaultMapNotice
	}
	return &MapStore{cli: cli, key: key, notice: notice}
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
// stored), effective the store's notice after now, and stores it if the
// map is still at rev. It returns the new map and its revision.
func (s *MapStore) Change(ctx context.Context, rev int64, cur groupmap.Map, now time.Time, change groupmap.Change) (groupmap.Map, int64, error) {
	next, err := cur.Next(now, s.notice, limitspec.LongestWindow, change)
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

// MapView is a group map kept current from etcd: what an allocator of a
// group consults on every grant. It re-reads the map every poll interval
// and knows how fresh its copy is: a version it has not seen was written
// after its last read was sent, so it governs only windows that start at
// least the store's notice after that (less a margin for the writer's
// clock). Owner answers only for windows that start before that horizon;
// for a later one it does not know, and the group must not grant it. A
// view that cannot reach etcd therefore stops owning windows one notice
// after its last read: never two owners. Safe for concurrent use.
type MapView struct {
	store *MapStore
	now   func() time.Time

	mu      sync.RWMutex // protects m, rev, sent, changed
	m       groupmap.Map
	rev     int64
	sent    time.Time     // when the newest successful read was sent
	changed chan struct{} // closed and replaced after every successful read
}

// NewMapView reads the map once (now is the allocator's clock); Run keeps
// it current.
func NewMapView(ctx context.Context, store *MapStore, now func() time.Time) (*MapView, error) {
	v := &MapView{store: store, now: now, changed: make(chan struct{})}
	if err := v.read(ctx); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *MapView) read(ctx context.Context) error {
	sent := v.now()
	m, rev, err := v.store.Get(ctx)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if rev >= v.rev {
		v.m, v.rev = m, rev
	}
	if sent.After(v.sent) {
		v.sent = sent
	}
	close(v.changed)
	v.changed = make(chan struct{})
	return nil
}

// Map returns the current map and its revision.
func (v *MapView) Map() (groupmap.Map, int64) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.m, v.rev
}

// Horizon is the first window start the view cannot answer for: windows
// starting before it are owned as the view's map says.
func (v *MapView) Horizon() time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.sent.Add(v.store.notice / 2)
}

// Owner names the group that owns limit's window starting at start. ok is
// false while no map is stored, and for a window starting at or after the
// horizon (the view is not fresh enough to say).
func (v *MapView) Owner(limit string, start time.Time) (group string, version int64, ok bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !start.Before(v.sent.Add(v.store.notice / 2)) {
		return "", 0, false
	}
	return v.m.Owner(limit, start)
}

// Wait returns once the view has read the map stored at revision rev or a
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

// WaitRead returns once a read sent at or after at (the view's clock) has
// succeeded, or ctx's error: after it, the horizon is at least at +
// half the notice.
func (v *MapView) WaitRead(ctx context.Context, at time.Time) error {
	for {
		v.mu.RLock()
		sent, ch := v.sent, v.changed
		v.mu.RUnlock()
		if !sent.Before(at) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run re-reads the map every poll interval until ctx ends (after a failed
// read, with exponential backoff up to the interval), telling report the
// outcome of every read (nil: read). After a failed read (etcd not
// answering, or a stored value that does not decode) the view keeps its
// last good map, and its horizon stops moving.
func (v *MapView) Run(ctx context.Context, poll time.Duration, report func(error)) {
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(min(100*time.Millisecond, poll)),
		backoff.WithMaxInterval(poll), backoff.WithMaxElapsedTime(0))
	for {
		wait := poll
		// A read may take longer than the poll interval on a loaded etcd:
		// it is what moves the horizon, so it gets time to finish.
		rctx, cancel := context.WithTimeout(ctx, max(poll, 5*time.Second))
		err := v.read(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		report(err)
		if err != nil {
			wait = bo.NextBackOff()
		} else {
			bo.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// WaitGroupMap returns once this allocator has read the group map at
// revision rev or later (at once without groups), or ctx's error: what a
// caller that just wrote the map waits for before it writes a limit here.
func (a *Allocator) WaitGroupMap(ctx context.Context, rev int64) error {
	if a.opt.groupView == nil {
		return nil
	}
	return a.opt.groupView.Wait(ctx, rev)
}

// addGroupMap names this allocator's group in a sync answer and adds the
// group map when the caller's is older (nothing without groups).
func (a *Allocator) addGroupMap(out *pb.SyncLimitsResponse, known int64) error {
	if a.opt.groupView == nil {
		return nil
	}
	out.Group = a.opt.group
	m, rev := a.opt.groupView.Map()
	if rev == known {
		return nil
	}
	b, err := groupmap.Encode(m)
	if err != nil {
		return err
	}
	out.GroupMap, out.GroupMapRevision = b, rev
	return nil
}

// WrongGroupError refuses an admin call about a limit another allocator
// group owns: it is read and written where it lives. Group and Allocator
// (the first of its addresses) name the owner; the gRPC status is
// FAILED_PRECONDITION with both in trailers, which quotactl follows.
type WrongGroupError struct {
	Limit, Group, Allocator string
}

func (e *WrongGroupError) Error() string {
	return fmt.Sprintf("limit %q lives in allocator group %q (%s), not here: ask it there", e.Limit, e.Group, e.Allocator)
}

// writableHere refuses a change of a limit that the newest version of the
// group map gives to another group (nil without groups). A limit that is
// moving is changed at its new group as soon as the move is written: its
// old group keeps its record only for the windows already in progress.
func (a *Allocator) writableHere(limit string) error {
	if a.opt.groupView == nil || planbind.IsPlan(limit) {
		return nil // a plan is written to, and read from, every group
	}
	m, _ := a.opt.groupView.Map()
	if len(m.Versions) == 0 {
		return &WrongGroupError{Limit: limit, Group: "", Allocator: "(no group map is stored yet)"}
	}
	v := m.Current()
	if owner := v.Owner(limit); owner != a.opt.group {
		g, _ := v.Group(owner)
		return &WrongGroupError{Limit: limit, Group: owner, Allocator: firstOf(g.Allocators)}
	}
	return nil
}

// elsewhere names the group a limit this group does not hold lives in
// (nil when it is this group's, or without groups): reads of a limit that
// is not here are sent there.
func (a *Allocator) elsewhere(limit string) error {
	if err := a.writableHere(limit); err != nil {
		var wg *WrongGroupError
		if errors.As(err, &wg) && wg.Group != "" {
			return err
		}
	}
	return nil
}

// ownedHere reports whether the newest version of the group map gives
// limit to this group (true without groups): what ListLimits lists.
func (a *Allocator) ownedHere(limit string) bool { return a.writableHere(limit) == nil }

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// errNoGroups refuses a group map call on an allocator that is not one of
// several groups.
var errNoGroups = status.Error(codes.FailedPrecondition,
	"this allocator is not one of several allocator groups (leasehold allocator -group): there is no group map")

// GetGroupMap implements pb.AdminServer.
func (s *Server) GetGroupMap(ctx context.Context, _ *pb.GetGroupMapRequest) (*pb.GetGroupMapResponse, error) {
	if _, err := s.allow(ctx, "GetGroupMap", auth.ActionRead, ""); err != nil {
		return nil, toStatus(ctx, err)
	}
	out := &pb.GetGroupMapResponse{Leader: s.a.Leader()}
	if s.a.opt.groupView == nil {
		return out, nil
	}
	out.Group = s.a.opt.group
	m, rev := s.a.opt.groupView.Map()
	if rev > 0 {
		b, err := groupmap.Encode(m)
		if err != nil {
			return nil, toStatus(ctx, err)
		}
		out.Map, out.Revision = b, rev
	}
	return out, nil
}

// ChangeGroupMap implements pb.AdminServer (admins only).
func (s *Server) ChangeGroupMap(ctx context.Context, req *pb.ChangeGroupMapRequest) (*pb.ChangeGroupMapResponse, error) {
	p, err := s.allow(ctx, "ChangeGroupMap", auth.ActionGroups, "")
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if s.a.opt.groupView == nil {
		return nil, errNoGroups
	}
	if len(req.GetGroups()) > groupmap.MaxGroups || len(req.GetPlace()) > groupmap.MaxPlacements || len(req.GetUnplace()) > groupmap.MaxPlacements {
		return nil, toStatus(ctx, fieldErr("groups", "at most %d groups and %d placements", groupmap.MaxGroups, groupmap.MaxPlacements))
	}
	change := groupmap.Change{Place: req.GetPlace(), Unplace: req.GetUnplace(), Reason: req.GetReason()}
	for _, g := range req.GetGroups() {
		change.Groups = append(change.Groups, groupmap.Group{Name: g.GetName(), Allocators: g.GetAllocators()})
	}
	store := s.a.opt.groupView.store
	cur, rev, err := store.Get(ctx)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if rev != req.GetExpectedRevision() {
		return nil, toStatus(ctx, fmt.Errorf("%w: the group map is at revision %d, not %d", ErrMapChanged, rev, req.GetExpectedRevision()))
	}
	m, nrev, err := store.Change(ctx, rev, cur, s.a.opt.now(), change)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	_ = s.a.opt.groupView.read(ctx) // this group knows the new version at once
	v := m.Current()
	s.a.log.Info("allocator: group map changed", "principal", p.Name, "version", v.Number, "from", v.From,
		"groups", len(v.Groups), "placements", len(v.Place), "reason", vocab.Cap(v.Reason, 200))
	b, err := groupmap.Encode(m)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &pb.ChangeGroupMapResponse{Map: b, Revision: nrev}, nil
}
