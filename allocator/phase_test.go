package allocator

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/limitspec"
	pb "leasehold/proto/leasehold/v1"
)

// phasedLimit is testLimit with a phase offset.
func phasedLimit(id string, g int64, w, phase, ttl time.Duration, regions ...string) *Limit {
	p := &pb.Limit{
		Id: id, LimitTokens: g, Window: durationpb.New(w), WindowPhase: durationpb.New(phase), Regions: regions,
		Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Ttl: durationpb.New(ttl), MinChunk: 1},
	}
	v, err := limitspec.ValidateLimit(p, []string{"eu", "us", "ap"})
	if err != nil {
		panic(err)
	}
	v.Version = 1
	return decodeLimit(v)
}

// TestCorePhasedWindows: two limits of one-minute windows, one aligned
// and one with a phase of 17 s, reset at different instants: the step
// table at fixed instants around both boundaries. Leases are clamped to
// each limit's own window end; the pool of the phased limit refills at
// t0+17s, not at t0; a lease carries its window's phase; records keep it
// (a rebuild and a report name the same windows).
func TestCorePhasedWindows(t *testing.T) {
	const s = time.Second
	c := NewCore()
	c.SetLimit(testLimit("t/aligned", 100, time.Minute, 30*s, "eu"))
	c.SetLimit(phasedLimit("t/phased", 100, time.Minute, 17*s, 30*s, "eu"))
	steps := []struct {
		at        time.Duration // from t0, a one-minute boundary
		limit     string
		want      int64
		tokens    int64
		expiresIn time.Duration
		windowEnd time.Duration // from t0
	}{
		// 10 s before t0: both spend their whole pool.
		{-10 * s, "t/aligned", 100, 100, 10 * s, 0},
		{-10 * s, "t/phased", 100, 100, 27 * s, 17 * s},
		// At t0 the aligned limit resets, the phased one does not.
		{0, "t/aligned", 40, 40, 30 * s, time.Minute},
		{0, "t/phased", 40, 0, 0, 17 * s},
		{17*s - time.Millisecond, "t/phased", 40, 0, 0, 17 * s},
		// At t0+17s the phased limit resets; its lease is clamped to
		// t0+77s only when the ttl reaches it.
		{17 * s, "t/phased", 40, 40, 30 * s, 77 * s},
		{50 * s, "t/phased", 40, 40, 27 * s, 77 * s},
		{50 * s, "t/aligned", 40, 40, 10 * s, time.Minute},
	}
	var grants []*Grant
	for i, st := range steps {
		now := t0.Add(st.at)
		d := c.Acquire(now, "eu", AcquireRequest{RequestID: "r" + string(rune('a'+i)), Limit: st.limit, Want: st.want})
		var got int64
		if d.Grant != nil {
			got = d.Grant.Tokens
			grants = append(grants, d.Grant)
			ls := d.Grant.ToProto(now)
			if ls.ExpiresIn.AsDuration() != st.expiresIn {
				t.Errorf("step %d: expires_in %v, want %v", i, ls.ExpiresIn.AsDuration(), st.expiresIn)
			}
			if end := now.Add(ls.WindowLeft.AsDuration()); !end.Equal(t0.Add(st.windowEnd)) {
				t.Errorf("step %d: window ends %v, want t0%+v", i, end.Sub(t0), st.windowEnd)
			}
			wantPhase := time.Duration(0)
			if st.limit == "t/phased" {
				wantPhase = 17 * s
			}
			if ls.WindowPhase.AsDuration() != wantPhase {
				t.Errorf("step %d: lease window_phase %v, want %v", i, ls.WindowPhase.AsDuration(), wantPhase)
			}
		} else if st.tokens > 0 {
			t.Fatalf("step %d: nothing granted: %+v", i, d)
		}
		if got != st.tokens {
			t.Fatalf("step %d: %s granted %d, want %d", i, st.limit, got, st.tokens)
		}
	}

	// The records keep the phase: a rebuild names the same windows and
	// pools.
	r := NewCore()
	r.SetLimit(testLimit("t/aligned", 100, time.Minute, 30*s, "eu"))
	r.SetLimit(phasedLimit("t/phased", 100, time.Minute, 17*s, 30*s, "eu"))
	for _, g := range grants {
		b, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		var back Grant
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.window() != g.window() {
			t.Fatalf("record %s round-trips to window %+v, want %+v", b, back.window(), g.window())
		}
		r.Restore(&back)
	}
	ph := c.limits["t/phased"].Windows()
	cur := ph.Of(t0.Add(50 * s))
	if p := r.Pool("t/phased", cur.Index); p != 20 {
		t.Errorf("rebuilt pool of the phased window = %d, want 20", p)
	}
	// Reports name the phased windows: [t0-43s, t0+17s) and [t0+17s, t0+77s).
	reps, err := r.reports(t0.Add(50*s), "t/phased", 5)
	if err != nil || len(reps) != 2 {
		t.Fatalf("reports: %v, %v", reps, err)
	}
	for i, want := range []time.Time{t0.Add(-43 * s), t0.Add(17 * s)} {
		if !reps[i].WindowStart.Equal(want) || !reps[i].WindowEnd.Equal(want.Add(time.Minute)) {
			t.Errorf("report %d: [%v, %v), want from %v", i, reps[i].WindowStart, reps[i].WindowEnd, want)
		}
	}
	if reps[0].Granted != 100 || reps[1].Granted != 80 {
		t.Errorf("reports granted %d and %d, want 100 and 80", reps[0].Granted, reps[1].Granted)
	}
	// Usage reported for a phased window lands in it, with its phase.
	rec := r.Report(t0.Add(50*s), "eu", "rep", &pb.Usage{LimitId: "t/phased", WindowIndex: cur.Index, Admitted: 30})
	if rec == nil || rec.PhaseMs != 17000 || rec.WindowMs != 60000 {
		t.Fatalf("usage record %+v", rec)
	}
	// Expired after the phased end, not the aligned one.
	for _, k := range r.Expired(t0.Add(77*s-time.Millisecond), 0) {
		if k.limit == "t/phased" && k.index == cur.Index {
			t.Errorf("phased window %d expired before its end", k.index)
		}
	}
}
