package planbind

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "leasehold/proto/leasehold/v1"
)

func plan(id string, g int64, binds ...string) *pb.Limit {
	return &pb.Limit{Id: id, LimitTokens: g, Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Version: 3, Binds: binds}
}

func TestPatternPrefix(t *testing.T) {
	for _, c := range []struct {
		in, prefix, err string
	}{
		{"tenant/{id}", "tenant/", ""},
		{"a/b.c/{id}", "a/b.c/", ""},
		{"tenant/", "", "ends with {id}"},
		{"{id}", "", "must follow a prefix"},
		{"tenant{id}", "", "must follow a prefix"},
		{"plans/{id}", "", "name plans"},
		{"a//{id}", "", "segments"},
		{"a/../{id}", "", "segments"},
		{"a b/{id}", "", "segments"},
		{"/{id}", "", "segments"},
		{"a/{id}/{id}", "", "segments"},
	} {
		got, err := PatternPrefix(c.in)
		if c.err == "" && (err != nil || got != c.prefix) {
			t.Errorf("PatternPrefix(%q) = %q, %v; want %q", c.in, got, err, c.prefix)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("PatternPrefix(%q) error %v; want one saying %q", c.in, err, c.err)
		}
	}
}

func TestMatch(t *testing.T) {
	tbl := NewTable([]*pb.Limit{
		plan("plans/pro", 1000, "tenant/{id}"),
		plan("plans/free", 10, "free/{id}", "trial/eu/{id}"),
		plan("plans/zzz", 1, "tenant/{id}"),                       // the same pattern: the smaller plan id wins
		plan("plans/ent", 5000, "tenant/bigco", "tenant/eu/acme"), // a mapping: wins over patterns
		plan("tenant/x", 5, "other/{id}"),                         // not a plan: skipped
	})
	for _, c := range []struct{ id, plan string }{
		{"tenant/newco", "plans/pro"},
		{"tenant/bigco", "plans/ent"},
		{"tenant/eu/acme", "plans/ent"},
		{"tenant/bigco2", "plans/pro"},
		{"tenant/eu/newco", ""}, // {id} is one segment
		{"free/a", "plans/free"},
		{"trial/eu/a", "plans/free"},
		{"trial/a", ""},
		{"other/a", ""},
		{"tenant", ""},
		{"plans/pro", ""},
		{"", ""},
	} {
		got, ok := tbl.Match(c.id)
		if got != c.plan || ok != (c.plan != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", c.id, got, ok, c.plan)
		}
	}
	if tbl.Len() != 5 {
		t.Errorf("Len = %d, want 5", tbl.Len())
	}
	if m := tbl.Mapped("plans/ent"); len(m) != 2 {
		t.Errorf("Mapped(plans/ent) = %v", m)
	}
	var empty Table
	if _, ok := empty.Match("tenant/a"); ok {
		t.Error("the zero Table matched")
	}
}

func TestParseBind(t *testing.T) {
	for _, c := range []struct {
		in, key string
		exact   bool
		err     string
	}{
		{"tenant/{id}", "tenant/", false, ""},
		{"tenant/atlas", "tenant/atlas", true, ""},
		{"atlas", "atlas", true, ""},
		{"tenant/{id}/x", "", false, "may only end a pattern"},
		{"tenant/a{b", "", false, "may only end a pattern"},
		{"plans/pro", "", false, "name plans"},
		{"tenant//a", "", false, "segments"},
		{"tenant/a/", "", false, "segments"},
		{strings.Repeat("x", 201), "", false, "longer"},
	} {
		key, exact, err := ParseBind(c.in)
		if c.err == "" && (err != nil || key != c.key || exact != c.exact) {
			t.Errorf("ParseBind(%q) = %q, %v, %v; want %q, %v", c.in, key, exact, err, c.key, c.exact)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseBind(%q) error %v; want one saying %q", c.in, err, c.err)
		}
	}
}

func TestResolve(t *testing.T) {
	p := plan("plans/pro", 1000, "tenant/{id}")
	p.Previous = plan("plans/pro", 500, "tenant/{id}")
	p.EffectiveFrom = timestamppb.Now()
	r := Resolve(p, "tenant/newco")
	switch {
	case r.Id != "tenant/newco" || r.Plan != "plans/pro" || len(r.Binds) != 0 || r.LimitTokens != 1000 || r.Version != 3:
		t.Fatalf("resolved %v", r)
	case r.Previous.Id != "tenant/newco" || r.Previous.Plan != "plans/pro" || r.Previous.LimitTokens != 500 || len(r.Previous.Binds) != 0:
		t.Fatalf("resolved previous %v", r.Previous)
	case p.Id != "plans/pro" || len(p.Binds) != 1:
		t.Fatalf("the plan changed: %v", p)
	}
	// A contract replaces G for its tenant, in each version as it was.
	p.Contracts = map[string]*pb.Contract{"tenant/atlas": {LimitTokens: 3000}}
	p.Previous.Contracts = map[string]*pb.Contract{"tenant/atlas": {LimitTokens: 2000}}
	a := Resolve(p, "tenant/atlas")
	if a.LimitTokens != 3000 || a.Previous.LimitTokens != 2000 || a.Contracts != nil || a.Previous.Contracts != nil {
		t.Fatalf("resolved with a contract: %v", a)
	}
	if o := Resolve(p, "tenant/other"); o.LimitTokens != 1000 || o.Previous.LimitTokens != 500 {
		t.Fatalf("another tenant: %v", o)
	}
}

