package limitspec

import (
	"errors"
	"leasehold/internal/zones"
	"leasehold/lease"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

func TestValidateLimitDefaults(t *testing.T) {
	in := &pb.Limit{Id: "tenant/a", LimitTokens: 100, Window: durationpb.New(time.Minute),
		Regions: []string{"us", "eu"}, Mode: pb.Mode_MODE_STRICT, Version: 7}
	got, err := ValidateLimit(in, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	if got == in || in.Version != 7 || in.Lease != nil {
		t.Fatal("the input was changed")
	}
	if got.Version != 0 || got.Regions[0] != "eu" || got.Lease.Ttl.AsDuration() != 15*time.Second || got.Lease.MinChunk != 1 {
		t.Fatalf("normalized: %v", got)
	}
}

// TestStandingSharesFitInG: every region's standing share fits in G
// together, exactly at the edge.
func TestStandingSharesFitInG(t *testing.T) {
	l := &pb.Limit{Id: "tenant/a", LimitTokens: 101, Window: durationpb.New(time.Minute),
		Regions: []string{"eu", "us"}, Mode: pb.Mode_MODE_STRICT, Lease: &pb.LeaseSettings{Standing: 50}}
	got, err := ValidateLimit(l, []string{"eu", "us"})
	if err != nil || got.Lease.Standing != 50 {
		t.Fatalf("50 x 2 regions of G = 101: %v, %v", got, err)
	}
	l.Lease.Standing = 51
	if _, err := ValidateLimit(l, []string{"eu", "us"}); err == nil || !strings.Contains(err.Error(), "at most 50 for 2 regions") {
		t.Fatalf("51 x 2 regions of G = 101: %v", err)
	}
}

func TestValidateLimitNamesTheField(t *testing.T) {
	valid := func() *pb.Limit {
		return &pb.Limit{Id: "tenant/a", LimitTokens: 100, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_BOUNDED}
	}
	for _, tc := range []struct {
		field string
		edit  func(*pb.Limit)
	}{
		{"limit.id", func(l *pb.Limit) { l.Id = "a//b" }},
		{"limit.window", func(l *pb.Limit) { l.Window = durationpb.New(MaxWindow + time.Second) }},
		{"limit.regions[0]", func(l *pb.Limit) { l.Regions = []string{"ap"} }},
		{"limit.mode", func(l *pb.Limit) { l.Mode = pb.Mode_MODE_UNSPECIFIED }},
		{"limit.fallback[eu].local_tokens", func(l *pb.Limit) {
			l.Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL}}
		}},
		{"limit.lease.ttl", func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(2 * time.Minute)} }},
		{"limit.limit_tokens", func(l *pb.Limit) { l.LimitTokens = vocab.MaxTokens + 1 }},
		{"limit.lease.min_chunk", func(l *pb.Limit) {
			l.LimitTokens = vocab.MaxTokens
			l.Lease = &pb.LeaseSettings{MinChunk: vocab.MaxTokens + 1}
		}},
		{"limit.lease.max_chunk", func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{MaxChunk: vocab.MaxTokens + 1} }},
		{"limit.lease.standing", func(l *pb.Limit) { l.Lease = &pb.LeaseSettings{Standing: -1} }},
		// Two regions' shares of 51 are more than G = 100.
		{"limit.lease.standing", func(l *pb.Limit) { l.Regions, l.Lease = []string{"eu", "us"}, &pb.LeaseSettings{Standing: 51} }},
		{"limit.settle_grace", func(l *pb.Limit) { l.SettleGrace = durationpb.New(MaxSettleGrace + time.Millisecond) }},
		{"limit.settle_grace", func(l *pb.Limit) { l.SettleGrace = durationpb.New(999 * time.Millisecond) }},
		{"limit.settle_grace", func(l *pb.Limit) { l.SettleGrace = &durationpb.Duration{Seconds: 1, Nanos: -1} }},
		{"limit.debt_policy", func(l *pb.Limit) { l.DebtPolicy = pb.DebtPolicy(9) }},
		{"limit.window_phase", func(l *pb.Limit) { l.WindowPhase = durationpb.New(time.Minute) }},
		{"limit.calendar.unit", func(l *pb.Limit) { l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "fortnight", Zone: "UTC"} }},
		{"limit.calendar.zone", func(l *pb.Limit) {
			l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "month", Zone: "Mars/Olympus"}
		}},
		{"limit.calendar.zone", func(l *pb.Limit) {
			l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "month", Zone: "../../etc/passwd"}
		}},
		{"limit.calendar.zone", func(l *pb.Limit) { l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "month"} }},
		{"limit.window", func(l *pb.Limit) { l.Calendar = &pb.CalendarWindows{Unit: "month", Zone: "Europe/Berlin"} }},
		{"limit.window_phase", func(l *pb.Limit) {
			l.Window, l.WindowPhase = nil, durationpb.New(time.Second)
			l.Calendar = &pb.CalendarWindows{Unit: "month", Zone: "Europe/Berlin"}
		}},
		// A calendar window's lease ttl is bounded by the unit's shortest
		// window (a day may last 23 h: ttl <= 22 h).
		{"limit.lease.ttl", func(l *pb.Limit) {
			l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "day", Zone: "America/New_York"}
			l.Lease = &pb.LeaseSettings{Ttl: durationpb.New(23 * time.Hour)}
		}},
		{"limit.calendar.zone", func(l *pb.Limit) { l.Window, l.Calendar = nil, &pb.CalendarWindows{Unit: "day", Zone: "Local"} }},
		{"limit.window_phase", func(l *pb.Limit) { l.WindowPhase = durationpb.New(-time.Second) }},
		{"limit.window_phase", func(l *pb.Limit) { l.WindowPhase = durationpb.New(time.Second + time.Microsecond) }},
		{"limit.window_phase", func(l *pb.Limit) { l.WindowPhase = &durationpb.Duration{Seconds: 1, Nanos: -1} }},
		{"limit.fallback[eu].local_tokens", func(l *pb.Limit) {
			l.Fallback = map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: vocab.MaxTokens + 1}}
		}},
		{"limit.tags", func(l *pb.Limit) {
			l.Tags = map[string]string{}
			for i := range MaxTags + 1 {
				l.Tags[string(rune('a'+i))] = "v"
			}
		}},
	} {
		l := valid()
		tc.edit(l)
		_, err := ValidateLimit(l, []string{"eu", "us"})
		var fe *vocab.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, vocab.ErrInvalid) {
			t.Errorf("%s: %v, want a FieldError naming it", tc.field, err)
		}
	}
}

