package regionagent

import (
	"math"
	"strconv"
	"time"
)

// This file is the pure core of the failover watcher (failover.go): it
// follows each Redis primary's replication history from INFO samples,
// tells when a history was cut (a failover or a rollback), and estimates
// the spends a cut forgot. No I/O; time is an argument.

// Kinds of a cut replication history.
const (
	// cutPromoted: a replica of the primary we followed was promoted (its
	// master_replid2 is the old id); it holds the old history up to
	// second_repl_offset - 1, exactly.
	cutPromoted = "promoted"
	// cutRollback: the same replication id went back to a lower offset (a
	// primary restarted from an older snapshot that kept its id).
	cutRollback = "rollback"
	// cutUnlinked: a new replication id with no link to the old one: a
	// restart (usually empty: the missing-bucket handling covers it) or a
	// node whose history we never saw. What it holds is unknown; it is
	// counted and logged, not estimated.
	cutUnlinked = "unlinked"
)

// maxOffsetSamples bounds the samples a history keeps: at one poll a
// second, two minutes. A cut point older than that reads as unknown (the
// estimate then covers the whole window, capped by what was spent).
const maxOffsetSamples = 128

type offsetSample struct {
	at     time.Time
	offset int64
}

// replTrack follows one node's replication history (one master_replid).
type replTrack struct {
	node    string
	replid  string
	samples []offsetSample // oldest first
	// caughtUp is the newest sample time whose offset every online replica
	// had acknowledged: writes before it are replicated. Zero: none known.
	caughtUp   time.Time
	sawReplica bool      // an online replica was ever listed
	replicas   int       // online replicas at the last sample
	lastOK     time.Time // last successful sample
	failing    time.Time // first failed poll since lastOK; zero if none
}

// lag is the age of the oldest write not known to be replicated, at the
// last sample; -1 when unknown (no replica ever seen).
func (t *replTrack) lag() time.Duration {
	if t.caughtUp.IsZero() {
		return -1
	}
	return t.lastOK.Sub(t.caughtUp)
}

func (t *replTrack) lastOffset() int64 {
	if len(t.samples) == 0 {
		return 0
	}
	return t.samples[len(t.samples)-1].offset
}

// add records a sample of a master in this history.
func (t *replTrack) add(now time.Time, info replInfo) {
	if len(t.samples) == maxOffsetSamples {
		copy(t.samples, t.samples[1:])
		t.samples = t.samples[:len(t.samples)-1]
	}
	t.samples = append(t.samples, offsetSample{at: now, offset: info.Offset})
	t.lastOK, t.failing = now, time.Time{}
	// Acknowledged by every online replica: the least of their offsets.
	// Any online replica may be the one promoted, so the least is the
	// conservative choice; a replica still syncing has nothing to promote
	// (Sentinel does not pick it) and is ignored.
	acked, n := int64(-1), 0
	for _, r := range info.Replicas {
		if r.online() {
			if n == 0 || r.Offset < acked {
				acked = r.Offset
			}
			n++
		}
	}
	t.replicas = n
	if n == 0 {
		return // nothing replicates: caughtUp stays where it was
	}
	t.sawReplica = true
	if at, ok := t.newestAtOrBelow(acked); ok && at.After(t.caughtUp) {
		t.caughtUp = at
	}
}

// newestAtOrBelow returns the newest sample time whose offset is <= point.
func (t *replTrack) newestAtOrBelow(point int64) (time.Time, bool) {
	for i := len(t.samples) - 1; i >= 0; i-- {
		if t.samples[i].offset <= point {
			return t.samples[i].at, true
		}
	}
	return time.Time{}, false
}

