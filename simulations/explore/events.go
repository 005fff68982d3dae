package explore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kind is a kind of event.
type Kind uint8

// The events a trace is made of.
const (
	EvCheck        Kind = iota + 1 // a gateway's Check of one token at a replica
	EvAdvance                      // time moves to an instant (timers due on the way fire)
	EvServe                        // the allocator takes a copy of a call's request
	EvCommit                       // a batch of a leader term reaches etcd (or is fenced)
	EvDeliver                      // a call's answer reaches its replica
	EvDropRequest                  // a copy of a call's request is lost
	EvDropAnswer                   // a call's answer is lost
	EvRetry                        // the replica's client sends a call's request again (same request ids)
	EvFail                         // the replica's client gives a call up
	EvLeader                       // the allocator's leader is deposed; a new one rebuilds from etcd
	EvRedisDown                    // a region's Redis stops answering
	EvRedisUp                      // it answers again
	EvRedisTimeout                 // a region's Redis takes writes but its answers are lost, unnoticed
	EvRollback                     // a region's Redis fails over, losing what its replica had not copied
	EvLimit                        // G changes, at once everywhere
	EvRestart                      // an agent replica is killed and started again (not synced)
	EvSync                         // a restarted replica's first limit sync answers
)

var kindNames = map[Kind]string{EvCheck: "check", EvAdvance: "advance", EvServe: "serve", EvCommit: "commit",
	EvDeliver: "deliver", EvDropRequest: "drop-request", EvDropAnswer: "drop-answer", EvRetry: "retry", EvFail: "fail",
	EvLeader: "leader", EvRedisDown: "redis-down", EvRedisUp: "redis-up", EvRedisTimeout: "redis-timeout", EvRollback: "rollback", EvLimit: "limit", EvRestart: "restart", EvSync: "sync"}

// Event is one step of a trace. Its fields depend on Kind: Region and
// Replica for a Check, Region for Redis events, At (from t0) for an
// advance, Call for a call's events, N for a batch id or the new G.
type Event struct {
	Kind    Kind
	Region  int
	Replica int
	N       int64
	Call    string
	At      time.Duration
}

func (k Kind) onCall() bool {
	return k == EvServe || k == EvDeliver || k == EvDropRequest || k == EvDropAnswer || k == EvRetry || k == EvFail
}

func (e Event) String() string {
	name := kindNames[e.Kind]
	switch e.Kind {
	case EvCheck, EvRestart, EvSync:
		return fmt.Sprintf("%s %s/%d", name, regionNames[e.Region], e.Replica)
	case EvAdvance:
		return fmt.Sprintf("%s t0+%dms", name, e.At.Milliseconds())
	case EvRedisDown, EvRedisUp, EvRedisTimeout, EvRollback:
		return name + " " + regionNames[e.Region]
	case EvLeader:
		return name
	}
	if e.Kind.onCall() {
		return name + " " + e.Call
	}
	return fmt.Sprintf("%s %d", name, e.N)
}

// FormatTrace writes a trace as ParseTrace reads it: events separated by
// "; ".
func FormatTrace(tr []Event) string {
	s := make([]string, len(tr))
	for i, e := range tr {
		s[i] = e.String()
	}
	return strings.Join(s, "; ")
}

