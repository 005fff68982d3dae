package bucket

import (
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"testing"

	"leasehold/regionagent/store"
)

// sstep is one call of a slot set step table at an explicit Redis
// instant.
type sstep struct {
	op     string // install, acquire, heartbeat, release
	now    int64
	share  store.SlotShare
	holder string // acquire
	slot   string // heartbeat, release
	ttl    int64
	want   any
}

func sinstall(now, seq, n, deadline int64, status ShareStatus, held int64) sstep {
	return sinstallA(now, seq, n, n, deadline, status, held)
}

func sinstallA(now, seq, n, admit, deadline int64, status ShareStatus, held int64) sstep {
	return sstep{op: "install", now: now, share: store.SlotShare{Seq: seq, N: n, Admit: admit, DeadlineMs: deadline},
		want: SlotInstallResult{Status: status, Held: held}}
}

func sacquire(now int64, holder string, ttl int64, want SlotAcquireResult) sstep {
	return sstep{op: "acquire", now: now, holder: holder, ttl: ttl, want: want}
}

func sbeat(now int64, slot string, ttl int64, held bool, expiresIn int64) sstep {
	return sstep{op: "heartbeat", now: now, slot: slot, ttl: ttl, want: SlotHeartbeatResult{Held: held, ExpiresInMs: expiresIn}}
}

func srelease(now int64, slot string, released bool) sstep {
	return sstep{op: "release", now: now, slot: slot, want: released}
}

func granted(id string, expiresIn, held, n, deadline int64) SlotAcquireResult {
	return SlotAcquireResult{Allowed: true, SlotID: id, ExpiresInMs: expiresIn, Held: held, N: n, DeadlineMs: deadline}
}

func denied(retry, held, n, deadline int64) SlotAcquireResult {
	return SlotAcquireResult{RetryMs: retry, Held: held, N: n, DeadlineMs: deadline}
}