// replCut is one cut replication history: writes made on the old primary
// between LossFrom and LossTo may be forgotten.
type replCut struct {
	Kind         string
	Node         string
	OldID, NewID string
	// Point is the replication offset of the old history the new primary
	// holds (-1: unknown).
	Point int64
	// LostBytes is the old history's last sampled offset minus Point: at
	// least this much of the replication stream was lost (-1: unknown).
	LostBytes int64
	// LossFrom: writes before it are kept. Zero: unknown (the estimate
	// then covers each window from its start).
	LossFrom time.Time
	// LossTo: no write reached the old primary after it. It is when polls
	// of the old primary started failing for good, or the detection.
	LossTo time.Time
	// LagSeen is the replication lag seen at the old primary's last good
	// sample (-1: unknown, no replica seen).
	LagSeen time.Duration
	// ID names the cut the same way on every agent replica, so the
	// compensation is applied once per bucket (a reservation id).
	ID string
}

// Lag is the span of writes the cut may have lost; -1 when LossFrom is
// unknown.
func (c replCut) Lag() time.Duration {
	if c.LossFrom.IsZero() {
		return -1
	}
	return max(0, c.LossTo.Sub(c.LossFrom))
}

// cut ends history t at now: the new primary holds it up to point (-1
// unknown).
func (t *replTrack) cut(now time.Time, kind, newID string, point int64) replCut {
	c := replCut{Kind: kind, Node: t.node, OldID: t.replid, NewID: newID, Point: point, LostBytes: -1,
		LossTo: now, LagSeen: t.lag()}
	if !t.failing.IsZero() {
		// The old primary stopped answering then and never answered again:
		// writes stopped reaching it too.
		c.LossTo = t.failing
	}
	switch {
	case point >= 0:
		c.LostBytes = max(0, t.lastOffset()-point)
		if at, ok := t.newestAtOrBelow(point); ok {
			c.LossFrom = at
		}
	default:
		c.LossFrom = t.caughtUp
	}
	if c.LossFrom.After(c.LossTo) {
		c.LossFrom = c.LossTo
	}
	c.ID = "failover/" + newID + "/" + strconv.FormatInt(max(-1, point), 10)
	return c
}

// replState follows the replication histories of a deployment's primaries
// (one for a standalone server or Sentinel, one per master on Cluster).
// Not safe for concurrent use; the watcher guards it.
type replState struct {
	tracks map[string]*replTrack // by node
}

// observe records a successful INFO of node at now and returns the cut
// it reveals, if any. A node that is not a master is ignored.
func (s *replState) observe(now time.Time, node string, info replInfo) (replCut, bool) {
	if info.Role != "master" {
		return replCut{}, false
	}
	if s.tracks == nil {
		s.tracks = map[string]*replTrack{}
	}
	t := s.tracks[node]
	if t != nil && t.replid == info.ReplID {
		if info.Offset >= t.lastOffset() {
			t.add(now, info)
			return replCut{}, false
		}
		c := t.cut(now, cutRollback, info.ReplID, info.Offset)
		s.tracks[node] = newTrack(now, node, info)
		return c, true
	}
	// A new history at this node. Promoted from one we follow?
	var prev *replTrack
	kind, point := cutUnlinked, int64(-1)
	if info.ReplID2 != "" {
		for _, o := range s.tracks {
			if o.replid == info.ReplID2 {
				prev, kind, point = o, cutPromoted, max(-1, info.SecondOffset-1)
				break
			}
		}
	}
	if prev == nil && t != nil {
		prev = t
	}
	if prev != nil && prev.node != node {
		delete(s.tracks, prev.node) // Cluster: the old master's node is gone
	}
	s.tracks[node] = newTrack(now, node, info)
	if prev == nil {
		return replCut{}, false // a node seen for the first time
	}
	return prev.cut(now, kind, info.ReplID, point), true
}

// failed records a failed INFO of node at now.
func (s *replState) failed(now time.Time, node string) {
	if t := s.tracks[node]; t != nil && t.failing.IsZero() {
		t.failing = now
	}
}