// ParseTrace reads a trace written by FormatTrace.
func ParseTrace(s string) ([]Event, error) {
	var out []Event
	for part := range strings.SplitSeq(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, arg, _ := strings.Cut(part, " ")
		k := Kind(0)
		for kk, n := range kindNames {
			if n == name {
				k = kk
			}
		}
		if k == 0 {
			return nil, fmt.Errorf("explore: unknown event %q", part)
		}
		e := Event{Kind: k}
		region := func(s string) (int, error) {
			i := slices.Index(regionNames[:], s)
			if i < 0 {
				return 0, fmt.Errorf("explore: %q: no region %q", part, s)
			}
			return i, nil
		}
		var err error
		switch k {
		case EvCheck, EvRestart, EvSync:
			r, rep, ok := strings.Cut(arg, "/")
			if !ok {
				return nil, fmt.Errorf("explore: %q: want region/replica", part)
			}
			if e.Region, err = region(r); err == nil {
				e.Replica, err = strconv.Atoi(rep)
			}
		case EvAdvance:
			var n int64
			n, err = strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(arg, "t0+"), "ms"), 10, 64)
			e.At = time.Duration(n) * time.Millisecond
		case EvRedisDown, EvRedisUp, EvRedisTimeout, EvRollback:
			e.Region, err = region(arg)
		case EvLeader:
		default:
			if k.onCall() {
				if r, n, ok := strings.Cut(arg, "#"); !ok || !strings.Contains(r, "-") || n == "" {
					err = fmt.Errorf("want a call id, replica#n")
				}
				e.Call = arg
				break
			}
			e.N, err = strconv.ParseInt(arg, 10, 64)
		}
		if err != nil {
			return nil, fmt.Errorf("explore: %q: %w", part, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// events lists the events possible in the state, in a fixed order.
func (w *world) events() []Event {
	var out []Event
	if w.left.checks > 0 {
		for ri, r := range w.regions {
			for i := range r.reps {
				out = append(out, Event{Kind: EvCheck, Region: ri, Replica: i})
			}
		}
	}
	for j, t := range w.instants() {
		if j == w.sc.instants() {
			break
		}
		out = append(out, Event{Kind: EvAdvance, At: t.Sub(t0)})
	}
	ids := make([]string, 0, len(w.calls))
	for id := range w.calls {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := w.calls[id]
		n := c.id
		if c.inflight > 0 {
			out = append(out, Event{Kind: EvServe, Call: n})
			if w.left.lose > 0 {
				out = append(out, Event{Kind: EvDropRequest, Call: n})
			}
		}
		if c.answering {
			out = append(out, Event{Kind: EvDeliver, Call: n})
			if w.left.lose > 0 {
				out = append(out, Event{Kind: EvDropAnswer, Call: n})
			}
		}
		if w.left.retry > 0 && !c.done {
			out = append(out, Event{Kind: EvRetry, Call: n})
		}
		if w.left.fail > 0 && !c.done {
			out = append(out, Event{Kind: EvFail, Call: n})
		}
	}
	for _, n := range append([]*allocNode{w.leader}, w.zombie...) {
		for _, b := range n.pending {
			out = append(out, Event{Kind: EvCommit, N: int64(b.id)})
		}
	}
	if w.left.leader > 0 {
		out = append(out, Event{Kind: EvLeader})
	}
	for ri, r := range w.regions {
		switch {
		case r.down:
			out = append(out, Event{Kind: EvRedisUp, Region: ri})
		case r.timeouts:
			out = append(out, Event{Kind: EvRedisUp, Region: ri}, Event{Kind: EvRedisDown, Region: ri})
		case w.left.outage > 0:
			out = append(out, Event{Kind: EvRedisDown, Region: ri}, Event{Kind: EvRedisTimeout, Region: ri})
		}
		if !r.down && !r.timeouts && w.left.rollback > 0 {
			out = append(out, Event{Kind: EvRollback, Region: ri})
		}
	}
	for ri, r := range w.regions {
		for i, rep := range r.reps {
			if !rep.core.IsSynced() {
				out = append(out, Event{Kind: EvSync, Region: ri, Replica: i})
			} else if w.left.restart > 0 {
				out = append(out, Event{Kind: EvRestart, Region: ri, Replica: i})
			}
		}
	}
	if w.left.limit > 0 {
		if g := w.limit.Tokens - 1; g >= 1 {
			out = append(out, Event{Kind: EvLimit, N: g})
		}
		out = append(out, Event{Kind: EvLimit, N: w.limit.Tokens + 1})
	}
	return out
}

// apply carries out one event; an event not possible in the state is an
// error (a replayed trace that does not fit its scope).
func (w *world) apply(e Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			w.fail("panic", "%s: %v", e, p)
		}
	}()
	if err := w.apply1(e); err != nil {
		return err
	}
	w.prune()
	return nil
}