// TestResolveContractFields: a contract replaces each field it sets and
// keeps the plan's others; regions it replaces drop the plan's
// fallbacks of regions left out.
func TestResolveContractFields(t *testing.T) {
	p := plan("plans/pro", 1000, "tenant/{id}")
	p.Window = durationpb.New(time.Minute)
	p.Mode = pb.Mode_MODE_BOUNDED
	p.Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 10}, "us": {Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}}
	p.Lease = &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 1}
	yes := true
	p.Contracts = map[string]*pb.Contract{
		"tenant/mode":    {Mode: pb.Mode_MODE_STRICT, Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}}},
		"tenant/regions": {Regions: []string{"eu"}},
		"tenant/all": {LimitTokens: 5, Window: durationpb.New(time.Hour), Lease: &pb.LeaseSettings{Ttl: durationpb.New(time.Minute), MinChunk: 2, MaxChunk: 3},
			Shadow: &yes},
	}
	m := Resolve(p, "tenant/mode")
	if m.Mode != pb.Mode_MODE_STRICT || len(m.Fallback) != 1 || m.Fallback["eu"].Kind != pb.FallbackKind_FALLBACK_KIND_CLOSED || m.LimitTokens != 1000 || len(m.Regions) != 2 {
		t.Fatalf("mode contract: %v", m)
	}
	r := Resolve(p, "tenant/regions")
	if len(r.Regions) != 1 || r.Regions[0] != "eu" || len(r.Fallback) != 1 || r.Fallback["eu"].LocalTokens != 10 || r.Mode != pb.Mode_MODE_BOUNDED {
		t.Fatalf("regions contract: %v", r)
	}
	a := Resolve(p, "tenant/all")
	if a.LimitTokens != 5 || a.Window.AsDuration() != time.Hour || a.Lease.Ttl.AsDuration() != time.Minute || a.Lease.MaxChunk != 3 || !a.Shadow ||
		a.Mode != pb.Mode_MODE_BOUNDED || len(a.Regions) != 2 {
		t.Fatalf("all-fields contract: %v", a)
	}
	o := Resolve(p, "tenant/other")
	if o.LimitTokens != 1000 || o.Window.AsDuration() != time.Minute || o.Shadow || len(o.Fallback) != 2 || o.Lease.Ttl.AsDuration() != 15*time.Second {
		t.Fatalf("no contract: %v", o)
	}
	if len(p.Fallback) != 2 || p.Lease.Ttl.AsDuration() != 15*time.Second || p.Shadow {
		t.Fatalf("the plan changed: %v", p)
	}
}

// TestResolveHashTag: a plan tagged {id} gives each tenant its id's last
// segment as its tag (its limits under several plans share it); a plan
// without one gives none (the id is the tag).
func TestResolveHashTag(t *testing.T) {
	p := plan("plans/pro", 10, "tenant/{id}", "team/eu/bigco")
	p.HashTag = Placeholder
	for id, want := range map[string]string{"tenant/atlas": "atlas", "team/eu/bigco": "bigco",
		"tenant/" + strings.Repeat("x", 65): ""} {
		if got := Resolve(p, id).HashTag; got != want {
			t.Errorf("%s: tag %q, want %q", id, got, want)
		}
	}
	p.HashTag = ""
	if got := Resolve(p, "tenant/atlas").HashTag; got != "" {
		t.Errorf("untagged plan: tenant tag %q", got)
	}
}

// FuzzMatch checks Match against a naive reference (every pattern's
// prefix, the rest one segment) and that Resolve names the id it was
// given, whatever the input.
func FuzzMatch(f *testing.F) {
	f.Add("tenant/{id}", "free/{id}", "tenant/newco")
	f.Add("a/b/{id}", "a/{id}", "a/b/c")
	f.Add("x/{id}", "x/{id}", "x/")
	f.Add("plans/{id}", "p/{id}", "plans/p")
	f.Add("tenant/atlas", "tenant/{id}", "tenant/atlas")
	f.Fuzz(func(t *testing.T, pat1, pat2, id string) {
		plans := []*pb.Limit{plan("plans/a", 1, pat1), plan("plans/b", 2, pat2)}
		tbl := NewTable(plans)
		got, ok := tbl.Match(id)
		// The reference: a plan naming id exactly (the smaller plan id
		// of those), else the smaller of those whose pattern matches.
		exactWant, patWant := "", ""
		for _, p := range plans {
			key, exact, err := ParseBind(p.Binds[0])
			if err != nil || IsPlan(id) {
				continue
			}
			if exact {
				if key == id && (exactWant == "" || p.Id < exactWant) {
					exactWant = p.Id
				}
				continue
			}
			if !strings.HasPrefix(id, key) {
				continue
			}
			rest := id[len(key):]
			if rest == "" || strings.Contains(rest, "/") {
				continue
			}
			if patWant == "" || p.Id < patWant {
				patWant = p.Id
			}
		}
		want := exactWant
		if want == "" {
			want = patWant
		}
		if got != want || ok != (want != "") {
			t.Fatalf("Match(%q) with %q, %q = %q, %v; the reference says %q", id, pat1, pat2, got, ok, want)
		}
		if ok {
			var pl *pb.Limit
			for _, p := range plans {
				if p.Id == got {
					pl = p
				}
			}
			if r := Resolve(pl, id); r.Id != id || r.Plan != got || r.LimitTokens != pl.LimitTokens {
				t.Fatalf("Resolve(%q) = %v", id, r)
			}
		}
	})
}