// TestValidateLimitPhase: a phase in [0, W) in whole milliseconds is
// kept, a zero phase is stored unset (the limit reads as it always did).
func TestValidateLimitPhase(t *testing.T) {
	for _, tc := range []struct {
		phase, want time.Duration
		unset       bool
	}{
		{17 * time.Second, 17 * time.Second, false},
		{time.Minute - time.Millisecond, time.Minute - time.Millisecond, false},
		{0, 0, true},
	} {
		in := &pb.Limit{Id: "tenant/a", LimitTokens: 100, Window: durationpb.New(time.Minute),
			Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT, WindowPhase: durationpb.New(tc.phase)}
		got, err := ValidateLimit(in, []string{"eu"})
		if err != nil {
			t.Fatalf("phase %v: %v", tc.phase, err)
		}
		if Phase(got) != tc.want || (got.WindowPhase == nil) != tc.unset {
			t.Errorf("phase %v: stored %v", tc.phase, got.WindowPhase)
		}
	}
}

// TestValidateLimitAtMaxTokens: every token amount of a limit may be
// vocab.MaxTokens (the one maximum), and one more is refused (above).
func TestValidateLimitAtMaxTokens(t *testing.T) {
	l := &pb.Limit{Id: "tenant/max", LimitTokens: vocab.MaxTokens, Window: durationpb.New(time.Minute),
		Regions: []string{"eu"}, Mode: pb.Mode_MODE_BOUNDED,
		Lease:    &pb.LeaseSettings{MinChunk: vocab.MaxTokens, MaxChunk: vocab.MaxTokens},
		Fallback: map[string]*pb.Fallback{"eu": {Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: vocab.MaxTokens}}}
	if _, err := ValidateLimit(l, []string{"eu"}); err != nil {
		t.Fatalf("a limit with every amount at MaxTokens: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{ModeName(pb.Mode_MODE_STRICT), "strict"},
		{ModeName(pb.Mode_MODE_BOUNDED), "bounded"},
		{ModeName(pb.Mode(9)), "mode(9)"},
		{FallbackName(nil), "closed"},
		{FallbackName(&pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_OPEN}), "open"},
		{FallbackName(&pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 50}), "local:50"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestValidateLimitCalendar: calendar windows are accepted, the ttl
// defaults to a quarter of the unit's shortest window, and the schedule
// holds the process's one location of the zone.
func TestValidateLimitCalendar(t *testing.T) {
	for _, tc := range []struct {
		unit, zone string
		ttl        time.Duration
	}{
		{"month", "Europe/Berlin", (28*24*time.Hour - 2*time.Hour) / 4},
		{"day", "America/New_York", (22 * time.Hour) / 4},
		{"year", "UTC", (365*24*time.Hour - 2*time.Hour) / 4},
	} {
		in := &pb.Limit{Id: "tenant/a", LimitTokens: 5_000_000, Regions: []string{"eu"}, Mode: pb.Mode_MODE_STRICT,
			Calendar: &pb.CalendarWindows{Unit: tc.unit, Zone: tc.zone}}
		got, err := ValidateLimit(in, []string{"eu"})
		if err != nil {
			t.Fatalf("%s %s: %v", tc.unit, tc.zone, err)
		}
		if d := got.Lease.Ttl.AsDuration(); d != tc.ttl {
			t.Errorf("%s: ttl %v, want %v", tc.unit, d, tc.ttl)
		}
		s1, s2 := Schedule(got), Schedule(proto.Clone(got).(*pb.Limit))
		if !s1.IsCalendar() || s1 != s2 || s1.Cal.Loc.String() != tc.zone {
			t.Errorf("%s %s: schedules %v and %v", tc.unit, tc.zone, s1, s2)
		}
	}
}

// TestLongestWindow: no window of any limit, fixed or calendar, is longer
// than LongestWindow (what the allocator group map keeps old versions
// for): the longest calendar years of a few zones, leap years included.
func TestLongestWindow(t *testing.T) {
	if LongestWindow < MaxWindow {
		t.Fatalf("LongestWindow %v < MaxWindow %v", LongestWindow, MaxWindow)
	}
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/New_York", "Pacific/Apia", "Australia/Lord_Howe"} {
		c, err := zones.Calendar("year", zone)
		if err != nil {
			t.Fatal(err)
		}
		s := lease.CalendarWindows(c)
		for y := 2010; y <= 2030; y++ {
			if w := s.Of(time.Date(y, 6, 1, 0, 0, 0, 0, time.UTC)); w.Length > LongestWindow {
				t.Errorf("%d in %s lasts %v > %v", y, zone, w.Length, LongestWindow)
			}
		}
	}
}
