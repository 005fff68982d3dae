package regionagent

import (
	"sync"
	"time"

	pb "leasehold/proto/leasehold/v1"
)

// limitView is what the agent needs of a limit, for its own region.
type limitView struct {
	id       string
	tokens   int64
	window   time.Duration
	ttl      time.Duration
	mode     pb.Mode
	fallback *pb.Fallback // never nil; CLOSED by default
	version  int64
	regions  int
}

// prior is the demand assumed for a limit before any is observed: the
// contract rate G/W shared by its regions. It sizes only the first lease.
func (l *limitView) prior() float64 {
	return float64(l.tokens) / l.window.Seconds() / float64(max(1, l.regions))
}

func viewOf(l *pb.Limit, region string) *limitView {
	fb := l.Fallback[region]
	if fb == nil {
		fb = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}
	}
	return &limitView{
		id:       l.Id,
		tokens:   l.LimitTokens,
		window:   l.Window.AsDuration(),
		ttl:      l.GetLease().GetTtl().AsDuration(),
		mode:     l.Mode,
		fallback: fb,
		version:  l.Version,
		regions:  len(l.Regions),
	}
}

// limitCache holds the limits of the region, replaced whole on each sync.
// Safe for concurrent use.
type limitCache struct {
	mu       sync.RWMutex // protects limits, revision
	limits   map[string]*limitView
	revision int64
	synced   chan struct{} // closed after the first successful sync
	once     sync.Once
}

func newLimitCache() *limitCache {
	return &limitCache{limits: map[string]*limitView{}, synced: make(chan struct{})}
}

func (c *limitCache) get(id string) *limitView {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.limits[id]
}

func (c *limitCache) replace(rev int64, ls []*pb.Limit, region string) {
	m := make(map[string]*limitView, len(ls))
	for _, l := range ls {
		m[l.Id] = viewOf(l, region)
	}
	c.mu.Lock()
	c.limits, c.revision = m, rev
	c.mu.Unlock()
	c.once.Do(func() { close(c.synced) })
}

func (c *limitCache) rev() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.revision
}

func (c *limitCache) markSynced() { c.once.Do(func() { close(c.synced) }) }
