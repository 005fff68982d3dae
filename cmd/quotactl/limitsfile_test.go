package main

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

const exampleFile = `# Contract limits
manage: [tenant/]
limits:
  - id: tenant/atlas
    limit: 1000
    window: 1m
    regions: [us, eu]
    mode: bounded
    fallback: {eu: closed, us: "local:100"}
    lease: {ttl: 15s}
    owner: finance
    description: |
      Atlas contract, 2026
    tags: {plan: gold, tenant: atlas}
    hash_tag: atlas
  - id: tenant/beta
    limit: 50
    window: 1s
    regions:
      - eu
    mode: strict
`

// TestDecodeLimitsFile: the example decodes to normalized limits: defaults
// filled in, regions sorted, strings as written.
func TestDecodeLimitsFile(t *testing.T) {
	lf, err := decodeLimitsFile("limits.yaml", []byte(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(lf.manage, ",") != "tenant/" || len(lf.limits) != 2 {
		t.Fatalf("manage %q, %d limits", lf.manage, len(lf.limits))
	}
	a, b := lf.limits[0], lf.limits[1]
	if a.line != 4 || b.line != 16 {
		t.Errorf("lines %d, %d; want 4, 16", a.line, b.line)
	}
	want := &pb.Limit{
		Id: "tenant/atlas", LimitTokens: 1000, Window: durationpb.New(time.Minute),
		Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{
			"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED},
			"us": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 100},
		},
		Lease:       &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second), MinChunk: 1},
		Owner:       "finance",
		Description: "Atlas contract, 2026\n",
		Tags:        map[string]string{"plan": "gold", "tenant": "atlas"},
		HashTag:     "atlas",
	}
	if !proto.Equal(a.limit, want) {
		t.Errorf("atlas decoded to %v\nwant %v", a.limit, want)
	}
	if got := b.limit; got.GetLease().GetTtl().AsDuration() != 250*time.Millisecond || got.Mode != pb.Mode_MODE_STRICT ||
		got.GetLease().GetMinChunk() != 1 || len(got.Fallback) != 0 {
		t.Errorf("beta decoded to %v", got)
	}

	// No manage: nil scope; "limits:" with nothing is no limits.
	lf, err = decodeLimitsFile("f", []byte("limits:\n"))
	if err != nil || lf.manage != nil || len(lf.limits) != 0 {
		t.Fatalf("empty limits: %v %v", lf, err)
	}
	lf, err = decodeLimitsFile("f", []byte("manage: \"*\"\nlimits: []\n"))
	if err != nil || strings.Join(lf.manage, ",") != "*" {
		t.Fatalf("manage *: %v %v", lf, err)
	}
}

