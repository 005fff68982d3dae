package overshoot

// A naive reference model of one (limit, window): a history of events
// replayed by a brute-force simulator that tracks every token one by one.
// The property tests in quick_test.go generate histories that obey the
// system's rules, replay them, and hold the admitted tokens the simulator
// counted against Compute of the Window the history reports.

import (
	"fmt"
	"math/rand"
	"reflect"
	"time"
)

// evKind is what happened.
type evKind int

const (
	evGrant         evKind = iota // allocator grants n tokens to region
	evReturn                      // region closes leases, n unspent tokens credited back
	evSpend                       // region admits n tokens from its leases
	evFallbackOn                  // region cannot get leases: enters its fallback
	evFallbackOff                 // region gets leases again
	evFallbackAdmit               // region admits n tokens under fallback
	evFailover                    // region's Redis fails over, the last n spends are lost
	evLimit                       // G becomes n
	evCarryIn                     // a lease of n tokens from the previous window reaches region
	evStrand                      // region's Redis goes down: its balance is lost for the window
	evSettleOver                  // a settle-later decision of region costs n more than its window's leases hold
)

// event is one step of a history. Fields unused by a kind are zero.
type event struct {
	kind     evKind
	region   int
	n        int64 // tokens, or the new G for evLimit
	lagMS    int64 // evFailover: replication lag in milliseconds
	rate     int64 // evFailover: the region's admit rate, tokens/s
	measured bool  // evFailover: the agent measured the lost spends
}

// regionConf is a region's fixed configuration.
type regionConf struct {
	name      string
	fallback  FallbackMode // FallbackClosed, FallbackLocal or FallbackOpen
	allowance int64        // A, for FallbackLocal
}

// history is everything that happened to one limit in one window.
type history struct {
	g0      int64 // G at the window's start
	regions []regionConf
	events  []event
}

// outcome is what the brute-force replay counted.
type outcome struct {
	w        Window // what the allocator and agents report
	admitted int64  // every admission, lease or fallback, counted one by one
}

// tok is one token the region holds or has spent.
type tok struct {
	id      int
	carried bool // from a lease of the previous window
	admits  int  // times admitted
	lost    int  // times its spend was forgotten by a Redis failover
}

// regionSim is one region's state in the replay.
type regionSim struct {
	balance          []*tok // tokens Redis believes unspent
	spendLog         []*tok // spends in order; the tail may be lost in a failover
	in               bool   // currently in fallback
	entered          bool   // entered fallback at least once
	leaseAdmitted    int64
	fallbackAdmitted int64
	settleOver       int64
	failovers        []Failover
}