// forget drops histories of nodes not sampled since before; Cluster nodes
// that left.
func (s *replState) forget(before time.Time) {
	for n, t := range s.tracks {
		if t.lastOK.Before(before) && (t.failing.IsZero() || t.failing.Before(before)) {
			delete(s.tracks, n)
		}
	}
}

// lag is the largest lag over the followed primaries (NaN when one has
// no replica to measure against) and the fewest online replicas.
func (s *replState) lag() (seconds float64, replicas int) {
	replicas = -1
	for _, t := range s.tracks {
		l := t.lag()
		if l < 0 {
			seconds = math.NaN()
		} else if !math.IsNaN(seconds) {
			seconds = max(seconds, l.Seconds())
		}
		if replicas < 0 || t.replicas < replicas {
			replicas = t.replicas
		}
	}
	return seconds, max(0, replicas)
}

func newTrack(now time.Time, node string, info replInfo) *replTrack {
	t := &replTrack{node: node, replid: info.ReplID}
	t.add(now, info)
	return t
}

// windowLoss is what the estimate of one (limit, window) needs.
type windowLoss struct {
	// Start and End delimit the window on the agent's clock.
	Start, End time.Time
	// Rate is the region's admit rate for the limit just before the cut,
	// tokens per second (bucket admitted counts, all replicas).
	Rate float64
	// Seen is the largest admitted count read from the old primary for
	// this window, at SeenAt (zero: never read).
	Seen   int64
	SeenAt time.Time
	// After is the admitted count the new primary holds (-1: unknown);
	// Exists says whether the new primary holds the bucket at all.
	After  int64
	Exists bool
	// Ahead is how far past a write its tokens may be spent without
	// another: a chunk reserved in the lost span is spent from memory for
	// up to its horizon (the agent's ChunkConfig.Horizon; 0 without).
	Ahead time.Duration
}

// estimateLoss returns the spends of window w that cut c may have
// forgotten (the redis_rollback estimate) and the part of them measured
// directly (observed):
//
//	observed = Seen - After                 (counted on the old primary, gone on the new)
//	lagged   = ceil(Rate x |[LossFrom, LossTo + Ahead] ∩ window|)
//	spent    = Seen + ceil(Rate x (LossTo + Ahead - SeenAt))   (what the window can have spent)
//	estimate = max(observed, min(lagged, spent))
//
// An unlinked cut (a restart, a node of unknown history) estimates 0: it
// has no replication point to measure from, and a restarted Redis is the
// missing-bucket handling's case (a new bucket epoch), whose buckets may
// already hold new leases with fewer spends than were seen. observed is
// still returned, for the log.
func estimateLoss(c replCut, w windowLoss) (estimate, observed int64) {
	if w.Exists && w.After >= 0 && w.Seen > w.After {
		observed = w.Seen - w.After
	}
	if c.Kind == cutUnlinked {
		return 0, observed
	}
	from := c.LossFrom
	if from.IsZero() || from.Before(w.Start) {
		from = w.Start
	}
	to := minTime(c.LossTo.Add(max(0, w.Ahead)), w.End)
	var tail int64 // spends after the last reading, up to the cut
	if !w.SeenAt.IsZero() {
		tail = tokensIn(w.Rate, to.Sub(maxTime(w.SeenAt, w.Start)))
	}
	spent := tokensIn(w.Rate, to.Sub(w.Start)) // never read: the rate over the window so far
	if !w.SeenAt.IsZero() {
		spent = addSat(w.Seen, tail)
	}
	lagged := tokensIn(w.Rate, to.Sub(from))
	return max(observed, min(lagged, spent)), observed
}

// tokensIn is ceil(rate x d), 0 for d <= 0 or rate <= 0, saturating (an
// unknown rate, NaN or +Inf, saturates like overshoot's estimate).
func tokensIn(rate float64, d time.Duration) int64 {
	if d <= 0 || !(rate > 0) && !math.IsNaN(rate) {
		return 0
	}
	x := float64(d) * rate / float64(time.Second)
	if math.IsNaN(x) || x >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Ceil(x))
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
