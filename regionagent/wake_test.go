package regionagent

import (
	"context"
	"testing"
	"time"
)

// TestMultiCheckWaitsOnce: a CheckMulti waiting on several limits (here
// one limit named twice, and two cold limits) is woken once however many
// of its limits change, in one Ready or in several: its wait channel is
// closed once (a second close panicked the agent).
func TestMultiCheckWaitsOnce(t *testing.T) {
	w := newWorld(t, "eu")
	x := w.putLimit(limit("tenant/wx", 100, time.Minute, 15*time.Second, "eu"))
	y := w.putLimit(limit("tenant/wy", 100, time.Minute, 15*time.Second, "eu"))
	z := w.putLimit(limit("tenant/wz", 100, time.Minute, 15*time.Second, "eu"))
	a := w.agent("eu", "r1", WithColdWait(2*time.Second))
	runWork(t, a)
	ctx := context.Background()
	for _, items := range [][]CheckItem{{{Limit: x.Id}, {Limit: x.Id}}, {{Limit: y.Id}, {Limit: z.Id}}} {
		ds, err := a.CheckMulti(ctx, items)
		if err != nil || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("%v: %+v %v", items, ds, err)
		}
	}
}