// replay runs h token by token. It returns an error when h breaks one of the
// system's rules: then h is not a history the system can produce.
func replay(h history) (outcome, error) {
	var (
		g, atGrant                 = h.g0, int64(0)
		granted, returned, carried int64
		nextID                     int
		fallbackTotal, settleTotal int64
		all                        []*tok
		rs                         = make([]regionSim, len(h.regions))
	)
	newTokens := func(n int64, carried bool) []*tok {
		ts := make([]*tok, n)
		for i := range ts {
			nextID++
			ts[i] = &tok{id: nextID, carried: carried}
			all = append(all, ts[i])
		}
		return ts
	}
	for i, e := range h.events {
		if e.kind != evLimit && (e.region < 0 || e.region >= len(rs)) {
			return outcome{}, fmt.Errorf("event %d: no region %d", i, e.region)
		}
		if e.n < 0 {
			return outcome{}, fmt.Errorf("event %d: negative n", i)
		}
		var (
			r    *regionSim
			conf regionConf
		)
		if e.kind != evLimit {
			r, conf = &rs[e.region], h.regions[e.region]
		}
		switch e.kind {
		case evGrant:
			// Invariant 1: a grant never exceeds the pool at grant time.
			if pool := max(0, g-granted+returned); e.n > pool {
				return outcome{}, fmt.Errorf("event %d: grant %d > pool %d", i, e.n, pool)
			}
			granted += e.n
			atGrant = max(atGrant, g)
			r.balance = append(r.balance, newTokens(e.n, false)...)
		case evReturn:
			if e.n > int64(len(r.balance)) {
				return outcome{}, fmt.Errorf("event %d: return %d > balance %d", i, e.n, len(r.balance))
			}
			for _, t := range r.balance[:e.n] {
				if !t.carried { // a carried lease goes back to its own window
					returned++
				}
			}
			r.balance = r.balance[e.n:]
		case evSpend:
			if e.n > int64(len(r.balance)) {
				return outcome{}, fmt.Errorf("event %d: spend %d > balance %d", i, e.n, len(r.balance))
			}
			for _, t := range r.balance[:e.n] {
				t.admits++
				r.spendLog = append(r.spendLog, t)
			}
			r.balance = r.balance[e.n:]
			r.leaseAdmitted += e.n
		case evFallbackOn:
			r.in, r.entered = true, true
		case evFallbackOff:
			r.in = false
		case evFallbackAdmit:
			switch {
			case !r.in || conf.fallback == FallbackClosed:
				return outcome{}, fmt.Errorf("event %d: fallback admit outside local/open fallback", i)
			case conf.fallback == FallbackLocal && r.fallbackAdmitted+e.n > conf.allowance:
				return outcome{}, fmt.Errorf("event %d: fallback admits above local:%d", i, conf.allowance)
			}
			r.fallbackAdmitted += e.n
			fallbackTotal += e.n
		case evFailover:
			// The spends made during the lag are lost: at most lag x rate
			// of them, unless the agent measured exactly how many.
			if e.n > int64(len(r.spendLog)) {
				return outcome{}, fmt.Errorf("event %d: lost %d > spends %d", i, e.n, len(r.spendLog))
			}
			if !e.measured && e.n*1000 > e.lagMS*e.rate {
				return outcome{}, fmt.Errorf("event %d: lost %d > lag %dms x %d/s", i, e.n, e.lagMS, e.rate)
			}
			cut := int64(len(r.spendLog)) - e.n
			for _, t := range r.spendLog[cut:] {
				t.lost++
				r.balance = append(r.balance, t) // Redis forgot the spend
			}
			r.spendLog = r.spendLog[:cut]
			f := Failover{Lag: time.Duration(e.lagMS) * time.Millisecond, AdmitRate: float64(e.rate)}
			if e.measured {
				f.Observed = e.n
			}
			r.failovers = append(r.failovers, f)
		case evLimit:
			g = e.n
		case evCarryIn:
			carried += e.n
			r.balance = append(r.balance, newTokens(e.n, true)...)
		case evStrand:
			r.balance = nil
		case evSettleOver:
			if len(r.balance) > 0 {
				return outcome{}, fmt.Errorf("event %d: settle overrun while the region holds %d", i, len(r.balance))
			}
			r.settleOver += e.n
			settleTotal += e.n
		default:
			return outcome{}, fmt.Errorf("event %d: unknown kind %d", i, e.kind)
		}
	}

	// Count admissions token by token, and check the model against itself:
	// a token is admitted at most once more than its spend was lost.
	var leaseTotal int64
	for _, t := range all {
		if t.admits > 1+t.lost {
			return outcome{}, fmt.Errorf("model bug: token %d admitted %d times, lost %d", t.id, t.admits, t.lost)
		}
		leaseTotal += int64(t.admits)
	}
	w := Window{Limit: g, LimitAtGrant: atGrant, Granted: granted, Returned: returned, CarriedOver: carried}
	var reported int64
	for i, c := range h.regions {
		reg := Region{
			Name:             c.name,
			Admitted:         rs[i].leaseAdmitted + rs[i].settleOver,
			FallbackAdmitted: rs[i].fallbackAdmitted,
			Failovers:        rs[i].failovers,
			SettleOverrun:    rs[i].settleOver,
		}
		if rs[i].entered {
			reg.Fallback = c.fallback
			reg.LocalAllowance = c.allowance
		}
		reported += rs[i].leaseAdmitted
		w.Regions = append(w.Regions, reg)
	}
	if reported != leaseTotal {
		return outcome{}, fmt.Errorf("model bug: regions report %d lease admits, tokens %d", reported, leaseTotal)
	}
	return outcome{w: w, admitted: leaseTotal + fallbackTotal + settleTotal}, nil
}

// genOpts says which faults a generated history may contain.
type genOpts struct {
	fallbacks []FallbackMode // fallback modes regions may be configured with
	failover  bool           // Redis failovers with lost writes
	lower     bool           // G changed mid-window, up or down
	carry     bool           // leases not clamped: carry-in from the previous window
	settle    bool           // settle-later decisions that overrun their window's leases
}

// allFaults allows every fault; open fallback is drawn rarely, since it
// makes the bound infinite and the history uninteresting.
var allFaults = genOpts{
	fallbacks: []FallbackMode{FallbackClosed, FallbackClosed, FallbackLocal, FallbackLocal, FallbackLocal, FallbackOpen},
	failover:  true, lower: true, carry: true, settle: true,
}

// strictFaults is strict mode (fallback closed) with clamped leases and no
// Redis failover, G unchanged: admitted <= G must hold exactly.
var strictFaults = genOpts{fallbacks: []FallbackMode{FallbackClosed}}

