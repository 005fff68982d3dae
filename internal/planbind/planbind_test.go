package planbind

import (
	"strings"
	"testing"

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
		plan("plans/zzz", 1, "tenant/{id}"), // the same pattern: the smaller plan id wins
		plan("tenant/x", 5, "other/{id}"),   // not a plan: skipped
	})
	for _, c := range []struct{ id, plan string }{
		{"tenant/newco", "plans/pro"},
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
	if tbl.Len() != 3 {
		t.Errorf("Len = %d, want 3", tbl.Len())
	}
	var empty Table
	if _, ok := empty.Match("tenant/a"); ok {
		t.Error("the zero Table matched")
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
}

// FuzzMatch checks Match against a naive reference (every pattern's
// prefix, the rest one segment) and that Resolve names the id it was
// given, whatever the input.
func FuzzMatch(f *testing.F) {
	f.Add("tenant/{id}", "free/{id}", "tenant/newco")
	f.Add("a/b/{id}", "a/{id}", "a/b/c")
	f.Add("x/{id}", "x/{id}", "x/")
	f.Add("plans/{id}", "p/{id}", "plans/p")
	f.Fuzz(func(t *testing.T, pat1, pat2, id string) {
		plans := []*pb.Limit{plan("plans/a", 1, pat1), plan("plans/b", 2, pat2)}
		tbl := NewTable(plans)
		got, ok := tbl.Match(id)
		want := ""
		for _, p := range plans {
			prefix, err := PatternPrefix(p.Binds[0])
			if err != nil || IsPlan(id) || !strings.HasPrefix(id, prefix) {
				continue
			}
			rest := id[len(prefix):]
			if rest == "" || strings.Contains(rest, "/") {
				continue
			}
			if want == "" || p.Id < want {
				want = p.Id
			}
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
