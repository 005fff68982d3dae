package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"leasehold/regionagent/store"
)

func taggedLimit(id, tag string) Limit {
	l := strictLimit(id, 100, time.Minute, 15*time.Second)
	l.HashTag = tag
	return l
}

// sameSlotWorld is newWorld with a Core that requires one slot per call
// (the region's Redis is a Cluster).
func sameSlotWorld(t *testing.T, ls ...Limit) *world {
	w := newWorld(t, 10, ls...)
	w.c = New(Config{Region: "eu", RequestPrefix: "eu-1-n", Seed: 1, SameSlotRequired: true})
	w.c.SetLimits(w.c.SyncStart(), 1, ls, w.now)
	w.c.SetAllocatorClock(w.now, w.now, w.now)
	return w
}

// keysOf lists every store key and lock the actions of rd name, as
// "what limit tag".
func keysOf(rd Ready) []string {
	var out []string
	add := func(what string, k store.Key) { out = append(out, what+" "+k.Limit+" "+k.HashTag) }
	for _, r := range rd.Rounds {
		add("round", r.Key)
	}
	for _, d := range rd.Deposits {
		add("deposit", d.Key)
	}
	for _, c := range rd.Closes {
		add("close", c.Key)
	}
	for _, c := range rd.Counters {
		add("counter", c.Key)
	}
	for _, u := range rd.Unlocks {
		add("unlock", store.Key{Limit: u.Limit, HashTag: u.HashTag})
	}
	for _, r := range rd.Reports {
		add("report", store.Key{Limit: r.Limit, HashTag: r.HashTag})
	}
	return out
}

// TestHashTagInEveryKey: every action the Core asks for a limit names the
// limit's hash tag (spends, rounds and their lock, deposits, counters,
// closes, reports, fallback counts, reservations); a limit without one,
// or whose tag is its id, names none, so its keys keep their old names.
func TestHashTagInEveryKey(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{taggedLimit("tenant/atlas/api", "atlas"), "atlas"},
		{taggedLimit("tenant/plain", ""), ""},
		{taggedLimit("tenant/self", "tenant/self"), ""},
	} {
		t.Run(tc.l.ID, func(t *testing.T) {
			w := newWorld(t, 10, tc.l)
			var seen []string
			record := func() {
				for range 1000 {
					rd := w.c.Ready()
					if rd.Empty() {
						return
					}
					seen = append(seen, keysOf(rd)...)
					w.run(rd)
				}
			}
			chk := w.c.Begin(w.now, []Item{{Limit: tc.l.ID}}, time.Time{})
			for chk.Step != StepDone {
				switch chk.Step {
				case StepSpend:
					for _, k := range chk.Keys {
						seen = append(seen, "spend "+k.Limit+" "+k.HashTag)
					}
					res, err := w.shared.Spend(chk.Keys, chk.Costs, chk.Counted, ms(w.now))
					w.c.Spent(w.now, chk, res, err)
				case StepWait:
					record()
					w.c.Woke(w.now, chk)
				}
			}
			wantAnswer(t, "check", chk.Answers[0], true, ReasonOK)
			// The window's end closes the lease and reports the window.
			w.now = w.now.Add(time.Minute + 3*time.Second)
			w.c.Tick(w.now)
			record()
			_, key, _, err := w.c.Reservation(w.now, tc.l.ID)
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, "reservation "+key.Limit+" "+key.HashTag)
			w.c.SetAllocatorHealth(w.now, false)
			l2 := tc.l
			l2.Fallback = Fallback{Kind: FallbackOpen}
			w.c.SetLimits(w.c.SyncStart(), 2, []Limit{l2}, w.now)
			fb := w.c.Begin(w.now, []Item{{Limit: tc.l.ID}}, time.Time{})
			w.c.Spent(w.now, fb, store.SpendResult{}, errors.New("redis timeout"))
			if fb.Step != StepCount {
				t.Fatalf("step %d, want the fallback count", fb.Step)
			}
			seen = append(seen, "fallback "+fb.Count[0].Key.Limit+" "+fb.Count[0].Key.HashTag)

			kinds := map[string]bool{}
			for _, s := range seen {
				f := strings.Fields(s + " -")
				kinds[f[0]] = true
				if tag := strings.TrimSuffix(strings.TrimPrefix(s, f[0]+" "+tc.l.ID), " -"); strings.TrimSpace(tag) != tc.want {
					t.Errorf("%q: hash tag %q, want %q", s, strings.TrimSpace(tag), tc.want)
				}
			}
			for _, k := range []string{"spend", "round", "unlock", "deposit", "close", "report", "reservation", "fallback"} {
				if !kinds[k] {
					t.Errorf("no %s seen (saw %v)", k, seen)
				}
			}
		})
	}
}