// genHistory makes a random history that keeps the rules. It mirrors only
// where each held token came from (replay checks every token again).
func genHistory(r *rand.Rand, o genOpts) history {
	h := history{g0: r.Int63n(301)}
	for i := range 1 + r.Intn(4) {
		c := regionConf{name: fmt.Sprintf("r%d", i), fallback: o.fallbacks[r.Intn(len(o.fallbacks))]}
		if c.fallback == FallbackLocal {
			c.allowance = r.Int63n(101)
		}
		h.regions = append(h.regions, c)
	}
	// mirror is a region's tokens in replay's order; true marks a token
	// carried in from the previous window.
	type mirror struct {
		balance, spends []bool
		fallback        int64
		in              bool
	}
	ms := make([]mirror, len(h.regions))
	g, granted, returned := h.g0, int64(0), int64(0)
	upTo := func(n int64) int64 { // in [0, n], n itself one time in three
		if n <= 0 {
			return 0
		}
		if r.Intn(3) == 0 {
			return n
		}
		return r.Int63n(n + 1)
	}
	add := func(to []bool, n int64, carried bool) []bool {
		for range n {
			to = append(to, carried)
		}
		return to
	}
	for range r.Intn(60) {
		ri := r.Intn(len(h.regions))
		m, conf := &ms[ri], h.regions[ri]
		e := event{region: ri}
		spend := func() {
			e.kind, e.n = evSpend, upTo(int64(len(m.balance)))
			m.spends = append(m.spends, m.balance[:e.n]...)
			m.balance = m.balance[e.n:]
		}
		switch k := r.Intn(100); {
		case k < 25:
			e.kind, e.n = evGrant, upTo(min(max(0, g-granted+returned), 100))
			granted += e.n
			m.balance = add(m.balance, e.n, false)
		case k < 30:
			e.kind, e.n = evReturn, upTo(int64(len(m.balance)))
			for _, carried := range m.balance[:e.n] {
				if !carried {
					returned++
				}
			}
			m.balance = m.balance[e.n:]
		case k < 60:
			spend()
		case k < 64:
			e.kind, m.in = evFallbackOn, true
		case k < 66:
			e.kind, m.in = evFallbackOff, false
		case k < 80:
			e.kind = evFallbackAdmit
			switch {
			case !m.in || conf.fallback == FallbackClosed:
				e.kind, m.in = evFallbackOn, true // no admits allowed: fall back instead
			case conf.fallback == FallbackLocal:
				e.n = upTo(conf.allowance - m.fallback)
			default:
				e.n = upTo(200)
			}
			m.fallback += e.n
		case k < 86 && o.failover:
			e.kind, e.lagMS, e.rate = evFailover, r.Int63n(2001), r.Int63n(101)
			e.measured = r.Intn(4) == 0
			most := min(int64(len(m.spends)), e.lagMS*e.rate/1000)
			if e.measured {
				most = int64(len(m.spends)) // the agent counted them: the estimate may be low
			}
			e.n = upTo(most)
			cut := int64(len(m.spends)) - e.n
			m.balance = append(m.balance, m.spends[cut:]...)
			m.spends = m.spends[:cut]
		case k >= 86 && k < 92 && o.lower:
			e.kind, e.n = evLimit, r.Int63n(301)
			g = e.n
		case k >= 92 && k < 96 && o.carry:
			e.kind, e.n = evCarryIn, upTo(100)
			m.balance = add(m.balance, e.n, true)
		case k >= 98 && o.settle && len(m.balance) == 0:
			// The settle's extra took what the region held first: only
			// the rest is an overrun.
			e.kind, e.n = evSettleOver, upTo(50)
		case k >= 96 && k < 98:
			e.kind, m.balance = evStrand, nil
		default: // k >= 98, or a fault this history may not contain
			spend()
		}
		h.events = append(h.events, e)
	}
	return h
}

// anyHistory is a history with any fault, for testing/quick.
type anyHistory struct{ h history }

// Generate implements quick.Generator.
func (anyHistory) Generate(r *rand.Rand, _ int) reflect.Value {
	return reflect.ValueOf(anyHistory{genHistory(r, allFaults)})
}

// strictHistory is a strict-mode history with clamped leases, no Redis
// failover and G unchanged, for testing/quick.
type strictHistory struct{ h history }

// Generate implements quick.Generator.
func (strictHistory) Generate(r *rand.Rand, _ int) reflect.Value {
	return reflect.ValueOf(strictHistory{genHistory(r, strictFaults)})
}
