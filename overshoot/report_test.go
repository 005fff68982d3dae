package overshoot

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReportJSONFieldNames(t *testing.T) {
	js, err := json.Marshal(NewReport("tenant/atlas", time.Unix(0, 0), time.Unix(60, 0), Window{}))
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(js, &fields); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range fields {
		got = append(got, k)
	}
	slices.Sort(got)
	want := []string{
		"admitted", "admitted_total", "bound", "fallback_admitted", "granted", "limit", "limit_tokens",
		"observed_overshoot", "returned", "stranded", "window_end", "window_start",
	}
	if !slices.Equal(got, want) {
		t.Errorf("JSON fields %v, want %v", got, want)
	}
	if string(fields["admitted"]) != "{}" {
		t.Errorf("admitted of a window without regions = %s, want {}", fields["admitted"])
	}
}

func TestNewReport(t *testing.T) {
	loc := time.FixedZone("CET", 3600)
	start := time.Date(2026, 11, 29, 19, 0, 0, 0, loc)
	w := Window{Limit: 600, LimitAtGrant: 1000, Granted: 1000, Returned: 100, Regions: []Region{
		{Name: "eu", Admitted: 500, Fallback: FallbackLocal, LocalAllowance: 100, FallbackAdmitted: 40},
		{Name: "us", Admitted: 300},
		{Name: "us", Admitted: 50, FallbackAdmitted: 0}, // listed twice: summed
	}}
	r := NewReport("tenant/atlas", start, start.Add(time.Minute), w)
	want := Report{
		Limit:             "tenant/atlas",
		WindowStart:       time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC),
		WindowEnd:         time.Date(2026, 11, 29, 18, 1, 0, 0, time.UTC),
		LimitTokens:       600,
		Granted:           1000,
		Returned:          100,
		Admitted:          map[string]int64{"eu": 540, "us": 350},
		AdmittedTotal:     890,
		FallbackAdmitted:  40,
		Bound:             Ceiling{Tokens: 400},
		ObservedOvershoot: 290,
		Stranded:          50,
		Terms:             Bound{Total: 400, Fallback: 100, LimitLowered: 300},
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("NewReport =\n%+v\nwant\n%+v", r, want)
	}
	if r.WindowStart.Location() != time.UTC {
		t.Errorf("window_start not in UTC")
	}
}

func TestCeilingJSON(t *testing.T) {
	for _, tc := range []struct {
		c    Ceiling
		json string
	}{
		{Ceiling{Tokens: 0}, "0"},
		{Ceiling{Tokens: 1200}, "1200"},
		{Ceiling{Tokens: math.MaxInt64}, "9223372036854775807"},
		{Ceiling{Infinite: true, Tokens: math.MaxInt64}, `"+Inf"`},
	} {
		js, err := json.Marshal(tc.c)
		if err != nil || string(js) != tc.json {
			t.Errorf("Marshal(%v) = %s, %v; want %s", tc.c, js, err, tc.json)
		}
		var back Ceiling
		if err := json.Unmarshal(js, &back); err != nil || back != tc.c {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", js, back, err, tc.c)
		}
		if got := tc.c.String(); got != strings.Trim(tc.json, `"`) {
			t.Errorf("String() = %q", got)
		}
	}
	if !math.IsInf(Ceiling{Infinite: true}.Float64(), 1) || (Ceiling{Tokens: 7}).Float64() != 7 {
		t.Error("Float64")
	}
	for _, bad := range []string{`"inf"`, `1.5`, `true`, `{}`} {
		var c Ceiling
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("Unmarshal(%s) = %v, want an error", bad, c)
		}
	}
	c := Ceiling{Tokens: 5}
	if err := json.Unmarshal([]byte("null"), &c); err != nil || c.Tokens != 5 {
		t.Errorf("null changed %v (%v)", c, err)
	}
}

func TestReportRoundTrip(t *testing.T) {
	start := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	w := Window{Limit: 1000, Granted: 1000, Regions: []Region{
		{Name: "eu", Admitted: 1000, Fallback: FallbackOpen, FallbackAdmitted: 9},
	}}
	r := NewReport("a", start, start.Add(time.Minute), w)
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	r.Terms = Bound{} // not in the JSON row
	if !reflect.DeepEqual(back, r) {
		t.Errorf("round trip:\n%+v\nwant\n%+v", back, r)
	}
}