// TestDecodeLimitsFileErrors: every refusal names the file, the line of
// the offending key or value, and the key or limit.
func TestDecodeLimitsFileErrors(t *testing.T) {
	head := "limits:\n  - id: tenant/a\n    limit: 10\n    window: 1m\n    regions: [eu]\n    mode: bounded\n"
	bucket := "limits:\n  - id: tenant/b\n    rate: 100/s\n    burst: 200\n    regions: [eu]\n    mode: strict\n"
	for _, tc := range []struct {
		name, in string
		want     string // a part of the message, after "f.yaml:LINE: "
		line     int
	}{
		{"empty", "", "empty file", 1},
		{"comment only", "# nothing\n", "empty file", 1},
		{"not a mapping", "- a\n- b\n", "the file: want a mapping, got a list", 1},
		{"unknown top key", "limit:\n  - id: x\n", `the file: unknown key "limit" (want manage, limits)`, 1},
		{"no limits", "manage: [tenant/]\n", `"limits" is required`, 1},
		{"limits not a list", "limits: {a: b}\n", "limits: want a list of limits, got a mapping", 1},
		{"unknown limit key", head + "    windw: 1m\n", `limits[0]: unknown key "windw"`, 7},
		{"unknown lease key", head + "    lease: {ttl: 1s, ttls: 2s}\n", `tenant/a: lease: unknown key "ttls"`, 7},
		{"duplicate key", head + "    limit: 20\n", `limits[0]: key "limit" given twice (first at line 3)`, 7},
		{"missing id", "limits:\n  - limit: 5\n", `limits[0]: "id" is required`, 2},
		{"missing window", "limits:\n  - id: x\n    limit: 5\n    regions: [eu]\n    mode: strict\n", `x: "window" is required`, 2},
		{"bad id", "limits:\n  - id: bad id!\n", `limits[0]: id: "bad id!"`, 2},
		{"limit not a number", strings.Replace(head, "limit: 10", "limit: ten", 1), `tenant/a: limit: "ten": want a whole number`, 3},
		{"limit zero", strings.Replace(head, "limit: 10", "limit: 0", 1), "tenant/a: limit: must be 1..1125899906842624, got 0", 3},
		{"window without unit", strings.Replace(head, "window: 1m", "window: 60", 1), `tenant/a: window: "60": want a duration with a unit`, 4},
		{"window too short", strings.Replace(head, "window: 1m", "window: 10ms", 1), "tenant/a: window: must be >= 1s", 4},
		{"regions not a list", strings.Replace(head, "regions: [eu]", "regions: eu", 1), `tenant/a: regions: want a list, e.g. [eu, us], got "eu"`, 5},
		{"bad region", strings.Replace(head, "regions: [eu]", "regions: [eu, EU]", 1), `tenant/a: regions[1]: "EU"`, 5},
		{"mode", strings.Replace(head, "mode: bounded", "mode: loose", 1), `tenant/a: mode: "loose": want strict or bounded`, 6},
		{"fallback kind", head + "    fallback: {eu: loose}\n", `tenant/a: fallback.eu: "loose": want closed, open or local:A`, 7},
		{"fallback region", head + "    fallback:\n      eu: closed\n      us: open\n", `tenant/a: fallback.us: region "us" is not in limit.regions`, 9},
		{"fallback local 0", head + "    fallback: {eu: \"local:0\"}\n", `tenant/a: fallback.eu: "local:0": want local:A with A a whole number from 1 to 1125899906842624, got "0"`, 7},
		{"strict with open", strings.Replace(head, "bounded", "strict", 1) + "    fallback: {eu: open}\n", "tenant/a: fallback.eu: strict limits admit only leased tokens", 7},
		{"ttl over window", head + "    lease:\n      ttl: 2m\n", "tenant/a: lease.ttl: must be <= the window", 8},
		{"min chunk", head + "    lease: {min_chunk: 50}\n", "tenant/a: lease.min_chunk: must be <= limit_tokens (10), got 50", 7},
		{"settle grace", head + "    settle_grace: 2m\n", "tenant/a: settle_grace: must be whole milliseconds in 1s..1m0s, got 2m0s", 7},
		{"debt policy", head + "    debt_policy: pay\n", `tenant/a: debt_policy: "pay": want carry or forgive`, 7},
		{"tags", head + "    tags: [a]\n", "tenant/a: tags: want a mapping of key to value", 7},
		{"hash tag", head + "    hash_tag: \"{atlas}\"\n", `tenant/a: hash_tag: "{atlas}": use [A-Za-z0-9._-]`, 7},
		{"owner not text", head + "    owner: {a: b}\n", "tenant/a: owner: want a text value, got a mapping", 7},
		{"duplicate id", head + "  - id: tenant/a\n    limit: 5\n    window: 1s\n    regions: [eu]\n    mode: strict\n", "limits[1]: tenant/a: declared twice (first at line 2)", 7},
		{"outside manage", "manage: [tenant/]\n" + strings.Replace(head, "tenant/a", "other/a", 1), "limits[0]: other/a: outside the file's scope (manage: tenant/)", 3},
		{"manage empty", "manage: []\nlimits: []\n", "manage: empty", 1},
		{"manage wildcard", "manage: [tenant/*]\nlimits: []\n", `manage[0]: "tenant/*": a prefix is plain text`, 1},
		{"alias", "limits:\n  - &a {id: x, limit: 1, window: 1s, regions: [eu], mode: strict}\n  - *a\n", "limits[1]: aliases", 3},
		{"alias value", head + "    owner: &o fin\n    description: *o\n", "aliases", 8},
		{"merge key", head + "    <<: {a: b}\n", `unknown key "<<"`, 7},
		{"two documents", "limits: []\n---\nlimits: []\n", "more than one YAML document", 2},
		{"syntax", "limits: [\n", "invalid YAML", 1},
		{"tab indent", "limits:\n\t- id: x\n", "invalid YAML", 2},
		{"not utf8", "limits: []\n# \xff\n", "not UTF-8", 2},
		// Bucket limits: rate and burst instead of limit and window.
		{"bucket with chunks", bucket + "    lease: {max_chunk: 5}\n", "tenant/b: lease.max_chunk: bucket limits are granted as rate shares", 7},
		{"bucket bad rate", strings.Replace(bucket, "100/s", "100/d", 1), `tenant/b: rate: "100/d": want a period after the /`, 3},
		{"bucket burst zero", strings.Replace(bucket, "burst: 200", "burst: 0", 1), "tenant/b: burst: must be >= 1, got 0", 4},
		{"bucket burst too large", strings.Replace(bucket, "burst: 200", "burst: 4503599628", 1), "tenant/b: burst: must be <= 4503599627 for a rate period of 1s", 4},
		{"bucket without burst", strings.Replace(bucket, "    burst: 200\n", "", 1), `tenant/b: "burst" is required with rate`, 3},
		{"bucket with a window", bucket + "    window: 1m\n", `tenant/b: "window": a limit with a rate is a bucket limit`, 7},
		{"burst without rate", head + "    burst: 5\n", `tenant/a: "burst": only a bucket limit has a burst`, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeLimitsFile("f.yaml", []byte(tc.in))
			var fe *fileError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T), want a *fileError", err, err)
			}
			if !strings.Contains(fe.msg, tc.want) {
				t.Errorf("message %q does not contain %q", fe.msg, tc.want)
			}
			if fe.line != tc.line {
				t.Errorf("line %d, want %d (%s)", fe.line, tc.line, err)
			}
			if !strings.HasPrefix(err.Error(), "f.yaml:") {
				t.Errorf("%q does not start with the file name", err)
			}
		})
	}
}

