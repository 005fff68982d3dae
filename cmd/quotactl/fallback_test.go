package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// TestFallbackRoundTrip: what formatFallbacks prints, parseFallbacks reads
// back to the same map, and canonical text prints back unchanged.
func TestFallbackRoundTrip(t *testing.T) {
	for _, s := range []string{
		"eu=closed",
		"eu=open",
		"eu=local:1",
		"eu=closed,us=local:100",
		"ap=open,eu=local:1125899906842624,us=closed", // vocab.MaxTokens
	} {
		m := map[string]*pb.Fallback{}
		if err := parseFallbacks(s, m); err != nil {
			t.Fatalf("parse %q: %v", s, err)
		}
		if got := formatFallbacks(m); got != s {
			t.Errorf("parse then format %q = %q", s, got)
		}
	}
	// Non-canonical input: order, spaces and a leading + are normalised.
	m := map[string]*pb.Fallback{}
	if err := parseFallbacks("us=local:+100, eu=closed", m); err != nil {
		t.Fatal(err)
	}
	if got := formatFallbacks(m); got != "eu=closed,us=local:100" {
		t.Errorf("normalised to %q", got)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	regions := []string{"eu", "us", "ap", "sa", "me-1"}
	for range 500 {
		want := map[string]*pb.Fallback{}
		for _, r := range regions {
			switch rng.IntN(4) {
			case 0:
			case 1:
				want[r] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_CLOSED}
			case 2:
				want[r] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}
			case 3:
				want[r] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: rng.Int64N(1 << 40)}
			}
		}
		if len(want) == 0 {
			continue
		}
		text := formatFallbacks(want)
		got := map[string]*pb.Fallback{}
		if err := parseFallbacks(text, got); err != nil {
			t.Fatalf("parse %q: %v", text, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d entries, want %d", text, len(got), len(want))
		}
		for r, fb := range want {
			if !proto.Equal(got[r], fb) {
				t.Fatalf("%q: %s = %v, want %v", text, r, got[r], fb)
			}
		}
	}
}

// TestEffectiveFallback: a region without an entry shows as closed.
func TestEffectiveFallback(t *testing.T) {
	l := &pb.Limit{Regions: []string{"eu", "us"}, Fallback: map[string]*pb.Fallback{
		"us": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 100},
	}}
	if got := effectiveFallback(l); got != "eu=closed,us=local:100" {
		t.Errorf("got %q", got)
	}
}

// TestFormatDuration: whole units print short and parse back.
func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second: "1s", time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m",
		time.Hour + 5*time.Second: "1h0m5s", 250 * time.Millisecond: "250ms", 0: "0s",
		31 * 24 * time.Hour: "744h", 1500 * time.Millisecond: "1.5s",
	} {
		got := formatDuration(durationpb.New(d))
		if got != want {
			t.Errorf("%v printed %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("%q parses to %v, %v", got, back, err)
		}
	}
	if formatDuration(nil) != "" {
		t.Error("nil duration")
	}
}