// slotCases are the slot set's behaviours (lua/slots.lua), as step tables
// at fixed instants. TestSlotsScript runs each on redis-server and
// miniredis, TestMemSlots on the in-memory store, with the same results.
var slotCases = []struct {
	name  string
	steps []sstep
}{
	{"no share: denied, nothing written", []sstep{
		sacquire(T0, "a", 1000, denied(0, 0, 0, 0)),
		sbeat(T0, "a~1", 1000, false, 0),
		srelease(T0, "a~1", false),
	}},
	{"cap: n held, the next denied until one is released", []sstep{
		sinstall(T0, 1, 2, T0+10_000, ShareInstalled, 0),
		sacquire(T0, "a", 3000, granted("a~1", 3000, 1, 2, T0+10_000)),
		sacquire(T0+10, "b", 1000, granted("b~2", 1000, 2, 2, T0+10_000)),
		sacquire(T0+20, "c", 1000, denied(990, 2, 2, T0+10_000)), // b's slot ends first
		srelease(T0+30, "b~2", true),
		srelease(T0+31, "b~2", false), // released twice: answered, not held
		sacquire(T0+40, "c", 1000, granted("c~3", 1000, 2, 2, T0+10_000)),
	}},
	{"idempotent by holder: the same slot back", []sstep{
		sinstall(T0, 1, 3, T0+10_000, ShareInstalled, 0),
		sacquire(T0, "a", 3000, granted("a~1", 3000, 1, 3, T0+10_000)),
		sacquire(T0+500, "a", 3000, granted("a~1", 2500, 1, 3, T0+10_000)),
		srelease(T0+600, "a~1", true),
		sacquire(T0+700, "a", 3000, granted("a~2", 3000, 1, 3, T0+10_000)), // a new slot: the old id is dead
		sbeat(T0+800, "a~1", 3000, false, 0),
	}},
	{"slot capped by the share's deadline; heartbeat extends up to it", []sstep{
		sinstall(T0, 1, 1, T0+2_000, ShareInstalled, 0),
		sacquire(T0, "a", 5000, granted("a~1", 2000, 1, 1, T0+2_000)),
		sbeat(T0+1_000, "a~1", 500, true, 1000), // never shortened by a heartbeat
		sinstall(T0+1_500, 2, 1, T0+6_000, ShareInstalled, 1),
		sbeat(T0+1_600, "a~1", 5000, true, 4400),
		sbeat(T0+6_000, "a~1", 5000, false, 0), // died with the share
		sacquire(T0+6_000, "b", 1000, denied(0, 0, 0, 0)),
	}},
	{"TTL: a holder that stops heartbeating loses its slot", []sstep{
		sinstall(T0, 1, 1, T0+60_000, ShareInstalled, 0),
		sacquire(T0, "a", 1000, granted("a~1", 1000, 1, 1, T0+60_000)),
		sacquire(T0+999, "b", 1000, denied(1, 1, 1, T0+60_000)),
		sacquire(T0+1000, "b", 1000, granted("b~2", 1000, 1, 1, T0+60_000)),
		sbeat(T0+1001, "a~1", 1000, false, 0),
		srelease(T0+1002, "a~1", false),
	}},
	{"a smaller share: slots beyond it keep their expiry and die", []sstep{
		sinstall(T0, 1, 3, T0+2_000, ShareInstalled, 0),
		sacquire(T0, "a", 1000, granted("a~1", 1000, 1, 3, T0+2_000)),
		sacquire(T0, "b", 1500, granted("b~2", 1500, 2, 3, T0+2_000)),
		sacquire(T0, "c", 2000, granted("c~3", 2000, 3, 3, T0+2_000)),
		sinstall(T0+100, 2, 1, T0+9_000, ShareInstalled, 3),
		sbeat(T0+200, "a~1", 5000, true, 800),  // two slots expire after a's: not extended
		sbeat(T0+200, "c~3", 5000, true, 5000), // none after c's: extended under the new share
		sbeat(T0+300, "b~2", 5000, true, 1200), // c's is after b's
		sacquire(T0+1600, "d", 1000, denied(3600, 1, 1, T0+9_000)),
		sbeat(T0+1600, "b~2", 5000, false, 0),
	}},
	{"admit below n: running slots kept, no new one until back within admit", []sstep{
		sinstall(T0, 1, 3, T0+5_000, ShareInstalled, 0),
		sacquire(T0, "a", 4000, granted("a~1", 4000, 1, 3, T0+5_000)),
		sacquire(T0, "b", 4000, granted("b~2", 4000, 2, 3, T0+5_000)),
		sacquire(T0, "c", 1000, granted("c~3", 1000, 3, 3, T0+5_000)),
		sinstallA(T0+100, 2, 3, 2, T0+9_000, ShareInstalled, 3),
		sacquire(T0+200, "d", 1000, denied(800, 3, 3, T0+9_000)),
		sbeat(T0+200, "a~1", 5000, true, 5000), // n is 3: the held slots are counted
		srelease(T0+300, "c~3", true),
		sacquire(T0+400, "d", 1000, denied(3600, 2, 3, T0+9_000)), // 2 held, admit 2: b~2 ends first
		srelease(T0+500, "b~2", true),
		sacquire(T0+600, "d", 1000, granted("d~4", 1000, 2, 3, T0+9_000)),
	}},
	{"stale and late shares", []sstep{
		sinstall(T0, 2, 1, T0+5_000, ShareInstalled, 0),
		sinstall(T0+10, 1, 5, T0+9_000, ShareStale, 0),
		sinstall(T0+10, 2, 5, T0+9_000, ShareStale, 0),
		sinstall(T0+5_000, 1, 4, T0+9_000, ShareInstalled, 0), // the one in force ended: a new leader's seq is heard
		sacquire(T0+5_001, "a", 1000, granted("a~1", 1000, 1, 4, T0+9_000)),
	}},
	{"clock going backwards: nothing lives twice", []sstep{
		sinstall(T0, 1, 1, T0+60_000, ShareInstalled, 0),
		sacquire(T0, "a", 1000, granted("a~1", 1000, 1, 1, T0+60_000)),
		sacquire(T0+1_500, "b", 1000, granted("b~2", 1000, 1, 1, T0+60_000)),
		sbeat(T0+200, "a~1", 1000, false, 0), // the new primary's clock is behind: still T0+1500
		sacquire(T0+300, "c", 1000, denied(1000, 1, 1, T0+60_000)),
	}},
	{"key expiry in the past: nothing written", []sstep{
		{op: "install", now: T0, share: store.SlotShare{Seq: 1, N: 1, Admit: 1, DeadlineMs: T0 - 10},
			want: SlotInstallResult{Status: ShareRefusedKeyExpiry}},
		sacquire(T0, "a", 1000, denied(0, 0, 0, 0)),
	}},
}