// TestEncodeLimitsFile: export's YAML decodes back to the same limits,
// and reads as the docs show it.
func TestEncodeLimitsFile(t *testing.T) {
	lf, err := decodeLimitsFile("limits.yaml", []byte(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	var ls []*pb.Limit
	for _, fl := range lf.limits {
		ls = append(ls, fl.limit)
	}
	// Awkward strings survive: quotes, colons, YAML keywords, newlines.
	ls[1].Owner = `yes: "no"`
	ls[1].Tags = map[string]string{"n": "1000", "b": "true", "empty": ""}
	ls[1].Description = "two\nlines\t"
	ls[1].SettleGrace = durationpb.New(45 * time.Second)
	ls[1].DebtPolicy = pb.DebtPolicy_DEBT_POLICY_FORGIVE
	ls[1].Lease.Standing = 3
	var buf bytes.Buffer
	if err := encodeLimitsFile(&buf, []string{"tenant/"}, ls); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"manage: [tenant/]\n",
		"  - id: tenant/atlas\n    limit: 1000\n    window: 1m\n    regions: [eu, us]\n    mode: bounded\n",
		`    fallback: {eu: closed, us: "local:100"}` + "\n",
		"    lease: {ttl: 15s, min_chunk: 1, max_chunk: 0}\n",
		"    tags: {plan: gold, tenant: atlas}\n    hash_tag: atlas\n",
		"    fallback: {eu: closed}\n",
		"    settle_grace: 45s\n    debt_policy: forgive\n",
		"    lease: {ttl: 250ms, min_chunk: 1, max_chunk: 0, standing: 3}\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	back, err := decodeLimitsFile("export.yaml", buf.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i, fl := range back.limits {
		if d := diffLimits(ls[i], fl.limit); len(d) > 0 {
			t.Errorf("%s changed in a round trip: %v", ls[i].Id, d)
		}
	}
	// Encoding is deterministic.
	var again bytes.Buffer
	if err := encodeLimitsFile(&again, []string{"tenant/"}, ls); err != nil || again.String() != out {
		t.Fatalf("second encoding differs: %v", err)
	}
}

var lineRe = regexp.MustCompile(`^f\.yaml:[1-9][0-9]*: `)

// FuzzLimitsFile: any input either decodes or is refused with an error
// naming the file and a line, never a panic; whatever decodes survives an
// export round trip unchanged.
func FuzzLimitsFile(f *testing.F) {
	f.Add([]byte(exampleFile))
	f.Add([]byte("limits: []\n"))
	f.Add([]byte("limits:\n  - {id: p, limit: 5, window: 1m, window_phase: 17s, regions: [eu], mode: strict}\n"))
	f.Add([]byte("limits:\n  - {id: c, limit: 5000000, calendar: {unit: month, zone: Europe/Berlin}, regions: [eu], mode: strict}\n"))
	f.Add([]byte("limits:\n  - {id: c, limit: 5, calendar: {unit: day}, window: 1m, regions: [eu], mode: strict}\n"))
	f.Add([]byte("manage: \"*\"\nlimits:\n  - {id: a, limit: 1, window: 1s, regions: [eu], mode: strict}\n"))
	f.Add([]byte("limits:\n  - &a {id: a}\n  - *a\n"))
	f.Add([]byte("limits:\n  - {id: b, rate: 5/250ms, burst: 7, regions: [eu, us], mode: bounded, fallback: {eu: closed}, lease: {ttl: 30s}}\n"))
	f.Add([]byte("limits:\n  - id: a\n    limit: 9223372036854775807\n    window: 744h\n    regions: [eu]\n    mode: bounded\n    fallback: {eu: \"local:1\"}\n    lease: {ttl: 100ms, min_chunk: 0, max_chunk: 0}\n    tags: {? [a] : b}\n"))
	f.Add([]byte("limits:\n  - {id: plans/pro, binds: [\"t/{id}\", t/big], contracts: {t/big: 5, t/x: 0}, limit: 1, window: 1s, regions: [eu], mode: strict}\n"))
	f.Add([]byte("limits:\n  - {id: plans/pro, binds: \"t/{id}\", contracts: [a], limit: 1, window: 1s, regions: [eu], mode: strict}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lf, err := decodeLimitsFile("f.yaml", data)
		if err != nil {
			var fe *fileError
			if !errors.As(err, &fe) || fe.line < 1 || !lineRe.MatchString(err.Error()) {
				t.Fatalf("error without a line: %q (%T)", err, err)
			}
			return
		}
		var ls []*pb.Limit
		for _, fl := range lf.limits {
			ls = append(ls, fl.limit)
		}
		var buf bytes.Buffer
		if err := encodeLimitsFile(&buf, lf.manage, ls); err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := decodeLimitsFile("f.yaml", buf.Bytes())
		if err != nil {
			t.Fatalf("export does not decode: %v\n%s", err, buf.String())
		}
		if len(back.limits) != len(ls) {
			t.Fatalf("%d limits back, want %d", len(back.limits), len(ls))
		}
		byID := map[string]*pb.Limit{}
		for _, fl := range back.limits {
			byID[fl.limit.Id] = fl.limit
		}
		for _, l := range ls {
			if d := diffLimits(l, byID[l.Id]); len(d) > 0 {
				t.Fatalf("%s changed in a round trip: %v\n%s", l.Id, d, buf.String())
			}
		}
	})
}

// TestLimitsFileShadow: shadow is true or false, kept in a round trip,
// and anything else is refused naming the line and the key.
func TestLimitsFileShadow(t *testing.T) {
	src := "limits:\n  - id: tenant/try\n    limit: 10\n    window: 1m\n    regions: [eu]\n    mode: strict\n    shadow: true\n"
	lf, err := decodeLimitsFile("limits.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !lf.limits[0].limit.Shadow {
		t.Fatal("shadow: true decoded as false")
	}
	var buf bytes.Buffer
	if err := encodeLimitsFile(&buf, nil, []*pb.Limit{lf.limits[0].limit}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "    shadow: true\n") {
		t.Fatalf("export lacks shadow:\n%s", buf.String())
	}
	_, err = decodeLimitsFile("limits.yaml", []byte(strings.Replace(src, "shadow: true", "shadow: maybe", 1)))
	if err == nil || err.Error() != `limits.yaml:7: tenant/try: shadow: "maybe": want true or false` {
		t.Fatalf("shadow: maybe: %v", err)
	}
}
