package simulations

import (
	"testing"
	"time"
)

// TestClockWhen: When is the earliest true time at which a clock reads at
// least t, for clocks with an offset, a drift, both, and neither.
func TestClockWhen(t *testing.T) {
	fast := Clock{Offset: 3 * ms, DriftPPM: 200}     // reads 1.0002 s per true second, 3 ms ahead
	slow := Clock{Offset: -40 * ms, DriftPPM: -1000} // reads 0.999 s per true second, 40 ms behind
	for _, tc := range []struct {
		name  string
		c     Clock
		at    time.Time
		want  time.Duration
		reads time.Time // the clock's reading then
	}{
		{"perfect", Clock{}, Epoch.Add(time.Second), time.Second, Epoch.Add(time.Second)},
		{"offset ahead", Clock{Offset: 5 * ms}, Epoch.Add(time.Second), 995 * ms, Epoch.Add(time.Second)},
		{"offset behind", Clock{Offset: -5 * ms}, Epoch.Add(time.Second), 1005 * ms, Epoch.Add(time.Second)},
		{"before the epoch", Clock{Offset: 5 * ms}, Epoch, -5 * ms, Epoch},
		{"fast", fast, Epoch.Add(3*ms + 10002*ms), 10 * time.Second, Epoch.Add(3*ms + 10002*ms)},
		// 10 s true reads 10 s - 10 ms - 40 ms, and so does 10 s - 1 ns (the
		// drift's -9,999,999.999 ns truncate to -9,999,999): a slow clock
		// reads the same instant for two ns now and then.
		{"slow", slow, Epoch.Add(10*time.Second - 50*ms), 10*time.Second - 1, Epoch.Add(10*time.Second - 50*ms)},
		{"slow, next ns", slow, Epoch.Add(10*time.Second - 50*ms + 1), 10*time.Second + 1, Epoch.Add(10*time.Second - 50*ms + 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.c.When(tc.at)
			if got != tc.want {
				t.Fatalf("When(%v) = %v, want %v", tc.at.Sub(Epoch), got, tc.want)
			}
			if r := tc.c.At(got); !r.Equal(tc.reads) {
				t.Fatalf("At(%v) reads %v, want %v", got, r.Sub(Epoch), tc.reads.Sub(Epoch))
			}
			if r := tc.c.At(got - 1); !r.Before(tc.at) {
				t.Fatalf("At(%v) already reads %v >= %v: not the earliest", got-1, r.Sub(Epoch), tc.at.Sub(Epoch))
			}
		})
	}
}

// TestClockWhenInvertsAt: for instants a clock reads, When finds the
// earliest true time that reads them, across drifts and offsets.
func TestClockWhenInvertsAt(t *testing.T) {
	for _, c := range []Clock{{}, {Offset: 7 * ms, DriftPPM: 20}, {Offset: -50 * ms, DriftPPM: -200}, {DriftPPM: 20000}} {
		for tt := time.Duration(0); tt < 10*time.Minute; tt += 7*time.Second + 13 {
			r := c.At(tt)
			w := c.When(r)
			if w > tt || c.At(w).Before(r) || !c.At(w-1).Before(r) {
				t.Fatalf("%+v: At(%v) = %v, When = %v", c, tt, r.Sub(Epoch), w)
			}
		}
	}
}