func (w *world) apply1(e Event) error {
	bad := func() error { return fmt.Errorf("explore: %q is not possible here", e) }
	call := func() (*call, error) {
		c := w.calls[e.Call]
		if c == nil {
			return nil, bad()
		}
		return c, nil
	}
	switch e.Kind {
	case EvCheck:
		if w.left.checks == 0 || e.Region < 0 || e.Region > 1 || e.Replica < 0 || e.Replica >= len(w.regions[e.Region].reps) {
			return bad()
		}
		w.left.checks--
		w.check(e.Region, e.Replica)
	case EvAdvance:
		t := t0.Add(e.At)
		if !slices.ContainsFunc(w.instants(), t.Equal) {
			return bad()
		}
		w.advance(t)
	case EvServe, EvDropRequest:
		c, err := call()
		if err != nil || c.inflight == 0 || e.Kind == EvDropRequest && w.left.lose == 0 {
			return bad()
		}
		if e.Kind == EvServe {
			w.serve(c)
		} else {
			w.left.lose--
			c.inflight--
		}
	case EvDeliver, EvDropAnswer:
		c, err := call()
		if err != nil || !c.answering || e.Kind == EvDropAnswer && w.left.lose == 0 {
			return bad()
		}
		if e.Kind == EvDeliver {
			w.deliver(c)
		} else {
			w.left.lose--
			c.answering, c.needs = false, nil
		}
	case EvRetry:
		c, err := call()
		if err != nil || c.done || w.left.retry == 0 {
			return bad()
		}
		w.left.retry--
		c.inflight++
	case EvFail:
		c, err := call()
		if err != nil || c.done || w.left.fail == 0 {
			return bad()
		}
		w.left.fail--
		w.giveUp(c)
	case EvCommit:
		for _, n := range append([]*allocNode{w.leader}, w.zombie...) {
			for _, b := range n.pending {
				if int64(b.id) == e.N {
					w.commit(n, b)
					return nil
				}
			}
		}
		return bad()
	case EvLeader:
		if w.left.leader == 0 {
			return bad()
		}
		w.left.leader--
		w.elect()
	case EvRedisDown, EvRedisUp, EvRedisTimeout:
		if e.Region < 0 || e.Region > 1 {
			return bad()
		}
		r := w.regions[e.Region]
		healthy := !r.down && !r.timeouts
		switch {
		case e.Kind == EvRedisUp && healthy, e.Kind == EvRedisDown && r.down,
			e.Kind == EvRedisTimeout && !healthy, healthy && w.left.outage == 0:
			return bad()
		}
		if healthy {
			w.left.outage--
		}
		if e.Kind == EvRedisTimeout {
			r.timeouts = true // the replicas are not told
			return nil
		}
		if e.Kind == EvRedisUp && r.timeouts {
			r.timeouts = false // the replicas never noticed
			return nil
		}
		w.setRedis(e.Region, e.Kind == EvRedisUp)
	case EvRollback:
		if e.Region < 0 || e.Region > 1 || w.regions[e.Region].down || w.regions[e.Region].timeouts || w.left.rollback == 0 {
			return bad()
		}
		w.left.rollback--
		w.rollback(e.Region)
	case EvRestart, EvSync:
		if e.Region < 0 || e.Region > 1 || e.Replica < 0 || e.Replica >= len(w.regions[e.Region].reps) {
			return bad()
		}
		rep := w.regions[e.Region].reps[e.Replica]
		if e.Kind == EvSync {
			if rep.core.IsSynced() {
				return bad()
			}
			w.sync(rep)
			w.drain(e.Region, e.Replica)
			return nil
		}
		if w.left.restart == 0 || !rep.core.IsSynced() {
			return bad()
		}
		w.left.restart--
		w.restart(e.Region, e.Replica)
	case EvLimit:
		if w.left.limit == 0 || e.N < 1 || (e.N != w.limit.Tokens-1 && e.N != w.limit.Tokens+1) {
			return bad()
		}
		w.left.limit--
		w.changeLimit(e.N)
	default:
		return bad()
	}
	return nil
}