// TestSameSlotRequired: with a Cluster store, a Check of limits with
// different hash tags is refused before anything is spent: an ItemError
// on limit_id naming both limits, their tags and the fix, and a note for
// the log. Limits sharing a tag are checked together, all or nothing;
// single Checks and a store that needs no slot are unaffected.
func TestSameSlotRequired(t *testing.T) {
	a, b := taggedLimit("tenant/atlas/api", "atlas"), taggedLimit("tenant/atlas/jobs", "atlas")
	c, d := taggedLimit("tenant/other", ""), taggedLimit("tenant/borealis", "borealis")
	w := sameSlotWorld(t, a, b, c, d)

	got, chk := w.checkMulti(Item{Limit: a.ID}, Item{Limit: b.ID, Cost: 2})
	if chk.Err != nil {
		t.Fatalf("same tag: %v", chk.Err)
	}
	wantAnswer(t, "same tag a", got[0], true, ReasonOK)
	wantAnswer(t, "same tag b", got[1], true, ReasonOK)

	for _, tc := range []struct {
		items []Item
		index int
		names []string
	}{
		{[]Item{{Limit: a.ID}, {Limit: c.ID}}, 1, []string{`"tenant/atlas/api" (hash_tag "atlas")`, `"tenant/other" (no hash_tag`}},
		{[]Item{{Limit: a.ID}, {Limit: b.ID}, {Limit: d.ID}}, 2, []string{`"tenant/atlas/api"`, `"tenant/borealis" (hash_tag "borealis")`}},
		{[]Item{{Limit: c.ID}, {Limit: c.ID}, {Limit: a.ID}}, 2, []string{`"tenant/other"`, `"tenant/atlas/api"`}},
	} {
		before := w.shared.Balance(a.key(w.c.WindowOf(w.now, &a).Index), ms(w.now)).Admitted
		chk := w.c.Begin(w.now, tc.items, time.Time{})
		if chk.Step != StepDone {
			t.Fatalf("%v: step %d, want refused at once", tc.items, chk.Step)
		}
		var ie *ItemError
		if !errors.As(chk.Err, &ie) || ie.Index != tc.index || ie.Field != "limit_id" || errors.Is(ie, ErrUnknownLimit) ||
			!errors.Is(ie, store.ErrCrossSlot) {
			t.Fatalf("%v: %v, want an ItemError (store.ErrCrossSlot) on items[%d].limit_id", tc.items, chk.Err, tc.index)
		}
		for _, s := range append(tc.names, "do not share a hash tag", "Cluster", "one hash_tag") {
			if !strings.Contains(ie.Reason, s) {
				t.Errorf("%v: %q lacks %q", tc.items, ie.Reason, s)
			}
		}
		rd := w.c.Ready()
		if len(rd.Notes) != 1 || rd.Notes[0].Kind != NoteCrossSlot || len(rd.Rounds) != 0 {
			t.Errorf("%v: ready %+v, want one cross-slot note and no round", tc.items, rd)
		}
		w.run(rd)
		if after := w.shared.Balance(a.key(w.c.WindowOf(w.now, &a).Index), ms(w.now)).Admitted; after != before {
			t.Errorf("%v: admitted %d -> %d: a refused Check spent", tc.items, before, after)
		}
	}
	wantAnswer(t, "single check of another tag", w.check(c.ID, 1), true, ReasonOK)

	// On a single Redis (no slots) the same Check is decided.
	w2 := newWorld(t, 10, a, c)
	got, chk = w2.checkMulti(Item{Limit: a.ID}, Item{Limit: c.ID})
	if chk.Err != nil || !got[0].Allowed || !got[1].Allowed {
		t.Fatalf("without SameSlotRequired: %v %+v", chk.Err, got)
	}
}

// TestCrossSlotFromTheStore: a store that refuses a Check's keys as in
// different slots (CROSSSLOT, the Core not told to require one) ends the
// Check with an ItemError naming the limits: never a fallback, never
// UNAVAILABLE with a retry that cannot succeed; noted for the log.
func TestCrossSlotFromTheStore(t *testing.T) {
	a, c := taggedLimit("tenant/atlas/api", "atlas"), taggedLimit("tenant/other", "")
	a.Fallback, c.Fallback = Fallback{Kind: FallbackOpen}, Fallback{Kind: FallbackOpen}
	a.Mode, c.Mode = ModeBounded, ModeBounded
	crossSlot := fmt.Errorf("%w: CROSSSLOT Keys in request don't hash to the same slot", store.ErrCrossSlot)
	for _, tc := range []struct {
		name string
		step func(w *world, chk *Check)
	}{
		{"spend error", func(w *world, chk *Check) { w.c.Spent(w.now, chk, store.SpendResult{}, crossSlot) }},
		{"spend result", func(w *world, chk *Check) {
			w.c.Spent(w.now, chk, store.SpendResult{Failed: -1, Err: crossSlot}, crossSlot)
		}},
		{"fallback count", func(w *world, chk *Check) {
			w.c.SetAllocatorHealth(w.now, false)
			w.c.Spent(w.now, chk, store.SpendResult{}, errors.New("timeout"))
			if chk.Step != StepCount {
				t.Fatalf("step %d, want the fallback count", chk.Step)
			}
			w.c.Counted(w.now, chk, false, nil, crossSlot)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 10, a, c)
			chk := w.c.Begin(w.now, []Item{{Limit: a.ID}, {Limit: c.ID}}, time.Time{})
			if chk.Step != StepSpend {
				t.Fatalf("step %d, want a spend", chk.Step)
			}
			tc.step(w, chk)
			var ie *ItemError
			if chk.Step != StepDone || !errors.As(chk.Err, &ie) || ie.Index != 1 || ie.Field != "limit_id" || !errors.Is(ie, store.ErrCrossSlot) {
				t.Fatalf("step %d, err %v; want done with an ItemError on items[1].limit_id", chk.Step, chk.Err)
			}
			for _, s := range []string{"CROSSSLOT", `"tenant/atlas/api"`, `"tenant/other"`, "one hash_tag"} {
				if !strings.Contains(ie.Reason, s) {
					t.Errorf("%q lacks %q", ie.Reason, s)
				}
			}
			if chk.Answers != nil || chk.Result != "" {
				t.Errorf("answers %+v, result %q: a refused Check answers nothing", chk.Answers, chk.Result)
			}
			var notes int
			for _, n := range w.c.Ready().Notes {
				if n.Kind == NoteCrossSlot {
					notes++
				}
			}
			if notes != 1 {
				t.Errorf("%d cross-slot notes, want 1", notes)
			}
		})
	}
}