func (s sstep) expireAt() int64 {
	if s.share.DeadlineMs < s.now {
		return s.share.DeadlineMs // refused: not after now
	}
	return farExpiry()
}

func (s sstep) run(t *testing.T, b *Buckets, key store.SlotKey) (any, error) {
	ctx := testCtx(t)
	switch s.op {
	case "install":
		return b.InstallSlots(ctx, SlotInstall{Key: key, Share: s.share, ExpireAtMs: s.expireAt(), NowMs: s.now})
	case "acquire":
		return b.AcquireSlot(ctx, key, s.holder, s.ttl, s.now)
	case "heartbeat":
		return b.HeartbeatSlot(ctx, key, s.slot, s.ttl, s.now)
	}
	return b.ReleaseSlot(ctx, key, s.slot, s.now)
}

func (s sstep) runMem(m *store.Mem, key store.SlotKey) (any, error) {
	switch s.op {
	case "install":
		exp := s.expireAt()
		if exp > s.share.DeadlineMs {
			exp = s.share.DeadlineMs + 24*3600*1000 // the Mem's clock is the table's
		}
		return m.InstallSlots(store.SlotInstall{Key: key, Share: s.share, ExpireAtMs: exp, NowMs: s.now})
	case "acquire":
		return m.AcquireSlot(key, s.holder, s.ttl, s.now)
	case "heartbeat":
		return m.HeartbeatSlot(key, s.slot, s.ttl, s.now)
	}
	return m.ReleaseSlot(key, s.slot, s.now)
}

func TestSlotsScript(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			b := New(be.rdb)
			for ci, c := range slotCases {
				t.Run(c.name, func(t *testing.T) {
					key := store.SlotKey{Limit: fmt.Sprintf("slots%d", ci)}
					for i, s := range c.steps {
						got, err := s.run(t, b, key)
						if err != nil {
							t.Fatalf("step %d (%s at T0%+d): %v", i, s.op, s.now-T0, err)
						}
						if !reflect.DeepEqual(got, s.want) {
							t.Fatalf("step %d (%s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.now-T0, got, s.want)
						}
					}
				})
			}
		})
	}
}

func TestMemSlots(t *testing.T) {
	for ci, c := range slotCases {
		t.Run(c.name, func(t *testing.T) {
			m := store.NewMem(24 * 3600 * 1000)
			key := store.SlotKey{Limit: fmt.Sprintf("slots%d", ci)}
			for i, s := range c.steps {
				got, err := s.runMem(m, key)
				if err != nil {
					t.Fatalf("step %d (%s at T0%+d): %v", i, s.op, s.now-T0, err)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d (%s at T0%+d):\n got %+v\nwant %+v", i, s.op, s.now-T0, got, s.want)
				}
			}
		})
	}
}

// TestSlotsRandomAgainstModel drives redis-server, miniredis and the
// in-memory store with the same random steps (shares growing and
// shrinking, clocks stepping back) and wants identical answers from all
// three. It also checks the rule the limit rests on, by brute force over
// a ledger of what the answers said: at every instant u, the slots alive
// at u are at most the n of the largest share installed by u whose
// deadline is after u (the allocator counts each region at its largest
// unexpired share).
func TestSlotsRandomAgainstModel(t *testing.T) {
	bes := backends(t)
	runs := 20
	if testing.Short() {
		runs = 5
	}
	holders := []string{"a", "b", "c", "d", "e", "f"}
	for run := range runs {
		rng := rand.New(rand.NewSource(int64(run)))
		m := store.NewMem(24 * 3600 * 1000)
		key := store.SlotKey{Limit: fmt.Sprintf("rnd%d", run)}
		now, seq := T0, int64(0)
		var shares []installed
		held := map[string]*interval{} // slot id -> its life, on the store's clock (the test's own ledger)
		var storeT int64               // the store's clock: the latest instant it saw (time never goes back)
		for i := range 120 {
			var s sstep
			now += int64(rng.Intn(400))
			at := now
			if rng.Intn(10) == 0 {
				at -= int64(rng.Intn(300)) // a failover to a primary behind
			}
			switch rng.Intn(6) {
			case 0:
				seq++
				sn := int64(rng.Intn(5))
				s = sstep{op: "install", now: at, share: store.SlotShare{Seq: seq, N: sn, Admit: rng.Int63n(sn + 1), DeadlineMs: now + int64(500+rng.Intn(3000))}}
			case 1, 2:
				s = sstep{op: "acquire", now: at, holder: holders[rng.Intn(len(holders))], ttl: int64(1 + rng.Intn(2000))}
			case 3, 4:
				s = sstep{op: "heartbeat", now: at, slot: pick(rng, held), ttl: int64(1 + rng.Intn(3000))}
			default:
				s = sstep{op: "release", now: at, slot: pick(rng, held)}
			}
			want, err := s.runMem(m, key)
			if err != nil {
				t.Fatalf("run %d step %d mem %+v: %v", run, i, s, err)
			}
			for _, be := range bes {
				got, err := s.run(t, New(be.rdb), key)
				if err != nil {
					t.Fatalf("run %d step %d %s %+v: %v", run, i, be.name, s, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("run %d step %d %s %+v:\n got %+v\nwant %+v (mem)", run, i, be.name, s, got, want)
				}
			}
			if len(shares) > 0 || s.op == "install" {
				storeT = max(storeT, at)
			}
			switch r := want.(type) {
			case SlotInstallResult:
				if r.Status == ShareInstalled {
					shares = append(shares, installed{s.share, storeT})
				}
			case SlotAcquireResult:
				if r.Allowed && held[r.SlotID] == nil {
					held[r.SlotID] = &interval{from: storeT, to: storeT + r.ExpiresInMs}
				}
			case SlotHeartbeatResult:
				if r.Held {
					held[s.slot].to = storeT + r.ExpiresInMs
				}
			case bool:
				if r {
					held[s.slot].to = storeT
				}
			}
			checkSlotRule(t, run, i, held, shares)
		}
	}
}

type interval struct{ from, to int64 } // alive in [from, to)

type installed struct {
	store.SlotShare
	at int64
}

func pick(rng *rand.Rand, held map[string]*interval) string {
	if len(held) == 0 || rng.Intn(5) == 0 {
		return fmt.Sprintf("x~%d", rng.Intn(3))
	}
	ids := make([]string, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids[rng.Intn(len(ids))]
}

// checkSlotRule: at every instant a slot's life starts or ends, the slots
// alive are at most the largest n of the shares installed by then whose
// deadline is after it. (Alive counts change only at those instants.)
func checkSlotRule(t *testing.T, run, step int, held map[string]*interval, shares []installed) {
	t.Helper()
	for _, iv := range held {
		for _, u := range []int64{iv.from, iv.to - 1} {
			var alive, allowed int64
			for _, o := range held {
				if o.from <= u && u < o.to {
					alive++
				}
			}
			for _, s := range shares {
				if s.at <= u && s.DeadlineMs > u {
					allowed = max(allowed, s.N)
				}
			}
			if alive > allowed {
				t.Fatalf("run %d step %d: %d slots alive at T0+%d, the largest share in force then allows %d",
					run, step, alive, u-T0, allowed)
			}
		}
	}
}
